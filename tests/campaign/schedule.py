"""A seed's schedule: the source, the sinks, the commit policy, the checkpoint store and the list
of (moment, fault) steps, all drawn from ``random.Random(seed)`` (so `make campaign SEED=s`
replays the same schedule and the same workload)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from tests.campaign.generator import TABLES

SOURCES = ("mysql", "postgres")
CORE_SINKS = ("kafka", "nats", "redis")
DELTA_SINKS = ("delta_merge", "delta_log")
SINK_GROUPS = ("kafka", "nats", "redis", "delta")

# What a fault does (faults.py) ; the server ones name a role: the source's server, the
# checkpoint store's PostgreSQL, or a sink's server.
RUN_FAULTS = ("run_kill", "run_stop", "run_stall_nats", "run_stall_kafka", "zombie")
SERVER_ROLES = ("source", "store", "kafka", "nats", "redis")
SERVER_FAULTS = tuple(f"{how}_{role}" for role in SERVER_ROLES for how in ("kill", "stop"))
FAULT_KINDS = RUN_FAULTS + SERVER_FAULTS
# Drawn only when --kinds names them (adding a kind to FAULT_KINDS would change every seed's
# draws): another client turns one table's Redis stream into a string while the run delivers
# (RENAME aside and SET, at once), and puts it back once the run has ended, as an operator does;
# Redis restored, while the run delivers, from a copy of its data taken before the run started
# (what it acknowledged since is gone), and the operator then runs the rewind the next run names;
# one Delta table (merged or changelog) taken back by `RESTORE TABLE`, while the run delivers, to
# its version before the run started, and likewise.
OPT_IN_KINDS = ("retype_redis", "restore_redis", "restore_delta")
# A run delivered by a Spark task (delivery "executor": the spec's Spark connection is a Connect
# server on a standalone cluster): the delivering Python worker SIGKILLed (Spark retries the
# task), the executor's JVM SIGKILLed (the cluster starts another, the task is retried there),
# the worker SIGSTOPped past the NATS window or the Kafka transaction timeout. Stopping the
# `tidegate run` client stalls nothing there, and a zombie's takeovers would wait for the one core
# the stopped task holds: those kinds are left out, run_kill stays (the task goes on without
# its client).
EXECUTOR_FAULTS = ("task_worker_kill", "executor_kill", "task_stall")
EXECUTOR_KINDS = ("run_kill", *EXECUTOR_FAULTS, *SERVER_FAULTS)
DELIVERIES = ("process", "executor")

NATS_WINDOW_S = 2.0  # the campaign's NATS duplicate_window: a stall of the run can exceed it
# With --hangs past_timeouts: the runs' TIDEGATE_STORE_TIMEOUT_S and TIDEGATE_SOURCE_READ_TIMEOUT_S,
# and a hang of the source's or the store's server drawn from 0.5 s to this long twice and 2 s more:
# a run waiting on the hung server times out and fails, and must be retried to the same outcome.
HANG_TIMEOUT_S = 3.0
# The campaign's Kafka transaction.timeout.ms (its connection's extra). The broker aborts a
# transaction open past it at its next abort check (scripts/services: every 500 ms), so a stall
# past it aborts the run's transaction when it stops the run while one is open.
KAFKA_TXN_TIMEOUT_MS = 4000
# With --snapshots resnapshot: the spec's snapshot.chunk_rows (a table of a schedule holds tens of
# rows, so a resnapshot is several chunks, each a part of its own where a Spark task gathers them).
SNAPSHOT_CHUNK_ROWS = 4


@dataclass(frozen=True)
class Step:
    """One fault: ``moment`` is ("commits", k) (once the faulted run has committed k sub-batches,
    as the store shows), ("delta_commits", k) (once it has made k commits to the Delta data
    tables: a sub-batch's commits go table by table, so this lands between two tables' commits of
    one sub-batch as often as not) or ("delay", s) (s seconds after the run started); ``hold`` how long a
    stopped process or server stays stopped (or a killed server down); ``wave`` the transactions
    written before the faulted run; ``writes_between`` those written after the fault, before the
    runs that follow; ``takeovers`` (zombie) the runs that finish the work before it wakes."""

    fault: str
    moment: tuple[str, float]
    hold: float
    wave: int
    writes_between: int
    takeovers: int = 0
    # retype_redis: the table whose stream is turned into a string; restore_delta: the Delta table
    # restored, as "merged/<table>" or "log/<table>"
    target: str = ""

    def __str__(self) -> str:
        extra = f", takeovers={self.takeovers}" if self.fault == "zombie" else ""
        extra += f", table={self.target}" if self.target else ""
        return (f"({self.moment[0]}={self.moment[1]}, {self.fault}, hold={self.hold}s, wave={self.wave}, "
                f"writes_between={self.writes_between}{extra})")


@dataclass(frozen=True)
class Rewind:
    """An operator's `tidegate checkpoints rewind` of one sink, ``back`` versions before
    its latest (or to its first), after step ``step``'s fault, or, ``in_flight``, at the step's
    moment while its faulted run delivers (the rewind takes the lease: the run is fenced)."""

    step: int
    sink: str
    back: int
    in_flight: bool

    def __str__(self) -> str:
        when = "while its run delivers" if self.in_flight else "after its fault"
        return f", then a rewind of {self.sink} {self.back} version(s) back {when}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    source: str
    sinks: tuple[str, ...]
    policy: str  # required | all | quorum
    optional: tuple[str, ...]  # sinks with required: false (policy required)
    quorum: int | None
    store: str  # sqlite | postgres
    max_events: int
    steps: tuple[Step, ...] = field(default_factory=tuple)
    delivery: str = "process"  # process (`tidegate run` delivers) | executor (a Spark task does)
    past_timeouts: bool = False  # the runs' store and source timeouts HANG_TIMEOUT_S, hangs drawn past it
    # With --snapshots resnapshot: the step whose faulted run is triggered with resolve=resnapshot,
    # and the tables it re-loads (the fault then strikes a run that snapshots them).
    resnapshot_step: int | None = None
    resnapshot_tables: tuple[str, ...] = ()
    # With --failovers gtid (MariaDB): the steps after whose fault the pipeline's connection moves
    # to the other server of the GTID pair (primary to replica, replica back to primary).
    failover_steps: tuple[int, ...] = ()
    rewinds: tuple[Rewind, ...] = ()  # with --rewinds random
    # With --retries same_record: a faulted run that failed is first delivered again from its
    # record, as an Airflow retry of its deliver task is (`tidegate run --retry`), then the reruns.
    retries: bool = False
    # With --poison dlq: some notes rows are too large for Kafka and NATS, whose sinks dead-letter
    # them (on_poison: dlq); no draw in the schedule (the workload draws which rows).
    poison: bool = False
    # With --poison dlq_mixed: half the huge rows are past the Kafka client's own limit too
    # (16 MiB: the producer refuses them before any broker sees them), the rest past the broker's
    huge_mixed: bool = False
    # With --envelope debezium: the Kafka sink writes Debezium's records (envelope: debezium, with
    # transaction metadata and tombstones); no draw either. Its changes carry no tidegate
    # position, so no rewind is drawn for it (the oracle could not tell a re-send from a duplicate).
    envelope: str = "tidegate"
    # With --kafka idempotent: the Kafka sink's idempotent producer (exactly_once: false), whose
    # guarantee is at least once; no draw.
    kafka_exactly_once: bool = True
    # With --types edges: the items table has a column per type the source offers (numbers,
    # decimals, times, binary, multi-byte text, JSON...), filled with values at the edges of their
    # types, which the oracle compares with the source's in the envelope's form; no draw.
    types: str = "plain"
    # With --plugin: the PostgreSQL slot's plugin (None: the default, which is wal2json here: the
    # pipeline's user may not publish the tables; pgoutput reads a publication the admin makes)
    plugin: str | None = None

    def describe(self) -> str:
        policy = self.policy + (f"({self.quorum})" if self.quorum else "") + (
            f", optional {list(self.optional)}" if self.optional else "")
        where = ", delivered by a Spark task" if self.delivery == "executor" else ""
        if self.retries:
            where += ", a failed run retried from its record"
        if self.past_timeouts:
            where += f", store and source timeouts {HANG_TIMEOUT_S:g}s"
        if self.poison:
            where += ", rows too large for Kafka and NATS dead-lettered" + (
                " (some past 16 MiB)" if self.huge_mixed else "")
        if self.envelope == "debezium" and "kafka" in self.sinks:
            where += ", Kafka in Debezium's envelope"
        if not self.kafka_exactly_once and "kafka" in self.sinks:
            where += ", Kafka at least once (idempotent producer)"
        return (f"seed {self.seed}: source {self.source}, sinks {list(self.sinks)}, policy {policy}, "
                f"store {self.store}, max_events {self.max_events}{where}\n"
                + "\n".join(f"  {i + 1}. {s}" + self._resnapshot(i) + self._failover(i)
                            + "".join(str(r) for r in self.rewinds if r.step == i)
                            for i, s in enumerate(self.steps)))

    def _failover(self, i: int) -> str:
        return ", then the connection fails over to the other server" if i in self.failover_steps else ""

    def _resnapshot(self, i: int) -> str:
        if i != self.resnapshot_step:
            return ""
        return f", its run re-loading {list(self.resnapshot_tables)} (resolve=resnapshot)"


def draw(seed: int, sources: tuple[str, ...] = SOURCES, sinks: tuple[str, ...] = SINK_GROUPS,
         kinds: tuple[str, ...] = FAULT_KINDS, delta_share: float = 0.1,
         delivery: str = "process", past_timeouts: bool = False, resnapshot: bool = False,
         failovers: bool = False, rewinds: bool | str = False, retries: bool = False,
         poison: bool = False, envelope: str = "tidegate", kafka_exactly_once: bool = True,
         types: str = "plain", plugin: str | None = None) -> Schedule:
    """The schedule of ``seed``, drawn within the given subsets. Delta (slow: seven Delta commits
    per sub-batch) is in a schedule only when ``sinks`` allows it, and then in ``delta_share`` of
    the seeds unless it is the only choice. ``delivery`` executor: the runs are delivered by a
    Spark task, with the fault kinds that apply there (EXECUTOR_KINDS within ``kinds``; no Delta
    sink, which keeps a run in its client). ``past_timeouts``: hangs of the source's and the
    store's servers drawn past HANG_TIMEOUT_S as often as not (the same draws otherwise).
    ``resnapshot``: one step's faulted run re-loads some tables (drawn from a generator of its
    own, ``{seed}/snapshot``, so the rest of the schedule is the seed's as without it).
    ``failovers`` (a MariaDB schedule): after some steps' faults the connection moves to the
    other server of the GTID pair (drawn from ``{seed}/failover``, likewise). ``rewinds``: some
    steps rewind a message sink (``{seed}/rewind``; not with ``failovers``: a rewind to a version
    from before a failover is refused by design); ``"any"``: any sink of the pipeline, Delta's
    included (the same draws where the pipeline has no Delta sink). ``retries``: a failed faulted
    run is delivered again from its record before the reruns (no draw: the same schedule).
    ``poison``: the workload writes rows too large for Kafka and NATS (no draw here either).
    ``envelope`` debezium: the Kafka sink writes Debezium's records (no draw).
    ``kafka_exactly_once`` False: the Kafka sink's idempotent producer (no draw)."""
    rng = random.Random(seed)
    if delivery == "executor":
        kinds = tuple(k for k in EXECUTOR_KINDS if k in kinds or kinds == FAULT_KINDS)
        sinks = tuple(s for s in sinks if s != "delta") or CORE_SINKS
    source = rng.choice(sorted(sources))
    chosen = [s for s in CORE_SINKS if s in sinks]
    delta_roll = rng.random()  # drawn whatever the subsets, so the rest of the draw stays the same
    with_delta = "delta" in sinks and (not chosen or delta_roll < delta_share)
    if with_delta:
        chosen += list(DELTA_SINKS)
    policy = rng.choice(("required", "all", "quorum"))
    optional: tuple[str, ...] = ()
    quorum = None
    if policy == "required" and len(chosen) > 1 and rng.random() < 0.5:
        optional = (rng.choice(chosen),)
    if policy == "quorum":
        quorum = max(1, len(chosen) - 1)
    usable = [k for k in kinds if sink_of(k) is None or sink_of(k) in chosen]
    if with_delta:  # a Delta run is slow: one fault, no zombie (two runs at once, both starting Spark)
        usable = [k for k in usable if k != "zombie"] or usable
    n_steps = 1 if with_delta else rng.randint(2, 4)
    steps = tuple(_step(rng, rng.choice(usable), with_delta, past_timeouts) for _ in range(n_steps))
    store = "postgres" if any(s.fault.endswith("_store") for s in steps) else "sqlite"
    # Delta: a few large sub-batches (each is a Delta commit per table, a second or more)
    max_events = rng.choice((30, 40)) if with_delta else rng.choice((4, 8, 16))
    sched = Schedule(seed, source, tuple(chosen), policy, optional, quorum, store, max_events, steps,
                     delivery, past_timeouts, retries=retries, poison=poison, envelope=envelope,
                     kafka_exactly_once=kafka_exactly_once, types=types, plugin=plugin)
    sched = with_resnapshot(sched) if resnapshot else sched
    sched = with_failovers(sched) if failovers else sched
    return with_rewinds(sched, every_sink=rewinds == "any") if rewinds and not failovers else sched


def with_rewinds(sched: Schedule, every_sink: bool = False) -> Schedule:
    """The schedule with rewinds after (or during) one or more of its steps (each step by a coin,
    one at least), each of a message sink of the pipeline (``every_sink``: of any sink), 1-6
    versions back; a zombie's step rewinds after it (its run is stopped at the moment)."""
    sinks = [s for s in sched.sinks if (every_sink or s in CORE_SINKS)
             and not (s == "kafka" and sched.envelope == "debezium")]
    if not sinks:
        return sched
    rng = random.Random(f"{sched.seed}/rewind")
    chosen = [i for i in range(len(sched.steps)) if rng.random() < 0.5] or [rng.randrange(len(sched.steps))]
    rewinds = tuple(Rewind(i, rng.choice(sinks), rng.randint(1, 6),
                           rng.random() < 0.5 and sched.steps[i].fault != "zombie") for i in chosen)
    return replace(sched, rewinds=rewinds)


def with_failovers(sched: Schedule) -> Schedule:
    """A MariaDB schedule with failovers after one or more of its steps (each step by a coin,
    one at least): the first moves the connection to the replica, the next back to the primary.
    A PostgreSQL schedule is left as it is: a promoted standby halts by design (no GTIDs)."""
    if sched.source != "mysql":
        return sched
    rng = random.Random(f"{sched.seed}/failover")
    steps = tuple(i for i in range(len(sched.steps)) if rng.random() < 0.5)
    return replace(sched, failover_steps=steps or (rng.randrange(len(sched.steps)),))


def with_resnapshot(sched: Schedule) -> Schedule:
    """The schedule with one step's faulted run triggered as a resnapshot of one to all tables."""
    rng = random.Random(f"{sched.seed}/snapshot")
    step = rng.randrange(len(sched.steps))
    tables = tuple(sorted(rng.sample(TABLES, rng.randint(1, len(TABLES)))))
    return replace(sched, resnapshot_step=step, resnapshot_tables=tables)


def sink_of(kind: str) -> str | None:
    """The sink a fault kind needs in the pipeline (a stall past the NATS window needs NATS)."""
    if kind == "restore_delta":
        return "delta_merge"
    for s in CORE_SINKS:
        if kind.endswith("_" + s):
            return s
    return None


def _step(rng: random.Random, fault: str, with_delta: bool = False, past_timeouts: bool = False) -> Step:
    if rng.random() < 0.7:
        moment: tuple[str, float] = ("commits", rng.randint(1, 2 if with_delta else 4))
        if with_delta and rng.random() < 0.5:  # (drawn for Delta schedules only: others keep theirs)
            moment = ("delta_commits", rng.randint(1, 6))
    else:
        moment = ("delay", round(rng.uniform(1.0, 4.0), 1))
    if fault == "task_stall":  # past the NATS window or the Kafka transaction timeout
        hold = max(NATS_WINDOW_S, KAFKA_TXN_TIMEOUT_MS / 1000) + round(rng.uniform(0.5, 3), 1)
    elif fault == "run_stall_nats":
        hold = NATS_WINDOW_S + round(rng.uniform(0.5, 3), 1)
    elif fault == "run_stall_kafka":
        hold = KAFKA_TXN_TIMEOUT_MS / 1000 + round(rng.uniform(0.5, 3), 1)
    elif past_timeouts and fault in ("stop_source", "stop_store"):  # one draw, as below
        hold = round(rng.uniform(0.5, 2 * HANG_TIMEOUT_S + 2), 1)
    else:
        hold = round(rng.uniform(0.5, 4), 1)
    writes = rng.choice((0, 0, rng.randint(3, 15)))
    wave = rng.randint(25, 40) if with_delta else rng.randint(15, 50)
    if fault in EXECUTOR_FAULTS:  # a run long enough that its task is still there at the moment
        wave *= 20
    return Step(fault, moment, hold, wave=wave, writes_between=writes,
                takeovers=rng.randint(1, 2) if fault == "zombie" else 0,
                target=_target(rng, fault))


def _target(rng: random.Random, fault: str) -> str:
    if fault == "retype_redis":
        return rng.choice(TABLES)
    if fault == "restore_delta":
        return f"{rng.choice(('merged', 'log'))}/{rng.choice(TABLES)}"
    return ""
