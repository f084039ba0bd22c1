"""Generated backlogs for the Debezium comparison (docs/compat.md, "Generated backlogs").

A seed (``random.Random(seed)``) draws, per source, tables from a catalogue of column types
(type modifiers, defaults, NOT NULL, key shapes; on PostgreSQL also domains, enums, arrays and
the REPLICA IDENTITY setting) and a workload over them: multi-row inserts of edge values per
type, updates that change a column, change nothing or change the key, deletes, and
transactions over two tables. Several seeds make one backlog (their tables are named
``g<seed>_<n>``), so that one Debezium capture compares them all. The result has the attributes
of ``tests.compat.backlogs`` that the harness reads, so it runs through the same comparison.

``python -m tests.compat.generator SOURCE SEED`` prints a seed's statements.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation

from tests.compat import backlogs

# --------------------------------------------------------------------------- value catalogue
# A column type: its SQL, and a function drawing a SQL literal of a value of that type (edge
# values first among the choices, so that every seed meets some of them).

Draw = Callable[[random.Random], str]


def _pick(*literals: str, also: Draw | None = None) -> Draw:
    def draw(r: random.Random) -> str:
        if also is not None and r.random() < 0.4:
            return also(r)
        return r.choice(literals)

    return draw


def _int_range(lo: int, hi: int) -> Draw:
    return _pick(str(lo), str(hi), "0", "1", "-1" if lo < 0 else "2", also=lambda r: str(r.randint(lo, hi)))


def _decimal(p: int, s: int) -> Draw:
    def draw(r: random.Random) -> str:
        whole = r.randint(0, p - s) if p > s else 0
        digits = "".join(r.choice("0123456789") for _ in range(whole)) or "0"
        frac = "".join(r.choice("0123456789") for _ in range(s))
        shape = r.random()
        if shape < 0.2 and s:  # trailing zeros
            frac = frac[: r.randint(0, s)].ljust(s, "0")
        elif shape < 0.3:  # the largest value of the type
            digits, frac = "9" * (p - s) or "0", "9" * s
        elif shape < 0.35:
            digits, frac = "0", "0" * s
        sign = "-" if r.random() < 0.3 else ""
        return f"{sign}{digits}.{frac}" if s else f"{sign}{digits}"

    return draw


def _text(n: int) -> Draw:
    samples = ["''", "'a'", "'héllo wörld ✓'", "'emoji 🌊'", "'it''s'", "'back\\\\slash'", "' spaced '"]

    def draw(r: random.Random) -> str:
        if r.random() < 0.5:
            s = r.choice(samples)
            return s if len(s) - 2 <= n else "'x'"
        k = r.randint(0, min(n, 40))
        return "'" + "".join(r.choice("abcdefghijklmnopqrstuvwxyz0123456789-_") for _ in range(k)) + "'"

    return draw


def _hex(n_lo: int, n_hi: int, form: Callable[[str], str], high: str = "0123456789abcdef") -> Draw:
    """Bytes as hex; ``high``: the digits a byte's high half is drawn from."""
    def draw(r: random.Random) -> str:
        k = r.randint(n_lo, n_hi)
        return form("".join(r.choice(high) + r.choice("0123456789abcdef") for _ in range(k)))

    return draw


def _toastable(small: Draw, form: Callable[[str], str], chance: float = 0.15) -> Draw:
    """Mostly ``small``'s values, sometimes one of 3-9 kB of random letters and digits: past
    PostgreSQL's TOAST threshold (about 2 kB) even compressed, so it is stored out of line and an
    update that leaves it alone logs it as unchanged."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

    def draw(r: random.Random) -> str:
        if r.random() < chance:
            return form("".join(r.choices(alphabet, k=r.randint(3000, 9000))))
        return small(r)

    return draw


def _stamp(r: random.Random, lo: int, hi: int) -> str:
    return (
        f"{r.randint(lo, hi):04d}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} "
        f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}"
    )


def _bits(n: int, form: Callable[[str], str]) -> Draw:
    return _pick(form("0" * n), form("1" * n), also=lambda r: form("".join(r.choice("01") for _ in range(n))))


@dataclass(frozen=True)
class ColumnType:
    sql: str
    draw: Draw
    key: bool = False  # may be part of a primary key
    default_ok: bool = True  # may carry a DEFAULT drawn from its own values
    default: Draw | None = None  # how a DEFAULT is drawn, if not as the values are
    not_null_ok: bool = True  # may be NOT NULL


def _mariadb_types(r: random.Random) -> list[ColumnType]:
    p = r.randint(1, 65)
    s = r.randint(0, min(p, 30))
    fsp = r.randint(0, 6)
    frac = (lambda r: "." + "".join(r.choice("0123456789") for _ in range(fsp))) if fsp else (lambda r: "")
    n = r.randint(1, 64)
    day = _pick(
        "'1000-01-01'",
        "'9999-12-31'",
        "'1969-12-31'",
        "'1970-01-01'",
        "'2024-02-29'",
        also=lambda r: f"'{r.randint(1000, 9999)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}'",
    )
    # zero dates and zero parts, which MariaDB's default sql_mode takes. Not invalid ones (a 30th
    # of February, under ALLOW_INVALID_DATES): Debezium's connector stops on them; nor year 0 with
    # a month and day: Debezium's snapshot moves it to 2000 (docs/compat.md)
    odd_day = _pick("'0000-00-00'", "'2024-00-00'", "'2023-11-00'", "'0000-00-15'")
    return [
        ColumnType("TINYINT", _int_range(-128, 127), key=True),
        ColumnType("TINYINT UNSIGNED", _int_range(0, 255), key=True),
        ColumnType("SMALLINT", _int_range(-32768, 32767), key=True),
        ColumnType("SMALLINT UNSIGNED", _int_range(0, 65535)),
        ColumnType("MEDIUMINT", _int_range(-8388608, 8388607)),
        ColumnType("MEDIUMINT UNSIGNED", _int_range(0, 16777215)),
        ColumnType("INT", _int_range(-2147483648, 2147483647), key=True),
        ColumnType("INT UNSIGNED", _int_range(0, 4294967295)),
        ColumnType("BIGINT", _int_range(-9223372036854775808, 9223372036854775807), key=True),
        ColumnType("BIGINT UNSIGNED", _int_range(0, 18446744073709551615), key=True),
        ColumnType("BOOLEAN", _pick("TRUE", "FALSE")),
        ColumnType(f"DECIMAL({p},{s})", _decimal(p, s), key=True),
        ColumnType(
            "FLOAT",
            _pick(
                "0", "-0e0", "1.5", "-3.25", "3.4e38", "1e-38", also=lambda r: f"{r.uniform(-1e6, 1e6):.3f}"
            ),
            # A DEFAULT of more than 6 significant digits differs by nature (docs/compat.md: the
            # catalog keeps 6, Debezium reads an ALTER's text; seed 129): not drawn.
            default=_pick(
                "0", "-0e0", "1.5", "-3.25", "3.4e38", "1e-38", also=lambda r: f"{r.uniform(-1e6, 1e6):.6g}"
            ),
        ),
        ColumnType(
            "DOUBLE",
            _pick(
                "0",
                "-0e0",
                "2.718281828459045",
                "-1e300",
                "1e-300",
                "1.7976931348623157e308",
                also=lambda r: repr(r.uniform(-1e12, 1e12)),
            ),
        ),
        ColumnType(
            "FLOAT(7,3)", _pick("1234.567", "-0.001", "0", also=lambda r: f"{r.uniform(-9999, 9999):.3f}")
        ),
        ColumnType(f"BIT({n})", _bits(n, lambda b: f"b'{b}'")),
        ColumnType("DATE", day, key=True),
        ColumnType("DATE", lambda r: odd_day(r) if r.random() < 0.3 else day(r), default_ok=False),
        ColumnType(
            f"DATETIME({fsp})",
            lambda r: (odd_day(r)[:-1] + " 12:34:56'" if r.random() < 0.3
                       else f"'{_stamp(r, 1000, 9999)}{frac(r)}'"),
            default_ok=False,
        ),
        ColumnType(
            f"TIMESTAMP({fsp})",
            _pick("'0000-00-00 00:00:00'", also=lambda r: f"'{_stamp(r, 1971, 2037)}{frac(r)}'"),
            default_ok=False,
        ),
        ColumnType(
            f"TIME({fsp})",
            _pick(
                "'-838:59:59'",
                "'838:59:59'",
                "'00:00:00'",
                "'23:59:59'",
                "'-00:00:01'",
                also=lambda r: (
                    f"'{r.randint(-837, 837)}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}{frac(r)}'"
                ),
            ),
            # NOT NULL with a value beyond 24:00: Debezium's time.precision.mode=connect writes
            # null into the required field and its connector stops (docs/compat.md)
            not_null_ok=False,
        ),
        ColumnType(
            f"DATETIME({fsp})",
            _pick(
                "'1000-01-01 00:00:00'",
                "'9999-12-31 23:59:59'",
                "'1969-12-31 23:59:59'",
                "'1970-01-01 00:00:00'",
                also=lambda r: f"'{_stamp(r, 1000, 9999)}{frac(r)}'",
            ),
            key=True,
        ),
        ColumnType(
            f"TIMESTAMP({fsp})",
            _pick(
                "'1970-01-01 00:00:01'",
                "'2038-01-19 03:14:07'",
                also=lambda r: f"'{_stamp(r, 1971, 2037)}{frac(r)}'",
            ),
        ),
        ColumnType("YEAR", _pick("1901", "2155", "2000", also=lambda r: str(r.randint(1901, 2155)))),
        ColumnType(f"CHAR({(c := r.randint(1, 20))})", _text(c), key=True),
        ColumnType(f"VARCHAR({(v := r.randint(1, 100))})", _text(v), key=True),
        ColumnType("TEXT", _toastable(_text(200), lambda t: f"'{t}'"), default_ok=False),
        # other character sets than the table's utf8mb4: values each can hold
        ColumnType(f"VARCHAR({r.randint(12, 60)}) CHARACTER SET latin1",
                   _pick("''", "'café crème'", "'Ñandú ÿ ß'", "'it''s'", "'plain'")),
        ColumnType(f"CHAR({r.randint(12, 30)}) CHARACTER SET cp1251",
                   _pick("'Привет, мир'", "'ёЁ №'", "'abc'")),
        ColumnType("TEXT CHARACTER SET utf16", _pick("'héllo ✓'", "'emoji 🌊'", "''"), default_ok=False),
        ColumnType(f"VARCHAR({r.randint(12, 40)}) CHARACTER SET sjis",
                   _pick("'日本語テキスト'", "'ｶﾅ'", "'x'")),
        # A binary DEFAULT's bytes from 0x80 up differ by nature (docs/compat.md): not drawn.
        ColumnType(f"BINARY({r.randint(1, 8)})", _hex(1, 1, lambda h: f"X'{h}'"),
                   default=_hex(1, 1, lambda h: f"X'{h}'", high="01234567")),
        ColumnType(f"VARBINARY({r.randint(1, 16)})", _hex(0, 1, lambda h: f"X'{h}'"),
                   default=_hex(0, 1, lambda h: f"X'{h}'", high="01234567")),
        ColumnType("BLOB", _toastable(_hex(0, 30, lambda h: f"X'{h}'"), lambda t: f"'{t}'"),
                   default_ok=False),
        ColumnType("ENUM('red','green','blue')", _pick("'red'", "'green'", "'blue'")),
        ColumnType("SET('a','b','c')", _pick("''", "'a'", "'a,c'", "'a,b,c'")),
        ColumnType(
            "JSON",
            _pick("'{}'", "'[]'", '\'{"k": [1, 2.5, "é", null]}\'', "'\"s\"'", "'12'"),
            default_ok=False,
        ),
    ]


def _postgres_types(r: random.Random, schema: str) -> list[ColumnType]:
    p = r.randint(1, 38)
    s = r.randint(0, p)
    tp = r.randint(0, 6)
    frac = (lambda r: "." + "".join(r.choice("0123456789") for _ in range(tp))) if tp else (lambda r: "")
    n = r.randint(1, 40)

    def ts(lo: int, hi: int) -> Draw:
        return lambda r: f"'{_stamp(r, lo, hi)}{frac(r)}'"

    return [
        ColumnType("SMALLINT", _int_range(-32768, 32767), key=True),
        ColumnType("INTEGER", _int_range(-2147483648, 2147483647), key=True),
        ColumnType("BIGINT", _int_range(-9223372036854775808, 9223372036854775807), key=True),
        ColumnType("BOOLEAN", _pick("TRUE", "FALSE")),
        ColumnType(f"NUMERIC({p},{s})", _decimal(p, s), key=True),
        ColumnType(
            "NUMERIC",
            _pick(
                "0",
                "1.50",
                "-0.000000001",
                "12345678901234567890.123456789",
                "100",
                also=_decimal(30, r.randint(0, 12)),
            ),
        ),
        ColumnType(
            "REAL", _pick("0", "1.5", "-3.25", "3.4e38", also=lambda r: f"{r.uniform(-1e6, 1e6):.2f}")
        ),
        ColumnType(
            "DOUBLE PRECISION",
            _pick("0", "2.718281828459045", "-1e300", "1e-300", also=lambda r: repr(r.uniform(-1e12, 1e12))),
        ),
        ColumnType("TEXT", _text(200), key=True),
        ColumnType(f"VARCHAR({(v := r.randint(1, 100))})", _text(v), key=True),
        ColumnType(f"CHAR({(c := r.randint(1, 20))})", _text(c)),
        ColumnType("BYTEA", _hex(0, 20, lambda h: f"'\\x{h}'")),
        # TOAST-sized values (non-key: an index row holds at most about 2.7 kB)
        ColumnType("TEXT", _toastable(_text(200), lambda t: f"'{t}'"), default_ok=False),
        ColumnType("BYTEA", _toastable(_hex(0, 20, lambda h: f"'\\x{h}'"),
                                       lambda t: f"convert_to('{t}', 'UTF8')"), default_ok=False),
        ColumnType(
            "DATE",
            _pick(
                "'0001-01-01'",
                "'9999-12-31'",
                "'1969-12-31'",
                "'1970-01-01'",
                "'2024-02-29'",
                also=lambda r: f"'{r.randint(1, 9999):04d}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}'",
            ),
            key=True,
        ),
        ColumnType(
            f"TIME({tp})",
            _pick(
                "'00:00:00'",
                "'23:59:59'",
                "'24:00:00'",
                also=lambda r: (
                    f"'{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}{frac(r)}'"
                ),
            ),
        ),
        ColumnType(
            f"TIME({tp}) WITH TIME ZONE", _pick("'00:00:00+00'", "'12:34:56-08:00'", "'23:59:59+05:30'")
        ),
        ColumnType(
            f"TIMESTAMP({tp})",
            _pick(
                "'1900-01-01 00:00:00'", "'1969-12-31 23:59:59'", "'9999-12-31 23:59:59'", also=ts(1, 9999)
            ),
            key=True,
        ),
        ColumnType(
            f"TIMESTAMPTZ({tp})",
            _pick(
                "'1969-12-31 23:59:59+00'",
                "'2038-01-19 03:14:07+05:30'",
                also=lambda r: ts(1000, 9999)(r)[:-1] + "+00'",
            ),
        ),
        ColumnType(
            "INTERVAL", _pick("'1 year 2 mons 3 days 04:05:06.789'", "'-1 days'", "'0'", "'00:00:00.000001'")
        ),
        ColumnType(
            "UUID",
            _pick("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'"),
            key=True,
        ),
        ColumnType("JSON", _pick("'{}'", "'[]'", '\'{"k": [1, 2.5, "é", null]}\''), default_ok=False),
        ColumnType("JSONB", _pick("'{}'", '\'{"b": 1, "a": [true, null]}\''), default_ok=False),
        ColumnType("INET", _pick("'192.168.0.1/24'", "'::1'", "'10.1.2.3'")),
        ColumnType("CIDR", _pick("'10.0.0.0/8'", "'2001:db8::/32'")),
        ColumnType("MACADDR", _pick("'08:00:2b:01:02:03'", "'00:00:00:00:00:00'")),
        ColumnType("INTEGER[]", _pick("'{}'", "'{1,2,NULL,4}'", "'{-2147483648}'"), default_ok=False),
        ColumnType("TEXT[]", _pick("'{}'", '\'{"a","b c",NULL}\''), default_ok=False),
        ColumnType(f"BIT({n})", _bits(n, lambda b: f"B'{b}'")),
        ColumnType(
            f"BIT VARYING({n})",
            _pick(
                "B''",
                "B'1'",
                also=lambda r: "B'" + "".join(r.choice("01") for _ in range(r.randint(0, n))) + "'",
            ),
        ),
        ColumnType("MONEY", _pick("0", "1234.56", "-0.01", "92233720368547758.07")),
        ColumnType(f"{schema}.mood", _pick("'sad'", "'ok'", "'happy'")),
        ColumnType(
            f"{schema}.posint", _pick("1", "2147483647", also=lambda r: str(r.randint(1, 1000))), key=True
        ),
        ColumnType(f"{schema}.amount", _decimal(12, 2)),
        ColumnType("XML", _pick("'<a>x</a>'", "'<b/>'"), default_ok=False),
        ColumnType("POINT", _pick("'(1.5,-2.25)'", "'(0,0)'"), default_ok=False),
        ColumnType("INT4RANGE", _pick("'[1,10)'", "'empty'", "'(,5]'"), default_ok=False),
    ]


POSTGRES_TYPES_SETUP = [
    "CREATE TYPE {schema}.mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN {schema}.posint AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN {schema}.amount AS NUMERIC(12,2)",
]

# --------------------------------------------------------------------------- tables


@dataclass
class Column:
    name: str
    type: ColumnType
    not_null: bool = False
    default: str | None = None
    pinned: bool = False  # a generated column's expression names it: never dropped, renamed, retyped

    def ddl(self) -> str:
        parts = [self.name, self.type.sql]
        parts.append("NOT NULL" if self.not_null else "NULL")
        if self.default is not None:
            parts.append(f"DEFAULT {self.default}")
        return " ".join(parts)


@dataclass
class Table:
    name: str
    key: list[Column]
    columns: list[Column]
    identity: str = "FULL"  # PostgreSQL's REPLICA IDENTITY: DEFAULT, FULL or INDEX
    rows: dict[tuple, dict[str, str]] = field(default_factory=dict)  # key literals -> column literals
    generated: list[str] = field(default_factory=list)  # generated columns' DDL: never written to

    @property
    def all(self) -> list[Column]:
        return self.key + self.columns


def _table(r: random.Random, name: str, types: list[ColumnType], source: str) -> Table:
    keyable = [t for t in types if t.key]
    shape = r.random()
    if shape < 0.15 and source == "postgres":
        key: list[Column] = []  # no primary key: REPLICA IDENTITY FULL carries whole rows
    elif shape < 0.35:
        key = [Column(f"k{i}", r.choice(keyable), not_null=True) for i in range(2)]
    else:
        key = [Column("id", r.choice(keyable), not_null=True)]
    columns = []
    for i, t in enumerate(r.sample(types, r.randint(2, 6))):
        c = Column(f"c{i}_" + re.sub(r"\W+", "_", t.sql.split("(")[0].split(".")[-1].lower()).strip("_"), t)
        if t.default_ok and r.random() < 0.35:
            c.default = (t.default or t.draw)(r)
            c.not_null = r.random() < 0.3 and t.not_null_ok
        columns.append(c)
    identity = "FULL"
    if source == "postgres" and key:
        identity = r.choice(["DEFAULT", "DEFAULT", "FULL", "INDEX"])
    table = Table(name, key, columns, identity)
    if r.random() < 0.3:  # a generated column over a plain one
        columns.append(Column("gsrc", ColumnType("INTEGER", _int_range(-1000000, 1000000)), pinned=True))
        table.generated.append("gcol INTEGER GENERATED ALWAYS AS (gsrc * 2) STORED" if source == "postgres"
                               else f"gcol INT AS (gsrc * 2) {r.choice(['VIRTUAL', 'PERSISTENT'])}")
    return table


# Widening retypes (ALTER a column's type mid-stream; every value drawn for the old type fits)
_WIDER = {
    "mariadb": [(r"^TINYINT", "SMALLINT"), (r"^SMALLINT", "INT"), (r"^MEDIUMINT", "INT"),
                (r"^INT\b", "BIGINT"),
                (r"^FLOAT$", "DOUBLE"), (r"^VARCHAR\((\d+)\)", lambda m: f"VARCHAR({int(m[1]) + 20})")],
    "postgres": [(r"^SMALLINT$", "INTEGER"), (r"^INTEGER$", "BIGINT"), (r"^REAL$", "DOUBLE PRECISION"),
                 (r"^VARCHAR\((\d+)\)$", lambda m: f"VARCHAR({int(m[1]) + 20})"),
                 (r"^NUMERIC\((\d+),(\d+)\)$", lambda m: f"NUMERIC({int(m[1]) + 2},{m[2]})")],
}


# an ALTER TABLE of Workload.alter, and the columns it names (a rename's old and new name)
_ALTER = re.compile(r"ALTER TABLE \w+\.(?P<table>\w+) (?:ADD COLUMN (?P<c0>\w+) .*|DROP COLUMN (?P<c1>\w+)"
                    r"|RENAME COLUMN (?P<c2>\w+) TO (?P<c5>\w+)|MODIFY COLUMN (?P<c3>\w+) .*"
                    r"|ALTER COLUMN (?P<c4>\w+) TYPE .*)$")


def _wider(source: str, sql: str) -> str | None:
    for pattern, wider in _WIDER[source]:
        if re.search(pattern, sql):
            return re.sub(pattern, wider, sql, count=1)
    return None


# --------------------------------------------------------------------------- workload


def _key_literals(r: random.Random, table: Table) -> tuple:
    return tuple(c.type.draw(r) for c in table.key)


def _row_literals(r: random.Random, table: Table) -> dict[str, str]:
    row = {}
    for c in table.columns:
        roll = r.random()
        if c.default is not None and roll < 0.25:
            row[c.name] = "DEFAULT" if c.not_null else r.choice(["DEFAULT", "NULL"])
        elif not c.not_null and roll < 0.35:
            row[c.name] = "NULL"
        else:
            row[c.name] = c.type.draw(r)
    return row


def _where(table: Table, key: tuple) -> str:
    names = [c.name for c in table.key] if table.key else ["rid"]
    return " AND ".join(f"{n} = {v}" for n, v in zip(names, key, strict=True))


def _same_key(literal: str) -> str:
    """A key literal as the server compares it: numbers by value, text case- and
    trailing-space-insensitively (MariaDB's collation), times without trailing fractional zeros."""
    text = literal.strip("'").lower().rstrip()
    try:
        number = Decimal(text)
        return "0" if number == 0 else str(number.normalize())  # -0.0 is 0
    except InvalidOperation:
        return text.rstrip("0").rstrip(".") if ":" in text else text


class Workload:
    """Statements over the tables of one seed; tracks the rows so that updates and deletes hit
    existing ones and inserts never collide on a key."""

    def __init__(self, r: random.Random, container: str, tables: list[Table], source: str,
                 types: list[ColumnType]):
        self.r, self.container, self.tables, self.source, self.types = r, container, tables, source, types
        self.serial = 0

    def qualified(self, t: Table) -> str:
        return f"{self.container}.{t.name}"

    def insert(self, t: Table) -> str | None:
        taken = {tuple(map(_same_key, k)) for k in t.rows}
        values = []
        for _ in range(self.r.randint(1, 3)):
            for _attempt in range(5):
                self.serial += 1
                key = _key_literals(self.r, t) if t.key else (str(self.serial),)
                if tuple(map(_same_key, key)) not in taken:
                    taken.add(tuple(map(_same_key, key)))
                    values.append((key, _row_literals(self.r, t)))
                    break
        if not values:
            return None
        names = [c.name for c in t.key] if t.key else ["rid"]
        names += [c.name for c in t.columns]
        for key, row in values:
            t.rows[key] = row
        rows = ", ".join("(" + ", ".join([*key, *row.values()]) + ")" for key, row in values)
        return f"INSERT INTO {self.qualified(t)} ({', '.join(names)}) VALUES {rows}"

    def update(self, t: Table) -> str | None:
        if not t.rows or not t.columns:
            return None
        key = self.r.choice(sorted(t.rows))
        roll = self.r.random()
        where = _where(t, key)
        if roll < 0.15 and t.key:  # the key changes
            new = _key_literals(self.r, t)
            if tuple(map(_same_key, new)) in {tuple(map(_same_key, k)) for k in t.rows}:
                return None
            t.rows[new] = t.rows.pop(key)
            sets = ", ".join(f"{c.name} = {v}" for c, v in zip(t.key, new, strict=True))
        elif roll < 0.25:  # nothing changes
            c = self.r.choice(t.columns)
            sets = f"{c.name} = {c.name}"
        else:
            cols = self.r.sample(t.columns, self.r.randint(1, len(t.columns)))
            new_row = _row_literals(self.r, t)
            for c in cols:
                t.rows[key][c.name] = new_row[c.name]
            sets = ", ".join(f"{c.name} = {new_row[c.name]}" for c in cols)
        return f"UPDATE {self.qualified(t)} SET {sets} WHERE {where}"

    def delete(self, t: Table) -> str | None:
        if not t.rows:
            return None
        key = self.r.choice(sorted(t.rows))
        where = _where(t, key)
        t.rows.pop(key)
        return f"DELETE FROM {self.qualified(t)} WHERE {where}"

    def truncate(self, t: Table) -> str:
        t.rows.clear()
        return f"TRUNCATE TABLE {self.qualified(t)}"

    def alter(self, t: Table) -> str | None:
        """One column added, dropped, renamed or retyped (a statement of its own)."""
        self.serial += 1
        movable = [c for c in t.columns if not c.pinned]
        kind = self.r.choice(["add", "drop", "rename", "retype"])
        q = self.qualified(t)
        if kind == "add":
            c = Column(f"a{self.serial}", self.r.choice([x for x in self.types if x.key or x.default_ok]))
            if self.source == "mariadb" and c.type.sql == "BOOLEAN":
                # Debezium types a column its DDL parser saw declared BOOLEAN as a boolean; the
                # catalog spells it tinyint(1), as tidegate reads it (declared, docs/compat.md).
                # Added as TINYINT(1): the same column and draws, no declared difference.
                c.type = replace(c.type, sql="TINYINT(1)")
            if c.type.default_ok and self.r.random() < 0.5:
                c.default = (c.type.default or c.type.draw)(self.r)
                c.not_null = self.r.random() < 0.3 and c.type.not_null_ok
            t.columns.append(c)
            for row in t.rows.values():
                row[c.name] = "DEFAULT"
            return f"ALTER TABLE {q} ADD COLUMN {c.ddl()}"
        if kind == "drop" and len(movable) > 1:
            c = self.r.choice(movable)
            t.columns.remove(c)
            for row in t.rows.values():
                row.pop(c.name, None)
            return f"ALTER TABLE {q} DROP COLUMN {c.name}"
        if kind == "rename" and movable:
            c = self.r.choice(movable)
            old, c.name = c.name, f"r{self.serial}_{c.name}"
            for row in t.rows.values():
                row[c.name] = row.pop(old, "NULL")
            return f"ALTER TABLE {q} RENAME COLUMN {old} TO {c.name}"
        wider = [(c, w) for c in movable if (w := _wider(self.source, c.type.sql))]
        if kind == "retype" and wider:
            c, sql = self.r.choice(wider)
            c.type = ColumnType(sql, c.type.draw, c.type.key, c.type.default_ok, c.type.default,
                                c.type.not_null_ok)
            if self.source == "postgres":
                return f"ALTER TABLE {q} ALTER COLUMN {c.name} TYPE {sql}"
            return f"ALTER TABLE {q} MODIFY COLUMN {c.ddl()}"
        return None

    def transaction(self) -> list[str]:
        roll = self.r.random()
        if roll < 0.06:  # DDL mid-stream, or a TRUNCATE: a transaction of their own
            t = self.r.choice(self.tables)
            s = self.alter(t) if roll < 0.04 else self.truncate(t)
            return [s] if s else []
        out = []
        for t in self.r.sample(self.tables, self.r.randint(1, min(2, len(self.tables)))):
            for _ in range(self.r.randint(1, 3)):
                op = self.r.choices([self.insert, self.update, self.delete], [5, 4, 1])[0]
                s = op(t)
                if s is not None:
                    out.append(s)
        return out


# --------------------------------------------------------------------------- a backlog


@dataclass
class Generated:
    """One seed's part: its tables' DDL, its transactions."""

    seed: int
    setup: list[str]
    transactions: list[list[str]]
    tables: list[Table]


def generate_seed(source: str, seed: int, transactions: int = 40) -> Generated:
    r = random.Random(seed)
    container = backlogs.MARIADB_DB if source == "mariadb" else backlogs.POSTGRES_SCHEMA
    types = _mariadb_types(r) if source == "mariadb" else _postgres_types(r, container)
    tables = [_table(r, f"g{seed}_{i}", types, source) for i in range(r.randint(2, 4))]
    setup = []
    for t in tables:
        cols = [c.ddl() for c in t.all] + t.generated
        if not t.key:  # no primary key: rows are told apart by a plain column, for the workload
            cols.insert(0, "rid INTEGER NOT NULL")
        if t.key:
            cols.append(f"PRIMARY KEY ({', '.join(c.name for c in t.key)})")
        charset = " CHARACTER SET utf8mb4" if source == "mariadb" else ""
        setup.append(f"CREATE TABLE {container}.{t.name} ({', '.join(cols)}){charset}")
        if source == "postgres":
            setup += _identity(container, t)
    work = Workload(r, container, tables, source, types)
    txs = [tx for tx in (work.transaction() for _ in range(transactions)) if tx]
    return Generated(seed, setup, txs, tables)


def _identity(schema: str, t: Table) -> list[str]:
    q = f"{schema}.{t.name}"
    if t.identity == "FULL":
        return [f"ALTER TABLE {q} REPLICA IDENTITY FULL"]
    if t.identity == "INDEX":
        # a unique index over NOT NULL columns: the key columns (already NOT NULL as a primary key)
        cols = ", ".join(c.name for c in t.key)
        return [
            f"CREATE UNIQUE INDEX {t.name}_ident ON {q} ({cols})",
            f"ALTER TABLE {q} REPLICA IDENTITY USING INDEX {t.name}_ident",
        ]
    return []


@dataclass
class Backlog:
    """The attributes of tests.compat.backlogs the harness reads, for generated seeds."""

    seeds: list[int]
    parts: dict[str, list[Generated]]
    MARIADB_DB: str = backlogs.MARIADB_DB
    POSTGRES_SCHEMA: str = backlogs.POSTGRES_SCHEMA
    STOP_TABLE: str = backlogs.STOP_TABLE
    PROBE_TABLE: str = backlogs.PROBE_TABLE
    MARIADB_END: list[str] = field(default_factory=lambda: list(backlogs.MARIADB_END))
    MARIADB_TEARDOWN: list[str] = field(default_factory=lambda: list(backlogs.MARIADB_TEARDOWN))
    POSTGRES_END: list[str] = field(default_factory=lambda: list(backlogs.POSTGRES_END))
    POSTGRES_TEARDOWN: list[str] = field(default_factory=lambda: list(backlogs.POSTGRES_TEARDOWN))
    # (transaction, log position after it) of each ALTER TABLE, noted by the harness as it writes
    ddl_marks: list[tuple[list[str], object]] = field(default_factory=list)

    def history(self, source: str):
        """The ALTERs' SchemaHistory: each one's table, the columns it names (added, dropped,
        renamed: both names, retyped), where it landed."""
        from tests.compat.harness import SchemaHistory

        out = SchemaHistory(source)
        for tx, position in self.ddl_marks:
            for statement in tx:
                m = _ALTER.match(statement)
                if m:
                    columns = frozenset(c for c in m.groupdict("").values() if c) - {m["table"]}
                    out.marks.append((m["table"], columns, position, statement))
        return out

    @property
    def MARIADB_SETUP(self) -> list[str]:  # noqa: N802 - the backlogs module's name
        m = backlogs.MARIADB_DB
        return [
            f"DROP DATABASE IF EXISTS {m}",
            f"CREATE DATABASE {m} CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
            *[s for g in self.parts.get("mariadb", []) for s in g.setup],
            f"CREATE TABLE {m}.{backlogs.STOP_TABLE} (id INT PRIMARY KEY)",
            f"CREATE TABLE {m}.{backlogs.PROBE_TABLE} (id INT AUTO_INCREMENT PRIMARY KEY)",
        ]

    @property
    def MARIADB_BACKLOG(self) -> list[list[str]]:  # noqa: N802
        return _interleave(self.parts.get("mariadb", []))

    @property
    def POSTGRES_SETUP(self) -> list[str]:  # noqa: N802
        p = backlogs.POSTGRES_SCHEMA
        return [
            f"DROP SCHEMA IF EXISTS {p} CASCADE",
            f"CREATE SCHEMA {p}",
            *[s.format(schema=p) for s in POSTGRES_TYPES_SETUP],
            *[s for g in self.parts.get("postgres", []) for s in g.setup],
            f"CREATE TABLE {p}.{backlogs.STOP_TABLE} (id INT PRIMARY KEY)",
            f"ALTER TABLE {p}.{backlogs.STOP_TABLE} REPLICA IDENTITY FULL",
            # a snapshot capture's probe (test_generated: Debezium reads the log once it sees a row)
            f"CREATE TABLE {p}.{backlogs.PROBE_TABLE} (id SERIAL PRIMARY KEY)",
        ]

    @property
    def POSTGRES_PUBLISHED(self) -> list[str]:  # noqa: N802
        return [t.name for g in self.parts.get("postgres", []) for t in g.tables] + [backlogs.STOP_TABLE,
                                                                                     backlogs.PROBE_TABLE]

    @property
    def POSTGRES_BACKLOG(self) -> list[list[str]]:  # noqa: N802
        return _interleave(self.parts.get("postgres", []))

    def statements_of(self, source: str, table: str) -> list[str]:
        """The DDL and every statement naming ``table`` (a failure's minimal reproduction)."""
        parts = self.parts.get(source, [])
        return [
            s
            for g in parts
            for s in [*g.setup, *(x for tx in g.transactions for x in tx)]
            if f".{table} " in s or f".{table}(" in s
        ]


def _interleave(parts: list[Generated]) -> list[list[str]]:
    """The seeds' transactions in turn, so that each seed's stay in its own order."""
    out: list[list[str]] = []
    queues = [list(g.transactions) for g in parts]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def backlog(sources: Iterable[str], seeds: Iterable[int], transactions: int = 40) -> Backlog:
    seeds = list(seeds)
    return Backlog(seeds, {s: [generate_seed(s, seed, transactions) for seed in seeds] for s in sources})


if __name__ == "__main__":
    source, seed = sys.argv[1], int(sys.argv[2])
    g = generate_seed(source, seed)
    for s in g.setup:
        print(s + ";")
    for tx in g.transactions:
        print("BEGIN;\n  " + ";\n  ".join(tx) + ";\nCOMMIT;")
