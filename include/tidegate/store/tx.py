"""What every role of the checkpoint store shares: the error type, the transaction cursor, and
the :class:`Role` base that runs a role's SQL through its backend's transactions."""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from ..errors import TidegateError


class StoreError(TidegateError):
    """The checkpoint store cannot be opened or used as asked."""


class Tx:
    """A cursor inside one database transaction; SQL uses ``?`` placeholders everywhere."""

    def __init__(self, cur: Any, paramstyle: str):
        self.cur = cur
        self.paramstyle = paramstyle

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.paramstyle == "format" else sql

    def exec(self, sql: str, params: tuple = ()) -> Any:
        self.cur.execute(self._sql(sql), params)
        return self.cur

    def one(self, sql: str, params: tuple = ()) -> tuple | None:
        # fetchall: a half-read RETURNING statement would keep SQLite from committing.
        rows = self.exec(sql, params).fetchall()
        return rows[0] if rows else None

    def all(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self.exec(sql, params).fetchall()


class Backend(Protocol):
    """What a role needs of the store it belongs to (a ``CheckpointStore``)."""

    def _tx(self, write: bool = False) -> contextlib.AbstractContextManager[Tx]:
        """A :class:`Tx` in one transaction of the store's connection (under its lock)."""

    def _for_update(self) -> str:
        """The clause that locks the rows a SELECT reads, where the dialect has one."""


class Role:
    """One role of the store (checkpoints, leases, ...): the SQL of its tables, run in the
    transactions of the backend it belongs to. A role that must act atomically with another
    (a checkpoint write checks the lease epoch) is handed that role when it is made, and passes
    its open :class:`Tx` to the other's in-transaction method instead of opening a second
    transaction."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def _tx(self, write: bool = False) -> contextlib.AbstractContextManager[Tx]:
        return self._backend._tx(write)
