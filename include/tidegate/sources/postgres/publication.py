"""The publication a pgoutput slot is read with: which one, creating it, checking it.

pgoutput sends the changes of the tables in the publications a read names, nothing else. A
pipeline reads one publication: the one ``source.publication`` names (the pipeline only uses
it: it must exist, and an administrator keeps it), or, without that setting, its own,
``tidegate_<pipeline>``, which it creates on its first run just before the slot: ``FOR ALL
TABLES`` when ``source.tables`` is empty (every table is captured), else ``FOR TABLE`` the
captured tables that exist then. Creating it needs the CREATE privilege on the database and
ownership of each table (``FOR ALL TABLES``: a superuser); without them the run fails with the
statement an administrator can run instead (a publication of that name is then used as is).

Order matters: pgoutput looks a publication up as the catalog was when each change was
written, so a slot whose start lies before the publication's creation cannot be read with it
("publication ... does not exist"); a table added to a publication later is published from the
ALTER on. The pipeline therefore creates its publication before its slot, and preflight
(:meth:`Publication.problems`) checks that the publication exists and covers the captured
tables.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import psycopg2
import psycopg2.errors

from ...errors import SourceError, SourceSettingError
from ..preflight import ERROR, INFO, WARNING, Problem
from .connection import PgServer
from .slot import PluginUnavailableError
from .snapshot import SYSTEM_SCHEMAS_SQL
from .snapshot import _ident as ident

log = logging.getLogger(__name__)


class PublicationPrivilegeError(PluginUnavailableError):
    """The pipeline may not create its own publication (and so a pgoutput slot) here."""


Table = tuple[str, str]  # (schema, table)
ACTIONS = ("insert", "update", "delete", "truncate")


def _names(tables: Iterable[Table]) -> str:
    return ", ".join(f"{s}.{t}" for s, t in sorted(tables))


def publication_tables(server: PgServer, tables: Any) -> list[Table] | None:
    """What a pipeline's own publication is for: None (every table) when its ``source.tables``
    is empty, else the captured tables (and partitioned tables) that exist, from the catalog."""
    if not tables:
        return None
    rows = server.query("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = "
                        f"c.relnamespace WHERE c.relkind IN ('r', 'p') AND {SYSTEM_SCHEMAS_SQL} "
                        "ORDER BY 1, 2", ())
    return [(s, t) for s, t in rows if (s, t) in tables]


class Publication:
    def __init__(self, server: PgServer, name: str, *, owned: bool):
        self.server = server
        self.name = name
        self.owned = owned  # the pipeline's own (created by it) or one source.publication names

    @property
    def conn(self):
        return self.server.conn

    def info(self) -> dict[str, Any] | None:
        """The publication's row of ``pg_publication``, or None when there is none."""
        rows = self.server.query("SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, "
                                 "pubviaroot FROM pg_publication WHERE pubname = %s", (self.name,))
        if not rows:
            return None
        alltables, *actions, viaroot = rows[0]
        return {"all_tables": alltables, "actions": dict(zip(ACTIONS, actions, strict=True)),
                "via_root": viaroot}

    def tables(self) -> set[Table]:
        """The tables the publication publishes now (partitions of a published partitioned
        table included)."""
        return {(s, t) for s, t in self.server.query(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (self.name,))}

    def create_statement(self, tables: list[Table] | None) -> str:
        """``CREATE PUBLICATION``: FOR ALL TABLES (``tables`` None) or FOR TABLE ``tables``."""
        what = ("ALL TABLES" if tables is None else
                "TABLE " + ", ".join(f"{ident(s)}.{ident(t)}" for s, t in sorted(tables)))
        return f"CREATE PUBLICATION {ident(self.name)} FOR {what}"

    def ensure(self, tables: list[Table] | None) -> bool:
        """Make the pipeline's own publication when it does not exist yet: for every table
        (``tables`` None) or for ``tables``. True when it was created. A publication that
        ``source.publication`` names is never created: it must exist."""
        if self.info() is not None:
            return False
        if not self.owned:
            raise SourceSettingError(
                f"publication {self.name!r} (source.publication) does not exist on {self.conn}: create "
                f"it before the pipeline's first run (CREATE PUBLICATION {self.name} FOR TABLE ...), or "
                f"remove source.publication to let the pipeline create its own")
        if tables is not None and not tables:
            raise SourceSettingError(
                f"none of the tables of source.tables exists on {self.conn} yet: the pipeline's "
                f"publication {self.name!r} is created for the captured tables, so create them first")
        statement = self.create_statement(tables)
        try:
            self.server.query(statement)
        except psycopg2.errors.DuplicateObject:
            return False
        except psycopg2.errors.InsufficientPrivilege as exc:
            need = ("a superuser (FOR ALL TABLES)" if tables is None else
                    "the CREATE privilege on the database and ownership of every table")
            reason = str(exc).strip().splitlines()[0]
            raise PublicationPrivilegeError(
                f"cannot create publication {self.name!r} on {self.conn}: {reason}. It takes {need}. "
                f"Have an administrator run: {statement}; the pipeline then uses it as it is (or set "
                f"source.publication to an existing publication)") from None
        except psycopg2.Error as exc:
            msg = (exc.pgerror or str(exc)).strip().splitlines()[0]
            raise SourceError(f"cannot create publication {self.name!r} on {self.conn}: {msg}") from None
        log.warning("created publication %r on %s for %s", self.name, self.conn,
                    "all tables" if tables is None else _names(tables))
        return True

    def problems(self, captured: list[Table] | None, slot_exists: bool) -> list[Problem]:
        """Preflight: the publication exists, covers the captured tables (``captured``: the
        existing tables ``source.tables`` selects; None when every table is captured) and
        publishes every kind of change."""
        info = self.info()
        if info is None:
            if self.owned and not slot_exists:
                return [Problem("publication", self.name,
                                f"publication {self.name!r} does not exist yet: it is created with the "
                                f"slot on the pipeline's first run", WARNING)]
            how = ("the pipeline created it with its slot: re-create it and then the slot" if self.owned
                   else f"CREATE PUBLICATION {self.name} FOR TABLE ...")
            return [Problem("publication", self.name,
                            f"publication {self.name!r} does not exist on {self.conn}: reading the slot "
                            f"with pgoutput fails without it ({how}; docs/operations.md)")]
        out: list[Problem] = []
        published = None if info["all_tables"] else self.tables()
        if captured is None and published is not None:
            out.append(Problem("publication", self.name,
                               f"source.tables is empty and publication {self.name!r} is not FOR ALL "
                               f"TABLES: the pipeline captures the {len(published)} table(s) it publishes",
                               INFO, {"tables": sorted(f"{s}.{t}" for s, t in published)}))
        elif captured is not None and published is not None:
            missing = [t for t in captured if t not in published]
            if missing:
                out.append(Problem("publication", self.name,
                                   f"publication {self.name!r} does not publish {_names(missing)}, which "
                                   f"source.tables captures: their changes are not in the stream. "
                                   f"ALTER PUBLICATION {self.name} ADD TABLE {_names(missing)} (changes "
                                   f"before that are not published: resnapshot those tables)",
                                   ERROR, {"tables": [f"{s}.{t}" for s, t in missing]}))
        off = [a for a in ACTIONS if not info["actions"][a]]
        if off:
            out.append(Problem("publication", self.name,
                               f"publication {self.name!r} does not publish {', '.join(off)}: those "
                               f"changes are not in the stream (ALTER PUBLICATION {self.name} SET "
                               f"(publish = '{', '.join(ACTIONS)}'))", WARNING))
        if info["via_root"]:
            out.append(Problem("publication", self.name,
                               f"publication {self.name!r} has publish_via_partition_root on: changes of "
                               f"partitions carry the partitioned table's name (with wal2json they carry "
                               f"the partition's)", WARNING))
        return out
