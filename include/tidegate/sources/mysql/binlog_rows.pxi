# The compiled twin of row_plans.py: the rows of one binlog ROWS event, through the table's
# NativePlan, straight to the bytes a run sends (encode_rows). Part of tidegate.native.rowcodec
# (native/rowcodec.pyx includes it, with the buffer and the value writers it uses);
# tests/unit/test_rowcodec_native.py compares its bytes with the Python path's.
#
# It covers the column kinds of KINDS (the plan builder in row_plans.py gives no native plan for a
# table with any other column); for anything unusual inside a row (a zero or impossible date, text
# that is not UTF-8, a non-finite double, an update that changes the primary key, bytes that do
# not add up) it gives up on the whole event (None) and the caller decodes that event with the
# Python path.

# column kinds of a native plan: (kind, a, b, c) per column, see NativePlan
cdef enum:
    K_INT = 1        # a: size in bytes (1, 2, 3, 4, 8), b: 1 if unsigned
    K_DOUBLE = 2
    K_YEAR = 3
    K_DECIMAL = 4    # a: precision, b: scale (<= 6)
    K_TEXT = 5       # a: length bytes (1-4), b: 1 UTF-8 text / 0 binary (base64), c: BINARY(n) pad
    K_DATE = 6
    K_DATETIME2 = 7  # a: fsp
    K_TIMESTAMP2 = 8  # a: fsp
    K_TIME2 = 9      # a: fsp

KINDS = {"int": K_INT, "double": K_DOUBLE, "year": K_YEAR, "decimal": K_DECIMAL, "text": K_TEXT,
         "date": K_DATE, "datetime2": K_DATETIME2, "timestamp2": K_TIMESTAMP2, "time2": K_TIME2}

cdef int DIGITS_BYTES[10]
DIGITS_BYTES[:] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]


# --------------------------------------------------------------------------- plans

cdef class NativePlan:
    """A table's row image layout for the compiled path: per column ``(kind, a, b, c)`` (see
    the kinds above) and its JSON name, and the primary key's column indexes in table order
    (the envelope's ``key``) and in name order (the message key, sorted as orjson's
    OPT_SORT_KEYS sorts)."""

    cdef int ncols
    cdef int* kind
    cdef int* a
    cdef int* b
    cdef int* c
    cdef list names  # b'"name":' per column, JSON-escaped
    cdef int npk
    cdef int* pk
    cdef int* pk_sorted
    cdef int* pk_slot  # column index -> its place in pk, or -1

    def __cinit__(self, list columns, list names, list pk, list pk_sorted):
        cdef int i
        self.ncols = len(columns)
        self.npk = len(pk)
        n = max(self.ncols, 1)
        self.kind = <int*>PyMem_Malloc(n * sizeof(int))
        self.a = <int*>PyMem_Malloc(n * sizeof(int))
        self.b = <int*>PyMem_Malloc(n * sizeof(int))
        self.c = <int*>PyMem_Malloc(n * sizeof(int))
        self.pk_slot = <int*>PyMem_Malloc(n * sizeof(int))
        self.pk = <int*>PyMem_Malloc(max(self.npk, 1) * sizeof(int))
        self.pk_sorted = <int*>PyMem_Malloc(max(self.npk, 1) * sizeof(int))
        if not (self.kind and self.a and self.b and self.c and self.pk_slot and self.pk and self.pk_sorted):
            raise MemoryError()
        for i in range(self.ncols):
            self.kind[i], self.a[i], self.b[i], self.c[i] = columns[i]
            self.pk_slot[i] = -1
        for i in range(self.npk):
            self.pk[i] = pk[i]
            self.pk_sorted[i] = pk_sorted[i]
            self.pk_slot[pk[i]] = i
        self.names = list(names)  # b'"name":', JSON-escaped by the caller

    def __dealloc__(self):
        PyMem_Free(self.kind)
        PyMem_Free(self.a)
        PyMem_Free(self.b)
        PyMem_Free(self.c)
        PyMem_Free(self.pk_slot)
        PyMem_Free(self.pk)
        PyMem_Free(self.pk_sorted)


cdef int text_ok(const unsigned char* s, Py_ssize_t n) except -1:
    """1 if ``s`` is UTF-8 (as Python's strict codec takes it), else 0."""
    cdef Py_ssize_t i = 0
    cdef uint64_t w
    while i + 8 <= n:  # ASCII, eight bytes at a time (most text)
        memcpy(&w, s + i, 8)
        if w & 0x8080808080808080ULL:
            break
        i += 8
    for i in range(i, n):
        if s[i] >= 0x80:
            try:  # validates (the rare non-ASCII text): the same check as bytes.decode("utf-8")
                PyUnicode_DecodeUTF8(<const char*>s, n, "strict")
            except UnicodeDecodeError:
                return 0
            return 1
    return 1


cdef Py_ssize_t decimal_value(Buf* out, const unsigned char* p, int precision, int scale) except -2:
    """A packed DECIMAL as str(Decimal(...)) writes it (scale <= 6: never exponent form);
    returns its size in bytes."""
    cdef int intg = precision - scale
    cdef int ifull = intg // 9, ileft = intg % 9, ffull = scale // 9, fleft = scale % 9
    cdef int sizes[16]
    cdef int digits[16]
    cdef int ng = 0, k, nint, size = 0
    cdef uint64_t g, mask
    cdef bint neg, started = False
    if ileft:
        sizes[ng], digits[ng] = DIGITS_BYTES[ileft], ileft
        ng += 1
    for k in range(ifull):
        sizes[ng], digits[ng] = 4, 9
        ng += 1
    nint = ng
    for k in range(ffull):
        sizes[ng], digits[ng] = 4, 9
        ng += 1
    if fleft:
        sizes[ng], digits[ng] = DIGITS_BYTES[fleft], fleft
        ng += 1
    neg = not (p[0] & 0x80)
    putc(out, b'"')
    if neg:
        putc(out, b'-')
    for k in range(ng):
        g = be(p + size, sizes[k])
        if k == 0:
            g ^= <uint64_t>1 << (sizes[0] * 8 - 1)
        if neg:
            mask = (<uint64_t>1 << (sizes[k] * 8)) - 1
            g ^= mask
        size += sizes[k]
        if k < nint:
            if started:
                put_padded(out, g, 9)
            elif g:
                put_u64(out, g)
                started = True
        else:
            if k == nint:
                if not started:
                    putc(out, b'0')
                    started = True
                putc(out, b'.')
            put_padded(out, g, digits[k])
    if not started:
        putc(out, b'0')
    putc(out, b'"')
    return size


cdef Py_ssize_t decode_image(NativePlan plan, const unsigned char* buf, Py_ssize_t o, Py_ssize_t end,
                             Buf* out, Py_ssize_t* span) except -2:
    """One full row image at ``o`` as a JSON object into ``out``; ``span`` gets (start, end)
    in ``out`` of each primary key column's value. Returns the offset after the image, or -1
    to give the event to the Python path."""
    cdef int ncols = plan.ncols, i, kind, nb = (plan.ncols + 7) // 8
    cdef const unsigned char* nulls = buf + o
    cdef const unsigned char* p
    cdef Py_ssize_t ln, start
    cdef uint64_t u
    cdef int64_t x, intpart, packed
    cdef double d
    cdef int y, m, dd, hh, mm, ss, us, fsp, w, slot
    cdef char* text
    cdef bytes name
    if o + nb > end:
        return -1
    o += nb
    putc(out, b'{')
    for i in range(ncols):
        if i:
            putc(out, b',')
        name = <bytes>plan.names[i]
        put_bytes(out, name)
        start = out.n
        slot = plan.pk_slot[i]
        if nulls[i >> 3] & (1 << (i & 7)):
            put(out, b'null', 4)
            if slot >= 0:
                span[2 * slot], span[2 * slot + 1] = start, out.n
            continue
        kind = plan.kind[i]
        p = buf + o
        if kind == K_INT:
            ln = plan.a[i]
            if o + ln > end:
                return -1
            u = le(p, <int>ln)
            if plan.b[i]:
                put_u64(out, u)
            else:
                if ln < 8 and u >> (ln * 8 - 1):
                    x = <int64_t>u - (<int64_t>1 << (ln * 8))
                else:
                    x = <int64_t>u
                put_i64(out, x)
            o += ln
        elif kind == K_TEXT:
            ln = plan.a[i]
            if o + ln > end:
                return -1
            u = le(p, <int>ln)
            o += ln
            if o + <Py_ssize_t>u > end:
                return -1
            if plan.b[i]:
                if not text_ok(buf + o, <Py_ssize_t>u):
                    return -1
                put_json_text(out, buf + o, <Py_ssize_t>u)
            else:
                put_base64(out, buf + o, <Py_ssize_t>u, plan.c[i])
            o += <Py_ssize_t>u
        elif kind == K_DECIMAL:
            # the size is fixed by (precision, scale); check it before reading
            ln = 0
            y = plan.a[i] - plan.b[i]
            ln = (y // 9) * 4 + DIGITS_BYTES[y % 9] + (plan.b[i] // 9) * 4 + DIGITS_BYTES[plan.b[i] % 9]
            if o + ln > end:
                return -1
            o += decimal_value(out, p, plan.a[i], plan.b[i])
        elif kind == K_DATETIME2 or kind == K_TIMESTAMP2:
            # a big-endian whole part (5 bytes; TIMESTAMP2's, seconds since 1970, 4), then the
            # fraction's (fsp + 1) // 2 bytes
            fsp = plan.a[i]
            w = 5 if kind == K_DATETIME2 else 4
            ln = w + (fsp + 1) // 2
            if o + ln > end:
                return -1
            u = be(p, w)
            if kind == K_TIMESTAMP2:
                if u == 0:
                    put(out, b'null', 4)
                else:
                    civil(out, <int64_t>u)
                    put_fraction(out, p + w, fsp)
                    put(out, b'+00:00"', 7)
            else:
                y = <int>(((u >> 22) & 0x1FFFF) // 13)
                m = <int>(((u >> 22) & 0x1FFFF) % 13)
                dd = <int>((u >> 17) & 0x1F)
                hh, mm, ss = <int>((u >> 12) & 0x1F), <int>((u >> 6) & 0x3F), <int>(u & 0x3F)
                if not (valid_date(y, m, dd) and hh < 24 and mm < 60 and ss < 60):
                    return -1  # zero or impossible: null in the Python path
                putc(out, b'"')
                put_date(out, y, m, dd)
                putc(out, b'T')
                put_hms(out, hh, mm, ss)
                put_fraction(out, p + w, fsp)
                putc(out, b'"')
            o += ln
        elif kind == K_DATE:
            if o + 3 > end:
                return -1
            u = le(p, 3)
            y, m, dd = <int>(u >> 9), <int>((u >> 5) & 0xF), <int>(u & 0x1F)
            if not valid_date(y, m, dd):
                return -1
            putc(out, b'"')
            put_date(out, y, m, dd)
            putc(out, b'"')
            o += 3
        elif kind == K_DOUBLE:
            if o + 8 > end:
                return -1
            memcpy(&d, p, 8)
            if not isfinite(d):
                return -1
            text = PyOS_double_to_string(d, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
            try:
                put(out, text, strlen(text))
            finally:
                PyMem_Free(text)
            o += 8
        elif kind == K_YEAR:
            if o + 1 > end:
                return -1
            if p[0]:
                put_u64(out, 1900 + p[0])
            else:
                put(out, b'null', 4)
            o += 1
        elif kind == K_TIME2:
            fsp = plan.a[i]
            ln = 3 + (fsp + 1) // 2
            if o + ln > end:
                return -1
            intpart = <int64_t>be(p, 3) - 0x800000
            if fsp <= 0:
                packed = intpart * (1 << 24)
            elif fsp <= 2:
                x = p[3]
                if intpart < 0 and x:
                    intpart += 1
                    x -= 0x100
                packed = intpart * (1 << 24) + x * 10000
            elif fsp <= 4:
                x = p[3] << 8 | p[4]
                if intpart < 0 and x:
                    intpart += 1
                    x -= 0x10000
                packed = intpart * (1 << 24) + x * 100
            else:
                packed = <int64_t>be(p, 6) - 0x800000000000
            putc(out, b'"')
            if packed < 0:
                putc(out, b'-')
                packed = -packed
            u = <uint64_t>packed >> 24
            put_hms(out, <int>((u >> 12) & 0x3FF), <int>((u >> 6) & 0x3F), <int>(u & 0x3F))
            us = <int>(packed & 0xFFFFFF)
            if us:
                putc(out, b'.')
                put_padded(out, us, 6)
            putc(out, b'"')
            o += ln
        else:
            return -1
        if slot >= 0:
            span[2 * slot], span[2 * slot + 1] = start, out.n
    putc(out, b'}')
    return o


cdef int civil(Buf* out, int64_t secs) except -1:
    """``"YYYY-MM-DDTHH:MM:SS`` (UTC) of seconds since the epoch (days to civil date:
    H. Hinnant's algorithm)."""
    cdef int64_t z = secs // 86400, rem = secs % 86400
    z += 719468
    cdef int64_t era = z // 146097
    cdef int64_t doe = z - era * 146097
    cdef int64_t yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    cdef int64_t yy = yoe + era * 400
    cdef int64_t doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    cdef int64_t mp = (5 * doy + 2) // 153
    cdef int64_t d = doy - (153 * mp + 2) // 5 + 1
    cdef int64_t mo = mp + 3 if mp < 10 else mp - 9
    if mo <= 2:
        yy += 1
    putc(out, b'"')
    put_date(out, <int>yy, <int>mo, <int>d)
    putc(out, b'T')
    return put_hms(out, <int>(rem // 3600), <int>(rem % 3600 // 60), <int>(rem % 60))


cdef int put_key(Buf* out, NativePlan plan, const char* image, Py_ssize_t* span, bint by_name) except -1:
    cdef int k, col, slot
    cdef bytes name
    if plan.npk == 0:
        return put(out, b'null', 4)
    putc(out, b'{')
    for k in range(plan.npk):
        col = plan.pk_sorted[k] if by_name else plan.pk[k]
        if k:
            putc(out, b',')
        name = <bytes>plan.names[col]
        put_bytes(out, name)
        slot = plan.pk_slot[col]
        put(out, image + span[2 * slot], span[2 * slot + 1] - span[2 * slot])
    return putc(out, b'}')


cdef inline bint same_key(NativePlan plan, const char* a, Py_ssize_t* sa, const char* b, Py_ssize_t* sb):
    cdef int k
    cdef Py_ssize_t n
    for k in range(plan.npk):
        n = sa[2 * k + 1] - sa[2 * k]
        if n != sb[2 * k + 1] - sb[2 * k]:
            return False
        if memcmp(a + sa[2 * k], b + sb[2 * k], n) != 0:
            return False
    return True


def encode_rows(NativePlan plan, bytes pkt, Py_ssize_t o, Py_ssize_t end, str op,
                bytes ikey_raw, bytes ikey_json, bytes source_head, bytes source_tail,
                bytes tail, long long total, long long n, type cls, dict common):
    """The events of one ROWS event's row images ``pkt[o:end]``, or None to let the Python
    path decode it (see the module docstring).

    Every event is ``cls`` (a ShippedEvent: the fields of ``common`` and ``value``,
    ``key_bytes``, ``idempotency_key``; the rest is read from the envelope if ever asked for).
    The envelope is assembled from the caller's fixed parts (JSON already, names escaped):
    ``ikey_raw``/``ikey_json`` the idempotency key up to the row number (UTF-8, and escaped
    with its opening quote), ``source_head`` from the ``"source"`` block up to ``"row":``,
    ``source_tail`` from ``,"gtid":`` up to ``"total_order":`` and ``tail`` the end after the
    data collection order; ``total``/``n`` the transaction's and the table's counts before
    this event."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(pkt)
    cdef Buf img1, img2, val, key, ik
    cdef Py_ssize_t* s1 = NULL
    cdef Py_ssize_t* s2 = NULL
    cdef bint upd = op == "u"
    cdef int row = 0
    cdef bytes opb = op.encode()
    cdef char opc = opb[0]  # c, u or d
    cdef list events = []
    cdef Buf* after_img
    cdef Py_ssize_t* after_span
    cdef int k, j
    if PyBytes_GET_SIZE(pkt) < end:
        return None
    img1.p = img2.p = val.p = key.p = ik.p = NULL
    img1.n = img2.n = val.n = key.n = ik.n = 0
    img1.cap = img2.cap = val.cap = key.cap = ik.cap = 0
    s1 = <Py_ssize_t*>PyMem_Malloc((2 * plan.npk + 2) * sizeof(Py_ssize_t))
    s2 = <Py_ssize_t*>PyMem_Malloc((2 * plan.npk + 2) * sizeof(Py_ssize_t))
    try:
        if s1 == NULL or s2 == NULL:
            raise MemoryError()
        while o < end:
            img1.n = img2.n = val.n = key.n = ik.n = 0
            o = decode_image(plan, buf, o, end, &img1, s1)
            if o < 0:
                return None
            after_img, after_span = &img1, s1
            if upd:
                o = decode_image(plan, buf, o, end, &img2, s2)
                if o < 0:
                    return None
                if not same_key(plan, img1.p, s1, img2.p, s2):
                    return None  # a primary key change: split in two events by the Python path
                after_img, after_span = &img2, s2
            total += 1
            n += 1
            put_bytes(&ik, ikey_raw)  # the idempotency key, then the envelope (envelope.pxi)
            put_u64(&ik, row)
            put_event_id(&val, &ik)
            put_bytes(&val, ikey_json)
            put_u64(&val, row)
            put_change(&val, opc, NULL if opc == b'c' else &img1,
                       &img2 if upd else (&img1 if opc == b'c' else NULL))
            put_key(&val, plan, after_img.p, after_span, False)
            put_bytes(&val, source_head)
            put_u64(&val, row)
            put_bytes(&val, source_tail)
            put_orders(&val, <uint64_t>total, <uint64_t>n)
            put_bytes(&val, tail)
            put_key(&key, plan, after_img.p, after_span, True)
            ev = cls.__new__(cls)
            d = dict(common)
            d["value"] = PyBytes_FromStringAndSize(val.p, val.n)
            d["key_bytes"] = PyBytes_FromStringAndSize(key.p, key.n)
            d["idempotency_key"] = PyUnicode_DecodeUTF8(ik.p, ik.n, "strict")
            PyObject_GenericSetAttr(ev, "__dict__", d)  # events.filled: d is this event's dict
            events.append(ev)
            row += 1
        if o != end:
            return None
        return events
    finally:
        PyMem_Free(img1.p)
        PyMem_Free(img2.p)
        PyMem_Free(val.p)
        PyMem_Free(key.p)
        PyMem_Free(ik.p)
        PyMem_Free(s1)
        PyMem_Free(s2)
