"""Change-log sources: ``base.py`` is the interface; each kind is a package (``mysql/``,
``postgres/``) registered in :mod:`tidegate.kinds`.

``make_source(spec, conn)`` returns the source for ``spec.source.kind``. A kind's code is
imported only when its source is made, so a deployment needs only the client library of the
sources it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..kinds import source_kind

if TYPE_CHECKING:
    from ..connections import Connection
    from ..spec import PipelineSpec
    from .base import Source

__all__ = ["make_source"]


def make_source(spec: PipelineSpec, conn: Connection, **kw: Any) -> Source:
    """The :class:`Source` for the spec's ``source.kind`` reading through ``conn`` (``kw``: the
    kind's own options, such as the reader to use)."""
    try:
        kind = source_kind(spec.source.kind)
    except ValueError as exc:
        raise ValueError(f"source: {exc}") from None
    return kind.make(spec, conn, **kw)
