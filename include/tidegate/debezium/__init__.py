"""``envelope: debezium``: the records Debezium's MySQL, MariaDB and PostgreSQL connectors
would write for tidegate's events (docs/operations.md, "Debezium envelope").

* ``values.py``: column values by SQL type and the connector's value modes (pure functions);
* ``envelope.py``: the encoder a sink holds: change records, tombstones, key-change headers,
  ``op: "t"``, transaction metadata, schema change records, heartbeats, the ``{schema, payload}``
  form;
* ``schema_changes.py``: the schema change topic's table changes (MySQL/MariaDB);
* ``spec.py``: the sink entry's ``envelope`` and ``debezium:`` fields (light: DAG parsing).
"""
