"""Table and column filters: which tables a pipeline captures, and what leaves the source of the
columns it keeps (docs/operations.md, "Filters and masking").

The spec says it in ``source:``::

    tables: ["shop.*", "!shop.audit_*"]    # include patterns, "!" excludes; default: every table
    columns:
      shop.customers:                       # a table or a pattern
        exclude: [ssn]                      # the column is dropped
        mask: {email: "***"}                # its value replaced by a fixed string
        hash: [phone]                       # hex SHA-256 of the salt + the value
        truncate: {name: 3}                 # the first N characters
    hash_salt: {conn_id: pii_salt}          # or {variable: pii_salt}

Patterns are ``fnmatch`` patterns (``*``, ``?``, ``[seq]``) matched against ``schema.table``
(``db.table`` for MySQL/MariaDB), case-sensitively, against the names as the log and the catalog
spell them. A table is captured when some include matches it (or there is no include) and no
exclude matches it.

Where the filters act: every source applies them to what it reads before the items leave its
process (:func:`filter_items` on the log's items, :meth:`RowTransform.row` on a snapshot's chunk
rows, ``snapshot.RowEvents``), so sinks, the DLQ records, the pipe of the reader process and the
rows a Spark task ships only ever hold filtered rows. A decoder needs nothing of its own: the
source's ``read`` passes every decoder's items through :func:`filter_items`.

Values are transformed in their envelope form (the JSON-native value, the same for a snapshot
row and a log event of the column), so a hash is the same whichever way a row arrives:

* ``hash``: ``sha256(salt + canonical(value)).hexdigest()``, where ``canonical`` is the UTF-8
  bytes of a string value (DECIMAL, dates, base64 binary are strings in the envelope) and the
  compact JSON text of any other value (``42``, ``true``, ``1.5``, ``["a","b"]``);
* ``mask``: the fixed string; ``truncate``: a string's first N characters (another value is cut
  as its JSON text);
* NULL stays NULL under every rule; a masked, hashed or truncated number becomes a string.

This module is light (no client library, no Airflow): DAG parsing validates specs through it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConnectionConfigError, SourceSettingError
from .events import ChangeEvent, ControlMessage, key_json_bytes

RULES = ("exclude", "mask", "hash", "truncate")
SALT_SOURCES = ("conn_id", "variable")
# A table name or pattern: schema and table parts of identifier characters and fnmatch's
# wildcards (names reach SQL only as bound parameters or quoted identifiers, never pasted).
PATTERN_RE = re.compile(r"^[A-Za-z0-9_$*?\[\]!-]+\.[A-Za-z0-9_$*?\[\]!-]+$")
_WILDCARDS = re.compile(r"[*?\[]")
SALT_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def is_pattern(name: str) -> bool:
    """Whether a table entry holds a wildcard (else it names one table)."""
    return bool(_WILDCARDS.search(name))


# =========================================================================== the spec's form


@dataclass(frozen=True)
class ColumnRules:
    """One entry of ``source.columns``: the rules for the tables ``pattern`` matches."""

    pattern: str
    exclude: tuple[str, ...] = ()
    mask: tuple[tuple[str, str], ...] = ()
    hash: tuple[str, ...] = ()
    truncate: tuple[tuple[str, int], ...] = ()

    def by_column(self) -> dict[str, tuple[str, Any]]:
        """column -> (rule, argument)."""
        out: dict[str, tuple[str, Any]] = {c: ("exclude", None) for c in self.exclude}
        out.update({c: ("mask", v) for c, v in self.mask})
        out.update({c: ("hash", None) for c in self.hash})
        out.update({c: ("truncate", n) for c, n in self.truncate})
        return out


def parse_tables(v: Any, probs: Any) -> tuple[str, ...]:
    """``source.tables``: table names, patterns, and ``!``-prefixed exclude patterns."""
    if v is None:
        return ()
    allowed = "schema.table names or patterns (shop.*, !shop.audit_*)"
    if not isinstance(v, list):
        probs.add("source.tables", f"must be a list, got {type(v).__name__}", allowed)
        return ()
    out: list[str] = []
    for i, t in enumerate(v):
        body = t[1:] if isinstance(t, str) and t.startswith("!") else t
        if not isinstance(t, str) or not PATTERN_RE.match(body or ""):
            probs.add(f"source.tables[{i}]", f"malformed table name or pattern {t!r}",
                      "schema.table of letters, digits, '_', '$', with * ? [..] as wildcards and a "
                      "leading ! to exclude")
        elif t in out:
            probs.add(f"source.tables[{i}]", f"duplicate entry {t!r}", "each entry once")
        else:
            out.append(t)
    return tuple(out)


def parse_columns(v: Any, tables: tuple[str, ...], probs: Any) -> tuple[ColumnRules, ...]:
    """``source.columns``: per table or pattern, the columns excluded, masked, hashed, truncated."""
    if v is None:
        return ()
    if not isinstance(v, dict) or not v:
        probs.add("source.columns", "must be a non-empty mapping of table (or pattern) to rules",
                  "{schema.table: {exclude: [...], mask: {...}, hash: [...], truncate: {...}}}")
        return ()
    table_filter = TableFilter(tables)
    out = []
    for pattern, rules in v.items():
        fp = f"source.columns.{pattern}"
        if not isinstance(pattern, str) or pattern.startswith("!") or not PATTERN_RE.match(pattern):
            probs.add(fp, f"malformed table name or pattern {pattern!r}",
                      "schema.table or a pattern (shop.*)")
            continue
        entry = _column_entry(pattern, rules, fp, probs)
        if entry is None:
            continue
        if not is_pattern(pattern) and not table_filter.matches(*pattern.split(".", 1)):
            probs.add(fp, f"{pattern} is not captured by source.tables, so these rules would never apply",
                      "a table source.tables captures, or add it to source.tables")
        out.append(entry)
    _conflicts(out, probs)
    return tuple(out)


def _column_entry(pattern: str, rules: Any, fp: str, probs: Any) -> ColumnRules | None:
    allowed = "exclude: [col], mask: {col: text}, hash: [col], truncate: {col: N}"
    if not isinstance(rules, dict) or not rules:
        probs.add(fp, "must be a non-empty mapping of rules", allowed)
        return None
    for k in rules:
        if k not in RULES:
            probs.add(f"{fp}.{k}", "unknown field", ", ".join(RULES))
    seen: dict[str, str] = {}
    ok = True

    def column(name: Any, rule: str, where: str) -> bool:
        nonlocal ok
        if not isinstance(name, str) or not name or any(ord(ch) < 32 for ch in name):
            probs.add(where, f"malformed column name {name!r}", "a column name")
            ok = False
            return False
        if name in seen:
            what = "listed twice" if seen[name] == rule else f"both {seen[name]} and {rule}"
            probs.add(where, f"column {name!r} is {what}", "one rule per column")
            ok = False
            return False
        seen[name] = rule
        return True

    exclude = _name_list(rules, "exclude", fp, probs, column)
    hashed = _name_list(rules, "hash", fp, probs, column)
    mask = []
    for name, text in _name_map(rules, "mask", fp, probs).items():
        if column(name, "mask", f"{fp}.mask.{name}"):
            if not isinstance(text, str):
                probs.add(f"{fp}.mask.{name}", f"must be a string, got {text!r}",
                          'the fixed text, e.g. "***"')
                ok = False
            else:
                mask.append((name, text))
    truncate = []
    for name, n in _name_map(rules, "truncate", fp, probs).items():
        if column(name, "truncate", f"{fp}.truncate.{name}"):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                probs.add(f"{fp}.truncate.{name}", f"bad value {n!r}", "an integer >= 1 (characters kept)")
                ok = False
            else:
                truncate.append((name, n))
    if not ok:
        return None
    return ColumnRules(pattern, tuple(exclude), tuple(mask), tuple(hashed), tuple(truncate))


def _name_list(rules: dict, key: str, fp: str, probs: Any, column: Any) -> list[str]:
    v = rules.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        probs.add(f"{fp}.{key}", f"must be a list of column names, got {type(v).__name__}", "[col, ...]")
        return []
    return [c for i, c in enumerate(v) if column(c, key, f"{fp}.{key}[{i}]")]


def _name_map(rules: dict, key: str, fp: str, probs: Any) -> dict:
    v = rules.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        probs.add(f"{fp}.{key}", f"must be a mapping of column to value, got {type(v).__name__}",
                  "{col: value}")
        return {}
    return v


def _conflicts(entries: list[ColumnRules], probs: Any) -> None:
    """A table named outright and matched by a pattern takes the rules of both: a column they give
    different rules is an error (two patterns that meet on a table are checked when it is met)."""
    for a in entries:
        if is_pattern(a.pattern):
            continue
        for b in entries:
            if b is a or not fnmatch.fnmatchcase(a.pattern, b.pattern):
                continue
            ra, rb = a.by_column(), b.by_column()
            for col in sorted(set(ra) & set(rb)):
                if ra[col] != rb[col]:
                    probs.add(f"source.columns.{a.pattern}",
                              f"column {col!r} has rule {ra[col][0]} here and {rb[col][0]} under "
                              f"{b.pattern!r}, which matches this table too", "one rule per column")


def parse_salt(v: Any, columns: Any, probs: Any) -> tuple[str, str] | None:
    """``source.hash_salt``: where the salt of ``hash`` comes from: an Airflow connection's password
    (``{conn_id: ID}``) or an Airflow variable (``{variable: NAME}``). ``columns``: ``source.columns``
    as written (an entry with another problem still says whether something is hashed)."""
    hashes = isinstance(columns, dict) and any(isinstance(r, dict) and r.get("hash")
                                               for r in columns.values())
    allowed = "{conn_id: ID} (the connection's password) or {variable: NAME} (an Airflow variable)"
    if v is None:
        if hashes:
            probs.add("source.hash_salt", "missing: a column is hashed, and a hash needs a secret salt "
                                          "(unsalted hashes of e-mails or phone numbers are reversed "
                                          "by trying every value)", allowed)
        return None
    if not isinstance(v, dict) or len(v) != 1 or next(iter(v)) not in SALT_SOURCES:
        probs.add("source.hash_salt", f"bad value {v!r}", allowed)
        return None
    (kind, name), = v.items()
    if not isinstance(name, str) or not SALT_NAME_RE.match(name):
        probs.add(f"source.hash_salt.{kind}", f"malformed name {name!r}", "letters, digits, '_', '.', '-'")
        return None
    if not hashes:
        probs.add("source.hash_salt", "set but no column is hashed",
                  "hash: [...] in source.columns, or omit it")
    return kind, name


# =========================================================================== tables


class TableFilter:
    """Which tables ``source.tables`` captures; ``(schema, table) in f`` answers (remembered per
    table). Sources hand it to their readers where a plain set of names was before, so a list of
    names without wildcards keeps being a frozenset (:func:`captured`)."""

    def __init__(self, entries: Iterable[str]):
        entries = tuple(entries)
        self.includes = tuple(e for e in entries if not e.startswith("!"))
        self.excludes = tuple(e[1:] for e in entries if e.startswith("!"))
        self._memo: dict[tuple[str, str], bool] = {}

    def matches(self, schema: str, table: str) -> bool:
        key = (schema, table)
        hit = self._memo.get(key)
        if hit is None:
            name = f"{schema}.{table}"
            hit = (not self.includes or any(fnmatch.fnmatchcase(name, p) for p in self.includes)) and \
                not any(fnmatch.fnmatchcase(name, p) for p in self.excludes)
            if len(self._memo) > 100_000:
                self._memo.clear()
            self._memo[key] = hit
        return hit

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.matches(*key)

    def __bool__(self) -> bool:
        return bool(self.includes or self.excludes)

    @property
    def literal(self) -> frozenset[tuple[str, str]] | None:
        """The captured tables when every entry names one table (no wildcard, no exclude)."""
        if self.excludes or any(is_pattern(p) for p in self.includes):
            return None
        return frozenset(tuple(p.split(".", 1)) for p in self.includes)  # type: ignore[misc]

    @property
    def schemas(self) -> frozenset[str]:
        """The schemas (MySQL databases) the includes can match, when each names its schema
        outright; empty when any schema can hold a captured table."""
        parts = [p.split(".", 1)[0] for p in self.includes]
        if not parts or any(is_pattern(s) for s in parts):
            return frozenset()
        return frozenset(parts)

    def may_hold(self, schema: str) -> bool:
        """Whether a table of ``schema`` can be captured (a dropped database's messages)."""
        return not self.includes or any(fnmatch.fnmatchcase(f"{schema}.x", p.split(".", 1)[0] + ".*")
                                        for p in self.includes)

    def select(self, names: Iterable[str]) -> list[str]:
        """The captured names among ``schema.table`` names, sorted."""
        return sorted(n for n in names if self.matches(*n.split(".", 1)))

    def unmatched(self, names: Iterable[str]) -> list[str]:
        """The entries (as written) that match none of ``names``: a typo, or a table not there yet."""
        names = list(names)
        out = [p for p in self.includes if not any(fnmatch.fnmatchcase(n, p) for n in names)]
        out += ["!" + p for p in self.excludes if not any(fnmatch.fnmatchcase(n, p) for n in names)]
        return out

    def wal2json_options(self) -> dict[str, str]:
        """wal2json's ``add-tables`` / ``filter-tables`` where the patterns can be said in its
        terms (a whole schema or table part ``*``), so the server leaves the other tables'
        changes out; the reader filters again either way."""
        def plugin_form(ps: tuple[str, ...]) -> str | None:
            out = []
            for p in ps:
                s, t = p.split(".", 1)
                if any(is_pattern(x) and x != "*" for x in (s, t)):
                    return None
                out.append(f"{s}.{t}")
            return ",".join(sorted(out)) if out else None

        opts = {}
        add = plugin_form(self.includes)
        if add:
            opts["add-tables"] = add
        drop = plugin_form(self.excludes)
        if drop:
            opts["filter-tables"] = drop
        return opts


def captured(tables: Iterable[str]) -> frozenset[tuple[str, str]] | TableFilter:
    """What a source tests ``(schema, table) in ...`` against: a frozenset for a list of names
    (empty: every table; the readers' code and cost as before), a :class:`TableFilter` otherwise."""
    f = TableFilter(tables)
    literal = f.literal
    return literal if literal is not None else f


def table_list(tables: frozenset[tuple[str, str]] | TableFilter) -> dict[str, str]:
    """wal2json's table options for what :func:`captured` returned."""
    if isinstance(tables, TableFilter):
        return tables.wal2json_options()
    return {"add-tables": ",".join(f"{s}.{t}" for s, t in sorted(tables))} if tables else {}


def snapshot_candidates(tables: Iterable[str], existing: Iterable[str]) -> list[str] | None:
    """The tables a snapshot reads by default: the names of ``source.tables`` in spec order, or
    the existing tables the patterns capture, sorted; None without ``source.tables`` (all)."""
    f = TableFilter(tables)
    if not f:
        return None
    if f.literal is not None:
        return list(f.includes)
    return f.select(existing)


# =========================================================================== columns


_DROP = object()  # the op of an excluded column


def canonical(value: Any) -> bytes:
    """The bytes a hash is taken over: a string's UTF-8, any other value's compact JSON text."""
    t = type(value)
    if t is str:
        return value.encode("utf-8")
    if t is int:  # the JSON text, without the json module's cost (bool is not int here)
        return str(value).encode("ascii")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8")


def hash_value(salt: bytes, value: Any) -> str:
    return hashlib.sha256(salt + canonical(value)).hexdigest()


def _truncated(value: Any, n: int) -> str:
    text = value if type(value) is str else canonical(value).decode("utf-8")
    return text[:n]


class RowTransform:
    """The column rules that apply to one table, ready to run on its rows."""

    def __init__(self, table: str, rules: dict[str, tuple[str, Any]], salt: bytes | None):
        self.table = table
        self.rules = rules
        self.excluded = frozenset(c for c, (r, _) in rules.items() if r == "exclude")
        if salt is None and any(r == "hash" for r, _ in rules.values()):
            raise ConnectionConfigError(
                f"{table}: a column is hashed but the salt was not given to the source "
                f"(source.hash_salt names where it comes from)")
        self.ops: dict[str, Any] = {}
        for col, (rule, arg) in rules.items():
            if rule == "exclude":
                self.ops[col] = _DROP
            elif rule == "mask":
                self.ops[col] = lambda v, text=arg: text
            elif rule == "hash":
                self.ops[col] = lambda v, s=salt: hash_value(s, v)
            else:
                self.ops[col] = lambda v, n=arg: _truncated(v, n)
        self.op_items = tuple(self.ops.items())
        self._key_checked: set[tuple[str, ...]] = set()

    def row(self, row: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """A row (JSON-native values) with the rules applied; None stays None."""
        if row is None:
            return None
        out = dict(row)  # a copy in C; then only the ruled columns, in place (the order stays)
        for col, op in self.op_items:
            if col in out:
                if op is _DROP:
                    del out[col]
                else:
                    v = out[col]
                    if v is not None:
                        out[col] = op(v)
        return out

    def check_key(self, key_columns: Iterable[str]) -> None:
        """A primary key column may be hashed (a stable stand-in for the key) but not excluded,
        masked or truncated: keys would vanish or collide, and consumers keyed by them merge rows."""
        key_columns = tuple(key_columns)
        if key_columns in self._key_checked:
            return
        for c in key_columns:
            rule = self.rules.get(c, (None,))[0]
            if rule in ("exclude", "mask", "truncate"):
                raise SourceSettingError(
                    f"source.columns: column {c!r} of {self.table} is part of its primary key and cannot be "
                    f"{'excluded' if rule == 'exclude' else rule + 'ed'} (keys would be lost or collide): "
                    f"hash it instead, or take it out of the rule")
        self._key_checked.add(key_columns)

    def key(self, key: dict[str, Any] | None) -> dict[str, Any] | None:
        if key is None:
            return None
        self.check_key(key)
        return self.row(key)

    def columns(self, cols: Any) -> Any:
        """A ``schema_change`` message's column list without the excluded columns."""
        if not isinstance(cols, list):
            return cols
        return [c for c in cols if not (isinstance(c, dict) and c.get("name") in self.excluded)]

    def mentions_excluded(self, text: str) -> bool:
        low = text.lower()
        return any(re.search(r"(?<![\w$])" + re.escape(c.lower()) + r"(?![\w$])", low) for c in self.excluded)


class ColumnFilters:
    """``source.columns`` with its salt: the :class:`RowTransform` of each table (None: no rule)."""

    def __init__(self, entries: tuple[ColumnRules, ...], salt: bytes | None):
        self.entries = entries
        self.salt = salt
        self._memo: dict[tuple[str, str], RowTransform | None] = {}

    def __repr__(self) -> str:  # the salt is a secret
        return f"ColumnFilters({[e.pattern for e in self.entries]})"

    @classmethod
    def of(cls, entries: tuple[ColumnRules, ...], salt: bytes | None) -> ColumnFilters | None:
        return cls(entries, salt) if entries else None

    def for_table(self, schema: str, table: str) -> RowTransform | None:
        key = (schema, table)
        if key in self._memo:
            return self._memo[key]
        name = f"{schema}.{table}"
        merged: dict[str, tuple[str, Any]] = {}
        origin: dict[str, str] = {}
        for e in self.entries:
            if not fnmatch.fnmatchcase(name, e.pattern):
                continue
            for col, rule in e.by_column().items():
                if col in merged and merged[col] != rule:
                    raise SourceSettingError(
                        f"source.columns: column {col!r} of {name} has rule {merged[col][0]} under "
                        f"{origin[col]!r} and {rule[0]} under {e.pattern!r}: give it one rule")
                merged[col], origin[col] = rule, e.pattern
        transform = RowTransform(name, merged, self.salt) if merged else None
        self._memo[key] = transform
        return transform


def filter_items(items: Iterable[Any], filters: ColumnFilters) -> Iterator[Any]:
    """A source's items with the column rules applied: rows (before and after images, the key,
    the headers naming a changed key) and the column lists and DDL of ``schema_change`` messages.
    Events of tables without rules pass as they are."""
    for_table = filters.for_table
    for item in items:
        t = type(item)
        if t is ChangeEvent:
            tr = for_table(item.schema, item.table)
            if tr is not None:
                item = _event(item, tr)
        elif t is ControlMessage and item.type == "schema_change":
            f = item.fields
            tr = for_table(f.get("schema") or f.get("db") or "", f.get("table") or "")
            if tr is not None and tr.excluded:
                item = _schema_change(item, tr)
        yield item


def _event(ev: Any, tr: RowTransform) -> Any:
    d = ev.__dict__
    headers = d.get("headers")
    if headers:  # the two events of a key change name each other's key: as it leaves, filtered
        headers = {h: key_json_bytes(tr.row(json.loads(v))) for h, v in headers.items()}
    return ChangeEvent.native(d["tenant"], d["pipeline"], d["connector"], d["db"], d["schema"], d["table"],
                              d["op"], tr.row(d["before"]), tr.row(d["after"]), tr.key(d["key"]), d["tx_id"],
                              d["event_id"], d["position"], d["ts_ms"], d["total_order"],
                              d["data_collection_order"], d["snapshot"], d["tx_end"], d["end_position"],
                              d.get("_floats_checked", False), d.get("commit_us"), headers)


def _schema_change(msg: Any, tr: RowTransform) -> Any:
    fields = dict(msg.fields)
    for name in ("columns", "previous_columns"):
        if name in fields:
            fields[name] = tr.columns(fields[name])
    ddl = fields.get("ddl")
    if isinstance(ddl, str) and tr.mentions_excluded(ddl):
        fields["ddl"] = None  # the statement names an excluded column: it does not leave the source
        fields["ddl_redacted"] = True
    return dataclasses.replace(msg, fields=fields)


def catalog_problems(tables: Iterable[str], entries: tuple[ColumnRules, ...],
                     catalog: Mapping[str, tuple[list[str], list[str]]]) -> list[tuple[str, str, bool]]:
    """What the filters say of the tables on the server (``catalog``: ``schema.table`` -> (columns,
    primary key)): (subject, message) for a table entry that matches no table, a column entry that
    matches no captured table, a rule on a column the table lacks, a key column excluded, masked
    or truncated, or two patterns giving one column two rules. A table named outright that is not
    there (yet) is only a warning, as it was before patterns."""
    out: list[tuple[str, str, bool]] = []
    tf = TableFilter(tables)
    names = sorted(catalog)
    for p in tf.unmatched(names):
        near = [n for n in names if fnmatch.fnmatch(n.lower(), p.lstrip("!").lower())]
        hint = f" (the names match case-insensitively: {', '.join(near[:3])}; patterns are case-sensitive)" \
            if near else ""
        out.append((p, f"source.tables entry {p!r} matches no table on the server{hint}: fix the "
                       f"pattern, or remove it", is_pattern(p) or p.startswith("!")))
    chosen = tf.select(names)
    filters = ColumnFilters(entries, b"")
    for e in entries:
        hits = [n for n in chosen if fnmatch.fnmatchcase(n, e.pattern)]
        if not hits:
            out.append((e.pattern, f"source.columns entry {e.pattern!r} matches no captured table: fix "
                                   f"the name or pattern, or remove the entry", is_pattern(e.pattern)))
            continue
        for n in hits:
            cols, key = catalog[n]
            missing = [c for c in e.by_column() if c not in cols]
            if missing:
                out.append((n, f"source.columns.{e.pattern}: {n} has no column "
                               f"{', '.join(map(repr, missing))}: fix the column name", True))
    for n in chosen:
        try:
            tr = filters.for_table(*n.split(".", 1))
            if tr is not None:
                tr.check_key(catalog[n][1])
        except SourceSettingError as exc:
            out.append((n, str(exc), True))
    return out
