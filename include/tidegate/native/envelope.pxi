# The parts of the tidegate envelope (events.ChangeEvent.value, its Python twin) that every
# compiled role writes alike, in the envelope's field order:
#
#   {"id":"<uuid5>","idempotency_key":"<key>","op":"c","before":B,"after":A,"key":K,
#    "source":{...the source's own block...,"total_order":T,"data_collection_order":N,...}}
#
# A role writes its idempotency key's text (unclosed), its key and its source block; the field
# names and their order are here. Part of tidegate.native.rowcodec (native/rowcodec.pyx
# includes it after the buffer).


cdef int put_event_id(Buf* val, Buf* ik) except -1:
    """``{"id":"<uuid5 of the idempotency key ik>","idempotency_key":``: the envelope's opening,
    whose event id is uuid5 over the namespace and the idempotency key."""
    cdef unsigned char digest[20]
    cdef char uid[36]
    tg_sha1(<const unsigned char*>PyBytes_AS_STRING(NAMESPACE), 16, <const unsigned char*>ik.p, ik.n, digest)
    uuid5_text(digest, uid)
    put(val, b'{"id":"', 7)
    put(val, uid, 36)
    return put(val, b'","idempotency_key":', 20)


cdef int put_change(Buf* val, char op, Buf* before, Buf* after) except -1:
    """``","op":"<op>","before":<before>,"after":<after>,"key":``, after the idempotency key's
    text (whose closing quote it writes); NULL for an image the change has not."""
    put(val, b'","op":"', 8)
    putc(val, op)
    put(val, b'","before":', 11)
    if before == NULL:
        put(val, b'null', 4)
    else:
        put(val, before.p, before.n)
    put(val, b',"after":', 9)
    if after == NULL:
        put(val, b'null', 4)
    else:
        put(val, after.p, after.n)
    return put(val, b',"key":', 7)


cdef int put_orders(Buf* val, uint64_t total, uint64_t n) except -1:
    """``<total>,"data_collection_order":<n>``: the row's place in its transaction and among its
    table's rows there, after the source block's ``"total_order":``."""
    put_u64(val, total)
    put(val, b',"data_collection_order":', 25)
    return put_u64(val, n)
