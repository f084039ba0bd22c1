# The compiled twin of snapshot_rows.py: a snapshot chunk's rows from their text (TextRowPlan).
# Part of tidegate.native.rowcodec (native/rowcodec.pyx includes it);
# tests/unit/test_snapshot_rows.py compares its bytes with the Python path's.

# --------------------------------------------------------------------------- MySQL text rows (snapshot chunks)
#
# A snapshot chunk read on MySQL/MariaDB gets its rows in the text protocol: per column a
# length-encoded string (0xFB for NULL). ``TextRowPlan.event`` writes the ``op: r`` event of one
# such row packet, byte for byte what ``snapshots.RowEvents`` builds from pymysql's values
# (sources/mysql/snapshot_rows.py is the Python side and names the column kinds); None for
# anything it does not write the same way (a zero date is written as null, as the Python path
# writes it; text that is not UTF-8, a number pymysql would rewrite: None), and the caller then decodes that row with pymysql.

cdef enum:
    T_INT = 1        # digits as they are
    T_YEAR = 2       # 0000 is null
    T_DECIMAL = 3    # a JSON string: the text, when str(Decimal(text)) gives it back
    T_DOUBLE = 4     # repr(float(text))
    T_TEXT = 5       # UTF-8 text
    T_BINARY = 6     # base64
    T_DATE = 7       # as date.isoformat(); a zero or impossible date is null
    T_DATETIME = 8   # as datetime.isoformat()
    T_TIMESTAMP = 9  # as datetime.isoformat() of a UTC datetime (+00:00)
    T_BOOL = 10      # PostgreSQL's t / f
    T_PG_TIMESTAMP = 11  # PostgreSQL's timestamp text, as values.ts_iso_fast writes it
    T_LOG_DOUBLE = 12  # real / double text as the log path reads it (a JSON number: -0 is 0.0)

TEXT_KINDS = {"int": T_INT, "year": T_YEAR, "decimal": T_DECIMAL, "double": T_DOUBLE, "text": T_TEXT,
              "binary": T_BINARY, "date": T_DATE, "datetime": T_DATETIME, "timestamp": T_TIMESTAMP,
              "bool": T_BOOL, "pg_timestamp": T_PG_TIMESTAMP, "log_double": T_LOG_DOUBLE}


cdef inline bint plain_integer(const unsigned char* s, Py_ssize_t n):
    """``s`` is what str(int(s)) writes: an optional minus, digits, no leading zero."""
    cdef Py_ssize_t i = 1 if n and s[0] == b'-' else 0
    cdef Py_ssize_t j
    if i >= n or (s[i] == b'0' and n - i > 1):
        return False
    for j in range(i, n):
        if s[j] < b'0' or s[j] > b'9':
            return False
    return True


cdef inline int digits(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept:
    cdef int v = 0
    cdef Py_ssize_t j
    for j in range(i, i + n):
        if s[j] < b'0' or s[j] > b'9':
            return -1
        v = v * 10 + (s[j] - 48)
    return v


cdef int put_text_datetime(Buf* out, const unsigned char* s, Py_ssize_t n, int kind) except -1:
    """A DATE / DATETIME / TIMESTAMP's text (``YYYY-MM-DD[ hh:mm:ss[.f]]``) as the Python path
    writes pymysql's value: isoformat in quotes, null for a date Python has no value for; 0
    for text of another shape."""
    cdef int y, mo, d, h = 0, mi = 0, sec = 0, us = 0, k
    if n < 10 or s[4] != b'-' or s[7] != b'-':
        return 0
    y, mo, d = digits(s, 0, 4), digits(s, 5, 2), digits(s, 8, 2)
    if y < 0 or mo < 0 or d < 0:
        return 0
    if kind == T_DATE:
        if n != 10:
            return 0
    else:
        if n < 19 or s[10] != b' ' or s[13] != b':' or s[16] != b':':
            return 0
        h, mi, sec = digits(s, 11, 2), digits(s, 14, 2), digits(s, 17, 2)
        if h < 0 or mi < 0 or sec < 0 or h > 23 or mi > 59 or sec > 59:
            return 0
        if n > 19:
            if s[19] != b'.' or n > 26 or n == 20:
                return 0
            us = digits(s, 20, n - 20)
            if us < 0:
                return 0
            for k in range(26 - n):
                us *= 10
    if not valid_date(y, mo, d):
        put(out, b'null', 4)
        return 1
    putc(out, b'"')
    put_date(out, y, mo, d)
    if kind != T_DATE:
        putc(out, b'T')
        put_hms(out, h, mi, sec)
        if us:
            putc(out, b'.')
            put_padded(out, us, 6)
        if kind == T_TIMESTAMP:
            put(out, b'+00:00', 6)
    putc(out, b'"')
    return 1


cdef int put_text_value(Buf* out, const unsigned char* s, Py_ssize_t n, int kind) except -1:
    """One non-null column value of a text row as JSON; 0 where the Python path is needed."""
    cdef Py_ssize_t i
    if kind == T_INT:
        if not plain_integer(s, n):
            return 0
        put(out, <const char*>s, n)
    elif kind == T_YEAR:
        for i in range(n):
            if s[i] != b'0':
                break
        else:
            put(out, b'null', 4)
            return 1
        if not plain_integer(s, n):
            return 0
        put(out, <const char*>s, n)
    elif kind == T_DECIMAL:
        i = 1 if n and s[0] == b'-' else 0
        if i >= n or (s[i] == b'0' and i + 1 < n and s[i + 1] != b'.'):
            return 0  # ZEROFILL's leading zeros: Decimal drops them
        for i in range(i, n):
            if (s[i] < b'0' or s[i] > b'9') and s[i] != b'.':
                return 0  # NaN, Infinity, an exponent
        return put_numeric(out, s, n)
    elif kind == T_BOOL:
        if n != 1 or (s[0] != b't' and s[0] != b'f'):
            return 0
        if s[0] == b't':
            put(out, b'true', 4)
        else:
            put(out, b'false', 5)
    elif kind == T_PG_TIMESTAMP:
        return put_timestamp(out, s, n)
    elif kind == T_DOUBLE or kind == T_LOG_DOUBLE:
        return n > 0 and put_float(out, s, n, kind == T_LOG_DOUBLE)
    elif kind == T_TEXT:
        if not text_ok(s, n):
            return 0
        put_json_text(out, s, n)
    elif kind == T_BINARY:
        put_base64(out, s, n, 0)
    else:
        return put_text_datetime(out, s, n, kind)
    return 1


cdef class TextRowPlan:
    """One chunk's columns and envelope parts (sources/mysql/snapshot_rows.py builds it):
    ``kinds`` per column, ``names`` (b'"name":', JSON-escaped), the primary key's columns in
    key order and in name order, ``ikey_raw`` the idempotency key up to the key's JSON (UTF-8),
    ``source_head`` from ``,"source":`` to the opening quote of ``"snapshot":``, ``tx_head``
    from there to ``"total_order":`` and ``tail`` after the data collection order."""

    cdef int ncols, npk
    cdef int* kind
    cdef int* pk
    cdef int* pk_sorted
    cdef list names
    cdef bytes ikey_raw, source_head, tx_head, tail
    cdef type cls
    cdef dict common
    # one row at a time: the buffers and the values' spans are the plan's, reused row after row
    cdef Buf img, val, key, ik
    cdef Py_ssize_t* span

    def __cinit__(self, list kinds, list names, list pk, list pk_sorted, bytes ikey_raw,
                  bytes source_head, bytes tx_head, bytes tail, type cls, dict common):
        cdef int i
        self.ncols, self.npk = len(kinds), len(pk)
        self.kind = <int*>PyMem_Malloc(max(self.ncols, 1) * sizeof(int))
        self.pk = <int*>PyMem_Malloc(max(self.npk, 1) * sizeof(int))
        self.pk_sorted = <int*>PyMem_Malloc(max(self.npk, 1) * sizeof(int))
        self.span = <Py_ssize_t*>PyMem_Malloc((2 * self.ncols + 2) * sizeof(Py_ssize_t))
        self.img.p = self.val.p = self.key.p = self.ik.p = NULL
        self.img.n = self.val.n = self.key.n = self.ik.n = 0
        self.img.cap = self.val.cap = self.key.cap = self.ik.cap = 0
        if not (self.kind and self.pk and self.pk_sorted and self.span):
            raise MemoryError()
        for i in range(self.ncols):
            self.kind[i] = kinds[i]
        for i in range(self.npk):
            self.pk[i], self.pk_sorted[i] = pk[i], pk_sorted[i]
        self.names = list(names)
        self.ikey_raw, self.source_head, self.tx_head, self.tail = ikey_raw, source_head, tx_head, tail
        self.cls, self.common = cls, common

    def __dealloc__(self):
        PyMem_Free(self.kind)
        PyMem_Free(self.pk)
        PyMem_Free(self.pk_sorted)
        PyMem_Free(self.span)
        PyMem_Free(self.img.p)
        PyMem_Free(self.val.p)
        PyMem_Free(self.key.p)
        PyMem_Free(self.ik.p)

    cdef int put_key(self, Buf* out, const char* image, Py_ssize_t* span, bint by_name) except -1:
        cdef int k, col
        putc(out, b'{')
        for k in range(self.npk):
            col = self.pk_sorted[k] if by_name else self.pk[k]
            if k:
                putc(out, b',')
            put_bytes(out, <bytes>self.names[col])
            put(out, image + span[2 * col], span[2 * col + 1] - span[2 * col])
        return putc(out, b'}')

    cdef object finish(self, bint last, long long n):
        """The event of the row image in ``img`` (values at ``span``): envelope, keys, event id."""
        cdef Buf* img = &self.img
        cdef Buf* val = &self.val
        cdef Buf* ik = &self.ik
        cdef Py_ssize_t* span = self.span
        val.n = self.key.n = ik.n = 0
        # the idempotency key (the key's JSON in key order), then the envelope (envelope.pxi)
        put_bytes(ik, self.ikey_raw)
        self.put_key(ik, img.p, span, False)
        put_event_id(val, ik)
        putc(val, b'"')
        put_json_chars(val, <const unsigned char*>ik.p, ik.n)
        put_change(val, b'r', NULL, img)
        put(val, ik.p + PyBytes_GET_SIZE(self.ikey_raw), ik.n - PyBytes_GET_SIZE(self.ikey_raw))
        put_bytes(val, self.source_head)
        put(val, b'last' if last else b'true', 4)
        put_bytes(val, self.tx_head)
        put_orders(val, <uint64_t>n, <uint64_t>n)
        put_bytes(val, self.tail)
        self.put_key(&self.key, img.p, span, True)
        ev = self.cls.__new__(self.cls)
        d = ev.__dict__
        d.update(self.common)
        d["value"] = PyBytes_FromStringAndSize(val.p, val.n)
        d["key_bytes"] = PyBytes_FromStringAndSize(self.key.p, self.key.n)
        d["idempotency_key"] = PyUnicode_DecodeUTF8(ik.p, ik.n, "strict")
        return ev

    cdef int open_value(self, int i) except -1:
        """Start column ``i``'s value in the image: its name, and where its value begins."""
        if i == 0:
            self.img.n = 0
            putc(&self.img, b'{')
        else:
            putc(&self.img, b',')
        put_bytes(&self.img, <bytes>self.names[i])
        self.span[2 * i] = self.img.n
        return 0

    def event(self, bytes pkt, bint last, long long n):
        """The event of one MySQL row packet, the ``n``-th of its chunk (``last``: the table's
        last row), or None for the Python path."""
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(pkt)
        cdef Py_ssize_t end = PyBytes_GET_SIZE(pkt), o = 0, size
        cdef Buf* img = &self.img
        cdef int i
        for i in range(self.ncols):
            if o >= end:
                return None
            self.open_value(i)
            if p[o] == 0xFB:
                put(img, b'null', 4)
                o += 1
            else:
                if p[o] < 0xFB:
                    size, o = p[o], o + 1
                elif o + 9 > end and (p[o] == 0xFE or o + 4 > end):
                    return None
                elif p[o] == 0xFC:
                    size, o = <Py_ssize_t>le(p + o + 1, 2), o + 3
                elif p[o] == 0xFD:
                    size, o = <Py_ssize_t>le(p + o + 1, 3), o + 4
                else:
                    size, o = <Py_ssize_t>le(p + o + 1, 8), o + 9
                if size < 0 or o + size > end:
                    return None
                if not put_text_value(img, p + o, size, self.kind[i]):
                    return None
                o += size
            self.span[2 * i + 1] = img.n
        if o != end or self.ncols == 0:
            return None
        putc(img, b'}')
        return self.finish(last, n)

    def values_event(self, tuple row, bint last, long long n):
        """The event of one row of text values (None for NULL; PostgreSQL's output text, as a
        snapshot chunk reads it), or None for the Python path."""
        cdef Buf* img = &self.img
        cdef Py_ssize_t size
        cdef const char* text
        cdef int i
        if len(row) != self.ncols or self.ncols == 0:
            return None
        for i in range(self.ncols):
            self.open_value(i)
            v = row[i]
            if v is None:
                put(img, b'null', 4)
            elif type(v) is not str:
                return None
            else:
                text = PyUnicode_AsUTF8AndSize(v, &size)
                if not put_text_value(img, <const unsigned char*>text, size, self.kind[i]):
                    return None
            self.span[2 * i + 1] = img.n
        putc(img, b'}')
        return self.finish(last, n)
