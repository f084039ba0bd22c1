# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled hot path of the log readers: the rows of one binlog ROWS event, or one wal2json
row message (:class:`Wal2JsonRows`, at the end of this file), straight to the bytes a run sends
(docs/architecture.md, "The compiled hot path").

For each row image of the event it writes the ``tidegate`` envelope (``ChangeEvent.value``),
the message key (``ChangeEvent.key_bytes``) and the idempotency key, byte for byte what the
pure-Python path (``row_plans`` decode, ``ChangeEvent.native``, orjson) produces, without a
Python object per column. It covers the column kinds of :data:`KINDS` (the plan builder in
``sources/mysql/row_plans.py`` gives no native plan for a table with any other column), and
for anything unusual inside a row (a zero or impossible date, text that is not UTF-8, a
non-finite double, an update that changes the primary key, bytes that do not add up) it gives
up on the whole event (returns None): the caller then decodes that event with the Python
path, which gives the values or the errors the contract names. ``tests/unit/test_rowcodec_native.py``
compares the bytes of both paths.

Every event built here is filled as ``events.filled`` fills one (its compiled twin): a new
instance whose dict is set at once, never written again but for a memoized derived value.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject_GenericSetAttr
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy, strlen


cdef extern from "Python.h":
    char* PyOS_double_to_string(double val, char format_code, int precision, int flags, int *ptype) except NULL
    int Py_DTSF_ADD_DOT_0
    void PyErr_Clear()

cdef extern from "math.h":
    bint isfinite(double x)

cdef extern from "sha1.h":
    void tg_sha1(const unsigned char *prefix, size_t plen, const unsigned char *msg, size_t mlen,
                 unsigned char digest[20])

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

cdef const char* HEX = b"0123456789abcdef"
cdef const char* B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
cdef int DIGITS_BYTES[10]
DIGITS_BYTES[:] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
cdef int DAYS[13]
DAYS[:] = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
cdef bytes NAMESPACE = bytes.fromhex("6f1c2a9e5b0d4c1e9d3a7a2e8b4c0d11")  # events.EVENT_ID_NAMESPACE


# --------------------------------------------------------------------------- output buffer

cdef struct Buf:
    char* p
    Py_ssize_t n
    Py_ssize_t cap


cdef int grow(Buf* b, Py_ssize_t need) except -1:
    cdef Py_ssize_t cap = b.cap * 2 if b.cap else 4096
    while cap < b.n + need:
        cap *= 2
    cdef char* p = <char*>PyMem_Realloc(b.p, cap)
    if p == NULL:
        raise MemoryError()
    b.p, b.cap = p, cap
    return 0


cdef inline int put(Buf* b, const char* s, Py_ssize_t n) except -1:
    if b.n + n > b.cap:
        grow(b, n)
    memcpy(b.p + b.n, s, n)
    b.n += n
    return 0


cdef inline int putc(Buf* b, char c) except -1:
    if b.n + 1 > b.cap:
        grow(b, 1)
    b.p[b.n] = c
    b.n += 1
    return 0


cdef inline int put_bytes(Buf* b, bytes s) except -1:
    return put(b, PyBytes_AS_STRING(s), PyBytes_GET_SIZE(s))


cdef inline void uuid5_text(const unsigned char* digest, char* uid) noexcept:
    """The 36 characters of the version-5 UUID whose SHA-1 is ``digest`` (as uuid.uuid5 prints it)."""
    cdef int k, j = 0
    for k in range(16):
        if k == 4 or k == 6 or k == 8 or k == 10:
            uid[j] = b'-'
            j += 1
        if k == 6:
            uid[j] = b'5'
        elif k == 8:
            uid[j] = HEX[((digest[k] >> 4) & 0x3) | 0x8]
        else:
            uid[j] = HEX[digest[k] >> 4]
        uid[j + 1] = HEX[digest[k] & 15]
        j += 2


cdef int put_u64(Buf* b, uint64_t v) except -1:
    cdef char tmp[24]
    cdef int i = 24
    if v == 0:
        return putc(b, b'0')
    while v:
        i -= 1
        tmp[i] = <char>(48 + v % 10)
        v //= 10
    return put(b, tmp + i, 24 - i)


cdef int put_i64(Buf* b, int64_t v) except -1:
    if v < 0:
        putc(b, b'-')
        return put_u64(b, <uint64_t>(-(v + 1)) + 1)
    return put_u64(b, <uint64_t>v)


cdef int put_padded(Buf* b, uint64_t v, int width) except -1:
    """``v`` with at least ``width`` digits (zero padded), as f"{v:0{width}d}"."""
    cdef char tmp[24]
    cdef int i = 24
    while v or 24 - i < width:
        i -= 1
        tmp[i] = <char>(48 + v % 10)
        v //= 10
    return put(b, tmp + i, 24 - i)


cdef unsigned char PLAIN[256]  # 1: a byte a JSON string holds as it is (not a control, '"' or '\\')
for _c in range(256):
    PLAIN[_c] = 1 if _c >= 0x20 and _c != 0x22 and _c != 0x5C else 0

cdef char ESCAPE[256]  # the letter after the backslash of a two-character escape; 0: written as \u00XX
for _c, _e in zip(b'"\\\n\r\t\b\f', b'"\\nrtbf'):
    ESCAPE[_c] = _e


cdef int put_json_text(Buf* b, const unsigned char* s, Py_ssize_t n) except -1:
    """A JSON string of UTF-8 text already checked: escapes as orjson and the stdlib
    (ensure_ascii=False) write them; every other byte as is, copied a run at a time."""
    cdef Py_ssize_t i = 0, j
    cdef unsigned char c
    putc(b, b'"')
    while i < n:
        j = i
        while j < n and PLAIN[s[j]]:
            j += 1
        if j > i:
            put(b, <const char*>s + i, j - i)
            i = j
            if i == n:
                break
        c = s[i]
        i += 1
        if ESCAPE[c]:
            putc(b, b'\\')
            putc(b, ESCAPE[c])
        else:
            put(b, b'\\u00', 4)
            putc(b, HEX[c >> 4])
            putc(b, HEX[c & 15])
    return putc(b, b'"')


cdef int put_base64(Buf* b, const unsigned char* s, Py_ssize_t n, Py_ssize_t pad) except -1:
    """``"<base64 of s padded with zero bytes to pad>"`` (binascii.b2a_base64, no newline)."""
    cdef Py_ssize_t total = n if n >= pad else pad
    cdef Py_ssize_t i = 0
    cdef uint32_t x
    cdef int k
    if b.n + (total + 2) // 3 * 4 + 2 > b.cap:
        grow(b, (total + 2) // 3 * 4 + 2)
    b.p[b.n] = b'"'
    b.n += 1
    while i < total:
        x = 0
        for k in range(3):
            x <<= 8
            if i + k < n:
                x |= s[i + k]
        b.p[b.n] = B64[(x >> 18) & 63]
        b.p[b.n + 1] = B64[(x >> 12) & 63]
        b.p[b.n + 2] = B64[(x >> 6) & 63] if i + 1 < total else b'='
        b.p[b.n + 3] = B64[x & 63] if i + 2 < total else b'='
        b.n += 4
        i += 3
    b.p[b.n] = b'"'
    b.n += 1
    return 0


cdef bint valid_date(int y, int m, int d):
    if y == 0 or m == 0 or d == 0 or m > 12:
        return False
    if d <= DAYS[m]:
        return True
    return m == 2 and d == 29 and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


cdef int put_three(Buf* b, int first, int width, char sep, int second, int third) except -1:
    """``first`` (``width`` digits), ``second`` and ``third`` (two digits each), ``sep`` between."""
    put_padded(b, first, width)
    putc(b, sep)
    put_padded(b, second, 2)
    putc(b, sep)
    return put_padded(b, third, 2)


cdef inline int put_date(Buf* b, int y, int m, int d) except -1:
    return put_three(b, y, 4, b'-', m, d)


cdef inline int put_hms(Buf* b, int h, int m, int s) except -1:
    return put_three(b, h, 2, b':', m, s)


cdef int frac_us(const unsigned char* p, int fsp):
    if fsp <= 0:
        return 0
    if fsp <= 2:
        return p[0] * 10000
    if fsp <= 4:
        return (p[0] << 8 | p[1]) * 100
    return p[0] << 16 | p[1] << 8 | p[2]


cdef int put_fraction(Buf* out, const unsigned char* p, int fsp) except -1:
    """A temporal's fraction of a second as ``.uuuuuu``; nothing where it is zero."""
    cdef int us = frac_us(p, fsp)
    if us:
        putc(out, b'.')
        put_padded(out, us, 6)
    return 0


cdef inline uint64_t be(const unsigned char* p, int n):
    cdef uint64_t x = 0
    cdef int i
    for i in range(n):
        x = x << 8 | p[i]
    return x


cdef inline uint64_t le(const unsigned char* p, int n):
    cdef uint64_t x = 0
    cdef int i
    for i in range(n - 1, -1, -1):
        x = x << 8 | p[i]
    return x


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
    cdef unsigned char digest[20]
    cdef char uid[36]
    cdef const char* ns = PyBytes_AS_STRING(NAMESPACE)
    cdef bytes opq
    cdef list events = []
    cdef Buf* after_img
    cdef Py_ssize_t* after_span
    cdef int k, j
    if PyBytes_GET_SIZE(pkt) < end:
        return None
    opq = b'","op":"' + op.encode() + b'","before":'
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
            # idempotency key and event id (uuid5 over namespace + key)
            put_bytes(&ik, ikey_raw)
            put_u64(&ik, row)
            tg_sha1(<const unsigned char*>ns, 16, <const unsigned char*>ik.p, ik.n, digest)
            uuid5_text(digest, uid)
            put(&val, b'{"id":"', 7)
            put(&val, uid, 36)
            put(&val, b'","idempotency_key":', 20)
            put_bytes(&val, ikey_json)
            put_u64(&val, row)
            put_bytes(&val, opq)
            if op == "c":
                put(&val, b'null,"after":', 13)
                put(&val, img1.p, img1.n)
            elif upd:
                put(&val, img1.p, img1.n)
                put(&val, b',"after":', 9)
                put(&val, img2.p, img2.n)
            else:
                put(&val, img1.p, img1.n)
                put(&val, b',"after":null', 13)
            put(&val, b',"key":', 7)
            put_key(&val, plan, after_img.p, after_span, False)
            put_bytes(&val, source_head)
            put_u64(&val, row)
            put_bytes(&val, source_tail)
            put_u64(&val, <uint64_t>total)
            put(&val, b',"data_collection_order":', 25)
            put_u64(&val, <uint64_t>n)
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


# --------------------------------------------------------------------------- shipped rows

def events_from_rows(list rows, type cls, object row_to_item):
    """The items of a batch of shipped rows (tidegate.shipped.item_to_row), as
    ``[row_to_item(row) for row in rows]`` gives them, with the events (nearly every row) built
    here: the run's process rebuilds every event it receives from a reader process, and this
    is that loop without a Python call per event."""
    cdef list out = []
    cdef tuple row
    for row in rows:
        if row[0] != "event":
            out.append(row_to_item(row))
            continue
        ev = cls.__new__(cls)
        d = ev.__dict__
        d["value"] = row[1]
        d["key_bytes"] = row[2]
        d["idempotency_key"] = row[3]
        d["op"] = row[4]
        d["db"] = row[5]
        d["schema"] = row[6]
        d["table"] = row[7]
        d["tx_id"] = row[8]
        d["tx_end"] = row[9]
        d["end_position"] = row[10]
        d["commit_us"] = row[12]
        if row[11]:
            d["headers"] = row[11]
        out.append(ev)
    return out


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
        cdef unsigned char digest[20]
        cdef char uid[36]
        if before != NULL and after != NULL and self.key_changed(t, before, after):
            return None
        lsn = PyUnicode_DecodeUTF8(lsn_text, ln, "strict")
        self.count(t.tkey, lsn, &n, &k)
        total = self.total
        # the idempotency key and the event id (uuid5 over the namespace and that key)
        put_bytes(ik, t.ikey_raw)
        put_bytes(ik, self.tx_raw)
        putc(ik, b'|')
        put(ik, lsn_text, ln)
        putc(ik, b':')
        put_u64(ik, <uint64_t>n)
        tg_sha1(<const unsigned char*>PyBytes_AS_STRING(NAMESPACE), 16, <const unsigned char*>ik.p, ik.n,
                digest)
        uuid5_text(digest, uid)
        put(val, b'{"id":"', 7)
        put(val, uid, 36)
        put(val, b'","idempotency_key":', 20)
        put_bytes(val, t.ikey_json)
        put(val, ik.p + PyBytes_GET_SIZE(t.ikey_raw), ik.n - PyBytes_GET_SIZE(t.ikey_raw))
        put(val, b'","op":"', 8)
        putc(val, b'c' if op == b'I' else (b'u' if op == b'U' else b'd'))
        put(val, b'","before":', 11)
        if before == NULL:
            put(val, b'null', 4)
        else:
            put(val, before.p, before.n)
        put(val, b',"after":', 9)
        if after == NULL:
            put(val, b'null', 4)
            image, span = before.p, sb
        else:
            put(val, after.p, after.n)
            image, span = after.p, sa
        put(val, b',"key":', 7)
        put_pg_key(val, t, image, span, False)
        put_bytes(val, t.source_names)
        put_bytes(val, self.tx_raw)
        put(val, b'","position":{"lsn":"', 21)
        put(val, lsn_text, ln)
        put_bytes(val, self.tx_mid)
        put_u64(val, <uint64_t>total)
        put(val, b',"data_collection_order":', 25)
        put_u64(val, <uint64_t>k)
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


# --------------------------------------------------------------------------- packed batches
#
# A reader process (reader_process.py) sends the run's process about every event of a read. As
# tuples through pickle that cost about 4 us per event across both processes, more than decoding
# the row. A packed batch is one bytes object holding each event's value, key and idempotency key
# with the lengths before them, plus two short lists: the distinct (op, db, schema, table, tx_id,
# commit_us) of its events, which change once per transaction or table, and everything else
# (end positions, headers, items that are not compiled-path events) that pickle carries as
# before. Both processes run the same build, so the layout is native-endian and unversioned.

cdef enum:
    P_EVENT = 0
    P_OTHER = 1
    F_TX_END = 1
    F_END_POSITION = 2
    F_HEADERS = 4
    F_NO_KEY = 8

cdef Py_ssize_t MAX_FIELD = 0xFFFFFFFF  # lengths travel as 32 bits


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL


cdef inline int put_u32(Buf* b, uint32_t v) except -1:
    return put(b, <const char*>&v, 4)


cdef inline int put_sized(Buf* b, const char* s, Py_ssize_t n) except -1:
    if n > MAX_FIELD:
        raise ValueError("a field of 4 GiB or more cannot be packed")
    put_u32(b, <uint32_t>n)
    return put(b, s, n)


def pack_items(list items, type cls, object item_to_row):
    """``items`` as a packed batch ``(blob, metas, others)`` (see above); :func:`unpack_items`
    gives them back. Events of class ``cls`` whose fields are all in their ``__dict__`` are packed;
    any other item travels as ``item_to_row(item)`` in ``others``."""
    cdef Buf out
    cdef list metas = []
    cdef list others = []
    cdef dict d
    cdef Py_ssize_t n
    cdef const char* s
    cdef uint8_t flags
    cdef object meta = None
    cdef object last = None
    out.p = NULL
    out.n = out.cap = 0
    try:
        for item in items:
            d = item.__dict__ if type(item) is cls else None
            if d is None or not _packable(d):
                putc(&out, P_OTHER)
                put_u32(&out, <uint32_t>len(others))
                others.append(item_to_row(item))
                continue
            meta = (d["op"], d["db"], d["schema"], d["table"], d["tx_id"], d.get("commit_us"))
            if last is None or meta != last:  # changes once per table or transaction
                metas.append(meta)
                last = meta
            end_position, headers, key = d.get("end_position"), d.get("headers"), d["key_bytes"]
            flags = ((F_TX_END if d.get("tx_end") else 0) | (F_END_POSITION if end_position is not None else 0)
                     | (F_HEADERS if headers else 0) | (F_NO_KEY if key is None else 0))
            putc(&out, P_EVENT)
            put_u32(&out, <uint32_t>(len(metas) - 1))
            putc(&out, <char>flags)
            if flags & F_END_POSITION:
                put_u32(&out, <uint32_t>len(others))
                others.append(end_position)
            if flags & F_HEADERS:
                put_u32(&out, <uint32_t>len(others))
                others.append(headers)
            value = d["value"]
            put_sized(&out, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
            if key is not None:
                put_sized(&out, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
            s = PyUnicode_AsUTF8AndSize(d["idempotency_key"], &n)
            put_sized(&out, s, n)
        return PyBytes_FromStringAndSize(out.p, out.n), metas, others
    finally:
        PyMem_Free(out.p)


cdef bint _packable(dict d):
    # the fields that travel, of the types the layout holds (a field not set yet is read from
    # the envelope on first use: such an event travels as a row)
    v, k, i = d.get("value"), d.get("key_bytes", 0), d.get("idempotency_key")
    return (type(v) is bytes and (k is None or type(k) is bytes) and type(i) is str
            and "op" in d and "db" in d and "schema" in d and "table" in d and "tx_id" in d)


cdef inline Py_ssize_t get_u32(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) except -1:
    cdef uint32_t v
    if i + 4 > n:
        raise ValueError("a packed batch ends inside a record")
    memcpy(&v, p + i, 4)
    return v


def unpack_items(bytes blob, list metas, list others, type cls, object row_to_item):
    """The items :func:`pack_items` packed, in order: events as ``cls`` (a ShippedEvent) with
    every field that travelled set, the other items as ``row_to_item`` gives them."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(blob)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(blob)
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t size
    cdef uint8_t flags
    cdef list out = []
    cdef tuple meta
    cdef dict d
    while i < n:
        if p[i] == P_OTHER:
            out.append(row_to_item(others[get_u32(p, i + 1, n)]))
            i += 5
            continue
        if p[i] != P_EVENT:
            raise ValueError(f"a packed batch has a record of unknown kind {p[i]} at byte {i}")
        meta = metas[get_u32(p, i + 1, n)]
        if i + 6 > n:
            raise ValueError("a packed batch ends inside a record")
        flags = p[i + 5]
        i += 6
        ev = cls.__new__(cls)
        d = ev.__dict__
        d["op"], d["db"], d["schema"], d["table"], d["tx_id"], d["commit_us"] = meta
        d["tx_end"] = bool(flags & F_TX_END)
        d["end_position"] = None
        if flags & F_END_POSITION:
            d["end_position"] = others[get_u32(p, i, n)]
            i += 4
        if flags & F_HEADERS:
            d["headers"] = others[get_u32(p, i, n)]
            i += 4
        size = get_u32(p, i, n)
        if i + 4 + size > n:
            raise ValueError("a packed batch ends inside a record")
        d["value"] = PyBytes_FromStringAndSize(<const char*>p + i + 4, size)
        i += 4 + size
        d["key_bytes"] = None
        if not flags & F_NO_KEY:
            size = get_u32(p, i, n)
            if i + 4 + size > n:
                raise ValueError("a packed batch ends inside a record")
            d["key_bytes"] = PyBytes_FromStringAndSize(<const char*>p + i + 4, size)
            i += 4 + size
        size = get_u32(p, i, n)
        if i + 4 + size > n:
            raise ValueError("a packed batch ends inside a record")
        d["idempotency_key"] = PyUnicode_DecodeUTF8(<const char*>p + i + 4, size, "strict")
        i += 4 + size
        out.append(ev)
    return out


def rows_from_items(list items, type cls, object item_to_row):
    """``[item_to_row(item) for item in items]`` (tidegate.shipped), with the rows of the events
    of class ``cls`` (the compiled paths' ShippedEvents, whose fields are all in their
    ``__dict__``) built here: a reader process turns every item it reads into a row."""
    cdef list out = []
    cdef dict d
    for item in items:
        if type(item) is not cls:
            out.append(item_to_row(item))
            continue
        d = item.__dict__
        try:  # the fields not set are the class's defaults (ChangeEvent)
            out.append(("event", d["value"], d["key_bytes"], d["idempotency_key"], d["op"], d["db"],
                        d["schema"], d["table"], d["tx_id"], d.get("tx_end", False), d.get("end_position"),
                        d.get("headers"), d.get("commit_us")))
        except KeyError:  # a field read from the envelope on first use
            out.append(item_to_row(item))
    return out


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
        cdef unsigned char digest[20]
        cdef char uid[36]
        val.n = self.key.n = ik.n = 0
        # idempotency key and event id: the key's JSON in key order
        put_bytes(ik, self.ikey_raw)
        self.put_key(ik, img.p, span, False)
        tg_sha1(<const unsigned char*>PyBytes_AS_STRING(NAMESPACE), 16, <const unsigned char*>ik.p, ik.n, digest)
        uuid5_text(digest, uid)
        put(val, b'{"id":"', 7)
        put(val, uid, 36)
        put(val, b'","idempotency_key":', 20)
        put_json_text(val, <const unsigned char*>ik.p, ik.n)
        put(val, b',"op":"r","before":null,"after":', 32)
        put(val, img.p, img.n)
        put(val, b',"key":', 7)
        put(val, ik.p + PyBytes_GET_SIZE(self.ikey_raw), ik.n - PyBytes_GET_SIZE(self.ikey_raw))
        put_bytes(val, self.source_head)
        put(val, b'last' if last else b'true', 4)
        put_bytes(val, self.tx_head)
        put_u64(val, <uint64_t>n)
        put(val, b',"data_collection_order":', 25)
        put_u64(val, <uint64_t>n)
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


# --------------------------------------------------------------------------- pgoutput rows (PostgreSQL)
#
# The pgoutput read path (sources/postgres/pgoutput.py) hands each Insert, Update and Delete
# message, as the pair (its LSN, its bytes), to :class:`PgOutputRows` before it decodes it.
# A row's values come as their output text, which ``put_text_value`` writes with the kinds the
# snapshot's PostgreSQL rows use (the log and the snapshot make the same value of a text); the
# envelope is Wal2JsonRows's. The reader registers each Relation message's columns
# (``relation``); a table with a column no kind covers, an unchanged TOAST value (``u``), a new
# column set, a changed primary key or bytes that do not add up go to the Python path (None).

from libc.stdio cimport snprintf


cdef class RelationRows(TableRows):
    """One Relation message's columns as the compiled path writes them."""

    cdef int ncols, nkey
    cdef int* kind
    cdef char* is_key  # in the replica identity (a K tuple's columns)
    cdef list keys     # b'"name":' per column
    cdef object signature  # the Python path's signature of a whole row (the reader's ``seen``)

    def __cinit__(self):
        self.kind = NULL
        self.is_key = NULL

    def __dealloc__(self):
        PyMem_Free(self.kind)
        PyMem_Free(self.is_key)


cdef Py_ssize_t put_tuple(Buf* out, Py_ssize_t* span, RelationRows r, const unsigned char* s, Py_ssize_t pos,
                          Py_ssize_t e, bint key_only) except -2:
    """The TupleData at ``pos`` as a row image (only the replica identity's columns when
    ``key_only``; a left-out column's span is -1): where it ends, or -1 for the Python path."""
    cdef int i
    cdef Py_ssize_t ln = 0
    cdef const unsigned char* text
    cdef bint first = True
    if pos + 2 > e or <int>be(s + pos, 2) != r.ncols:
        return -1
    pos += 2
    out.n = 0
    putc(out, b'{')
    for i in range(r.ncols):
        if pos >= e:
            return -1
        if s[pos] == b't':
            if pos + 5 > e:
                return -1
            ln = <Py_ssize_t>be(s + pos + 1, 4)
            text = s + pos + 5
            pos += 5 + ln
            if pos > e:
                return -1
        elif s[pos] == b'n':
            text = NULL
            pos += 1
        else:
            return -1  # u: an unchanged TOAST value; b: binary (never sent by protocol 1)
        if key_only and not r.is_key[i]:
            span[2 * i] = -1
            continue
        if not first:
            putc(out, b',')
        first = False
        put_bytes(out, <bytes>r.keys[i])
        span[2 * i] = out.n
        if text == NULL:
            put(out, b'null', 4)
        elif not put_text_value(out, text, ln, r.kind[i]):
            return -1
        span[2 * i + 1] = out.n
    putc(out, b'}')
    return pos


cdef class PgOutputRows(Wal2JsonRows):
    """The compiled path of one pgoutput read: ``relation(...)`` for each Relation message,
    ``row((lsn, msg), seen)`` the event of an Insert / Update / Delete, or None for the Python
    path. Counts and envelope as :class:`Wal2JsonRows`."""

    cdef dict rels  # relid -> RelationRows, or None for a table the compiled path leaves alone

    def __init__(self, str tenant, str pipeline, tables, type cls):
        super().__init__(tenant, pipeline, tables, cls)
        self.rels = {}

    def relation(self, uint32_t relid, str schema, str table, list names, list kinds, list key,
                 list pk, object signature):
        """A Relation message's table: its columns' ``names``, their ``kinds`` (``TEXT_KINDS``
        names; None where no kind covers the type), which are in the replica identity (``key``),
        the primary key's names ``pk`` and the Python path's ``signature`` of a whole row."""
        import orjson

        cdef RelationRows r
        cdef int i
        if not names or None in kinds or not pk:
            self.rels[relid] = None
            return
        r = <RelationRows>self.named(RelationRows.__new__(RelationRows), schema, table)
        r.ncols = len(names)
        r.kind = <int*>PyMem_Malloc(r.ncols * sizeof(int))
        r.is_key = <char*>PyMem_Malloc(r.ncols)
        if r.kind == NULL or r.is_key == NULL:
            raise MemoryError()
        for i in range(r.ncols):
            r.kind[i] = TEXT_KINDS[kinds[i]]
            r.is_key[i] = bool(key[i])
        r.keys = [orjson.dumps(n) + b":" for n in names]
        r.nkey = sum(1 for k in key if k)
        r.signature = signature
        place_pk(r, pk, names)
        if r.ncols > self.cap:
            self.grow(r.ncols)
        self.rels[relid] = r

    def row(self, object m, dict seen):
        """The event of the pgoutput row change ``m`` (its LSN and bytes), or None."""
        if type(m) is not tuple:
            return None
        msg = (<tuple>m)[1]
        cdef uint64_t at = (<tuple>m)[0]
        cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(msg)
        cdef Py_ssize_t e = PyBytes_GET_SIZE(msg), pos
        cdef char op
        cdef char lsn[40]
        cdef int ln
        cdef Buf* before = &self.bufs[0]
        cdef Buf* after = &self.bufs[1]
        cdef bint has_before = True
        if e < 6 or s[0] not in (73, 85, 68):  # I, U, D
            return None
        op = s[0]
        r = self.rels.get(<uint32_t>be(s + 1, 4))
        if r is None:
            return None
        cdef RelationRows t = <RelationRows>r
        if not t.wanted:
            return None
        if op == b'I':
            if s[5] != b'N' or put_tuple(after, self.span_a, t, s, 6, e, False) != e:
                return None
            has_before = False
        elif op == b'D':
            if (s[5] != b'K' and s[5] != b'O') or put_tuple(before, self.span_b, t, s, 6, e, s[5] == b'K') != e:
                return None
        else:
            if s[5] == b'K' or s[5] == b'O':
                pos = put_tuple(before, self.span_b, t, s, 6, e, s[5] == b'K')
                if pos < 0 or pos >= e or s[pos] != b'N':
                    return None
                pos += 1
            elif s[5] == b'N':  # the key did not change: the old key is the new row's
                pos = 6
                has_before = t.nkey > 0
                if has_before and put_tuple(before, self.span_b, t, s, pos, e, True) != e:
                    return None
            else:
                return None
            if put_tuple(after, self.span_a, t, s, pos, e, False) != e:
                return None
        if op != b'D':
            last = seen.get(t.tkey)
            if last is not t.signature and last != t.signature:
                return None  # a new column set: the Python path tells it
        ln = snprintf(lsn, 40, b"%X/%X", <unsigned int>(at >> 32), <unsigned int>(at & 0xFFFFFFFF))
        self.bufs[2].n = self.bufs[3].n = self.bufs[4].n = 0
        return self.envelope(t, op, lsn, ln, before if has_before else NULL, after if op != b'D' else NULL,
                             &self.bufs[2], &self.bufs[3], &self.bufs[4])
