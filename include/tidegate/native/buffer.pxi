# The output buffer and the value writers every compiled reader shares: numbers, JSON strings,
# base64, dates and times. Part of tidegate.native.rowcodec (native/rowcodec.pyx includes it);
# the Python twins are orjson and the value conversions of each source (docs/architecture.md,
# "The compiled hot path").

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
    """A JSON string of UTF-8 text already checked (:func:`put_json_chars`, quoted)."""
    putc(b, b'"')
    put_json_chars(b, s, n)
    return putc(b, b'"')


cdef int put_json_chars(Buf* b, const unsigned char* s, Py_ssize_t n) except -1:
    """The inside of a JSON string of UTF-8 text already checked: escapes as orjson and the
    stdlib (ensure_ascii=False) write them; every other byte as is, copied a run at a time."""
    cdef Py_ssize_t i = 0, j
    cdef unsigned char c
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
    return 0


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
