"""A seeded randomized fault campaign (`make campaign`): a random workload on MariaDB or
PostgreSQL, a random schedule of real faults while `tidegate run` delivers it, and the source as
the oracle. See runner.py for the usage."""
