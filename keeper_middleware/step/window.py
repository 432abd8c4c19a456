"""The window policy: how big a request is, when to cut, and how much room each part gets (pure).

Everything here is a function of the messages, the NOTES, the configuration and the token
counter, so the sync and async steps, and every adapter, size requests alike; the engine does
the archiving these decisions call for.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage

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
from keeper_middleware.step.entries import Entry, classify, first_fresh, messages_of, sizes_of
from keeper_middleware.step.excerpts import (
    MIN_EXCERPT_TOKENS,
    excerpt_ref,
    pointer_cost,
    smallest_form,
)
from keeper_middleware.step.fold import foldable, folded_pair, reply_stub, round_ref
from keeper_middleware.step.items import items_since_notes
from keeper_middleware.step.room import units, water_level, water_level_above
from keeper_middleware.step.tail import WindowFacts
from keeper_middleware.tokens.counting import ADDITIVE_COUNTERS, TokenCounter

NOTES_FRAME_TOKENS = 64
"""What the NOTES message adds to the NOTES' own text (its frame, mark and kept-turns line)."""
_ENTRY_ID: Callable[[Entry], str] = operator.attrgetter("id")
_FLOORS_KEPT = 4096
"""Sessions whose excerpt floor is kept at once (all are dropped when more come)."""


Excerpt = Callable[[BaseMessage, int], BaseMessage]
"""Archive a message whole and return its excerpt within a cap (the engine's I/O)."""


@dataclass(frozen=True, slots=True)
class WindowPolicy:
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

    def excerpt_floor(self, session: str) -> int:
        """The least a new message's cap may be: an excerpt's head and tail and its pointer
        line (whose reference is the session's; worked out once a session, as every step
        asks)."""
        floors = self._floors
        found = floors.get(session)
        if found is None:
            if len(floors) >= _FLOORS_KEPT:
                floors.clear()
            ref = excerpt_ref(session, "x")
            found = floors[session] = MIN_EXCERPT_TOKENS + pointer_cost(ref, self.tokens.count_text)
        return found

    def message_caps(
        self,
        session: str,
        entries: Sequence[Entry],
        seen: set[str],
        setup: ModelSetup,
        notes: Notes,
        *,
        facts: WindowFacts | None = None,
        first: int | None = None,
    ) -> tuple[dict[str, int], int, list[list[Entry]]]:
        """The most each new message may take in view, by id, the room one message has in
        view (what a search result or a page read back may take), and the rounds of tool
        calls to fold (too big even with every message at its smallest: :mod:`.fold`).

        A cut can pass any message but never splits a tool call from its results, so each such
        unit (one message, or a call with its results) must fit a note request beside the fixed
        part: system prompt and tools, the pinned task, the NOTES, the note request and what is
        repeated beside a question. Within a unit the room is shared so that small messages stay
        whole and only the big ones are cut down, none beyond the message limit.
        """
        layout = self.layout(messages_of(entries)) if facts is None else facts.layout
        parts = self.fixed_parts(entries, setup, seen, facts)
        # what was kept in view beside the NOTES is in every note request too, but it is not
        # fixed: when it leaves no room it is excerpted (in_view_excess), never refused
        kept = sum(
            e.tokens
            for e in entries[layout.head_end : layout.noted_start]
            if e.kind != "notes" and not e.fresh(seen)
        )
        beside = self.beside_cost(notes)
        room = self.config.budget - sum(parts.values())
        limit = self.config.message_tokens  # worked out once: a property of a few calls
        floor = self.excerpt_floor(session)
        caps: dict[str, int] = {}
        folds: list[list[Entry]] = []
        for unit in units(entries[_first_unit_with_fresh(entries, seen, first) :]):
            flags = [e.fresh(seen) for e in unit]
            if not any(flags):
                continue
            fresh = list(itertools.compress(unit, flags))
            in_view = sum(e.tokens for e, new in zip(unit, flags, strict=True) if not new)
            besides = beside if any(e.question for e in fresh) else 0
            avail = room - in_view - besides
            sizes = [e.tokens for e in fresh]
            if sum(map(min, sizes, itertools.repeat(floor))) <= avail:
                share = water_level(sizes, avail - kept, limit)
                if share < MIN_EXCERPT_TOKENS and kept:
                    share = water_level(sizes, avail, limit)
                caps.update(zip(map(_ENTRY_ID, fresh), itertools.repeat(max(share, floor))))
                continue
            # a burst (fifty tool results at once, or five hundred): too many for each to keep
            # a head, a tail and a full pointer, so the big ones stand as their smallest form
            smallest = [self.least_tokens(session, e) for e in fresh]
            if sum(smallest) > avail:
                if not foldable(unit, seen):
                    raise self._unit_too_big(parts, in_view, besides, smallest)
                # fifty calls at once in a small window: the round stands as one pointer pair
                pair = self.folded_tokens(session, unit)
                if pair > avail:
                    folded = f"the new round of {len(unit) - 1} tool calls folded to one call"
                    raise self._unit_too_big(parts, in_view, besides, [pair], folded)
                folds.append(unit)
                continue
            level = water_level_above(sizes, smallest, avail, limit)
            caps.update(
                (e.id, max(least, min(size, level)))
                for e, size, least in zip(fresh, sizes, smallest, strict=True)
            )
        return caps, max(MIN_EXCERPT_TOKENS, min(room, limit)), folds

    def folded_tokens(self, session: str, unit: Sequence[Entry]) -> int:
        """What a round folded to its pointer pair takes in view."""
        ref = excerpt_ref(session, unit[0].id)
        pair = folded_pair([e.message for e in unit], round_ref(ref), reply_stub(ref))
        return self.tokens.count_messages(list(pair))

    def least_tokens(self, session: str, entry: Entry) -> int:
        """The least a message can take in view: its :func:`smallest_form` (an excerpt is
        never bigger than what it stands for)."""
        ref = excerpt_ref(session, entry.id)
        smallest = smallest_form(entry.message, ref)
        if smallest is entry.message:
            return entry.tokens
        return min(entry.tokens, self.tokens.count_messages([smallest]))

    def _unit_too_big(
        self,
        parts: Mapping[str, int],
        in_view: int,
        besides: int,
        smallest: Sequence[int],
        label: str | None = None,
    ) -> WindowTooSmallError:
        """The refusal of new input that cannot fit even with every message at its smallest
        (or, for a round of tool calls, folded: ``label``); the parts it lists add up to the
        total it states."""
        label = label or f"the new input at its smallest ({len(smallest)} messages)"
        listed = {
            **parts,
            "the rest of its unit in view": in_view,
            "what stands beside a question": besides,
            label: sum(smallest),
        }
        need = sum(listed.values())
        return WindowTooSmallError(
            f"the fixed part of a request does not fit: {_listed(listed)} = {need} tokens, "
            f"over the budget of {self.config.budget} (window {self.config.window} - reply "
            f"reserve {self.config.reserve}) by {need - self.config.budget}. Raise the "
            "window, lower reply_reserve, or shorten the largest part (fewer tool calls at once "
            "make a smaller input)."
        )

    def in_view_excess(self, entries: Sequence[Entry], setup: ModelSetup) -> tuple[list[int], int]:
        """The messages kept in view beside the NOTES and in the first unit not yet noted (a
        message, or a tool call with its results) that must be excerpted for a note request to
        fit after them again, and the cap each gets.

        Used when nothing can be cut: what is in view outgrew the window after the messages
        were taken in (the NOTES or the kept exchange grew, an open question's work piled up).
        """
        messages = messages_of(entries)
        layout = self.layout(messages)
        open_at = open_question_index(messages, self.detector, start=layout.head_end)
        first = layout.head_end if layout.notes_index is None else layout.notes_index + 1
        end = layout.noted_start
        while end < len(entries) and (end == open_at or entries[end].kind is not None):
            end += 1
        end += 1
        while end < len(entries) and entries[end].is_tool_result:
            end += 1
        end = min(end, len(entries))
        # the kept messages and the first unit not yet noted; never the question itself
        shrinkable = [i for i in range(first, end) if i != open_at and entries[i].kind is None]
        if not shrinkable:
            return [], 0
        fixed = [m for i, m in enumerate(messages[:end]) if i not in shrinkable]
        room = self.config.budget - self.request_cost() - self.count(setup, fixed)
        sizes = [entries[i].tokens for i in shrinkable]
        level = water_level(sizes, room, self.config.message_tokens)
        over = [i for i, size in zip(shrinkable, sizes, strict=True) if size > level]
        return over, level

    def shrink_largest(
        self,
        entries: Sequence[Entry],
        setup: ModelSetup,
        excerpt: Excerpt,
        *,
        start: int,
        target: int | None = None,
    ) -> list[BaseMessage]:
        """Excerpt the biggest messages from ``start`` on (not the keeper's own) until the
        request fits ``target`` (default: room for a note request within the budget);
        ``excerpt`` archives each whole first.

        The request is counted once; each excerpt then takes off what it saved (recounting the
        whole window after each message made this quadratic in the messages)."""
        if target is None:
            target = self.config.budget - self.request_cost()
        result = messages_of(entries)
        sizes = {
            i: e.tokens
            for i, e in enumerate(entries)
            if i >= start and e.kind is None and not e.is_system
        }
        total = self.count(setup, result)
        for index in sorted(sizes, key=lambda i: -sizes[i]):
            excess = total - target
            if excess <= 0:
                break
            cap = max(MIN_EXCERPT_TOKENS, sizes[index] - excess)
            result[index] = excerpt(result[index], cap)
            if result[index] is not entries[index].message:
                total += self.tokens.count_messages([result[index]]) - sizes[index]
        return result

    def too_big_error(
        self, request_tokens: int, entries: Sequence[Entry], setup: ModelSetup
    ) -> WindowTooSmallError:
        """The refusal of a request nothing more can be cut from or excerpted in."""
        parts = self.parts_in_view(messages_of(entries), setup, request_tokens)
        return WindowTooSmallError(
            f"the request is {request_tokens} tokens ({_listed(parts)}), over the budget of "
            f"{self.config.budget} (window {self.config.window} - reply reserve "
            f"{self.config.reserve}) by {request_tokens - self.config.budget}, and nothing "
            "more can be cut or excerpted. Raise the window, lower reply_reserve, or shorten "
            "the largest part."
        )

    def parts_in_view(
        self, messages: Sequence[BaseMessage], setup: ModelSetup, total: int
    ) -> dict[str, int]:
        """What a request of ``total`` tokens is made of, by part: system prompt, tools, the
        pinned task, the NOTES, an open question with the work on it, and the other messages
        (the rest of ``total``, so the parts always add up to it)."""
        layout = self.layout(messages)
        head = messages[: layout.head_end]
        tools = self.tokens.count_messages([], setup.tool_schemas) if setup.tools else 0
        system_and_tools = self.count(setup, [m for m in head if isinstance(m, SystemMessage)])
        notes = (
            self.tokens.count_messages([messages[layout.notes_index]])
            if layout.notes_index is not None
            else 0
        )
        open_at = open_question_index(messages, self.detector, start=layout.noted_start)
        question = self.tokens.count_messages(messages[open_at:]) if open_at is not None else 0
        parts = {
            "system prompt": system_and_tools - tools,
            "tools": tools,
            "pinned task": self.count(setup, head) - system_and_tools,
            "NOTES": notes,
            "the open question and the work on it": question,
        }
        parts["the other messages in view"] = total - sum(parts.values())
        return parts

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
            f"after a cut the request is still {size} tokens ({_listed(parts)}), over the "
            f"budget of {self.config.budget} (window {self.config.window} - reply reserve "
            f"{self.config.reserve}) by {size - self.config.budget}: what must stay in view "
            "(system prompt, task, NOTES within notes_budget, any open question) does not fit. "
            "Raise the window, lower reply_reserve or notes_budget, or shorten the system "
            "prompt."
        )


def _listed(parts: Mapping[str, int]) -> str:
    """The fixed parts as an error names them: "system prompt 24 + tools 400 + ..."."""
    return " + ".join(f"{name} {size}" for name, size in parts.items() if size)


def _first_unit_with_fresh(
    entries: Sequence[Entry], seen: set[str], first: int | None = None
) -> int:
    """Where the unit holding the first message not taken in yet starts (the end when there is
    none): the units before it need no cap, so a step sizes only what is new (``first``: the
    first such message, when known)."""
    if first is None:
        first = first_fresh(entries, seen)
    while 0 < first < len(entries) and entries[first].is_tool_result:
        first -= 1
    return first


@functools.lru_cache(maxsize=64)
def _kept_of(notes_text: str) -> int:
    """How many messages after a NOTES message are already noted (read once per NOTES text)."""
    return parse_notes(notes_text)[1]
