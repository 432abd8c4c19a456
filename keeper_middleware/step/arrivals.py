"""Taking new messages in: item numbers, the room each may take, and what stands beside a
new question (the RULES, retrieved sentences).

This is where a message enters the keeper's view: it is numbered once, fitted once (a message
too big for its room is archived whole and stands in view as an excerpt), and a question gets
the RULES right after it, so a model that reads only the newest turns still sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.config import KeeperConfig
from keeper_middleware.messages.facts import keeper_kind, role_of
from keeper_middleware.model.setup import ModelSetup
from keeper_middleware.notes.block import Notes
from keeper_middleware.reinjection.additions import (
    merge_hits,
    question_queries,
    render_retrieved_block,
    render_rules_block,
)
from keeper_middleware.reinjection.questions import QuestionDetector
from keeper_middleware.retrievers.base import Retriever, search_within
from keeper_middleware.search.guards import after_new_input, input_budget
from keeper_middleware.sessions.branches import Branches, state_head
from keeper_middleware.sessions.state import SessionState
from keeper_middleware.step.entries import Entry, first_fresh, ids_of, messages_of
from keeper_middleware.step.items import (
    ITEMS_SINCE_NOTES,
    Counting,
    ItemNumbering,
    items_since_notes,
    renumber,
)
from keeper_middleware.step.tail import Appending
from keeper_middleware.step.window import WindowPolicy
from keeper_middleware.tokens.counting import TokenCounter

log = logging.getLogger(__name__)

ArchiveWhole = Callable[[str, BaseMessage, int | None, int, MutableMapping[str, Any]], BaseMessage]
"""Archive a message word for word on the branch the keeper state names and return its excerpt
within a cap (session, message, item, cap, keeper state): the engine's I/O, handed in."""

FoldRound = Callable[
    [str, Sequence[BaseMessage], int | None, MutableMapping[str, Any]], list[BaseMessage]
]
"""Archive every message of a round of tool calls word for word and return the pointer pair it
stands as in view (session, the round's messages, item, keeper state): the engine's I/O."""

ROOM_KEY = "room"
"""Where the keeper state keeps the room one message has in view, as the step measured it (the
search tool sizes its reply to it, on the branch it runs on)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrivals:
    """Takes new messages into one keeper's sessions."""

    config: KeeperConfig
    tokens: TokenCounter
    detector: QuestionDetector
    items: ItemNumbering
    window: WindowPolicy
    sessions: SessionState
    passages: Retriever
    """Serves the sentences shown beside a new question (``show_retrieved``)."""
    archive_whole: ArchiveWhole
    fold_round: FoldRound
    branches: Branches
    """What the branch a step runs on sees (the retrieved sentences are its own)."""
    index_ready: Callable[[str], None] = lambda session: None
    """Makes sure the session's archived turns are indexed before its passages are searched."""

    def observe(
        self,
        session: str,
        entries: Sequence[Entry],
        kstate: dict[str, Any],
        setup: ModelSetup,
        notes: Notes,
        appending: Appending | None = None,
    ) -> tuple[list[BaseMessage], bool]:
        """Number new inputs, fit each new message to the room it needs, and place the RULES
        (and retrieved sentences) after new questions. True when a message was excerpted.
        ``notes`` are the NOTES in effect on the branch ``kstate`` names; ``appending``: the
        step only appends to the window the last one ended with (what it found in that
        window; its ``ids`` end as the ids of the messages in view when ``whole`` is set)."""
        before: list[str] = kstate.get("seen", [])
        seen = set(before) if appending is None else appending.ids
        added_ids: list[str] = []  # the ids added to ``seen`` below (``appending`` only)

        def take_id(msg_id: str) -> None:
            if appending is not None and msg_id not in seen:
                added_ids.append(msg_id)
            seen.add(msg_id)

        # ``kstate`` is the step's own copy (``json_copy`` of the caller's on the full path, the
        # last step's private copy on the append path): its item numbers change in place
        held = kstate.get("items")
        items: dict[str, int] = held if type(held) is dict else dict(held or {})
        counting = Counting.load(kstate)
        since_notes = items_since_notes(kstate)
        counters = self.sessions.counters(session)
        facts = None if appending is None else appending.facts
        caps, room, folds = self.window.message_caps(
            session,
            entries,
            seen,
            setup,
            notes,
            facts=facts,
            first=None if appending is None else appending.first,
        )
        self.sessions.set_room(session, room)
        kstate[ROOM_KEY] = room
        folded = {unit[0].id: unit for unit in folds}
        skip: set[str] = set()
        result: list[BaseMessage] = []
        new_input = shrunk = False
        newest_input: BaseMessage | None = None
        # what was taken in before is passed over whole (the loop below would only note its ids
        # as seen, one by one); adding ids only makes later messages less fresh, never more
        first = first_fresh(entries, seen) if appending is None else appending.first
        if appending is None:
            seen.update(ids_of(messages_of(entries[:first])))
            result.extend(messages_of(entries[:first]))
        else:  # the last window's ids are all in ``seen`` already
            result.extend(appending.messages)
            for msg_id in ids_of(messages_of(entries[appending.length : first])):
                take_id(msg_id)
            result.extend(messages_of(entries[appending.length : first]))
        oversized = self.config.budget // 2  # a message over it is logged
        for entry in entries[first:]:
            message, msg_id = entry.message, entry.id
            if msg_id in skip:
                continue
            if not entry.fresh(seen):
                take_id(msg_id)
                result.append(message)
                continue
            unit = folded.get(msg_id)
            if unit is not None:  # a round too big even at its smallest: one pointer pair
                last_item = counting.last_item
                pair = self.fold_round(session, [e.message for e in unit], last_item, kstate)
                for e in unit:
                    items[e.id] = last_item
                    take_id(e.id)
                    skip.add(e.id)
                for m in pair:
                    take_id(str(m.id))
                result.extend(pair)
                shrunk = True
                continue
            take_id(msg_id)
            if entry.tokens > oversized:
                self._log_if_oversized(session, entry)
            is_question = entry.question
            if self.items.is_new_input(message):
                new_input = True
                newest_input = message
                taken = self.items.take(counting, message, question=is_question)
                since_notes += taken.new_item
                renumber(items, taken.renumber)
            items[msg_id] = counting.last_item
            cap = caps[msg_id]
            if entry.tokens > cap:
                message = self.archive_whole(session, message, counting.last_item, cap, kstate)
                shrunk = True
            result.append(message)
            if is_question:
                total = None if facts is None else facts.total
                room = self.config.notes_threshold - self.window.size_of(
                    setup, entries, total=total
                )
                extra = self.beside_question(
                    session, message, notes.rules, state_head(kstate), room=room
                )
                for added in extra:
                    take_id(str(added.id))
                    result.append(added)
                counters.rules_injected += sum(1 for m in extra if keeper_kind(m) == "rules")
        if new_input:
            with self.sessions.lock:
                config = self.config
                budget = input_budget(
                    config.search_budget, config.searches_per_question, newest_input
                )
                guard = after_new_input(self.sessions.guard(session), budget=budget)
                self.sessions.set_guard(session, guard)
        if appending is not None and _appended_seen(kstate, before, added_ids, result, appending):
            kstate["items"] = items  # its ids are the last window's and the ones added
        else:
            result_ids = ids_of(result)
            live_ids = set(result_ids)
            kstate["seen"] = ordered_seen(before, seen, result_ids, live_ids)
            kstate["items"] = (
                items
                if items.keys() <= live_ids
                else {k: v for k, v in items.items() if k in live_ids}
            )
        counting.save(kstate)
        kstate[ITEMS_SINCE_NOTES] = since_notes
        kstate.setdefault("notes_item", 0)
        return result, shrunk

    def beside_question(
        self,
        session: str,
        question: BaseMessage,
        rules: Sequence[str],
        head: str | None,
        *,
        room: int,
    ) -> list[BaseMessage]:
        """The keeper's messages placed right after a new question: the RULES, and the
        passages retrieved for it from the branch ``head``, within what the request leaves
        under the notes threshold (``room``: that threshold less the request with the
        question) and at most a quarter of the budget."""
        added: list[BaseMessage] = []
        qid = str(question.id)
        own = self.sessions.own
        if self.config.rules_next_to_questions and rules:
            block = render_rules_block(rules)
            room -= self.tokens.count_text(block)
            added.append(own(session, block, "rules", f"rules-{qid}"))
        if self.config.show_retrieved > 0:
            self.index_ready(session)
            within = self.branches.passages(session, head)
            per_query = [
                search_within(
                    self.passages, q, session=session, k=self.config.show_retrieved, within=within
                )
                for q in question_queries(question)
            ]
            hits = merge_hits(per_query, self.config.show_retrieved * max(1, len(per_query)))
            found = bool(hits)
            block = render_retrieved_block(hits)
            # the room above the notes threshold is the question's own work's (its search
            # results): the passages take only what is free below it, at most a quarter of the
            # budget, the lowest-ranked leaving first
            limit = min(room, self.config.budget // 4)
            while hits and self.tokens.count_text(block) > limit:
                hits = hits[: len(hits) * 3 // 4]
                block = render_retrieved_block(hits)
            if hits or not found:  # none that fits is no block, never "nothing matches"
                added.append(own(session, block, "retrieved", f"retrieved-{qid}"))
        return added

    def _log_if_oversized(self, session: str, entry: Entry) -> None:
        size = entry.tokens
        if size > self.config.budget // 2:
            log.warning(
                "oversized message session=%s id=%s role=%s tokens=%d budget=%d: it alone takes "
                "over half the budget",
                session,
                entry.message.id,
                role_of(entry.message),
                size,
                self.config.budget,
            )


def _appended_seen(
    kstate: dict[str, Any],
    before: list[str],
    added_ids: list[str],
    result: Sequence[BaseMessage],
    appending: Appending,
) -> bool:
    """Set the state's ``seen`` ids as :func:`ordered_seen` orders them, from the ids added
    alone, when every id added is in view (then the ids before were the last window's, all
    still in view, and ``appending.ids`` ends as the ids in view); False when one is not (a
    round folded to its pointer pair), and nothing is set."""
    new_ids = ids_of(result[appending.length :])
    added = set(added_ids)
    if not added.issubset(new_ids):
        return False
    fresh = dict.fromkeys(filter(added.__contains__, new_ids))
    if type(before) is list:  # the last step's private copy, this step's to extend
        before.extend(fresh)
        kstate["seen"] = before
    else:
        kstate["seen"] = [*before, *fresh]
    appending.whole = True
    return True


def ordered_seen(
    before: Sequence[str], seen: set[str], result_ids: Sequence[str], live: set[str]
) -> list[str]:
    """The ids taken in, for the keeper state: those it held (``before``) in their order, then
    the ones added, in the order of the messages in view (the ids no longer in view left out
    when any is). A stable order lets a store save only what was appended to it."""
    held = dict.fromkeys(before)
    added = seen.difference(held)
    ordered = [*held, *dict.fromkeys(filter(added.__contains__, result_ids))]
    return ordered if seen <= live else [i for i in ordered if i in live]
