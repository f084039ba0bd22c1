# The compiled twin of shipped.py: events rebuilt from shipped rows, and packed batches (the
# form a reader process sends the run's process its events in). Part of tidegate.native.rowcodec
# (native/rowcodec.pyx includes it).

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
