"""The compiled pgoutput rows (tidegate.native.rowcodec.PgOutputRows) against the Python path,
byte for byte, on generated messages: for each seed, transactions of Insert / Update / Delete
messages of a relation of every compiled kind (the text PostgreSQL's output functions write,
edges included: NaN, the infinities, -0, numerics ``Decimal`` writes in exponent form, BC and
infinite timestamps, escapes and non-ASCII), under REPLICA IDENTITY FULL and DEFAULT, with
key changes, no old tuple, unchanged TOAST values and a Relation message that changes the
columns between rows. Both reads must give the same items; the compiled path must have written
most rows and the Python path the rest. (tests/integration/test_pgoutput_compiled.py does the
same on a real server's WAL, with wal2json's read as a second oracle.)"""

from __future__ import annotations

import random
import uuid

import pytest
from tidegate.native import rowcodec
from tidegate.sources.postgres.pgoutput import UNCHANGED, PgOutputDecoder

from tests.integration.source_items import compiled_share
from tests.unit.test_pgoutput_messages import FakeServer, Host, delete, insert, reader, relation, tx, update

# (name, type OID, format_type name, a generator of its output text)
TYPES = [
    ("i2", 21, "smallint"), ("i4", 23, "integer"), ("i8", 20, "bigint"), ("o", 26, "oid"),
    ("n", 1700, "numeric"), ("n2", 1700, "numeric(12,2)"), ("r", 700, "real"),
    ("d", 701, "double precision"), ("b", 16, "boolean"), ("t", 25, "text"),
    ("vc", 1043, "character varying(40)"), ("c", 1042, "character(8)"),
    ("dt", 1082, "date"), ("tm", 1083, "time without time zone"), ("u", 2950, "uuid"), ("j", 3802, "jsonb"),
    ("ts", 1114, "timestamp without time zone"), ("tz", 1184, "timestamp with time zone"),
    ("iv", 1186, "interval"),
]


@pytest.fixture(autouse=True)
def _compiled_module():
    """These twins compare two paths: without the compiled module there is only one (fail, never skip)."""
    assert rowcodec is not None, "tidegate.native.rowcodec is not built (scripts/build_native.py)"


class PythonRowsReader(PgOutputDecoder):
    use_compiled = False


def value(rng: random.Random, name: str) -> str | None:
    def text(k):
        return "".join(rng.choice("ab \"\\'\n\t\x01\x1fé€😀中/") for _ in range(rng.randint(0, k)))

    def stamp(zone):
        if rng.random() < 0.1:
            return rng.choice(["infinity", "-infinity", "0044-03-15 12:00:00 BC"])
        return (f"{rng.randint(1, 9999):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
                + rng.choice(["", ".5", ".123456", ".000001"])
                + (rng.choice(["+00", "+05:30", "-08"]) if zone else ""))

    if rng.random() < 0.08:
        return None
    edge = rng.random() < 0.12
    return {
        "i2": lambda: str(rng.choice([-2**15, 0, 2**15 - 1, rng.randint(-99, 99)])),
        "i4": lambda: str(rng.randint(-2**31, 2**31 - 1)),
        "i8": lambda: str(rng.choice([-2**63, 2**63 - 1, rng.randint(-10**12, 10**12)])),
        "o": lambda: str(rng.choice([0, 4294967295, 42])),
        "n": lambda: rng.choice(["NaN", "0.000000100", "0.0000001", "-0.000001", "0.0", "1E+2", "Infinity",
                                 "123456789012345678901234567890"]) if edge
        else f"{rng.uniform(-1e5, 1e5):.6f}",
        "n2": lambda: rng.choice(["0.00", "-0.01", "9999999999.99"]) if edge
        else f"{rng.uniform(-1e6, 1e6):.2f}",
        "r": lambda: rng.choice(["NaN", "-0", "Infinity", "1e-05", "3.4e+38", "-Infinity"]) if edge
        else repr(rng.uniform(-1e6, 1e6))[:9],
        "d": lambda: rng.choice(["NaN", "-0", "-Infinity", "1e-07", "1e+16", "1e+300", "0.3333333333333333"])
        if edge
        else repr(rng.uniform(-1e9, 1e9)),
        "b": lambda: rng.choice(["t", "f"]),
        "t": lambda: text(300), "vc": lambda: text(40), "c": lambda: text(8).ljust(8)[:8],
        "dt": lambda: rng.choice(["2024-02-29", "0001-01-01", "infinity", "0044-03-15 BC"]),
        "tm": lambda: rng.choice(["00:00:00", "23:59:59.999999", "12:30:00.5"]),
        "u": lambda: str(uuid.UUID(int=rng.getrandbits(128))),
        "j": lambda: rng.choice(['{"a": [1, 2.5, "é"]}', "[]", "null", '"x\\ny"']),
        "ts": lambda: stamp(False), "tz": lambda: stamp(True),
        "iv": lambda: rng.choice(["1 day 02:03:04.5", "-3 mons", "00:00:00"]),
    }[name]()


def messages(rng: random.Random) -> list[tuple[int, bytes]]:
    """Transactions on two relations: 7 (REPLICA IDENTITY FULL, every kind), 8 (DEFAULT, id and
    text, some values unchanged TOAST); a Relation message adds a column to 8 midway."""
    cols = [(True, "id", 20, -1)] + [(True, n, oid, -1) for n, oid, _ in TYPES]
    full = relation(7, "s", "full_t", "f", cols)
    dflt = [(True, "id", 20, -1), (False, "t", 25, -1)]
    msgs: list[tuple[int, bytes]] = [(0x10, full), (0x11, relation(8, "s", "dflt", "d", dflt))]
    rows: dict[int, list] = {}
    lsn, xid = 0x1000, 1
    for n in range(30):
        if n == 20:
            dflt = [*dflt, (False, "w", 23, -1)]
            msgs.append((lsn, relation(8, "s", "dflt", "d", dflt)))
            lsn += 8
        changes = []
        for _ in range(rng.randint(1, 25)):
            roll = rng.random()
            key = rng.choice(list(rows)) if rows else None
            new = [str(key or rng.randrange(10**9))] + [value(rng, c[0]) for c in TYPES]
            if roll < 0.45 or key is None:
                new[0] = str(rng.randrange(10**9))
                rows[int(new[0])] = new
                changes += [(lsn, insert(7, new)),
                            (lsn + 1, insert(8, [new[0], new[9]] + ["7"] * (len(dflt) - 2)))]
            elif roll < 0.75:
                old = rows[key]
                if rng.random() < 0.15:  # a key change
                    new[0] = str(rng.randrange(10**9))
                    del rows[key]
                rows[int(new[0])] = new
                changes.append((lsn, update(7, new, old=old, kind=b"O")))
                text = UNCHANGED if rng.random() < 0.3 else new[9]
                tail = ["7"] * (len(dflt) - 2)
                if new[0] != old[0]:
                    old_key = [old[0], None, *[None] * len(tail)]
                    changes.append((lsn + 1, update(8, [new[0], text, *tail], old=old_key)))
                else:
                    changes.append((lsn + 1, update(8, [new[0], text, *tail])))
            else:
                old = rows.pop(key)
                changes += [(lsn, delete(7, old, kind=b"O")),
                            (lsn + 1, delete(8, [old[0]] + [None] * (len(dflt) - 1)))]
            lsn += 2 if rng.random() < 0.7 else 0  # rows of one record share an LSN
        end = lsn + 0x40
        msgs += tx(lsn + 0x20, end, *changes, xid=xid)
        lsn, xid = end + 0x10, xid + 1
    return msgs


class TypedServer(FakeServer):
    NAMES = {**FakeServer.NAMES, **{(oid, -1): name for _, oid, name in TYPES}, (20, -1): "bigint"}


def test_compiled_rows_are_the_python_rows_on_generated_messages():
    shares = []
    for seed in range(12):
        msgs = messages(random.Random(seed))
        host = Host()
        host.server = TypedServer()
        upto = msgs[-1][0] + 0x100
        compiled = list(reader(0, upto, host).run(iter(msgs)))
        r = PythonRowsReader(host, reader(0, upto).start_lsn, reader(0, upto).upto)
        shares.append(compiled_share(list(r.run(iter(msgs))), compiled))
    assert 0.3 <= min(shares) and max(shares) < 1.0, shares
