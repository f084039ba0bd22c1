"""MySQL/MariaDB binlog source, cut by role.

* ``server.py``: the control connection and what the server is (identity, head, binlog
  files, the GTID position at a coordinate);
* the log decoder: ``binlog_client.py`` (our own replication protocol client),
  ``row_plans.py`` (table maps and generated row decoders) and ``decoder.py``; it hands the
  transaction structure to ``transactions.py``. The reference decoder it is compared with
  (python-mysql-replication) is a test oracle: ``tests/reference_decoders/mysql_library.py``;
* ``values.py``: the column value conversions (and the fixes the reference decoder applies to
  python-mysql-replication's values);
* ``ddl.py`` and ``columns.py``: which tables a DDL statement changes, and their columns after
  it as the binlog tells them (the schema_change control messages);
* ``preflight.py``: binlog settings, privileges, retention headroom;
* ``failover.py``: placing a checkpoint of another server by its GTID set;
* ``source.py``: :class:`MySqlSource`, which composes them into the Source interface;
* ``position.py``: :class:`BinlogPosition` and :class:`GtidSet` (light);
* ``spec.py``: the ``source:`` fields of this kind and their checks (light); ``KIND`` below
  registers the kind (:mod:`tidegate.kinds`).

Positions, ids and boundaries (the contract other code relies on):

* A transaction is one binlog event group: GTID event (MariaDB: its flags say whether it is a
  standalone DDL group) or ``BEGIN`` query, then table maps and row events, then the ``XID``
  event or a ``COMMIT``/``ROLLBACK`` query; a standalone DDL group ends with its query.
* ``tx_id`` is the GTID (MariaDB ``0-1-42``, MySQL ``uuid:42``); without GTIDs it is
  ``"{file}:{pos}"`` of the transaction's first event (GTID/BEGIN). Stable on every replay.
* ``event_id`` is ``"{file}:{pos}:{i}"``: the start position of the row event and the row's
  0-based index in it.
* The last row of a transaction carries ``end_position`` = the position just after the
  commit event (``XID``'s end), with ``gtid_set`` = the server's executed GTID set after this
  transaction (MariaDB: last GTID per domain), ``server_id`` / ``server_uuid`` of the server
  read. That is where the next read starts, and what a checkpoint stores.
* ``read(start, upto)`` yields exactly the transactions whose commit ends in
  ``(start, upto]``: it starts reading at ``start`` (a transaction boundary) and stops at the
  first event that starts at or after ``upto``. ``upto`` must be a transaction boundary
  (:meth:`MySqlSource.head` always is: the server writes event groups whole); a transaction
  straddling ``upto`` is an error, never a silent cut.
* Column names come from the binlog's row metadata only (``binlog_row_metadata=FULL``); a row
  event without them raises :class:`SourceSettingError` naming the setting and the table.
  Statement-logged DML (``binlog_format``) and partial row images (``binlog_row_image``) are
  detected in the stream and raise the same way.
* Schema changes: a DDL statement that changes a captured table (``ddl.py``: ALTER, CREATE,
  DROP, RENAME and TRUNCATE TABLE, CREATE/DROP INDEX, DROP DATABASE; with no table filter,
  every table) becomes one ``schema_change`` :class:`~tidegate.events.ControlMessage` per
  captured table it names, where the statement sits: in its transaction (its own, for a DDL
  outside one), ``tx_id`` and ``end_position`` as for a row. Fields: ``change`` (the kind of
  statement), ``ddl`` (the statement), ``db`` and ``schema`` (the database), ``table``, and
  ``columns`` (``[{"name", "type"}]``): the table's columns after the change as the binlog
  tells them (``columns.py``: the table's next TABLE_MAP), ``[]`` for a table the statement
  drops or renames away, ``null`` where the binlog does not tell. ``event_id`` is
  ``"{file}:{pos}:{db}.{table}"`` of the query event, ``ts_ms`` its time: the same on every
  replay. The statements are also kept in :attr:`MySqlSource.schema_changes` (reset at the
  start of every read) as :class:`SchemaChange` records. Rows before and after a DDL carry
  the columns their own table map described.
* Slices (``slicing.py``): ``slices()`` cuts a range at binlog files, and a file range larger
  than ``slice_bytes`` (default 64 MiB, ``TIDEGATE_MYSQL_SLICE_BYTES``) at transaction
  boundaries inside the file.

Values (JSON-faithful, see ``events.encode_value``): integers of every width as numbers
(unsigned included), DECIMAL as the server's text (every place of the scale, never an
exponent: ``events.decimal_text``), FLOAT as the shortest
decimal that round-trips the 32-bit value, DOUBLE as number, text as string (decoded with the
column's character set), BLOB/BINARY/VARBINARY/GEOMETRY as base64 (BINARY(n) zero-padded to n
bytes), DATE/DATETIME as ISO-8601 (``2024-01-02T03:04:05.123456``), TIMESTAMP as ISO-8601 in
UTC (``...+00:00``), TIME as ``[-]HH:MM:SS[.ffffff]``, YEAR as number, ENUM as string, SET as
a sorted list (empty set → ``[]``), BIT(n) as a string of n ``0``/``1`` characters, JSON as
its JSON text (MariaDB stores JSON as text; MySQL's binary JSON is re-serialized), zero dates
as null.
"""

from ...kinds import SourceKind
from . import spec

KIND = SourceKind(name="mysql", fields=spec.FIELDS, parse=spec.parse,
                  replication_client=spec.replication_client,
                  position="tidegate.sources.mysql.position:BinlogPosition",
                  source="tidegate.sources.mysql.source:MySqlSource",
                  dataset_of="tidegate.sources.mysql.spec:dataset")


def __getattr__(name: str):
    # ``from tidegate.sources.mysql import MySqlSource`` keeps working (scripts written against the
    # package, e.g. benchmark harnesses), without importing the decoder when the package is
    # imported for its KIND alone.
    if name == "MySqlSource":
        from .source import MySqlSource  # on demand: the KIND alone loads no decoder

        return MySqlSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
