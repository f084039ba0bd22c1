"""Which seeds a generated test runs: its own few in ``make test``, or others named in an
environment variable, so a developer can point any generator at a range nobody ran yet.

``N`` runs seeds 0..N-1 (what each variable meant before ranges); ``A-B`` runs A..B, both
included; ``a,b,c`` runs those. A value of another form is refused with the forms it takes."""

from __future__ import annotations

import os
import re


def seeds_from_env(name: str, default: list[int]) -> list[int]:
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return list(default)
    if re.fullmatch(r"\d+", raw):
        return list(range(int(raw)))
    if m := re.fullmatch(r"(\d+)-(\d+)", raw):
        return list(range(int(m[1]), int(m[2]) + 1))
    if re.fullmatch(r"\d+(,\d+)+", raw):
        return [int(s) for s in raw.split(",")]
    raise ValueError(f"{name}={raw!r}: give a count N (seeds 0..N-1), a range A-B (both included) "
                     f"or a list a,b,c")
