"""The Spark side of a run (docs/architecture.md, "Processes").

* ``job.py``: the Spark job's body (``deliver``) and its reader, which reads the run's read
  plan in Spark tasks;
* ``slices.py``: the tasks that decode the log's slices;
* ``chunks.py``: the Python Data Source whose tasks read a snapshot's chunks;
* ``windows.py``: partitions computed a few at once, handed over in order.

Nothing here is imported by the engine outside this package, but for the Delta sink, which
asks ``connect.active_session()`` for the run's Spark Connect server; pyspark is imported only
where a Spark session is used.
"""
