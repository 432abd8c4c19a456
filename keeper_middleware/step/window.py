"""The window policy: how big a request is, when to cut, and how much room each part gets (pure).

Everything here is a function of the messages, the NOTES, the configuration and the token
counter, so the sync and async steps, and every adapter, size requests alike; the engine does
the archiving these decisions call for.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.config import KeeperConfig
from keeper_middleware.errors import WindowTooSmallError
from keeper_middleware.messages.facts import (
    first_of_kind,
    keeper_message,
    kind_positions,
    safe_boundary,
    text_of,
)
from keeper_middleware.messages.memo import SameMessageMemo
from keeper_middleware.model.setup import ModelSetup
from keeper_middleware.notes.block import Notes, parse_notes, render_notes
from keeper_middleware.notes.cadence import items_due
from keeper_middleware.notes.rewrite import REWRITE_REQUEST_TEXT
from keeper_middleware.notes.taking import notes_request_text
from keeper_middleware.reinjection.additions import render_rules_block
from keeper_middleware.reinjection.questions import QuestionDetector, open_question_index
from keeper_middleware.step.cut import (
    CutPlan,
    Layout,
    find_layout,
    pin_open_question,
    plan_cut,
    work_start,
)
from keeper_middleware.step.entries import Entry, classify, messages_of, sizes_of
from keeper_middleware.step.items import items_since_notes
from keeper_middleware.step.tail import WindowFacts
from keeper_middleware.step.view_room import ViewRoom, listed_parts
from keeper_middleware.tokens.counting import ADDITIVE_COUNTERS, TokenCounter

NOTES_FRAME_TOKENS = 64
"""What the NOTES message adds to the NOTES' own text (its frame, mark and kept-turns line)."""


@dataclass(frozen=True, slots=True)
class WindowPolicy(ViewRoom):
    """The sizing decisions of one keeper: its configuration, counter and question detector."""

    config: KeeperConfig
    tokens: TokenCounter
    detector: QuestionDetector
    unchanged_in_place: bool = False
    """The caller never changes a message in place once a step has seen it
    (:class:`~keeper_middleware.step.known.LastEntries`): what was worked out of a message is
    then kept by the object alone, with no copy of its fields to compare."""
    _known: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Sizes that are the same for every request of this keeper (the note request's)."""
    _setups: list[tuple[ModelSetup, tuple[int, int]]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    """The setup the keeper was last called with, and what it adds to a request."""
    _besides: list[tuple[tuple[str, ...], int]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    """The RULES :meth:`beside_cost` last priced, and the price."""
    _floors: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    """:meth:`excerpt_floor` by session (bounded)."""
    _facts: SameMessageMemo[dict[str, Any]] = field(
        default_factory=SameMessageMemo, init=False, repr=False, compare=False
    )
    """What earlier steps worked out of each message still in view (kind, size, question), so a
    step classifies only its new messages (:mod:`~keeper_middleware.messages.memo`)."""

    def __post_init__(self) -> None:
        if self.unchanged_in_place:
            object.__setattr__(self, "_facts", SameMessageMemo(same_objects=True))

    def classify(self, messages: Sequence[BaseMessage], known: Sequence[Entry] = ()) -> list[Entry]:
        """The step's entries of ``messages`` (those in ``known`` reused for the same message,
        and what an earlier step worked out of the same unchanged message object)."""
        return classify(messages, self.tokens, self.detector, known, self._facts)

    def count(self, setup: ModelSetup, messages: Sequence[BaseMessage]) -> int:
        """The request's size as the model receives it (system prompt and tools included)."""
        if not messages:
            return self._setup_sizes(setup)[0]
        return self.tokens.count_messages(setup.render(messages), setup.tool_schemas)

    def _setup_sizes(self, setup: ModelSetup) -> tuple[int, int]:
        """What ``setup`` adds to any request: its system prompt and tools, and its tools
        alone. Counted once for the setup a keeper was last called with (every step asks
        several times; an equal setup made anew for each request is the same setup)."""
        known = self._setups
        if known and (known[0][0] is setup or known[0][0] == setup):
            return known[0][1]
        bare = self.tokens.count_messages(setup.render([]), setup.tool_schemas)
        tools = self.tokens.count_messages([], setup.tool_schemas)
        known[:] = [(setup, (bare, tools))]
        return bare, tools

    def count_of(
        self,
        setup: ModelSetup,
        messages: Sequence[BaseMessage],
        entries: Sequence[Entry] | None,
        facts: WindowFacts | None = None,
    ) -> int:
        """:meth:`count` of ``messages``; from their entries' sizes (each message's counted once,
        no pass through the counter) when ``entries`` are theirs and the counter's count of a
        request is the sum of its messages' counts, so the two are the same number (``facts``:
        the window's, when its step only appended to the last one's: their sum of sizes)."""
        if facts is not None and entries is not None and type(self.tokens) in ADDITIVE_COUNTERS:
            return self.size_of(setup, entries, total=facts.total)
        if (
            entries is not None
            and type(self.tokens) in ADDITIVE_COUNTERS
            and len(entries) == len(messages)
            and all(map(operator.is_, messages_of(entries), messages))
        ):
            return self.size_of(setup, entries)
        return self.count(setup, messages)

    def layout(self, messages: Sequence[BaseMessage]) -> Layout:
        """Where the head, the NOTES and the already-noted messages are."""
        at = first_of_kind(messages, "notes")
        kept = 0 if at is None else _kept_of(text_of(messages[at]))
        return find_layout(messages, pinned_head=self.config.pinned_head, kept=kept, notes_index=at)

    def notes_due(
        self,
        kstate: Mapping[str, Any],
        request_tokens: int,
        layout: Layout,
        messages: Sequence[BaseMessage],
        *,
        asking: int | None = None,
        new_tokens: int | None = None,
    ) -> bool:
        """Whether a cut is due: the request reached the threshold, or enough items passed.

        While a question is open (``asking``: its index) the threshold is the budget itself:
        the question's work (its search results, what it read) is its working set and may fill
        the window before a cut takes anything; a cut at the notes threshold there archived
        results the answer still needed, and the searches to find them again ran out."""
        if layout.noted_start >= len(messages):
            return False
        threshold = self.config.notes_threshold if asking is None else self.config.budget + 1
        if request_tokens >= threshold:
            return True
        every = self.config.notes_every_items
        if every is None:
            return False
        # numbering can restart, jump or go back: items are counted as they arrive, never a
        # negative count (``items_since_notes``)
        new_items = items_since_notes(kstate)
        if new_items >= every or layout.notes_index is None:
            return new_items >= every
        due = items_due(
            every=every,
            notes_tokens=self.tokens.count_messages([messages[layout.notes_index]]),
            new_tokens=(
                self.tokens.count_messages(messages[layout.noted_start :])
                if new_tokens is None
                else new_tokens
            ),
            new_items=new_items,
        )
        return new_items >= due

    def plan(
        self,
        messages: list[BaseMessage],
        kstate: Mapping[str, Any],
        setup: ModelSetup,
        notes: Notes,
        *,
        due: bool = False,
        entries: Sequence[Entry] | None = None,
        facts: WindowFacts | None = None,
    ) -> tuple[CutPlan | None, int]:
        """The cut to make now (None: none), and the request's size as it stands (``due``:
        cut whatever the size and the cadence say, as a part of a backlog is; ``entries``:
        the step's entries of ``messages``, whose sizes it adds up when the counter allows;
        ``facts``: what the whole-window passes give for them, when known)."""
        new_tokens = None
        if facts is None or entries is None or type(self.tokens) not in ADDITIVE_COUNTERS:
            facts = None
            layout = self.layout(messages)
            open_at = open_question_index(messages, self.detector, start=layout.head_end)
        else:
            layout, open_at = facts.layout, facts.open_at
            new_tokens = facts.noted_tokens(entries)
        request_tokens = self.count_of(setup, messages, entries, facts)
        plan = None
        if due or self.notes_due(
            kstate, request_tokens, layout, messages, asking=open_at, new_tokens=new_tokens
        ):
            request_cost = self.request_cost()

            def fits(boundary: int) -> bool:
                size = self.count(setup, messages[:boundary]) + request_cost
                return size <= self.config.budget

            plan = plan_cut(messages, layout, open_question=open_at, notes_call_fits=fits)
            if plan is not None and plan.kept_count:
                plan = self.drop_kept_if_too_big(plan, messages, notes, setup)
            over = request_tokens > self.config.budget
            if open_at is not None and over and not self.leaves_room(plan, messages, notes, setup):
                # the work on an open question has outgrown the window: note and archive it,
                # keeping the question itself in view
                passing = plan_cut(messages, layout, open_question=None, notes_call_fits=fits)
                if passing is not None:
                    pinned = pin_open_question(messages, passing, open_at)
                    plan = self.keep_question_work(pinned, messages, notes, setup)
        return plan, request_tokens

    def keep_question_work(
        self, plan: CutPlan, messages: Sequence[BaseMessage], notes: Notes, setup: ModelSetup
    ) -> CutPlan:
        """A cut that passes an open question keeps as much of the question's own work in view
        as leaves room to work (under the notes threshold): its oldest results leave first,
        and only as many as must. The work kept is noted all the same (kept as already noted),
        so the next cut may take it without noting it twice."""
        start = work_start(messages, plan)
        if start >= plan.keep_from:
            return plan
        fixed = [
            *messages[: plan.layout.head_end],
            *(messages[i] for i in plan.pinned),
        ]
        room = self.config.notes_threshold - self.notes_estimate(notes)
        starts = [i for i in range(start, plan.keep_from) if safe_boundary(messages, i) == i]
        low, high = 0, len(starts)  # the first start whose window fits; len: none does
        while low < high:
            middle = (low + high) // 2
            if self.count(setup, [*fixed, *messages[starts[middle] :]]) <= room:
                high = middle
            else:
                low = middle + 1
        if low == len(starts):
            return plan
        return replace(plan, keep_from=starts[low])

    def leaves_room(
        self,
        plan: CutPlan | None,
        messages: Sequence[BaseMessage],
        notes: Notes,
        setup: ModelSetup,
    ) -> bool:
        """Whether the window after ``plan`` is under the notes threshold (room to work)."""
        if plan is None:
            return False
        window = [
            *messages[: plan.layout.head_end],
            *(messages[i] for i in plan.pinned),
            *messages[plan.keep_from :],
        ]
        return self.count(setup, window) + self.notes_estimate(notes) <= self.config.budget

    def notes_estimate(self, notes: Notes) -> int:
        """The NOTES' size after the next cut: grown by what it notes, fitted to their budget."""
        grown = self.tokens.count_text(render_notes(notes)) * 5 // 4 + 256
        return min(grown, self.config.notes_tokens + NOTES_FRAME_TOKENS)

    def drop_kept_if_too_big(
        self, plan: CutPlan, messages: Sequence[BaseMessage], notes: Notes, setup: ModelSetup
    ) -> CutPlan:
        """Keep the newest exchange only if the window after the cut leaves room to work: as
        it is, or with its messages at their smallest (a burst of tool results stays in view
        as pointers the model can follow; :meth:`CutCommit.finish` excerpts them)."""
        notes_estimate = self.notes_estimate(notes)
        after = [*messages[: plan.layout.head_end], *messages[plan.keep_from :]]
        size = self.count(setup, after) + notes_estimate
        if size <= self.config.notes_threshold:
            return plan
        kept = self.classify(messages[plan.keep_from : plan.boundary])
        saved = sum(e.tokens - self.least_tokens("", e) for e in kept if e.kind is None)
        if size - saved <= self.config.notes_threshold:
            return plan
        return replace(plan, keep_from=plan.boundary)

    def fixed_parts(
        self,
        entries: Sequence[Entry],
        setup: ModelSetup,
        seen: set[str] | None = None,
        facts: WindowFacts | None = None,
    ) -> dict[str, int]:
        """What every note request carries whatever is cut, by part, in tokens (the pinned
        task counted only once taken in, when ``seen`` is given; ``facts``: the window's
        layout and NOTES, when known)."""
        layout = self.layout(messages_of(entries)) if facts is None else facts.layout
        notes_at = (
            kind_positions(messages_of(entries), "notes") if facts is None else facts.notes_at
        )
        head = [e for e in entries[: layout.head_end] if seen is None or not e.fresh(seen)]
        tools = self._setup_sizes(setup)[1] if setup.tools else 0
        system_and_tools = self.count(setup, [e.message for e in head if e.is_system])
        return {
            "system prompt": system_and_tools - tools,
            "tools": tools,
            "pinned task": sum(e.tokens for e in head if not e.is_system),
            # the note request that notes a unit carries the NOTES: as they are in view now,
            # and as a later cut may grow them, up to their budget
            "NOTES": max(
                self.config.notes_tokens + NOTES_FRAME_TOKENS,
                sum(entries[i].tokens for i in notes_at),
            ),
            "note request": self.request_cost(),
        }

    def request_cost(self) -> int:
        """The note request's own size (the message appended to ask for the changes); the
        same for every request of this keeper, so worked out once."""
        found = self._known.get("request")
        if found is None:
            rewrite = self.config.notes_mode == "rewrite"
            text = REWRITE_REQUEST_TEXT if rewrite else notes_request_text(0)
            found = self.tokens.count_messages([keeper_message(text, "notes_request")])
            self._known["request"] = found
        return found

    def size_of(
        self, setup: ModelSetup, entries: Sequence[Entry], *, total: int | None = None
    ) -> int:
        """A request's size from its entries' own sizes (each message sized once a step):
        the messages, and the system prompt (when not stored) and tools the call adds
        (``total``: the sum of the entries' sizes, when known)."""
        stored_system = bool(entries) and entries[0].is_system
        extra = self._setup_sizes(setup)[1] if stored_system else self.count(setup, [])
        return extra + (sum(sizes_of(entries)) if total is None else total)

    def beside_cost(self, notes: Notes) -> int:
        """What the keeper places beside a new question: the RULES and retrieved sentences
        (worked out once for the RULES a keeper last saw: every step asks, and the RULES
        change only at a cut)."""
        rules = notes.rules
        known = self._besides
        if known and known[0][0] == rules:
            return known[0][1]
        cost = 0
        if self.config.rules_next_to_questions and rules:
            cost += self.tokens.count_text(render_rules_block(rules)) + 8
        if self.config.show_retrieved > 0:
            cost += self.config.budget // 4
        known[:] = [(rules, cost)]
        return cost

    def window_after_cut(
        self,
        plan: CutPlan,
        messages: Sequence[BaseMessage],
        setup: ModelSetup,
        notes_message: Callable[[CutPlan], BaseMessage],
    ) -> tuple[CutPlan, BaseMessage, list[BaseMessage], int]:
        """The window a cut leaves (head, NOTES, pinned question, kept exchange, the rest) and
        its size; the kept exchange leaves too when it does not fit beside the new NOTES."""
        for keep_kept in (True, False):
            if not keep_kept:
                plan = replace(plan, keep_from=plan.boundary)
            notes = notes_message(plan)
            window = [
                *messages[: plan.layout.head_end],
                notes,
                *(messages[i] for i in plan.pinned),
                *messages[plan.keep_from :],
            ]
            size = self.count(setup, window)
            if size <= self.config.budget or plan.keep_from == plan.boundary:
                break
        return plan, notes, window, size

    def after_cut_error(
        self, size: int, window: Sequence[BaseMessage], setup: ModelSetup
    ) -> WindowTooSmallError:
        """The refusal of a window that is still too big after a cut and its excerpts."""
        parts = self.parts_in_view(window, setup, size)
        return WindowTooSmallError(
            f"after a cut the request is still {size} tokens ({listed_parts(parts)}), over the "
            f"budget of {self.config.budget} (window {self.config.window} - reply reserve "
            f"{self.config.reserve}) by {size - self.config.budget}: what must stay in view "
            "(system prompt, task, NOTES within notes_budget, any open question) does not fit. "
            "Raise the window, lower reply_reserve or notes_budget, or shorten the system "
            "prompt."
        )


@functools.lru_cache(maxsize=64)
def _kept_of(notes_text: str) -> int:
    """How many messages after a NOTES message are already noted (read once per NOTES text)."""
    return parse_notes(notes_text)[1]
