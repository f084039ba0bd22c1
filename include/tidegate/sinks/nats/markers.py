"""The sink's checkpoint subject, ``{pipeline}.__checkpoint.{sink_id}``: commit markers (the
position every event before it is stored to), claims (a run's epoch, the last record carried
forward) and the fencing that JetStream's per-subject expected sequence gives them (the sink
module's docstring tells the protocol)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import nats.js.errors as jerr

from ...errors import SinkError
from ...positions import position_from_json
from ...sink_checkpoints import SinkCheckpoint
from .client import Client

POSITION_HEADER = "Tidegate-Position"
EXTENDS_HEADER = "Tidegate-Extends"
CHECKPOINT_KEY_HEADER = "Tidegate-Checkpoint-Key"
EPOCH_HEADER = "Tidegate-Epoch"
COMMIT_SEQ_HEADER = "Tidegate-Commit-Seq"  # on a claim: the stream sequence of the last commit marker
EXPECT_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed expected-sequence check


def commit_seq_of(last: Any) -> int:
    """The stream sequence of the last commit marker, given the checkpoint subject's last
    message: a commit marker (it has a ``Nats-Msg-Id``) is its own; a claim carries it in
    ``Tidegate-Commit-Seq`` (a claim written before that header: its own sequence, where the
    read-back then starts); no message: 0."""
    if last is None:
        return 0
    h = last.headers or {}
    if "Nats-Msg-Id" in h:
        return int(last.seq)
    carried = h.get(COMMIT_SEQ_HEADER, "")
    return int(carried) if carried.isdigit() else int(last.seq)


def _newer_epoch(headers: dict[str, str], epoch: int | None) -> int | None:
    held = headers.get(EPOCH_HEADER)
    return int(held) if held and held.isdigit() and int(held) > (epoch or 0) else None


@dataclasses.dataclass(eq=False, repr=False)  # repr: the default; the fields hold connection settings
class CheckpointSubject:
    """``fenced(newer epoch or None)`` is the sink's fatal error for a writer another run fenced.
    ``marker_seq``: the stream sequence of this sink's last marker or claim (None: not claimed);
    ``commit_seq``: that of its last commit marker (0: none), where the read-back starts."""

    client: Client
    stream: str
    subject: str
    checkpoint_key: str
    fenced: Callable[[int | None], SinkError]
    marker_seq: int | None = dataclasses.field(default=None, init=False)
    commit_seq: int = dataclasses.field(default=0, init=False)

    def headers(self, record: SinkCheckpoint | None, epoch: int | None) -> dict[str, str]:
        headers = {CHECKPOINT_KEY_HEADER: self.checkpoint_key}
        if record is not None:
            headers[POSITION_HEADER] = json.dumps(record.position.to_json(), sort_keys=True,
                                                  separators=(",", ":"))
            if record.extends is not None:
                headers[EXTENDS_HEADER] = str(record.extends)
        if epoch is not None:
            headers[EPOCH_HEADER] = str(epoch)
        return headers

    @staticmethod
    def body(headers: dict[str, str]) -> bytes:
        """A marker's payload says what it is, for whoever reads ``{pipeline}.>``."""
        return json.dumps({"type": "checkpoint", "checkpoint_key": headers[CHECKPOINT_KEY_HEADER],
                           "epoch": headers.get(EPOCH_HEADER)}, separators=(",", ":")).encode()

    async def last(self) -> Any:
        """The subject's last message (None: none)."""
        try:
            return await self.client.js.get_last_msg(self.stream, self.subject)
        except jerr.NotFoundError:
            return None

    async def check_claim(self, epoch: int | None) -> None:
        """Before publishing anything: is this sink's last marker still the subject's last? A
        zombie learns it was fenced here, before any data goes out (the marker's expected
        sequence is what makes it certain)."""
        if self.marker_seq is None:
            return
        last = await self.last()
        if last is not None and last.seq != self.marker_seq:
            newer = _newer_epoch(last.headers or {}, epoch)
            if newer is not None:
                raise self.fenced(newer)

    async def commit(self, record: SinkCheckpoint, epoch: int | None) -> None:
        """The commit marker of a sub-batch, refused by the server if another writer has
        written the checkpoint subject since this sink's previous marker (fencing)."""
        headers = self.headers(record, epoch)
        # Replay-stable: a retry of the same sub-batch by the same run is a duplicate.
        headers["Nats-Msg-Id"] = "|".join((self.checkpoint_key, f"e{epoch}", headers[POSITION_HEADER],
                                           f"x{record.extends}"))
        if self.marker_seq is not None:
            headers[EXPECT_LAST_SUBJECT_SEQ] = str(self.marker_seq)
        try:
            ack = await self._publish(headers)
        except jerr.APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            ack = await self._after_refused(headers["Nats-Msg-Id"])
        self.marker_seq = self.commit_seq = ack.seq

    async def _after_refused(self, msg_id: str) -> Any:
        """The marker was refused: the subject's last message is not our previous marker. It is
        this very marker when an earlier attempt was stored but its ack lost; anything else was
        written by another run."""
        last = await self.last()
        h = (last.headers or {}) if last is not None else {}
        if last is not None and h.get("Nats-Msg-Id") == msg_id:
            return last
        held = h.get(EPOCH_HEADER)
        raise self.fenced(int(held) if held and held.isdigit() else None)

    async def claim(self, epoch: int | None) -> None:
        """Publish this run's claim, the last record carried forward, expecting the subject's
        last message to be the one read (a concurrent claim: read again)."""
        while True:
            last = await self.last()
            h = (last.headers or {}) if last is not None else {}
            newer = _newer_epoch(h, epoch)
            if newer is not None:
                raise self.fenced(newer)
            commit_seq = commit_seq_of(last)
            headers = {**{k: v for k, v in h.items() if k in (POSITION_HEADER, EXTENDS_HEADER)},
                       **self.headers(None, epoch), COMMIT_SEQ_HEADER: str(commit_seq),
                       EXPECT_LAST_SUBJECT_SEQ: str(last.seq if last is not None else 0)}
            try:
                ack = await self._publish(headers)
            except jerr.APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    continue
                raise
            self.marker_seq, self.commit_seq = ack.seq, commit_seq
            return

    async def _publish(self, headers: dict[str, str]) -> Any:
        return await self.client.js.publish(self.subject, self.body(headers), stream=self.stream,
                                            timeout=self.client.publish_timeout_s, headers=headers)

    def record_of(self, msg: Any) -> SinkCheckpoint | None:
        """The sink-side checkpoint a last message carries (None: not this sink's, or none)."""
        h = msg.headers if msg is not None else None
        if not h or h.get(CHECKPOINT_KEY_HEADER) != self.checkpoint_key or POSITION_HEADER not in h:
            return None
        extends = h.get(EXTENDS_HEADER)
        return SinkCheckpoint(position_from_json(h[POSITION_HEADER]),
                              int(extends) if extends is not None and extends.isdigit() else None)


__all__ = ["CHECKPOINT_KEY_HEADER", "COMMIT_SEQ_HEADER", "EPOCH_HEADER", "EXTENDS_HEADER",
           "POSITION_HEADER", "CheckpointSubject", "commit_seq_of"]
