"""PostgreSQL logical decoding source (wal2json format-version 2 or pgoutput protocol 1,
psycopg2), cut by role.

* ``connection.py``: sessions, the control connection, and what the server is (system
  identifier, timeline, head);
* ``slot.py``: the pipeline's replication slot (create with its plugin, drop, health, typed
  errors, release);
* ``wal2json.py``: the transports (the streaming replication protocol, one peek through a named
  cursor), the wal2json message format, the read path and the cheap ``has_changes`` look; the
  read path it replaced is a test oracle, ``tests/reference_decoders/postgres_reference.py``;
* ``pgoutput.py``: pgoutput's messages turned into the read path's, and its ``has_changes``;
* ``publication.py``: the publication a pgoutput slot is read with (made by the pipeline or
  named in the spec) and its checks;
* ``columns.py``: schema changes told from the rows' columns, remembered between runs;
* ``values.py``: value conversions, one at a time and as generated per-table row plans;
* ``preflight.py``: settings, the CDC role, slot health and WAL headroom, replica identity;
* ``source.py``: :class:`PostgresSource`, which composes them into the Source interface;
* ``position.py``: :class:`Lsn` and :class:`PgPosition` (light);
* ``spec.py``: the ``source:`` fields of this kind and their checks (light); ``KIND`` below
  registers the kind (:mod:`tidegate.kinds`).

Positions, ids and boundaries (the contract other code relies on):

* A position is an LSN. A transaction's ``end_position`` is the **end of its commit record**
  (wal2json's ``nextlsn``, pgoutput's Commit ``end_lsn``, logical decoding's ``end_lsn``).
  :meth:`PostgresSource.release` advances the slot to such an end, and a slot whose
  ``confirmed_flush_lsn`` is X no longer
  returns a transaction whose commit record starts before X (the server's rule), so none
  that ends at or before X. ``read(start, upto)`` yields the transactions with
  ``start < end <= upto``; comparing ends is exact because a transaction's commit record
  ends after every record of it, and commit order is LSN order.
* ``head()`` is the end of the flushed WAL (``pg_current_wal_flush_lsn()``): every
  transaction whose commit was flushed before the call ends at or before it, and every one
  that ends at or before it can be decoded at once (logical decoding reads flushed WAL only),
  so it is a valid upper bound; an asynchronous commit still unflushed goes to the next run.
  It is never inside a commit record (see ``PgServer.head``): a bound there, once a slot was
  released to it, would make the server skip that transaction. The server may still return
  one transaction whose commit record ends after the bound (it stops after the record that
  reaches it): the decoder drops it (it checks ``nextlsn`` on the ``B`` record before emitting
  any row) and the next run delivers it.
* ``tx_id`` is ``"{xid}:{commit_lsn}"`` (commit_lsn = start of the commit record, wal2json's
  ``lsn`` on B/C, pgoutput's final LSN); ``event_id`` is ``"{change_lsn}:{n}"``, n counting the rows of the
  transaction that share the change's LSN (a multi-insert logs several rows in one record).
* A read streams the slot over the replication protocol (the reference decoder: one
  ``pg_logical_slot_peek_changes`` call through a named cursor); either way the cost is linear
  in the range and client memory bounded, and it never moves the slot: only
  :meth:`PostgresSource.release` does. Empty transactions (DDL, no row changes, or every row
  filtered out) yield nothing; the final ``PositionMark(upto)`` moves checkpoints past them.
* Unchanged TOAST values (wal2json leaves them out of an UPDATE's new tuple, pgoutput marks them
  ``u``) are taken from the
  old tuple when the table has REPLICA IDENTITY FULL, and are otherwise emitted as the
  Debezium placeholder ``"__debezium_unavailable_value"``: never as null.
* Schema changes (``columns.py``): a ``TRUNCATE`` of a captured table and a change of its column
  set (noticed from the rows: wal2json carries no DDL) are ``schema_change`` control messages
  in the stream, inside the transaction where they happen: a TRUNCATE where it sits
  (``change: "truncate"``), a column change just before the first row with the new columns
  (``change: "columns"``, with ``columns`` and ``previous_columns``: name and type, in order).
  Their ``event_id`` is ``"{lsn}:truncate:{schema}.{table}"`` and ``"{lsn}:{n}:columns"`` (the
  id of the row that shows the change, then ``:columns``). Column sets are remembered in the
  checkpoint store between runs (:meth:`PostgresSource.use_store`).

Values (JSON-faithful): integers as numbers, numeric as the server's text (exact, scale kept,
never an exponent: ``events.decimal_text``; wal2json turns numeric NaN/Infinity into null),
real/double as numbers, text as string, bytea as base64, boolean as true/false, date as
``YYYY-MM-DD``, time as ``HH:MM:SS[.f]``, timestamp as ISO-8601 ``YYYY-MM-DDTHH:MM:SS[.f]``
(the fraction as the server writes it: trailing zeros dropped, ``.26308``), timestamptz
as ISO-8601 in UTC with ``+00:00``, uuid as string, json/jsonb as their JSON text, arrays as
JSON arrays of the converted elements. Other types keep PostgreSQL's text output.
"""

from ...kinds import SourceKind
from . import spec

KIND = SourceKind(name="postgres", fields=spec.FIELDS, parse=spec.parse,
                  replication_client=spec.replication_client,
                  position="tidegate.sources.postgres.position:PgPosition",
                  source="tidegate.sources.postgres.source:PostgresSource",
                  dataset_of="tidegate.sources.postgres.spec:dataset",
                  complete=spec.complete, may_read_in_child=spec.may_read_in_child,
                  reads_in_process="tidegate.sources.postgres.source:light_log_reads",
                  log_read_under_lease=True)


def __getattr__(name: str):
    # ``from tidegate.sources.postgres import PostgresSource`` keeps working (scripts written against the
    # package, e.g. benchmark harnesses), without importing the decoder when the package is
    # imported for its KIND alone.
    if name == "PostgresSource":
        from .source import PostgresSource  # on demand: the KIND alone loads no decoder

        return PostgresSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
