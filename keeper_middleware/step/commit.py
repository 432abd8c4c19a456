"""Finishing a cut: the new NOTES fitted to their budget, the window the cut leaves, and the
turns that leave it archived word for word in the same transaction as the new NOTES version
(and the change to which entries moved from the NOTES to the archive).

A cut whose transaction committed before a crash is finished from the archive, not asked of the
model again, so no turn is archived twice and no NOTES version is written twice. The same holds
for a cut replayed from the same checkpoint (LangGraph time travel without new input): its key
names the branch it follows and every message it covers, so it is the same cut, with the same
NOTES. The cut follows the branch's head (the keeper state's ``head``) and becomes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.archive.records import ArchivedTurn, NotesDraft
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig
from keeper_middleware.messages.facts import is_input
from keeper_middleware.model.setup import ModelSetup
from keeper_middleware.notes.block import Notes, notes_from_json, notes_to_json, render_notes
from keeper_middleware.notes.budget import MOVED_TURN_NAME, fit_notes, moved_text
from keeper_middleware.notes.recall import moved_update
from keeper_middleware.notes.taking import NoteOutcome
from keeper_middleware.reinjection.additions import render_rules_block
from keeper_middleware.sessions.branches import HEAD_KEY, commit_on_branch, state_head
from keeper_middleware.sessions.state import SessionState, remember_notes
from keeper_middleware.step.cut import KEPT_KEY, cut_key
from keeper_middleware.step.items import ITEMS_SINCE_NOTES
from keeper_middleware.step.result import Pending, StepResult
from keeper_middleware.step.turns import leaving_turns
from keeper_middleware.step.view_room import Excerpt
from keeper_middleware.step.window import WindowPolicy
from keeper_middleware.tokens.counting import TokenCounter

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class CutCommit:
    """Finishes the cuts of one keeper's sessions."""

    config: KeeperConfig
    tokens: TokenCounter
    window: WindowPolicy
    sessions: SessionState
    archive: ArchiveStore
    excerpter: Callable[[str, MutableMapping[str, Any]], Excerpt]
    """Archives a message whole on the branch the keeper state names and excerpts it (for a
    window still too big after a cut)."""
    sync_index: Callable[[str], None]
    """Indexes what was archived (after the transaction: a crash there is caught up)."""
    whole_of: Callable[[str, str | None, ArchivedTurn, BaseMessage], ArchivedTurn]
    """The record an untouched excerpt stands for (``OversizedMessages.whole_of``)."""

    def reuse_committed(self, pending: Pending) -> NoteOutcome | Notes | None:
        """A cut committed before a crash (or made before on this branch from the same
        messages: a replay) is finished from the archive, with the NOTES it wrote."""
        assert pending.plan is not None
        head = state_head(pending.state)
        covered = pending.messages[: pending.plan.boundary]
        pending.key = cut_key(pending.session, head, covered)
        if self.archive.find_cut(pending.session, pending.key) is None:
            return None
        written = self.archive.notes_at(pending.session, pending.key)
        return notes_from_json(written.data_json) if written else pending.notes

    def rules_beside_open_question(
        self,
        session: str,
        window: list[BaseMessage],
        pending: Pending,
        notes: Notes,
        setup: ModelSetup,
        size: int,
    ) -> tuple[list[BaseMessage], int, BaseMessage | None]:
        """The RULES placed right after the open question when the cut that just ran wrote
        the first of them (or the cuts of a backlog that came before the question).

        A question is given the RULES as it arrives, from the NOTES of that moment. When the
        same step makes the first cut of a conversation, those NOTES do not exist yet, and the
        question went out with the RULES only in the new NOTES above it (realistic traffic at
        16 turns: 8 of 26 conversations, through every entry point). A block that does not fit
        the budget is not added: the NOTES still hold the RULES.
        """
        if not (self.config.rules_next_to_questions and notes.rules):
            return window, size, None
        entries = self.window.classify(window, pending.entries)
        latest = next((i for i in reversed(range(len(entries))) if is_input(window[i])), None)
        if latest is None or not entries[latest].question:
            return window, size, None
        if any(entry.kind == "rules" for entry in entries[latest + 1 :]):
            return window, size, None
        text = render_rules_block(notes.rules)
        block = self.sessions.own(session, text, "rules", f"rules-{entries[latest].id}")
        grown = [*window[: latest + 1], block, *window[latest + 1 :]]
        grown_size = self.window.count(setup, grown)
        if grown_size > self.config.budget:
            return window, size, None
        return grown, grown_size, block

    def finish(
        self, pending: Pending, outcome: NoteOutcome | Notes, setup: ModelSetup
    ) -> StepResult:
        plan, session, messages = pending.plan, pending.session, pending.messages
        assert plan is not None
        items: dict[str, int] = pending.state["items"]
        state = pending.state
        notes = outcome.notes if isinstance(outcome, NoteOutcome) else outcome
        known = [items[str(messages[i].id)] for i in plan.noted if str(messages[i].id) in items]
        first = (
            notes.first_item if notes.first_item is not None else (min(known) if known else None)
        )
        last = max(known) if known else notes.last_item
        notes = notes.covering(first, last)
        fitted = fit_notes(
            notes, budget=self.config.notes_tokens, count_text=self.tokens.count_text
        )
        notes = fitted.notes
        rendered = render_notes(notes)
        plan, notes_message, window, size = self.window.window_after_cut(
            plan,
            messages,
            setup,
            lambda cut: self.sessions.own(
                session, render_notes(notes, kept=cut.kept_count), "notes", f"notes-{pending.key}"
            ),
        )
        if plan.keep_from < plan.boundary and size > self.config.notes_threshold:
            # the exchange kept in view is too big to leave room to work: its biggest
            # messages stand as excerpts (or pointers), archived whole now
            window = self.window.shrink_largest(
                self.window.classify(window, pending.entries),
                setup,
                self.excerpter(session, items),
                start=plan.layout.head_end + 1,
                target=self.config.notes_threshold,
            )
            size = self.window.count(setup, window)
        if size > self.config.budget:
            window = self.window.shrink_largest(
                self.window.classify(window, pending.entries),
                setup,
                self.excerpter(session, state),
                start=plan.layout.head_end + 1,
            )
            size = self.window.count(setup, window)
        if size > self.config.budget:
            raise self.window.after_cut_error(size, window, setup)
        window, size, rules_block = self.rules_beside_open_question(
            session, window, pending, notes, setup, size
        )
        head = state_head(state)
        turns = leaving_turns(
            session,
            pending.entries,
            plan,
            items,
            resolve=lambda turn, message: self.whole_of(session, head, turn, message),
        )
        if fitted.moved_any:
            # what left the NOTES is archived word for word with the cut, where search finds it
            turns.append(
                ArchivedTurn(
                    session=session,
                    msg_id=f"notes-moved-{pending.key}",
                    item=notes.last_item,
                    role="human",
                    content=moved_text(fitted, notes.last_item),
                    name=MOVED_TURN_NAME,
                )
            )
        data_json = notes_to_json(notes)
        record = commit_on_branch(
            self.archive,
            session,
            head,
            cut_key=pending.key,
            turns=turns,
            notes=NotesDraft(
                first_item=notes.first_item,
                last_item=notes.last_item,
                text=rendered,
                data_json=data_json,
            ),
            # which entries are in the archive rather than the NOTES changes with the NOTES
            moved=moved_update(
                notes,
                fitted.moved_state,
                back=[key for key, _ in pending.recalled],
                held_before=[key for key, _ in pending.notes.state],
            ),
        )
        remember_notes(data_json, notes)  # the next step reads this version: not parsed back
        self.sync_index(session)
        state = dict(state)
        state[HEAD_KEY] = pending.key
        at = next(i for i, m in enumerate(window) if m.id == notes_message.id)
        state[KEPT_KEY] = [str(m.id) for m in window[at + 1 : at + 1 + plan.kept_count]]
        state["notes_item"] = int(state.get("last_item", 0))
        state[ITEMS_SINCE_NOTES] = 0
        live = {str(m.id) for m in window}
        state["seen"] = [i for i in state["seen"] if i in live] + [str(notes_message.id)]
        if rules_block is not None and str(rules_block.id) not in state["seen"]:
            state["seen"].append(str(rules_block.id))
        state["items"] = {k: v for k, v in items.items() if k in live}
        counters = self.sessions.counters(session)
        # a cut committed again under its key (a replica that died after committing it and
        # saving the counters, the step redone elsewhere) is the same cut: count it once. The
        # NOTES versions count up by one a cut, so the version is the number of cuts made.
        made = record.notes_version if record.notes_version is not None else counters.cuts + 1
        if made > counters.cuts:
            counters.notes_entries_moved += len(fitted.moved_state) + len(fitted.moved_open)
        counters.cuts = max(counters.cuts, made)
        if rules_block is not None:
            counters.rules_injected += 1
        counters.archive_turns = self.archive.turn_count(session)
        counters.notes_tokens = self.tokens.count_text(rendered)
        counters.peak_window = max(counters.peak_window, size)
        self.sessions.save_counters(session)
        log.info(
            "cut session=%s archived=%d kept=%d window_tokens=%d budget=%d archive_turns=%d",
            session,
            record.turns_archived,
            len(window),
            size,
            self.config.budget,
            counters.archive_turns,
        )
        log.info(
            "notes session=%s version=%s items=%s-%s rules=%d state=%d open=%d tokens=%d",
            session,
            record.notes_version,
            notes.first_item,
            notes.last_item,
            len(notes.rules),
            len(notes.state),
            len(notes.open),
            counters.notes_tokens,
        )
        return StepResult(window, state, changed=True, rewritten=True, cut=True)
