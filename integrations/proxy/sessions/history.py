"""Mapping an agent's whole, ever-growing history onto the keeper's window, by content (pure).

The agent sends everything it still holds on every call; the proxy keeps its own window (what
the upstream sees: the task, the NOTES, the turns still in view, its own archive searches) and
remembers one fingerprint per agent message it has taken in, in the agent's order. Each request
is *aligned* with those fingerprints by content, never by position:

- **Continuing**: the request is what was taken in plus new messages; the new ones are appended.
- **Trimming the front**: an agent that drops its oldest messages sends a request that starts
  inside what was taken in. The dropped messages are not withdrawn: they stay in view or in the
  archive, where the keeper put them.
- **Editing, regenerating, resending**: the messages taken in after the first one the request
  still carries, and that the request no longer carries, are *withdrawn*. Those still in the
  live window after the NOTES are removed from it (and what the proxy placed after them); the
  NOTES' count of kept messages is lowered to match. Matched messages the removal took along are
  put back, so an edit in view replaces one message and keeps the rest. Archived messages and
  those in the pinned head stay where they are: the archive is never edited.
- **Coming back**: a withdrawn message that a later request carries again (the owner of a
  session continuing after a foreign request, a client undoing an edit) gets its first id back,
  so it is never archived twice and, if it was archived, not put in view again.
- **A request that shares nothing** with the session (a foreign request) withdraws nothing.

The reply the proxy returns is taken in with the fingerprint of the form the agent receives, so
the agent sending it back is recognised.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.integrations.proxy.conversation.chat_request import LazyMessages
from keeper_middleware.integrations.proxy.conversation.form import RequestError
from keeper_middleware.integrations.proxy.sessions.records import SessionRecord
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import parse_notes, render_notes

__all__ = ["Intake", "align", "continued", "take_in", "unknown_response", "withdraw"]


@dataclass(frozen=True, slots=True)
class Intake:
    """What taking in one request changed."""

    record: SessionRecord
    new: int
    """Agent messages taken in with a new id."""
    withdrawn: int
    """Earlier agent messages the request no longer carries (edited, dropped or resent)."""
    removed_from_view: int
    """Window messages removed and not put back."""
    returned: int = 0
    """Withdrawn messages the request carried again, recognised by content."""
    added_chars: int = 0
    """Characters of text the window holds that it did not hold before the request."""


def align(taken: Sequence[str], digests: Sequence[str]) -> list[tuple[int, int]]:
    """(taken index, request index) of every message matched by content, both in order.

    The common shapes (continuing, trimming the front) are found in linear time; anything else
    goes to a longest-matching-blocks diff."""
    n, m = len(taken), len(digests)
    if not n or not m:
        return []
    if m >= n and list(digests[:n]) == list(taken):
        return [(i, i) for i in range(n)]
    if m <= n and list(taken[:m]) == list(digests):
        return [(i, i) for i in range(m)]
    first = digests[0]
    for start in (i for i, d in enumerate(taken) if d == first):
        run = n - start
        if run <= m and list(taken[start:]) == list(digests[:run]):
            return [(start + i, i) for i in range(run)]
    matcher = difflib.SequenceMatcher(None, list(taken), list(digests), autojunk=False)
    return [(a + i, b + i) for a, b, size in matcher.get_matching_blocks() for i in range(size)]


def take_in(
    record: SessionRecord,
    messages: Sequence[BaseMessage],
    digests: Sequence[str],
    new_id: Callable[[], str],
    archived: Callable[[set[str]], set[str]],
    *,
    keep_dropped: bool = False,
    incremental: bool = True,
) -> Intake:
    """The record after the agent's request: withdrawals applied, new messages appended.

    ``archived`` says which of some message ids the archive holds (only asked about withdrawn
    messages coming back). With ``keep_dropped`` nothing is withdrawn: messages the request no
    longer carries stay where they are (the client compacted its own history; the keeper keeps
    what it dropped in view until a cut archives it). ``incremental=False`` aligns even a
    continuing request whole (the reference the appending path is tested against)."""
    taken = record.taken
    if incremental and _continues(taken, digests):
        return _appended(record, messages, digests, new_id, archived)
    before = {str(m.id) for m in record.window}
    intake = _matched(record, messages, digests, new_id, archived, keep_dropped=keep_dropped)
    added = sum(len(text_of(m)) for m in intake.record.window if str(m.id) not in before)
    return replace(intake, added_chars=added)


def _continues(taken: Sequence[tuple[str, str]], digests: Sequence[str]) -> bool:
    """Whether the request is what was taken in plus new messages (one comparison of the
    fingerprints at C speed: the common case, an agent continuing its conversation)."""
    count = len(taken)
    return count <= len(digests) and tuple(map(itemgetter(0), taken)) == tuple(digests[:count])


def _appended(
    record: SessionRecord,
    messages: Sequence[BaseMessage],
    digests: Sequence[str],
    new_id: Callable[[], str],
    archived: Callable[[set[str]], set[str]],
) -> Intake:
    """A continuing request: nothing is withdrawn, only the messages after what was taken in
    are read (each gets a new id, or its first id back when it was withdrawn earlier). The same
    result as :func:`_matched` gives for it, in time proportional to what is new."""
    arrivals = _Arrivals(record.withdrawn, new_id)
    new_taken = [
        (digests[j], arrivals.take(messages, j, digests[j]))
        for j in range(len(record.taken), len(digests))
    ]
    appended = arrivals.settle(
        {str(m.id) for m in record.window} if arrivals.returning else set(), archived
    )
    return Intake(
        record=replace(
            record,
            window=(*record.window, *appended),
            taken=(*record.taken, *new_taken),
            withdrawn=arrivals.still_withdrawn(),
        ),
        new=arrivals.fresh,
        withdrawn=0,
        removed_from_view=0,
        returned=len(arrivals.returning),
        added_chars=sum(len(text_of(m)) for m in appended),
    )


def _matched(
    record: SessionRecord,
    messages: Sequence[BaseMessage],
    digests: Sequence[str],
    new_id: Callable[[], str],
    archived: Callable[[set[str]], set[str]],
    *,
    keep_dropped: bool,
) -> Intake:
    """Any request, aligned with what was taken in by content (edits, regenerates, trims,
    resends, foreign requests)."""
    taken = record.taken
    pairs = align([d for d, _ in taken], digests)
    matched = {j: i for i, j in pairs}
    first = pairs[0][0] if pairs else len(taken)
    kept_taken = {i for i, _ in pairs}
    withdrawn = [taken[i] for i in range(first, len(taken)) if i not in kept_taken]
    if keep_dropped:
        withdrawn = []
    arrivals = _Arrivals((*record.withdrawn, *withdrawn), new_id)
    window = withdraw(record.window, {msg_id for _, msg_id in withdrawn})
    in_window = {str(m.id) for m in window}
    removed = {str(m.id): m for m in record.window if str(m.id) not in in_window}

    new_taken = list(taken[:first])
    arrivals.appended = [removed[msg_id] for _, msg_id in new_taken if msg_id in removed]
    put_back = len(arrivals.appended)
    for j, digest in enumerate(digests):
        if j in matched:
            msg_id = taken[matched[j]][1]
            if msg_id in removed:
                arrivals.appended.append(removed[msg_id])
                put_back += 1
        else:
            msg_id = arrivals.take(messages, j, digest)
        new_taken.append((digest, msg_id))
    appended = arrivals.settle(in_window, archived)
    return Intake(
        record=replace(
            record,
            window=(*window, *appended),
            taken=tuple(new_taken),
            withdrawn=arrivals.still_withdrawn(),
        ),
        new=arrivals.fresh,
        withdrawn=len(withdrawn),
        removed_from_view=len(removed) - put_back,
        returned=len(arrivals.returning),
    )


class _Arrivals:
    """The request's messages the session does not hold (in the order they come): each gets
    a new id, or its first id back when a withdrawn message with its fingerprint waits."""

    def __init__(self, withdrawn: Sequence[tuple[str, str]], new_id: Callable[[], str]) -> None:
        self.pool: dict[str, list[str]] = {}
        for digest, msg_id in withdrawn:
            self.pool.setdefault(digest, []).append(msg_id)
        self.new_id = new_id
        self.appended: list[BaseMessage] = []
        self.returning: list[tuple[int, str]] = []
        self.fresh = 0

    def take(self, messages: Sequence[BaseMessage], index: int, digest: str) -> str:
        """Append ``messages[index]`` with its id; the id."""
        waiting = self.pool.get(digest)
        if waiting:
            msg_id = waiting.pop(0)
            self.returning.append((len(self.appended), msg_id))
        else:
            msg_id, self.fresh = self.new_id(), self.fresh + 1
        self.appended.append(_with_id(messages, index, msg_id))
        return msg_id

    def settle(
        self, in_window: set[str], archived: Callable[[set[str]], set[str]]
    ) -> list[BaseMessage]:
        """What to append: returning messages still in view, or archived, are not put back."""
        if not self.returning:
            return self.appended
        back = {msg_id for _, msg_id in self.returning}
        skip = (back & in_window) | archived(back - in_window)
        drop = {at for at, msg_id in self.returning if msg_id in skip}
        return [m for at, m in enumerate(self.appended) if at not in drop]

    def still_withdrawn(self) -> tuple[tuple[str, str], ...]:
        return tuple((d, i) for d, ids in self.pool.items() for i in ids)


def unknown_response() -> RequestError:
    """The one error for a ``previous_response_id`` this proxy cannot continue for the caller:
    malformed, never given, or another tenant's (which reads exactly like an unknown one, so an
    id tells nobody whether it names something elsewhere)."""
    return RequestError(
        "This previous_response_id is not known to this proxy: send the whole conversation in "
        "'input', or continue from the latest response of the conversation.",
        param="previous_response_id",
    )


def _notes_at(window: Sequence[BaseMessage]) -> int | None:
    return next((i for i, m in enumerate(window) if keeper_kind(m) == "notes"), None)


def withdraw(window: Sequence[BaseMessage], ids: set[str]) -> tuple[BaseMessage, ...]:
    """The window without the withdrawn messages that can still leave it, and what follows them.

    Only messages after the NOTES can leave (the pinned head stays once NOTES exist). When the
    first one removed is among the messages the NOTES say were kept in view, the NOTES' kept count
    is lowered so the keeper does not take later messages for already noted.
    """
    if not ids:
        return tuple(window)
    notes_at = _notes_at(window)
    floor = 0 if notes_at is None else notes_at + 1
    cut = next((i for i in range(floor, len(window)) if str(window[i].id) in ids), None)
    if cut is None:
        return tuple(window)
    kept = list(window[:cut])
    if notes_at is not None:
        notes, kept_count = parse_notes(text_of(window[notes_at]))
        still_kept = min(kept_count, cut - floor)
        if still_kept != kept_count:
            text = render_notes(notes, kept=still_kept)
            kept[notes_at] = window[notes_at].model_copy(update={"content": text})
    return tuple(kept)


def _with_id(messages: Sequence[BaseMessage], index: int, msg_id: str) -> BaseMessage:
    """``messages[index]`` with the id the session gives it. A request's own messages
    (:class:`~..conversation.chat_request.LazyMessages`) are made with it, once; any other
    sequence's message is copied (it may be held elsewhere)."""
    if isinstance(messages, (LazyMessages, _After)):
        return messages.kept(index, msg_id)
    return messages[index].model_copy(update={"id": msg_id})


class _After(Sequence[BaseMessage]):
    """``messages`` placed after ``count`` positions that are never read (they match what the
    session has taken in already)."""

    def __init__(self, count: int, messages: Sequence[BaseMessage]) -> None:
        self.skipped, self.messages = count, messages

    def __len__(self) -> int:
        return self.skipped + len(self.messages)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < self.skipped:
            raise IndexError("a message the session has taken in already is not resent")
        return self.messages[index - self.skipped]

    def kept(self, index: int, msg_id: str) -> BaseMessage:
        """:func:`_with_id` of the message at ``index``."""
        if index < self.skipped:
            raise IndexError("a message the session has taken in already is not resent")
        return _with_id(self.messages, index - self.skipped, msg_id)


def continued(
    record: SessionRecord, request: Any, pairs: Sequence[tuple[int | None, str]]
) -> tuple[tuple[tuple[int | None, str], ...], Sequence[BaseMessage]]:
    """A request that sends only what follows the session's latest response (``continues``),
    as the whole history it stands for: what the session took in, then the request's messages.
    Refused when the session has moved on since that response (or never reached it)."""
    taken = record.taken
    if request.continues not in {msg_id for _, msg_id in taken}:  # unknown, or another tenant's
        raise unknown_response()
    if taken[-1][1] != request.continues:
        raise RequestError(
            "This response is not the latest of its conversation in keeper-proxy (a later "
            "request continued it, or it was never answered here); keeper-proxy continues "
            "only from the latest response. Send the whole conversation in 'input' instead.",
            param="previous_response_id",
        )
    whole = tuple((None, digest) for digest, _ in taken) + tuple(pairs)
    return whole, _After(len(taken), request.messages)
