# The compiled twin of the rows of pgoutput.py (PgOutputRows), on the envelope of Wal2JsonRows
# and the text values of snapshot_rows.pxi. Part of tidegate.native.rowcodec (native/rowcodec.pyx
# includes it); tests/unit/test_pgoutput_rows.py compares its bytes with the Python path's.

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
