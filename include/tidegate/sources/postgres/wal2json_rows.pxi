# The compiled twin of the rows of wal2json.py (Wal2JsonRows). Part of tidegate.native.rowcodec
# (native/rowcodec.pyx includes it); tests/unit/test_wal2json_rows.py compares its bytes with
# the Python path's.

# --------------------------------------------------------------------------- wal2json rows (PostgreSQL)
#
# The PostgreSQL read path (sources/postgres/wal2json.py) hands each wal2json message of a row
# change (format-version 2: I/U/D) to :class:`Wal2JsonRows`, which scans the JSON in place and
# writes the event's bytes (envelope, message key, idempotency key) as the Python path
# (msgspec, the generated row plans, ``ChangeEvent.native``, orjson) writes them, without a
# Python object per column. Anything it does not cover (a column type without a compiled
# conversion: arrays, bytea; a number the contract writes differently; a ``\u`` escape; a new
# column set; a primary key change; an UPDATE without a whole old row) it leaves to the Python
# path: ``row`` returns None and the reader decodes that message as before.

cdef extern from "stdlib.h":
    double strtod(const char* s, char** end)

cdef enum:
    V_NONE = 0       # no compiled conversion: the message goes to the Python path
    V_PLAIN = 1      # as wal2json writes it: a string, an integer, true/false/null
    V_NUMERIC = 2    # a bare JSON number -> its text as a JSON string
    V_FLOAT = 3      # real / double precision: a bare number -> Python's float repr
    V_TIMESTAMP = 4  # PostgreSQL's text -> ISO-8601 (values.ts_iso_fast)

cdef struct Col:
    const unsigned char* name
    Py_ssize_t name_n
    const unsigned char* typ
    Py_ssize_t typ_n
    const unsigned char* val   # NULL: no "value" (wal2json then means null)
    Py_ssize_t val_n           # a string's span excludes its quotes
    char vkind                 # b's' string, b'n' number, b'l' null/true/false, b'o' object/array


cdef inline Py_ssize_t ws(const unsigned char* s, Py_ssize_t i, Py_ssize_t e):
    while i < e and (s[i] == 32 or s[i] == 10 or s[i] == 13 or s[i] == 9):
        i += 1
    return i


cdef Py_ssize_t scan_string(const unsigned char* s, Py_ssize_t i, Py_ssize_t e, int* esc):
    """``s[i]`` is a string's opening quote: the index after its closing quote, or -1.
    ``esc[0]``: 1 when it holds an escape."""
    cdef const unsigned char* q
    i += 1
    esc[0] = 0
    q = <const unsigned char*>memchr(s + i, 0x22, e - i)
    if q == NULL:
        return -1
    if memchr(s + i, 0x5C, q - (s + i)) == NULL:  # no escape (most strings): the first quote ends it
        return q - s + 1
    while i < e:
        if s[i] == 0x22:
            return i + 1
        if s[i] == 0x5C:
            esc[0] = 1
            i += 1
        i += 1
    return -1


cdef Py_ssize_t skip_value(const unsigned char* s, Py_ssize_t i, Py_ssize_t e):
    """The index after the JSON value at ``s[i]``, or -1."""
    cdef int depth = 0
    cdef int esc
    cdef unsigned char c
    if i >= e:
        return -1
    c = s[i]
    if c == 0x22:
        return scan_string(s, i, e, &esc)
    if c != b'{' and c != b'[':  # a number or a literal
        while i < e and s[i] not in (44, 125, 93, 32, 10, 13, 9):
            i += 1
        return i
    while i < e:
        c = s[i]
        if c == 0x22:
            i = scan_string(s, i, e, &esc)
            if i < 0:
                return -1
            continue
        if c == b'{' or c == b'[':
            depth += 1
        elif c == b'}' or c == b']':
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


cdef inline bint key_is(const unsigned char* s, Py_ssize_t a, Py_ssize_t b, const char* name, Py_ssize_t n):
    return b - a == n and memcmp(s + a, name, n) == 0


cdef Py_ssize_t scan_columns(const unsigned char* s, Py_ssize_t i, Py_ssize_t e, Col* cols, int cap,
                             int* count):
    """A wal2json column array at ``s[i]`` into ``cols`` (at most ``cap``): the index after it, or
    -1 (also for names or types with escapes, which the Python path takes)."""
    cdef int n = 0
    cdef int esc
    cdef Py_ssize_t ka, kb, va
    cdef Col* c
    if i >= e or s[i] != b'[':
        return -1
    i = ws(s, i + 1, e)
    if i < e and s[i] == b']':
        count[0] = 0
        return i + 1
    while True:
        if n >= cap or i >= e or s[i] != b'{':
            return -1
        c = &cols[n]
        c.name = c.typ = c.val = NULL
        c.name_n = c.typ_n = c.val_n = 0
        c.vkind = b'l'
        i = ws(s, i + 1, e)
        while i < e and s[i] != b'}':
            if s[i] != 0x22:
                return -1
            ka = i + 1
            i = scan_string(s, i, e, &esc)
            if i < 0:
                return -1
            kb = i - 1
            i = ws(s, i, e)
            if i >= e or s[i] != b':':
                return -1
            i = ws(s, i + 1, e)
            va = i
            if i < e and s[i] == 0x22:
                i = scan_string(s, i, e, &esc)
                if i < 0:
                    return -1
                if key_is(s, ka, kb, b"name", 4) or key_is(s, ka, kb, b"type", 4):
                    if esc:
                        return -1
                    if s[ka] == b'n':
                        c.name, c.name_n = s + va + 1, i - va - 2
                    else:
                        c.typ, c.typ_n = s + va + 1, i - va - 2
                elif key_is(s, ka, kb, b"value", 5):
                    c.val, c.val_n, c.vkind = s + va + 1, i - va - 2, b's'
            else:
                i = skip_value(s, i, e)
                if i < 0:
                    return -1
                if key_is(s, ka, kb, b"value", 5):
                    c.val, c.val_n = s + va, i - va
                    c.vkind = b'n' if (s[va] == b'-' or (s[va] >= b'0' and s[va] <= b'9')) else (
                        b'o' if s[va] == b'{' or s[va] == b'[' else b'l')
            i = ws(s, i, e)
            if i < e and s[i] == b',':
                i = ws(s, i + 1, e)
        if i >= e or c.name == NULL or c.typ == NULL:
            return -1
        n += 1
        i = ws(s, i + 1, e)
        if i < e and s[i] == b',':
            i = ws(s, i + 1, e)
            continue
        if i < e and s[i] == b']':
            count[0] = n
            return i + 1
        return -1


cdef int string_ok(const unsigned char* s, Py_ssize_t n) except -1:
    """1 if the JSON string body ``s`` can be copied as is: UTF-8, and escapes only as orjson
    writes them (``\\"``, ``\\\\``, ``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f``, ``\\u00XX`` below 0x20)."""
    cdef Py_ssize_t i = 0
    cdef unsigned char c
    while i < n:
        if s[i] == 0x5C:
            if i + 1 >= n:
                return 0
            c = s[i + 1]
            if c == b'u':
                if i + 5 >= n or s[i + 2] != b'0' or s[i + 3] != b'0' or (s[i + 4] != b'0' and s[i + 4] != b'1'):
                    return 0
                c = s[i + 5]
                if not ((c >= b'0' and c <= b'9') or (c >= b'a' and c <= b'f')):
                    return 0
                c = 16 * (s[i + 4] - 48) + (c - 48 if c <= b'9' else c - 87)
                if c == 0x08 or c == 0x09 or c == 0x0A or c == 0x0C or c == 0x0D:  # orjson writes these short
                    return 0
                i += 6
                continue
            if c not in (0x22, 0x5C, 0x6E, 0x72, 0x74, 0x62, 0x66):  # " \\ n r t b f
                return 0
            i += 2
            continue
        i += 1
    return text_ok(s, n)


cdef inline bint integer_token(const unsigned char* s, Py_ssize_t n):
    cdef Py_ssize_t i
    for i in range(n):
        if s[i] == b'.' or s[i] == b'e' or s[i] == b'E':
            return False
    return True


cdef int put_numeric(Buf* out, const unsigned char* s, Py_ssize_t n) except -1:
    """A bare number as ``str(Decimal(text))`` / ``str(int)`` writes it, in quotes; 0 when that
    text would differ from the token (an exponent; six or more zeros right after ``0.``, which
    Decimal writes in exponent form)."""
    cdef Py_ssize_t i = 1 if n and s[0] == b'-' else 0
    cdef Py_ssize_t z = 0
    if not integer_token(s, n):
        for z in range(n):
            if s[z] == b'e' or s[z] == b'E':
                return 0
        if i + 1 < n and s[i] == b'0' and s[i + 1] == b'.':
            z = 0
            i += 2
            while i < n and s[i] == b'0':
                z += 1
                i += 1
            if z >= 6:
                return 0
    putc(out, b'"')
    put(out, <const char*>s, n)
    putc(out, b'"')
    return 1


cdef int put_float(Buf* out, const unsigned char* s, Py_ssize_t n, bint json_token=True) except -1:
    """A bare number as ``float(value)`` is written (repr); 0 for a non-finite one.
    ``json_token``: ``s`` is a JSON number (wal2json), whose ``-0`` the Python path reads as the
    integer 0; else it is a column's text (a snapshot chunk), read by ``float``."""
    cdef char tmp[64]
    cdef char* text
    cdef double d
    if n >= 64:
        return 0
    memcpy(tmp, s, n)
    tmp[n] = 0
    d = strtod(tmp, NULL)
    if not isfinite(d):
        return 0
    if d == 0.0 and json_token and integer_token(s, n):
        d = 0.0  # "-0" is the integer 0 to the Python path: 0.0, not -0.0
    text = PyOS_double_to_string(d, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
    try:
        put(out, text, strlen(text))
    finally:
        PyMem_Free(text)
    return 1


cdef int put_timestamp(Buf* out, const unsigned char* s, Py_ssize_t n) except -1:
    """PostgreSQL's timestamp text as values.ts_iso_fast writes it, in quotes; 0 for a zone
    other than none or +00 (the regular expression's cases)."""
    cdef Py_ssize_t i, plus = 0, minus = 0
    for i in range(n):
        if s[i] >= 0x80:
            return 0  # the Python path counts characters, not bytes
    if n < 11 or s[10] != 32:
        putc(out, b'"')
        put(out, <const char*>s, n)
        putc(out, b'"')
        return 1
    for i in range(19, n):
        if s[i] == b'+':
            plus += 1
        elif s[i] == b'-':
            minus += 1
    putc(out, b'"')
    put(out, <const char*>s, 10)
    putc(out, b'T')
    put(out, <const char*>s + 11, n - 11)
    if plus == 0 and minus == 0:
        putc(out, b'"')
        return 1
    if minus == 0 and plus == 1 and n >= 22 and memcmp(s + n - 3, b"+00", 3) == 0 and (
            n - 19 == 3 or (s[n - 4] >= b'0' and s[n - 4] <= b'9')):
        put(out, b':00"', 4)
        return 1
    return 0


cdef int put_value(Buf* out, Col* c, int kind) except -1:
    """Column ``c``'s final JSON value; 0 when the Python path must convert it."""
    if c.val == NULL:
        return put(out, b'null', 4) + 1
    if c.vkind == b's':
        if not string_ok(c.val, c.val_n):
            return 0
        if kind == V_TIMESTAMP:
            return put_timestamp(out, c.val, c.val_n)
        putc(out, b'"')
        put(out, <const char*>c.val, c.val_n)
        return putc(out, b'"') + 1
    if c.vkind == b'n':
        if kind == V_PLAIN:
            if not integer_token(c.val, c.val_n):
                return 0  # a Decimal where the contract has no conversion: the Python path decides
            return put(out, <const char*>c.val, c.val_n) + 1
        if kind == V_NUMERIC:
            return put_numeric(out, c.val, c.val_n)
        if kind == V_FLOAT:
            return put_float(out, c.val, c.val_n)
        return 0
    if c.vkind == b'l':
        if c.val[0] != b'n' and kind == V_NUMERIC:
            return 0  # str(True): the Python path writes it
        return put(out, <const char*>c.val, c.val_n) + 1
    return 0


def value_kind(str typ):
    """The compiled conversion of a wal2json column type (values.value_code's cases)."""
    if typ.endswith("[]") or typ == "bytea":
        return V_NONE
    if typ.startswith(("numeric", "decimal")):
        return V_NUMERIC
    if typ in ("real", "double precision"):
        return V_FLOAT
    if typ.startswith("timestamp"):
        return V_TIMESTAMP
    return V_PLAIN


cdef class RowShape:
    """One column set (names and types, in order) of a table's rows: its signature as the
    Python path's row plans name it, the raw JSON of each name and type to recognise it, each
    column's conversion and its name as an envelope key."""

    cdef readonly tuple signature
    cdef list names_raw, types_raw, keys
    cdef int n
    cdef int* kind
    cdef bint compiled

    def __cinit__(self):
        self.kind = NULL

    def __dealloc__(self):
        PyMem_Free(self.kind)


cdef RowShape make_shape(Col* cols, int n):
    cdef RowShape sh = RowShape.__new__(RowShape)
    cdef int i
    sh.n = n
    sh.names_raw, sh.types_raw, sh.keys = [], [], []
    sh.kind = <int*>PyMem_Malloc((n + 1) * sizeof(int))
    if sh.kind == NULL:
        raise MemoryError()
    sig = []
    sh.compiled = True
    for i in range(n):
        raw_name = PyBytes_FromStringAndSize(<const char*>cols[i].name, cols[i].name_n)
        raw_type = PyBytes_FromStringAndSize(<const char*>cols[i].typ, cols[i].typ_n)
        name, typ = raw_name.decode(), raw_type.decode()
        sh.names_raw.append(raw_name)
        sh.types_raw.append(raw_type)
        sh.keys.append(b'"' + raw_name + b'":')
        sh.kind[i] = value_kind(typ)
        if sh.kind[i] == V_NONE:
            sh.compiled = False
        sig.append((name, typ))
    sh.signature = tuple(sig)
    return sh


cdef bint same_shape(RowShape sh, Col* cols, int n):
    cdef int i
    cdef bytes a
    if sh is None or sh.n != n:
        return False
    for i in range(n):
        a = <bytes>sh.names_raw[i]
        if PyBytes_GET_SIZE(a) != cols[i].name_n or memcmp(PyBytes_AS_STRING(a), cols[i].name, cols[i].name_n):
            return False
        a = <bytes>sh.types_raw[i]
        if PyBytes_GET_SIZE(a) != cols[i].typ_n or memcmp(PyBytes_AS_STRING(a), cols[i].typ, cols[i].typ_n):
            return False
    return True


cdef class TableRows:
    """What the compiled path keeps of one table: its names as the event fields and the
    envelope hold them, whether the read takes it, the last column sets met, and its primary
    key (as the message's ``pk`` names it) resolved against the last new tuple's set."""

    cdef str schema, table
    cdef tuple tkey
    cdef bint wanted
    cdef bytes source_names  # ,"db":S,"schema":S,"table":T,"tx_id":"   (JSON)
    cdef bytes ikey_raw, ikey_json  # tenant|pipeline|schema.table|   (UTF-8; JSON-escaped)
    cdef RowShape after_shape, before_shape
    cdef bytes pk_raw
    cdef int npk
    cdef int* pk_col      # per key column (message order): its index in the image, -1 absent
    cdef int* pk_sorted   # key columns in name order (the message key)
    cdef list pk_keys     # b'"name":' per key column
    cdef RowShape pk_for  # the shape pk_col was resolved against

    def __cinit__(self):
        self.pk_col = self.pk_sorted = NULL

    def __dealloc__(self):
        PyMem_Free(self.pk_col)
        PyMem_Free(self.pk_sorted)


cdef int put_image(Buf* out, Py_ssize_t* span, RowShape sh, Col* cols) except -1:
    """A row image as the envelope writes it, with each value's span in ``out`` (for the key);
    0 when a value needs the Python path."""
    cdef int i
    putc(out, b'{')
    for i in range(sh.n):
        if i:
            putc(out, b',')
        put_bytes(out, <bytes>sh.keys[i])
        span[2 * i] = out.n
        if not put_value(out, &cols[i], sh.kind[i]):
            return 0
        span[2 * i + 1] = out.n
    putc(out, b'}')
    return 1


cdef int put_pg_key(Buf* out, TableRows t, const char* image, Py_ssize_t* span, bint by_name) except -1:
    """The primary key of an image: in the message's ``pk`` order (envelope) or by name (message
    key); a key column the image lacks is null."""
    cdef int k, j, col
    putc(out, b'{')
    for k in range(t.npk):
        j = t.pk_sorted[k] if by_name else k
        if k:
            putc(out, b',')
        put_bytes(out, <bytes>t.pk_keys[j])
        col = t.pk_col[j]
        if col < 0 or span[2 * col] < 0:  # not a column of the table, or not in this image
            put(out, b'null', 4)
        else:
            put(out, image + span[2 * col], span[2 * col + 1] - span[2 * col])
    return putc(out, b'}')


cdef int place_pk(TableRows t, list names, list cols) except -1:
    """``t``'s primary key ``names`` (in the message's order), placed among an image's ``cols``."""
    import orjson

    cdef int k
    PyMem_Free(t.pk_col)
    PyMem_Free(t.pk_sorted)
    t.pk_col = <int*>PyMem_Malloc((len(names) + 1) * sizeof(int))
    t.pk_sorted = <int*>PyMem_Malloc((len(names) + 1) * sizeof(int))
    if t.pk_col == NULL or t.pk_sorted == NULL:
        raise MemoryError()
    for k, name in enumerate(names):
        t.pk_col[k] = cols.index(name) if name in cols else -1
    for k, j in enumerate(sorted(range(len(names)), key=lambda i: names[i].encode())):
        t.pk_sorted[k] = j
    t.pk_keys = [orjson.dumps(n) + b":" for n in names]
    t.npk = len(names)
    return 0


cdef class Wal2JsonRows:
    """The compiled path of one PostgreSQL read (see the section comment above): ``row(msg,
    seen)`` gives the event of a wal2json row-change message, or None for the Python path.

    It also keeps the transaction's counts for both paths (``begin`` at each transaction,
    ``next`` per event of the Python path, ``extra`` for the second event of a key change), as
    ``reader.TxCounts`` does where the module is not built."""

    cdef type cls
    cdef str tenant, pipeline
    cdef object tables
    cdef dict by_name
    cdef TableRows last
    cdef bytes last_name
    cdef Col* cols
    cdef Col* ident
    cdef int cap
    cdef Py_ssize_t* span_a
    cdef Py_ssize_t* span_b
    cdef Buf bufs[5]  # before, after, envelope, message key, idempotency key: reused row to row
    cdef str tx_id
    cdef bytes tx_raw, tx_mid, tx_tail
    cdef object ts_us
    cdef public long long total
    cdef dict per_table
    cdef str last_lsn  # the LSN of the last event and how many events it had (TxCounts, postgres/wal2json.py)
    cdef long long at_lsn

    def __cinit__(self):
        cdef int k
        self.cols = self.ident = NULL
        self.span_a = self.span_b = NULL
        for k in range(5):
            self.bufs[k].p = NULL
            self.bufs[k].n = self.bufs[k].cap = 0

    def __init__(self, str tenant, str pipeline, tables, type cls):
        self.tenant, self.pipeline, self.tables, self.cls = tenant, pipeline, tables, cls
        self.by_name = {}
        self.last = None
        self.last_name = None
        self.cap = 0
        self.grow(64)
        self.begin("", "", None, 0, None)

    def __dealloc__(self):
        cdef int k
        PyMem_Free(self.cols)
        PyMem_Free(self.ident)
        PyMem_Free(self.span_a)
        PyMem_Free(self.span_b)
        for k in range(5):
            PyMem_Free(self.bufs[k].p)

    cdef grow(self, int cap):
        PyMem_Free(self.cols)
        PyMem_Free(self.ident)
        PyMem_Free(self.span_a)
        PyMem_Free(self.span_b)
        self.cols = <Col*>PyMem_Malloc(cap * sizeof(Col))
        self.ident = <Col*>PyMem_Malloc(cap * sizeof(Col))
        self.span_a = <Py_ssize_t*>PyMem_Malloc(2 * cap * sizeof(Py_ssize_t))
        self.span_b = <Py_ssize_t*>PyMem_Malloc(2 * cap * sizeof(Py_ssize_t))
        if self.cols == NULL or self.ident == NULL or self.span_a == NULL or self.span_b == NULL:
            raise MemoryError()
        self.cap = cap

    def begin(self, str tx_id, str commit, xid, long long ts_ms, ts_us):
        """A new transaction: its id, commit LSN, xid and commit time (ms, µs)."""
        self.total = 0
        self.per_table = {}
        self.last_lsn, self.at_lsn = "", 0
        self.tx_id = tx_id
        self.ts_us = ts_us
        self.tx_raw = tx_id.encode()
        xid_json = b"null" if xid is None else str(int(xid)).encode()
        ts = str(ts_ms).encode()
        self.tx_mid = (b'","commit_lsn":"' + commit.encode() + b'","xid":' + xid_json + b'},"ts_ms":' + ts
                       + b',"snapshot":"false"},"transaction":{"id":"' + self.tx_raw + b'","total_order":')
        self.tx_tail = b'},"ts_ms":' + ts + b'}'

    def next(self, tkey, str lsn):
        """(the event's index among the transaction's events at ``lsn``, its total order, its
        order among its table's events) for the next event."""
        cdef long long n, k
        self.count(tkey, lsn, &n, &k)
        return n, self.total, k

    cdef int count(self, tkey, str lsn, long long* n, long long* k) except -1:
        if lsn == self.last_lsn:
            n[0] = self.at_lsn
            self.at_lsn += 1
        else:
            n[0], self.last_lsn, self.at_lsn = 0, lsn, 1
        self.total += 1
        k[0] = self.per_table.get(tkey, 0) + 1
        self.per_table[tkey] = k[0]
        return 0

    def extra(self, tkey):
        """One more event of ``tkey`` (a key change's second event)."""
        self.total += 1
        self.per_table[tkey] += 1

    cdef TableRows table_of(self, const unsigned char* s, Py_ssize_t sa, Py_ssize_t sn,
                            Py_ssize_t ta, Py_ssize_t tn):
        cdef TableRows t
        cdef const char* last
        if self.last is not None and PyBytes_GET_SIZE(self.last_name) == sn + 1 + tn:
            last = PyBytes_AS_STRING(self.last_name)  # the same table as the last row's (most rows)
            if memcmp(last, s + sa, sn) == 0 and last[sn] == 0 and memcmp(last + sn + 1, s + ta, tn) == 0:
                return self.last
        name = PyBytes_FromStringAndSize(<const char*>s + sa, sn) + b"\0" + \
            PyBytes_FromStringAndSize(<const char*>s + ta, tn)
        t = self.by_name.get(name)
        if t is None:
            t = self.named(TableRows.__new__(TableRows),
                           PyBytes_FromStringAndSize(<const char*>s + sa, sn).decode(),
                           PyBytes_FromStringAndSize(<const char*>s + ta, tn).decode())
            self.by_name[name] = t
        self.last, self.last_name = t, name
        return t

    cdef TableRows named(self, TableRows t, str schema, str table):
        """``t`` with its table's names as the envelope and the idempotency key write them."""
        import orjson

        t.schema, t.table = schema, table
        t.tkey = (schema, table)
        t.wanted = not self.tables or t.tkey in self.tables
        sj, tj = orjson.dumps(schema), orjson.dumps(table)
        t.source_names = (b',"source":{"connector":"postgresql","pipeline":' + orjson.dumps(self.pipeline)
                          + b',"db":' + sj + b',"schema":' + sj + b',"table":' + tj + b',"tx_id":"')
        prefix = f"{self.tenant}|{self.pipeline}|{schema}.{table}|"
        t.ikey_raw = prefix.encode()
        ikey_json = orjson.dumps(prefix)
        t.ikey_json = ikey_json[:len(ikey_json) - 1]  # without the closing quote
        t.after_shape = t.before_shape = t.pk_for = None
        t.pk_raw = None
        t.npk = 0
        return t

    cdef bint resolve_pk(self, TableRows t, const unsigned char* s, Py_ssize_t pa, Py_ssize_t pn,
                         RowShape image) except -1:
        """``t``'s key columns from the message's ``pk`` array, placed in ``image``; False when
        there is no key (the Python path writes null)."""
        cdef int k
        if t.pk_raw is not None and t.pk_for is image and PyBytes_GET_SIZE(t.pk_raw) == pn \
                and memcmp(PyBytes_AS_STRING(t.pk_raw), s + pa, pn) == 0:
            return t.npk > 0
        import json

        raw = PyBytes_FromStringAndSize(<const char*>s + pa, pn)
        place_pk(t, [c["name"] for c in json.loads(raw)], [n for n, _ in image.signature])
        t.pk_raw, t.pk_for = raw, image
        return t.npk > 0

    def row(self, object msg, dict seen):
        """The event of the wal2json message ``msg`` when it is a row change the compiled path
        covers (``seen``: the reader's last column set per table), else None; the transaction's
        counts move only when an event is returned."""
        if type(msg) is not bytes:
            return None  # text (a peek's): the Python path
        cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(msg)
        cdef Py_ssize_t e = PyBytes_GET_SIZE(msg)
        cdef Py_ssize_t i, ka, kb, va
        cdef Py_ssize_t la = 0, ln = -1, sa = 0, sn = -1, ta = 0, tn = -1, pa = 0, pn = -1
        cdef int ncols = -1, nident = -1, esc, k, col
        cdef char op = 0
        cdef TableRows t
        cdef RowShape shape
        i = ws(s, 0, e)
        if i >= e or s[i] != b'{':
            return None
        i = ws(s, i + 1, e)
        while i < e and s[i] != b'}':
            if s[i] != 0x22:
                return None
            ka = i + 1
            i = scan_string(s, i, e, &esc)
            if i < 0:
                return None
            kb = i - 1
            i = ws(s, i, e)
            if i >= e or s[i] != b':':
                return None
            i = ws(s, i + 1, e)
            va = i
            if key_is(s, ka, kb, b"columns", 7) or key_is(s, ka, kb, b"identity", 8):
                if s[ka] == b'c':
                    i = scan_columns(s, i, e, self.cols, self.cap, &ncols)
                else:
                    i = scan_columns(s, i, e, self.ident, self.cap, &nident)
                if i < 0:
                    if self.cap < 4096 and e // 16 > self.cap:  # perhaps only too many columns
                        self.grow(min(4096, <int>(e // 16)))
                        return self.row(msg, seen)
                    return None
            else:
                i = skip_value(s, i, e)
                if i < 0:
                    return None
                if key_is(s, ka, kb, b"action", 6):
                    if i - va != 3 or s[va + 1] not in (73, 85, 68):  # I, U, D
                        return None  # not a row change
                    op = s[va + 1]
                elif key_is(s, ka, kb, b"pk", 2):
                    pa, pn = va, i - va
                elif s[va] == 0x22 and (key_is(s, ka, kb, b"lsn", 3) or key_is(s, ka, kb, b"schema", 6)
                                        or key_is(s, ka, kb, b"table", 5)):
                    scan_string(s, va, e, &esc)
                    if esc:
                        return None
                    if s[ka] == b'l':
                        la, ln = va + 1, i - va - 2
                    elif s[ka] == b's':
                        sa, sn = va + 1, i - va - 2
                    else:
                        ta, tn = va + 1, i - va - 2
            i = ws(s, i, e)
            if i < e and s[i] == b',':
                i = ws(s, i + 1, e)
        if op == 0 or ln < 0 or sn < 0 or tn < 0 or pn < 0:
            return None
        t = self.table_of(s, sa, sn, ta, tn)
        if not t.wanted:
            return None
        # the column sets: a new tuple's must be the one the reader saw last (else the Python
        # path tells the change); an UPDATE's old tuple the whole row, as its new one
        if op == b'I' or op == b'U':
            if ncols < 0 or (op == b'I' and nident >= 0) or (op == b'U' and nident != ncols):
                return None
            if not same_shape(t.after_shape, self.cols, ncols):
                t.after_shape = make_shape(self.cols, ncols)
            shape = t.after_shape
            if op == b'U' and not same_shape(shape, self.ident, nident):
                return None
            last = seen.get(t.tkey)
            if last is not shape.signature and last != shape.signature:
                return None
        else:
            if nident < 0 or ncols >= 0:
                return None
            if same_shape(t.after_shape, self.ident, nident):  # a whole old row (REPLICA IDENTITY FULL)
                shape = t.after_shape
            else:
                if not same_shape(t.before_shape, self.ident, nident):
                    t.before_shape = make_shape(self.ident, nident)
                shape = t.before_shape
        if not shape.compiled or shape.n == 0 or not self.resolve_pk(t, s, pa, pn, shape):
            return None
        self.bufs[0].n = self.bufs[1].n = self.bufs[2].n = self.bufs[3].n = self.bufs[4].n = 0
        return self.event(t, s, op, shape, la, ln, &self.bufs[0], &self.bufs[1], &self.bufs[2],
                          &self.bufs[3], &self.bufs[4])

    cdef object event(self, TableRows t, const unsigned char* s, char op, RowShape shape,
                      Py_ssize_t la, Py_ssize_t ln, Buf* before, Buf* after, Buf* val, Buf* key, Buf* ik):
        """The event of a scanned row change (see ``row``), or None."""
        # the images first: nothing is counted before the row is known to be compiled
        if op != b'I' and not put_image(before, self.span_b, shape, self.ident):
            return None
        if op != b'D' and not put_image(after, self.span_a, shape, self.cols):
            return None
        return self.envelope(t, op, <const char*>s + la, ln, before if op != b'I' else NULL,
                             after if op != b'D' else NULL, val, key, ik)

    cdef object envelope(self, TableRows t, char op, const char* lsn_text, Py_ssize_t ln, Buf* before,
                         Buf* after, Buf* val, Buf* key, Buf* ik):
        """The event of a row change whose images are written (``before`` / ``after``: NULL for
        none; their values' spans in ``span_b`` / ``span_a``, -1 for a column an image lacks),
        at the LSN ``lsn_text``; None for a changed primary key (two events, by the Python path)."""
        cdef Py_ssize_t* span
        cdef const char* image
        cdef long long n, k, total
        cdef Py_ssize_t* sa = self.span_a
        cdef Py_ssize_t* sb = self.span_b
        cdef int col
        if before != NULL and after != NULL and self.key_changed(t, before, after):
            return None
        lsn = PyUnicode_DecodeUTF8(lsn_text, ln, "strict")
        self.count(t.tkey, lsn, &n, &k)
        total = self.total
        # the idempotency key, then the envelope (envelope.pxi)
        put_bytes(ik, t.ikey_raw)
        put_bytes(ik, self.tx_raw)
        putc(ik, b'|')
        put(ik, lsn_text, ln)
        putc(ik, b':')
        put_u64(ik, <uint64_t>n)
        put_event_id(val, ik)
        put_bytes(val, t.ikey_json)
        put(val, ik.p + PyBytes_GET_SIZE(t.ikey_raw), ik.n - PyBytes_GET_SIZE(t.ikey_raw))
        put_change(val, b'c' if op == b'I' else (b'u' if op == b'U' else b'd'), before, after)
        if after == NULL:
            image, span = before.p, sb
        else:
            image, span = after.p, sa
        put_pg_key(val, t, image, span, False)
        put_bytes(val, t.source_names)
        put_bytes(val, self.tx_raw)
        put(val, b'","position":{"lsn":"', 21)
        put(val, lsn_text, ln)
        put_bytes(val, self.tx_mid)
        put_orders(val, <uint64_t>total, <uint64_t>k)
        put_bytes(val, self.tx_tail)
        put_pg_key(key, t, image, span, True)
        ev = self.cls.__new__(self.cls)
        d = ev.__dict__
        d["value"] = PyBytes_FromStringAndSize(val.p, val.n)
        d["key_bytes"] = PyBytes_FromStringAndSize(key.p, key.n)
        d["idempotency_key"] = PyUnicode_DecodeUTF8(ik.p, ik.n, "strict")
        d["op"] = "c" if op == b'I' else ("u" if op == b'U' else "d")
        d["db"] = t.schema
        d["schema"] = t.schema
        d["table"] = t.table
        d["tx_id"] = self.tx_id
        d["tx_end"] = False
        d["end_position"] = None
        d["commit_us"] = self.ts_us
        return ev

    cdef bint key_changed(self, TableRows t, Buf* before, Buf* after):
        """Whether an UPDATE's primary key changed, as ``reader.old_key`` tells it: an old image
        without every key column says no; values are compared as their JSON (equal values
        written differently, 0.0 and -0.0, say yes: the Python path then decides)."""
        cdef int k, col
        cdef Py_ssize_t* sa = self.span_a
        cdef Py_ssize_t* sb = self.span_b
        for k in range(t.npk):
            col = t.pk_col[k]
            if col < 0 or sb[2 * col] < 0:
                return False
        for k in range(t.npk):
            col = t.pk_col[k]
            if (sa[2 * col + 1] - sa[2 * col] != sb[2 * col + 1] - sb[2 * col]
                    or memcmp(after.p + sa[2 * col], before.p + sb[2 * col], sa[2 * col + 1] - sa[2 * col]) != 0):
                return True
        return False
