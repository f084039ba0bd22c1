"""Sink write throughput: events/s for N events per sink, and the Kafka exactly-once overhead.

    eval "$(scripts/services env)"
    .venv/bin/python benchmarks/sink_write.py                # 200k events per sink
    .venv/bin/python benchmarks/sink_write.py --events 50000 --sinks kafka --repeat 3 --json

Every sink gets the same pre-built events (serialized once, as in a real run), cut into
sub-batches of ``--batch`` events at transaction boundaries, through the public Sink API
(``open``, ``deliver`` per sub-batch, ``close``). The clock covers the deliveries (every
sub-batch acknowledged durably: Kafka acks=all / committed transaction, JetStream acks, Redis
EXEC), not ``open`` and not a small warm-up sub-batch (connections, producer id, metadata).
Kafka is measured in both modes in the same run; the exactly-once overhead
is ``(eos_time / idempotent_time - 1) * 100`` %. With ``--repeat`` the best time of each sink
is used. Topics, streams and keys are unique per run and deleted afterwards (``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "include"))

from tidegate.batching import SubBatch, Transaction  # noqa: E402
from tidegate.connections import get_connection  # noqa: E402
from tidegate.events import ChangeEvent  # noqa: E402
from tidegate.sinks import make_sink  # noqa: E402
from tidegate.sinks.kafka.spec import KafkaSinkSpec  # noqa: E402
from tidegate.sinks.nats.spec import NatsSinkSpec  # noqa: E402
from tidegate.sinks.redis.spec import RedisSinkSpec  # noqa: E402
from tidegate.sources.mysql.position import BinlogPosition  # noqa: E402
from tidegate.spec import BatchSpec, PipelineSpec, SourceSpec  # noqa: E402

FILE = "mysql-bin.000001"


def build_batches(pipeline: str, n_events: int, batch: int, rows_per_tx: int, pad: int,
                  first_tx: int = 1) -> list[SubBatch]:
    txs: list[Transaction] = []
    n = 0
    tx_no = first_tx - 1
    while n < n_events:
        tx_no += 1
        rows = min(rows_per_tx, n_events - n)
        evs = []
        for i in range(rows):
            seq = n + i
            last = i == rows - 1
            end = BinlogPosition(FILE, 4 + tx_no * 10_000, server_id=1)
            evs.append(ChangeEvent.build(
                tenant="bench", pipeline=pipeline, connector="mysql", db="shop", schema="shop",
                table="orders", op="u", before={"id": seq % 10_000, "status": "new"},
                after={"id": seq % 10_000, "status": "paid", "seq": seq, "note": "n" * pad},
                key={"id": seq % 10_000}, tx_id=f"0-1-{tx_no}", event_id=f"{FILE}:{tx_no * 10_000 + i}:0",
                position={"file": FILE, "pos": tx_no * 10_000 + i}, ts_ms=1_764_000_000_000 + tx_no,
                total_order=i + 1, data_collection_order=i + 1, tx_end=last,
                end_position=end if last else None))
        for e in evs:
            _ = e.value, e.key_bytes  # serialize once, outside the clock
        txs.append(Transaction(f"0-1-{tx_no}", evs[-1].end_position, tuple(evs)))
        n += rows
    out, cur, cnt = [], [], 0
    for tx in txs:
        cur.append(tx)
        cnt += len(tx.events)
        if cnt >= batch:
            out.append(SubBatch(len(out) + 1, tuple(cur)))
            cur, cnt = [], 0
    if cur:
        out.append(SubBatch(len(out) + 1, tuple(cur)))
    return out


def run_sink(label: str, spec: KafkaSinkSpec | NatsSinkSpec | RedisSinkSpec, pipeline: str,
             batches: list[SubBatch],
             warmup: list[SubBatch] = ()) -> dict:
    pspec = PipelineSpec(pipeline=pipeline, source=SourceSpec("mysql", "cdc_mysql"), sinks=(spec,),
                         batch=BatchSpec(max_events=max(b.event_count for b in batches)), tenant="bench")
    conn = get_connection(spec.conn_id)
    sink = make_sink(pspec, spec, conn)
    try:
        sink.open()
        for b in warmup:  # connections, producer id, first metadata: outside the clock
            sink.deliver(b)
        t0 = time.perf_counter()
        for b in batches:
            sink.deliver(b)
        dt = time.perf_counter() - t0
    finally:
        sink.close()
    n = sum(b.event_count for b in batches)
    size = sum(b.byte_size for b in batches)
    return {"sink": label, "events": n, "seconds": round(dt, 3), "events_per_s": round(n / dt),
            "mb_per_s": round(size / dt / 1e6, 1), "sub_batches": len(batches)}


def cleanup(run: str, kinds: set[str], created: dict[str, list[str]]) -> None:
    if "kafka" in kinds and created.get("kafka"):
        from confluent_kafka.admin import AdminClient

        conn = get_connection("cdc_kafka")
        admin = AdminClient({"bootstrap.servers": conn.extra["bootstrap.servers"]})
        for f in admin.delete_topics(created["kafka"], operation_timeout=30).values():
            try:
                f.result(30)
            except Exception:  # noqa: BLE001 - best effort
                pass
    if "redis" in kinds and created.get("redis"):
        import redis

        c = get_connection("cdc_redis")
        r = redis.Redis(host=c.host, port=c.port, username=c.login, password=c.password)
        r.delete(*created["redis"])
        r.close()
    if "nats" in kinds and created.get("nats"):
        import nats

        c = get_connection("cdc_nats")

        async def drop():
            nc = await nats.connect(f"nats://{c.host}:{c.port}", user=c.login, password=c.password)
            for s in created["nats"]:
                try:
                    await nc.jetstream().delete_stream(s)
                except Exception:  # noqa: BLE001
                    pass
            await nc.close()

        asyncio.run(drop())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=50_000, help="events per sub-batch (max_events)")
    ap.add_argument("--rows-per-tx", type=int, default=5)
    ap.add_argument("--pad", type=int, default=200, help="extra characters per row")
    ap.add_argument("--sinks", default="kafka,nats,redis")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--envelope", choices=("tidegate", "debezium"), default="tidegate",
                    help="the Kafka sink's envelope (debezium: Debezium's records and tombstones)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    kinds = {s.strip() for s in args.sinks.split(",") if s.strip()}
    run = "bench_" + uuid.uuid4().hex[:8]
    t0 = time.perf_counter()
    batches = build_batches(run, args.events, args.batch, args.rows_per_tx, args.pad)
    warmup = build_batches(run, 2 * args.rows_per_tx, args.batch, args.rows_per_tx, args.pad,
                           first_tx=10_000_000)  # other idempotency keys: no NATS duplicates
    n = sum(b.event_count for b in batches)
    avg = sum(b.byte_size for b in batches) / n
    print(f"built {n} events ({avg:.0f} B each) in {len(batches)} sub-batches in "
          f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)

    created: dict[str, list[str]] = {"kafka": [], "nats": [], "redis": []}
    results: dict[str, dict] = {}

    def best(label: str, make_spec) -> None:
        for i in range(args.repeat):
            spec, pipeline = make_spec(i)
            r = run_sink(label, spec, pipeline, batches, warmup)
            print(f"  {label:<18} run {i + 1}: {r['events_per_s']:>9,} events/s ({r['seconds']}s)",
                  file=sys.stderr)
            if label not in results or r["seconds"] < results[label]["seconds"]:
                results[label] = r

    try:
        if "kafka" in kinds:
            def kafka_spec(eos: bool):
                def make(i: int):
                    p = f"{run}_{'eos' if eos else 'idem'}_{i}"
                    created["kafka"] += [f"{p}.shop.orders", f"_ckpt_{p}"]
                    # A literal topic: open() creates it, outside the clock.
                    return KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka",
                                         topic=f"{p}.shop.orders", exactly_once=eos, partitions=3,
                                         checkpoint_topic=f"_ckpt_{p}", envelope=args.envelope), p
                return make

            for i in range(args.repeat):  # interleave the two modes so drift hits both alike
                for eos in (False, True):
                    label = "kafka_exactly_once" if eos else "kafka_idempotent"
                    spec, pipeline = kafka_spec(eos)(i)
                    r = run_sink(label, spec, pipeline, batches, warmup)
                    print(f"  {label:<18} run {i + 1}: {r['events_per_s']:>9,} events/s ({r['seconds']}s)",
                          file=sys.stderr)
                    if label not in results or r["seconds"] < results[label]["seconds"]:
                        results[label] = r
        if "nats" in kinds:
            def nats_spec(i: int):
                s = f"{run.upper()}_{i}"
                created["nats"].append(s)
                return NatsSinkSpec(id="bus", kind="nats", conn_id="cdc_nats", stream=s,
                                subject="{pipeline}.{schema}.{table}", max_in_flight=1000), f"{run}_n{i}"
            best("nats", nats_spec)
        if "redis" in kinds:
            def redis_spec(i: int):
                p = f"{run}_r{i}"
                created["redis"] += [f"{p}:shop.orders", f"tidegate:checkpoint:{p}::sink::cache"]
                return RedisSinkSpec(id="cache", kind="redis", conn_id="cdc_redis",
                                stream="{pipeline}:{schema}.{table}"), p
            best("redis", redis_spec)
    finally:
        if not args.keep:
            cleanup(run, kinds, created)

    out = {"events": n, "event_bytes": round(avg), "sub_batch": args.batch, "results": list(results.values())}
    if "kafka_idempotent" in results and "kafka_exactly_once" in results:
        idem, eos = results["kafka_idempotent"]["seconds"], results["kafka_exactly_once"]["seconds"]
        out["kafka_exactly_once_overhead_pct"] = round((eos / idem - 1) * 100, 1)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{n} events of {avg:.0f} B, sub-batches of {args.batch}")
        print(f"{'sink':<20}{'events/s':>12}{'MB/s':>8}{'seconds':>10}")
        for r in results.values():
            print(f"{r['sink']:<20}{r['events_per_s']:>12,}{r['mb_per_s']:>8}{r['seconds']:>10}")
        if "kafka_exactly_once_overhead_pct" in out:
            pct = out["kafka_exactly_once_overhead_pct"]
            print(f"Kafka exactly-once overhead vs idempotent: {pct:+.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
