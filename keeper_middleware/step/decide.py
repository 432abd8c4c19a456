"""The step's decision once its messages are taken in: the cut the window needs, if any.

Before a cut is chosen, what is in view is fitted under the budget in the order that loses
least: retrieved passages leave view first (they are archived text shown again), then what a
cut kept as already noted, then the biggest messages in view are excerpted (each archived
whole first). A backlog (more history than one note request can carry) is noted in parts, a
cut each. The engine (:class:`~keeper_middleware.keeper.Keeper`) calls the model and commits;
this module only decides, reading the archive for what a note request may recall.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.config import KeeperConfig
from keeper_middleware.model.setup import ModelSetup
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.dialogue import NoteDialogue
from keeper_middleware.sessions.branches import Branches, state_head
from keeper_middleware.sessions.state import SessionState
from keeper_middleware.step.backlog import Backlog, part_end, with_part
from keeper_middleware.step.cut import CutPlan
from keeper_middleware.step.entries import Entry, messages_of
from keeper_middleware.step.oversized import OversizedMessages
from keeper_middleware.step.result import Pending, StepResult
from keeper_middleware.step.room import unkeep, without_passages
from keeper_middleware.step.tail import WindowFacts
from keeper_middleware.step.window import WindowPolicy

__all__ = ["Decisions"]

log = logging.getLogger(__name__)
"""The request size of every step that decided (DEBUG)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decisions:
    """One keeper's step decisions: its configuration, window policy and the parts they read."""

    config: KeeperConfig
    window: WindowPolicy
    oversized: OversizedMessages
    dialogue: NoteDialogue
    sessions: SessionState
    branches: Branches

    def next_part(
        self, pending: Pending, result: StepResult, setup: ModelSetup, notes: Notes
    ) -> Pending:
        """After a part's cut: the window it left and the next part of the backlog (``notes``:
        as the part's cut left them, on the branch it made)."""
        backlog = pending.backlog
        assert backlog is not None
        window = self.window
        entries = window.classify(result.messages, pending.entries)
        fixed = window.size_of(setup, entries)
        room = self.config.budget - window.request_cost() - fixed
        end = part_end(backlog.entries, backlog.start, room, stop=backlog.open_at)
        taken = backlog.rest() if end is None else backlog.take(end)
        entries = [*entries, *taken]
        return self.decide(
            pending.session,
            messages_of(entries),
            entries,
            with_part(result.state, backlog, taken),
            setup,
            notes,
            True,
            None if end is None else backlog,
        )

    def decide(
        self,
        session: str,
        messages: list[BaseMessage],
        entries: list[Entry],
        kstate: dict[str, Any],
        setup: ModelSetup,
        notes: Notes,
        replaced: bool,
        backlog: Backlog | None,
        facts: WindowFacts | None = None,
    ) -> Pending:
        """The cut this window needs (if any), after fitting what is in view (``facts``: the
        window's, when known).

        A part of a backlog is always cut (the rest of the backlog follows it), and keeps no
        exchange in view: the next part comes right after it."""
        window = self.window
        budget = self.config.budget
        shrunk = replaced
        due = backlog is not None
        plan, request_tokens = window.plan(
            messages, kstate, setup, notes, due=due, entries=entries, facts=facts
        )
        again = (kstate, setup, notes, due)  # what each plan after a change in view takes
        if not due and request_tokens > budget:
            # retrieved passages are archived text shown again: when the window is over the
            # budget (an open question's work has outgrown it) they leave view before a cut
            # takes any of that work; under it they stay, so the prefix cache keeps serving them
            messages, dropped = without_passages(entries)
            if dropped:
                shrunk = True
                entries, plan, request_tokens = self._replanned(messages, entries, *again)
        if plan is None and request_tokens > budget:
            # what was kept in view as already noted may leave with the next cut instead
            messages, unkept = unkeep(entries)
            if unkept:
                shrunk = True
                entries, plan, request_tokens = self._replanned(messages, entries, *again)
        for _ in range(8):
            if plan is not None or request_tokens <= budget:
                break
            messages, more = self.oversized.shrink_in_view(session, entries, kstate, setup)
            if not more:
                break
            shrunk = True
            entries, plan, request_tokens = self._replanned(messages, entries, *again)
        if plan is None and request_tokens > budget:
            # the last resort: excerpt the biggest messages in view, wherever they are
            layout = window.layout(messages)
            messages = window.shrink_largest(
                entries,
                setup,
                self.oversized.excerpter(session, kstate),
                start=layout.head_end,
            )
            shrunk = True
            entries, plan, request_tokens = self._replanned(messages, entries, *again)
        if backlog is not None:
            if plan is None:
                # nothing in this part could be cut: the rest is decided as one window
                taken = backlog.rest()
                entries = [*entries, *taken]
                merged = with_part(kstate, backlog, taken)
                return self.decide(
                    session, messages_of(entries), entries, merged, setup, notes, shrunk, None
                )
            if not plan.pinned:
                plan = replace(plan, keep_from=plan.boundary)
        counters = self.sessions.counters(session)
        if plan is None:  # sent as it is; a cut records the window it leaves (``CutCommit.finish``)
            counters.peak_window = max(counters.peak_window, request_tokens)
        log.debug(
            "step session=%s messages=%d request_tokens=%d notes_at=%d budget=%d",
            session,
            len(messages),
            request_tokens,
            self.config.notes_threshold,
            budget,
        )
        if plan is None and request_tokens > budget:
            raise window.too_big_error(request_tokens, entries, setup)
        pending = Pending(
            session,
            messages,
            kstate,
            plan,
            notes,
            replaced=shrunk,
            entries=entries,
            backlog=backlog,
        )
        if plan is not None and self.config.notes_mode == "in_place":
            # only the moved entries the noted turns may name are read, not every one ever moved
            noted = self.dialogue.noted_text(pending)
            chain = self.branches.chain(session, state_head(kstate))
            pending.moved_entries = self.sessions.moved_named(session, noted, chain)
            pending.archived_keys = self.sessions.archived_keys(
                session, self.dialogue.named_names(noted), chain
            )
        return pending

    def _replanned(
        self,
        messages: list[BaseMessage],
        entries: list[Entry],
        kstate: dict[str, Any],
        setup: ModelSetup,
        notes: Notes,
        due: bool,
    ) -> tuple[list[Entry], CutPlan | None, int]:
        """The entries of ``messages`` after something in view changed (those in ``entries``
        reused), and :meth:`WindowPolicy.plan` of them."""
        entries = self.window.classify(messages, entries)
        plan, request_tokens = self.window.plan(
            messages, kstate, setup, notes, due=due, entries=entries
        )
        return entries, plan, request_tokens
