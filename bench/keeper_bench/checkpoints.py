"""The run folder's LangGraph checkpointer, which stores each message once.

A run commits a checkpoint at every graph step (``durability="sync"``, so that a run cut short
resumes inside its step), and LangGraph's ``SqliteSaver`` writes the whole graph state each
time. For an arm whose state stays the size of its window that is cheap; langmem's peer keeps
every message of the stream in its state (its node never removes one), so each step wrote the
whole stream read so far, up to four times, and read it back: a 1M-token run spent most of its
time there, and the time grew with the square of the stream.

:class:`MessageSharingSaver` stores each distinct message once, in its own table, keyed by a
digest of its serialised form; a checkpoint keeps the digests of a message list in place of the
list. What a checkpoint restores is what it would have restored before: the same serialiser
writes and reads every message, only the container differs. A checkpoint written by the plain
saver (a run folder from before) is read as it was written.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_bench.arms.peers import LANGMEM_SUMMARY_TYPE

MESSAGE_REFS = "__keeper_bench_message_refs__"
"""The key of the dict that stands for a message list in a stored checkpoint."""

_LOOKUP_CHUNK = 500
"""Digests per SELECT when messages are read back (SQLite caps a statement's parameters)."""


def _is_message_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, BaseMessage) for item in value)
    )


def _message_refs(value: Any) -> list[str] | None:
    if isinstance(value, dict) and len(value) == 1 and MESSAGE_REFS in value:
        return list(value[MESSAGE_REFS])
    return None


def _scope(config: RunnableConfig) -> tuple[str, str]:
    configurable = config.get("configurable", {})
    return str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))


class MessageSharingSaver(SqliteSaver):
    """A ``SqliteSaver`` whose checkpoints refer to their messages instead of holding them.

    Messages live in ``message_blobs`` (digest, serialiser type, bytes), written once and never
    deleted; the checkpoints and pending writes tables are LangGraph's own.
    """

    def __init__(self, conn: sqlite3.Connection, *, serde: Any = None) -> None:
        super().__init__(conn, serde=serde)
        # the digests known to be in ``message_blobs`` (their bytes stay in the file: holding
        # them here kept every message of a 10M-token run in memory, 70 MB of peak RSS)
        self._stored: set[str] = set()
        # the digests last stored or restored for a message channel, with the channel's version
        # then: a checkpoint whose channel kept that version holds that very list (as LangGraph's
        # own savers assume when they store a channel only when its version changes)
        self._refs: dict[tuple[tuple[str, str], str], tuple[Any, list[str]]] = {}

    def setup(self) -> None:
        if self.is_setup:
            return
        super().setup()
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS message_blobs "
            "(digest TEXT PRIMARY KEY, type TEXT NOT NULL, blob BLOB NOT NULL)"
        )
        self.conn.commit()

    # -- writing ---------------------------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        values = dict(checkpoint["channel_values"])
        versions = checkpoint["channel_versions"]
        new: list[tuple[str, str, bytes]] = []
        for channel, value in values.items():
            if not _is_message_list(value):
                continue
            key = (_scope(config), channel)
            known, version = self._refs.get(key), versions.get(channel)
            if known is not None and version is not None and known[0] == version:
                refs = known[1]  # unchanged since stored or restored: LangGraph's own contract
            else:
                refs = [self._digest(m, new) for m in value]
                self._refs[key] = (version, refs)
            values[channel] = {MESSAGE_REFS: refs}
        if new:
            # in the transaction that the checkpoint's own insert commits (or an earlier one)
            with self.cursor(transaction=False) as cur:
                cur.executemany(
                    "INSERT OR IGNORE INTO message_blobs (digest, type, blob) VALUES (?, ?, ?)",
                    new,
                )
        stored: Checkpoint = {**checkpoint, "channel_values": values}
        return super().put(config, stored, metadata, new_versions)

    def _digest(self, message: BaseMessage, new: list[tuple[str, str, bytes]]) -> str:
        kind, blob = self.serde.dumps_typed(message)
        digest = hashlib.blake2b(kind.encode() + b"\0" + blob, digest_size=20).hexdigest()
        if digest not in self._stored:
            self._stored.add(digest)
            new.append((digest, kind, blob))
        return digest

    # -- reading ---------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = super().get_tuple(config)
        return None if found is None else self._restored(found)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        for found in super().list(config, filter=filter, before=before, limit=limit):
            yield self._restored(found)

    def _restored(self, found: CheckpointTuple) -> CheckpointTuple:
        values = dict(found.checkpoint["channel_values"])
        referring = {c: refs for c, v in values.items() if (refs := _message_refs(v)) is not None}
        if not referring:
            return found
        blobs = self._load([d for refs in referring.values() for d in refs])
        versions = found.checkpoint["channel_versions"]
        for channel, refs in referring.items():
            values[channel] = [self.serde.loads_typed(blobs[d]) for d in refs]
            self._refs[(_scope(found.config), channel)] = (versions.get(channel), refs)
        return found._replace(checkpoint={**found.checkpoint, "channel_values": values})

    def _load(self, digests: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        """Read the messages a checkpoint refers to from the file (a run reads a checkpoint only
        to resume, so they are read, not remembered)."""
        blobs: dict[str, tuple[str, bytes]] = {}
        wanted = sorted(set(digests))
        with self.cursor(transaction=False) as cur:
            for start in range(0, len(wanted), _LOOKUP_CHUNK):
                chunk = wanted[start : start + _LOOKUP_CHUNK]
                marks = ",".join("?" * len(chunk))
                cur.execute(
                    f"SELECT digest, type, blob FROM message_blobs WHERE digest IN ({marks})",
                    chunk,
                )
                for digest, kind, blob in cur.fetchall():
                    blobs[digest] = (kind, blob)
        self._stored.update(blobs)
        lost = [d for d in wanted if d not in blobs]
        if lost:
            raise ValueError(
                f"{len(lost)} message(s) a checkpoint refers to are missing from message_blobs "
                f"(first {lost[0]}); the checkpoint file is damaged: delete the run folder's "
                "checkpoints.sqlite3 and its progress.json to run the arm again"
            )
        return blobs

    # -- housekeeping ----------------------------------------------------------------------------
    def latest_checkpoint_id(self, thread_id: str) -> str | None:
        """The thread's newest checkpoint id, read without loading the checkpoint."""
        with self.cursor(transaction=False) as cur:
            cur.execute(
                "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' "
                "ORDER BY checkpoint_id DESC LIMIT 1",
                (thread_id,),
            )
            row = cur.fetchone()
        return None if row is None else str(row[0])

    def keep_only_latest(self, thread_id: str) -> None:
        """Delete the thread's older checkpoints and their writes: a resume never needs them,
        and a long run would otherwise store its whole window once per graph step."""
        latest = self.latest_checkpoint_id(thread_id)
        if latest is None:
            return
        with self.cursor() as cur:
            for table in ("checkpoints", "writes"):
                cur.execute(
                    f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_id != ?",
                    (thread_id, latest),
                )


def open_checkpointer(path: Path) -> MessageSharingSaver:
    """The run folder's checkpointer; it may also restore langmem's running summary (its peer
    arm keeps one in the graph state; LangGraph would otherwise warn about an unregistered
    type)."""
    connection = sqlite3.connect(str(path), check_same_thread=False)
    # its WAL journal then survives a killed process without a sync at every graph step (a run
    # commits one per step); only a power cut could lose the last steps, which a resume redoes
    connection.execute("PRAGMA synchronous=NORMAL")
    serde = JsonPlusSerializer(allowed_msgpack_modules=[LANGMEM_SUMMARY_TYPE])
    return MessageSharingSaver(connection, serde=serde)
