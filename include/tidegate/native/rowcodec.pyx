# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled hot path of the readers (docs/architecture.md, "The compiled hot path"): the rows of
a binlog ROWS event, of a wal2json or pgoutput message, of a snapshot chunk, straight to the bytes
a run sends, and the packed batches a reader process sends the run's process.

One extension module built from one file per role, each beside the Python code it mirrors (its
twin, which gives the same bytes and runs where this module is not built):

* ``native/buffer.pxi``: the output buffer and the value writers every role shares;
* ``native/envelope.pxi``: the envelope's shared parts (event id, change, orders), in its field order;
* ``sources/mysql/binlog_rows.pxi``: binlog rows (twin: ``sources/mysql/row_plans.py``);
* ``shipped_rows.pxi``: shipped rows and packed batches (twin: ``shipped.py``);
* ``sources/postgres/wal2json_rows.pxi``: wal2json rows (twin: ``sources/postgres/wal2json.py``);
* ``sources/snapshot_rows.pxi``: snapshot chunk rows (twin: ``sources/snapshot_rows.py``);
* ``sources/postgres/pgoutput_rows.pxi``: pgoutput rows (twin: ``sources/postgres/pgoutput.py``).

They are one module, not six, so that the buffer's small functions stay inlined in every role
and no call crosses a module boundary per column. For each row the compiled path writes the
``tidegate`` envelope (``ChangeEvent.value``), the message key and the idempotency key, byte for
byte what the pure-Python path produces, without a Python object per column; for anything
unusual inside a row it gives up on that row or event (returns None) and the caller decodes it
with the Python path, which gives the values or the errors the contract names. A unit test per
twin compares the bytes of both paths.

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

cdef const char* HEX = b"0123456789abcdef"
cdef const char* B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
cdef int DAYS[13]
DAYS[:] = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
cdef bytes NAMESPACE = bytes.fromhex("6f1c2a9e5b0d4c1e9d3a7a2e8b4c0d11")  # events.EVENT_ID_NAMESPACE


include "native/buffer.pxi"
include "native/envelope.pxi"
include "sources/mysql/binlog_rows.pxi"
include "shipped_rows.pxi"
include "sources/postgres/wal2json_rows.pxi"
include "sources/snapshot_rows.pxi"
include "sources/postgres/pgoutput_rows.pxi"
