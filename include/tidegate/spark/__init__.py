"""The Spark side of a run (docs/architecture.md, "Processes").

* ``job.py``: the Spark job's body (``deliver``) and its reader, which reads the run's read
  plan in Spark tasks;
* ``connect.py``: a run as a Spark Connect client; ``session.py``: its session, kept per
  pipeline;
* ``delivery.py``: a run delivered by one Spark task; ``gathered.py``: parts read by tasks of
  their own and gathered into it;
* ``task_source.py``: the Python Data Source whose one partition runs a function in a task;
* ``slices.py``: the tasks that decode the log's slices;
* ``chunks.py``: the tasks that read a snapshot's chunks;
* ``windows.py``: partitions computed a few at once, handed over in order.

Nothing here is imported by the engine outside this package: a Connect client's run carries its
session (``RunContext.spark``), which the runner lends to the sinks that write through Spark (the
Delta sink); pyspark is imported only where a Spark session is used.
"""
