"""NATS subjects: the filter a subject template stands for, whether a stream's subject captures
another, and which subjects one may publish to (pure functions)."""

from __future__ import annotations

import re

# A subject one can publish to: dot-separated non-empty tokens, no whitespace, no wildcard.
_VALID_SUBJECT = re.compile(r"^[^\s.*>]+(\.[^\s.*>]+)*$")


def subject_filter(template: str, pipeline: str) -> str:
    """The subjects a template can produce, as a NATS filter: ``{pipeline}`` filled in, a token
    that is one placeholder → ``*``, a token with a placeholder inside → ``>`` (and stop)."""
    out = []
    for tok in template.replace("{pipeline}", pipeline).split("."):
        if "{" not in tok:
            out.append(tok)
        elif re.fullmatch(r"\{(db|schema|table)\}", tok):
            out.append("*")
        else:
            out.append(">")
            break
    return ".".join(out)


def subject_covers(pattern: str, subject: str) -> bool:
    """Does stream subject ``pattern`` capture every subject matching filter ``subject``?"""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return i < len(s)
        if i >= len(s) or s[i] == ">":
            return False
        if tok != "*" and tok != s[i]:
            return False
    return len(p) == len(s)


def publishable(subject: str) -> bool:
    return _VALID_SUBJECT.match(subject) is not None


def fewest_filters(subjects: str, channels: tuple[str, ...]) -> list[str]:
    """``subjects`` (a filter) and those of ``channels`` it does not cover: as few filters as
    cover them all (NATS 2.9: one filter per consumer)."""
    return [subjects] + [c for c in channels if not subject_covers(subjects, c)]


__all__ = ["fewest_filters", "publishable", "subject_covers", "subject_filter"]
