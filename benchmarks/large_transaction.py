"""One source transaction larger than memory, delivered by ``tidegate run``: events/s and the
peak RSS of every process of the run.

    PATH="$PWD/.venv/bin:$PATH" .venv/bin/python benchmarks/large_transaction.py \\
        [--rows 5000000] [--source mysql|postgres] [--sinks kafka,nats,redis]

One table (id, v, s VARCHAR(40)); ``--rows`` rows inserted by one INSERT ... SELECT, so one
source transaction. One pipeline per sink (Kafka exactly-once, NATS JetStream, Redis Streams),
each placed at the head before the write, with the default batch limits (50,000 events,
64 MiB): the transaction passes them and is kept on local disk while it is delivered
(docs/performance.md, "A transaction larger than memory"). Per pipeline: the run's wall time and
events/s, its sub-batches (1: one Kafka transaction, one MULTI/EXEC), the peak RSS (VmHWM) of
the run's process and of each child process (the binlog reader), the spill directory's peak
use, and what the target holds afterwards, counted: Kafka through a read_committed consumer
(records and the sum of their ids), NATS by the stream's count for the subject, Redis by XLEN.

The servers: ``scripts/services up mysql postgres kafka nats redis``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

from servers import admin_connection, bench_table, services_env  # benchmarks/servers.py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "include"))
BIN = Path(sys.executable).parent

SINKS = {
    "kafka": 'kind: kafka, conn_id: cdc_kafka, topic: "{pipeline}.{table}", exactly_once: true',
    "nats": 'kind: nats, conn_id: cdc_nats, stream: "LT_{name}", subject: "{pipeline}.{table}"',
    "redis": 'kind: redis, conn_id: cdc_redis, stream: "{pipeline}:{table}"',
}


def write_transaction(source: str, env: dict, schema: str, rows: int) -> float:
    """``rows`` rows in one statement, one transaction; returns its seconds."""
    conn = admin_connection(source, env)
    t0 = time.monotonic()
    with conn.cursor() as c:
        if source == "mysql":
            c.execute(f"INSERT INTO {schema}.t SELECT seq, seq % 97, CONCAT('status-', seq % 13, "
                      f"'-padding-padding') FROM {schema}.seq_1_to_{rows}")
        else:
            c.execute(f"INSERT INTO {schema}.t SELECT g, g % 97, 'status-' || (g % 13) || "
                      f"'-padding-padding' FROM generate_series(1, {rows}) g")
    conn.close()
    return time.monotonic() - t0


class PeakRss:
    """Polls the VmHWM (the kernel's own peak resident set) of a process and its descendants,
    and the size of a directory, until stopped."""

    def __init__(self, pid: int, spill_dir: Path):
        self.pid, self.spill_dir = pid, spill_dir
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (command, kB)
        self.spill_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        kids: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError):
                    continue
                kids.setdefault(ppid, []).append(int(entry.name))
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo += kids.get(p, [])
        return out

    def _poll(self) -> None:
        while not self._stop.is_set():
            for p in self._tree():
                try:
                    status = Path(f"/proc/{p}/status").read_text()
                    cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
                except OSError:
                    continue
                hwm = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmHWM")), 0)
                if hwm >= self.peaks.get(p, ("", 0))[1]:
                    self.peaks[p] = (cmd, hwm)
            self.spill_peak = max(self.spill_peak, sum(f.stat().st_size for f in self.spill_dir.iterdir())
                                  if self.spill_dir.exists() else 0, self._unlinked_spill())
            self._stop.wait(0.05)

    def _unlinked_spill(self) -> int:
        """Spill files are unlinked at once: their size shows in the run's open descriptors."""
        total = 0
        for p in self._tree():
            try:
                fds = list(Path(f"/proc/{p}/fd").iterdir())
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(fd)
                    if target.startswith(str(self.spill_dir)):
                        total += fd.stat().st_size
                except OSError:
                    continue
        return total

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def count_kafka(env: dict, topic: str) -> tuple[int, int]:
    """(records, sum of their ids) of ``topic`` through a read_committed consumer."""
    import orjson
    from confluent_kafka import Consumer, TopicPartition
    from tidegate.connections import get_connection

    conn = get_connection("cdc_kafka", env)
    c = Consumer({"bootstrap.servers": conn.extra["bootstrap.servers"], "group.id": uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    n = total = 0
    left = set(parts)
    while left:
        for m in c.consume(10000, timeout=5):
            if m.error():
                if m.error().code() == -191:  # _PARTITION_EOF
                    left.discard(m.partition())
                    continue
                raise SystemExit(f"consuming {topic}: {m.error()}")
            n += 1
            total += orjson.loads(m.key())["id"]
    c.close()
    return n, total


def count_nats(env: dict, stream: str, subject: str) -> int:
    import asyncio

    import nats
    from tidegate.connections import get_connection

    conn = get_connection("cdc_nats", env)

    async def go() -> int:
        nc = await nats.connect(f"nats://{conn.host}:{conn.port}", user=conn.login, password=conn.password)
        info = await nc.jetstream().stream_info(stream, subjects_filter=subject)
        await nc.close()
        return (info.state.subjects or {}).get(subject, 0)

    return asyncio.run(go())


def count_redis(env: dict, key: str) -> int:
    import redis
    from tidegate.connections import get_connection

    conn = get_connection("cdc_redis", env)
    return redis.Redis(host=conn.host, port=conn.port, username=conn.login, password=conn.password).xlen(key)


def run(name: str, env: dict, log: Path, spill: Path) -> dict:
    """``tidegate run name``: its report, wall time and peaks."""
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen([str(BIN / "tidegate"), "run", name], env=env, stdout=subprocess.PIPE,
                                stderr=out, text=True)
        peaks = PeakRss(proc.pid, spill)
        stdout, _ = proc.communicate()
        peaks.stop()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"tidegate run {name} failed; see {log}")
    report = json.loads(stdout[stdout.index("{"):])
    main_kb = peaks.peaks.pop(proc.pid, ("", 0))[1]
    child = max(((kb, cmd) for cmd, kb in peaks.peaks.values()), default=(0, ""))
    return {"wall": wall, "report": report, "main_kb": main_kb, "child": child, "spill": peaks.spill_peak}


def one_sink(sink: str, a: argparse.Namespace, env: dict, base: Path, spill: Path) -> None:
    name = f"lt_{sink}_{uuid.uuid4().hex[:6]}"
    (base / f"{name}.yaml").write_text(textwrap.dedent(f"""\
        pipeline: {name}
        source: {bench_table(a.source, env, name, 47800)}
        sinks:
          - {{id: out, {SINKS[sink].replace("{name}", name)}}}
        """))
    run(name, env, base / f"{name}-place.log", spill)  # places the pipeline at the head
    wrote = write_transaction(a.source, env, name, a.rows)
    r = run(name, env, base / f"{name}.log", spill)
    rep = r["report"]
    events = rep.get("events") or sum(s.get("events", 0) for s in rep.get("sinks", {}).values())
    if sink == "kafka":
        n, ids = count_kafka(env, f"{name}.t")
        held = f"{n} records, ids sum {'ok' if ids == a.rows * (a.rows + 1) // 2 else 'WRONG'}"
    elif sink == "nats":
        n = count_nats(env, f"LT_{name}", f"{name}.t")
        held = f"{n} messages"
    else:
        n = count_redis(env, f"{name}:t")
        held = f"{n} entries"
    kb, cmd = r["child"]
    other = f"{kb / 1024:.0f} ({cmd.split()[2] if len(cmd.split()) > 2 else cmd[:30]})" if kb else "-"
    print(f"| {a.source} | {sink} | {a.rows} | {wrote:.1f} | {r['wall']:.1f} | {events / r['wall']:,.0f} "
          f"| {rep.get('sub_batches')} | {r['main_kb'] / 1024:.0f} | {other} | {r['spill'] / 2**20:.0f} "
          f"| {held}{'' if n == a.rows else ' MISMATCH'} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--source", choices=("mysql", "postgres"), default="mysql")
    ap.add_argument("--sinks", default="kafka,nats,redis")
    a = ap.parse_args()
    env = dict(os.environ, **services_env())
    base = Path(tempfile.mkdtemp(prefix="tidegate-lt-"))
    spill = base / "spill"
    spill.mkdir()
    env.update(TIDEGATE_CHECKPOINT_STORE=f"sqlite:///{base / 'store.sqlite'}",
               TIDEGATE_PIPELINES_DIR=str(base), TIDEGATE_SPILL_DIR=str(spill))
    os.environ.update(env)
    print(f"one transaction of {a.rows} rows from {a.source}; load average {os.getloadavg()[0]:.1f}; "
          f"logs in {base}")
    print("| source | sink | rows | write s | run s | events/s | sub-batches | run peak RSS MiB "
          "| child peak RSS MiB | spill peak MiB | target holds |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for sink in a.sinks.split(","):
        one_sink(sink, a, env, base, spill)
    shutil.rmtree(spill, ignore_errors=True)


if __name__ == "__main__":
    main()
