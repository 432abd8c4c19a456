"""The keeper engine: pure decisions around an archive, driven by a model call it is given.

Each step, before the model is called:

1. new inputs get their item numbers; a new question gets the RULES placed right after it;
2. when the request is about to outgrow the window (or every N items), one more message is
   appended to the conversation the server has already read, asking for the changes; the reply
   is parsed, checked, re-asked within bounds, and applied to the NOTES;
3. the turns that leave the window are archived word for word in the same transaction as the
   new NOTES version, and the window restarts from the task, the NOTES and the newest exchange.

Adapters (the LangGraph node, the LangChain middleware, the proxy) only convert formats and call
:meth:`Keeper.step` or :meth:`Keeper.astep`; the two differ only in how the model is called.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import threading
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from keeper_middleware.archive import (
    ArchivedTurn,
    ArchiveStore,
    NotesDraft,
    open_archive,
)
from keeper_middleware.cadence import items_due
from keeper_middleware.changes import SetLine, UnsetLine
from keeper_middleware.checks import NoteCheck, default_checks
from keeper_middleware.config import KeeperConfig
from keeper_middleware.counters import Counters
from keeper_middleware.cut import (
    CutPlan,
    Layout,
    cut_key,
    find_layout,
    pin_open_question,
    plan_cut,
)
from keeper_middleware.errors import ConfigurationError, WindowTooSmallError
from keeper_middleware.excerpts import (
    MIN_EXCERPT_TOKENS,
    archived_text,
    excerpt_ref,
    pointer_cost,
    read_page,
    shrink_message,
)
from keeper_middleware.indexing import catch_up
from keeper_middleware.injection import (
    merge_hits,
    question_queries,
    render_retrieved_block,
    render_rules_block,
)
from keeper_middleware.items import ItemNumbering
from keeper_middleware.marks import SECRET_KEY, new_secret, signed, verified
from keeper_middleware.messages import (
    close_unanswered_calls,
    is_empty_reply,
    keeper_kind,
    keeper_message,
    reasoning_of,
    role_of,
    storable_text,
    strip_reasoning,
    text_of,
    thought_to_limit,
    with_storable_calls,
)
from keeper_middleware.note_taking import Ask, Done, NoteOutcome, NoteTaking, notes_request_text
from keeper_middleware.notes import (
    Notes,
    notes_from_json,
    notes_to_json,
    parse_notes,
    render_notes,
)
from keeper_middleware.notes_budget import MOVED_TURN_NAME, fit_notes, moved_text
from keeper_middleware.postgres.archive import PostgresArchive
from keeper_middleware.postgres.connect import redact_url
from keeper_middleware.questions import (
    PatternQuestionDetector,
    QuestionDetector,
    open_question_index,
)
from keeper_middleware.recall import (
    named_in,
    recall_block,
    settle_recalled,
    track_moved,
    with_recalled,
)
from keeper_middleware.retrievers.base import Retriever
from keeper_middleware.retrievers.factory import RetrieverSpec, make_retriever
from keeper_middleware.rewrite import REWRITE_REQUEST_TEXT, merge_rewrite, parse_rewrite
from keeper_middleware.rules import looks_like_instruction, quoted_in
from keeper_middleware.search import (
    SEARCH_TOOL_NAME,
    GuardState,
    SearchCommand,
    after_new_input,
    decide,
    render_results,
)
from keeper_middleware.search_args import ReadArgs, Refusal, parse_search_args
from keeper_middleware.session_locks import SessionLockBackend, SessionLocks
from keeper_middleware.tokens import TokenCounter, resolve_token_counter

MOVED_KEYS = "notes_moved_keys"
"""Per-session value: the STATE keys whose entries are in the archive rather than the NOTES."""
MOVED_ENTRIES = "notes_moved_entries"
"""Per-session value: those entries, key → value as last noted (a notes request recalls them)."""
NOTES_FRAME_TOKENS = 64
"""What the NOTES message adds to the NOTES' own text (its frame, mark and kept-turns line)."""
NoteCall = Callable[[list[BaseMessage], Mapping[str, Any]], AIMessage]
AsyncNoteCall = Callable[[list[BaseMessage], Mapping[str, Any]], Awaitable[AIMessage]]
Tool = BaseTool | Callable[..., Any] | dict[str, Any]
"""A tool as LangChain accepts it: a tool object, a function, or an OpenAI-style schema."""

log = logging.getLogger("keeper_middleware")
"""One record per decision: a cut (INFO), a NOTES version (INFO), a re-ask (INFO), a refused
search (INFO), an oversized message (WARNING), the request size of every step (DEBUG)."""


@dataclass(frozen=True, slots=True)
class ModelSetup:
    """How the model is called. Work calls and note calls share it, so a note call renders
    exactly like a normal call and the server's prefix cache serves it (2–4% cache hits before
    this was so, 91% after, measured)."""

    system_prompt: str | None = None
    tools: tuple[Tool, ...] = ()

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [convert_to_openai_tool(t) for t in self.tools]  # type: ignore[arg-type]

    def render(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """The messages exactly as the model receives them."""
        if self.system_prompt is None or (messages and isinstance(messages[0], SystemMessage)):
            return list(messages)
        return [SystemMessage(content=self.system_prompt), *messages]


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one keeper step decided: the new message list and the keeper's bookkeeping."""

    messages: list[BaseMessage]
    state: dict[str, Any]
    changed: bool
    """True when ``messages`` differs from what the step was given."""
    rewritten: bool
    """True when messages were removed or replaced (not only appended)."""
    cut: bool = False


@dataclass(slots=True)
class _Pending:
    """A step between its decision and its model calls."""

    session: str
    messages: list[BaseMessage]
    state: dict[str, Any]
    plan: CutPlan | None
    notes: Notes
    request: list[BaseMessage] = field(default_factory=list)
    key: str = ""
    tool_schemas: list[dict[str, Any]] = field(default_factory=list)
    replaced: bool = False
    """A message was replaced under its own id (an excerpt, a forged tag removed)."""
    archived_keys: frozenset[str] = frozenset()
    """STATE keys whose entries are in the archive, not the NOTES (read with the archive)."""
    moved_entries: Mapping[str, str] = field(default_factory=dict)
    """Those entries, each as last noted (what a notes request may recall)."""
    recalled: tuple[tuple[str, str], ...] = ()
    """The moved entries the notes request recalls (the noted turns name them)."""


class Keeper:
    """The engine. One instance serves many sessions (threads); all state is per session."""

    def __init__(
        self,
        config: KeeperConfig | None = None,
        *,
        archive: ArchiveStore | str | Path = ":memory:",
        retriever: RetrieverSpec = None,
        passages_retriever: RetrieverSpec = None,
        token_counter: TokenCounter | str | None = None,
        checks: Sequence[NoteCheck] | None = None,
        question_detector: QuestionDetector | None = None,
        namespace: str | None = None,
    ) -> None:
        """``retriever`` serves the archive search tool; ``passages_retriever`` (default: the
        same) serves the sentences shown next to new questions (``show_retrieved``), so the two
        can be swapped independently. ``namespace`` names the collection a retriever on a
        Chroma server (``"embedding+http://host:port"``) keeps this keeper's passages in; the
        default is one collection per archive file, so apps sharing a server never collide."""
        if config is not None and not isinstance(config, KeeperConfig):
            raise ConfigurationError(
                f"config={config!r} is a {type(config).__name__}, not a KeeperConfig; pass "
                "config=KeeperConfig(window=..., ...)"
                + (" (e.g. KeeperConfig(**your_dict))" if isinstance(config, Mapping) else "")
            )
        self.config = config or KeeperConfig()
        self.archive = open_archive(archive)
        index_dir = None
        database, schema = _database_of(self.archive)
        if database is None and isinstance(archive, str | Path) and str(archive) != ":memory:":
            index_dir = Path(archive).with_suffix(".index")
        self.namespace = namespace or archive_namespace(self.archive if database else archive)
        self.retriever = make_retriever(
            retriever,
            path=index_dir,
            namespace=self.namespace,
            database=database,
            schema=schema,
        )
        self.passages_retriever = (
            self.retriever
            if passages_retriever is None
            else make_retriever(
                passages_retriever,
                path=index_dir.with_suffix(".passages") if index_dir else None,
                namespace=f"{self.namespace}-passages",
                database=database,
                schema=schema,
            )
        )
        shared = self.archive if isinstance(self.archive, SessionLockBackend) else None
        self.locks = SessionLocks(shared)
        self.tokens = resolve_token_counter(token_counter)
        self.checks = (
            tuple(checks) if checks is not None else default_checks(self.config.tracked_names)
        )
        self.detector = question_detector or PatternQuestionDetector(self.config.question_patterns)
        self.items = ItemNumbering(self.config.item_pattern, self.config.item_tools)
        self._lock = threading.RLock()
        self._counters: dict[str, Counters] = {}
        self._saved_counters: dict[str, dict[str, Any]] = {}
        self._secrets: dict[str, str] = {}
        self._caps: dict[str, int] = {}

    # ----------------------------------------------------------------- state and counters

    @contextmanager
    def session(self, session: str) -> Iterator[None]:
        """Hold a session: its steps, searches and counters run one at a time, across every
        thread, task and (on a shared store) process. Re-entrant within one flow of control."""
        with self.locks.hold(session) as took:
            if took:
                self._forget(session)
            yield

    @asynccontextmanager
    async def asession(self, session: str) -> AsyncIterator[None]:
        """:meth:`session` for asyncio: waiting never blocks the event loop."""
        async with self.locks.ahold(session) as took:
            if took:
                self._forget(session)
            yield

    def _forget(self, session: str) -> None:
        """Drop what this process remembers of a session: another process may have moved it on."""
        with self._lock:
            self._counters.pop(session, None)

    def counters(self, session: str) -> Counters:
        with self._lock:
            if session not in self._counters:
                stored = self.archive.get_value(session, "counters")
                self._counters[session] = Counters.from_json(stored)
                if stored is not None:
                    self._saved_counters[session] = self._counters[session].to_json()
            return self._counters[session]

    def _save_counters(self, session: str) -> None:
        """Write the counters if they changed since they were last written (most steps change
        nothing: no cut, no rules shown, no larger window)."""
        data = self.counters(session).to_json()
        if self._saved_counters.get(session) != data:
            self.archive.put_value(session, "counters", data)
            self._saved_counters[session] = data

    def notes(self, session: str) -> Notes:
        """The current NOTES of a session (empty before the first cut)."""
        latest = self.archive.latest_notes(session)
        if latest is None:
            return Notes()
        return _notes_of(latest.data_json)

    def _secret(self, session: str) -> str:
        """The session's secret for marking the keeper's own messages (kept in the archive, so
        a restarted keeper still recognises them; never sent to a model)."""
        with self._lock:
            if session not in self._secrets:
                stored = self.archive.get_value(session, SECRET_KEY)
                if not isinstance(stored, str) or not stored:
                    stored = new_secret()
                    self.archive.put_value(session, SECRET_KEY, stored)
                self._secrets[session] = stored
            return self._secrets[session]

    def _own(self, session: str, text: str, kind: str, msg_id: str) -> BaseMessage:
        """A keeper message, marked so that no one else's message passes for it."""
        return signed(keeper_message(text, kind, msg_id=msg_id), self._secret(session))

    def _guard(self, session: str) -> GuardState:
        return GuardState.from_json(self.archive.get_value(session, "search_guard"))

    def _set_guard(self, session: str, guard: GuardState) -> None:
        self.archive.put_value(session, "search_guard", guard.to_json())

    # ----------------------------------------------------------------- the step

    def step(
        self,
        session: str,
        messages: Sequence[BaseMessage],
        state: Mapping[str, Any] | None,
        setup: ModelSetup,
        call: NoteCall,
    ) -> StepResult:
        """One keeper step before a model call (sync)."""
        with self.session(session):
            pending = self._prepare(session, messages, state, setup)
            if pending.plan is None:
                return self._finish_without_cut(pending, messages)
            outcome = self._reuse_committed(pending)
            if outcome is None:
                pending.request = self._note_request(pending, setup)
                pending.tool_schemas = setup.tool_schemas
                outcome = self._take_notes(pending, call)
            return self._finish_cut(pending, outcome, setup)

    async def astep(
        self,
        session: str,
        messages: Sequence[BaseMessage],
        state: Mapping[str, Any] | None,
        setup: ModelSetup,
        call: AsyncNoteCall,
    ) -> StepResult:
        """One keeper step before a model call (async); same decisions as :meth:`step`.

        The archive and index work runs in a worker thread, never on the event loop; only the
        model calls are awaited here. The session is held throughout (the threads run in this
        task's context, so they count as holding it)."""
        async with self.asession(session):
            pending = await asyncio.to_thread(self._prepare, session, messages, state, setup)
            if pending.plan is None:
                return await asyncio.to_thread(self._finish_without_cut, pending, messages)
            outcome = await asyncio.to_thread(self._reuse_committed, pending)
            if outcome is None:
                pending.request = self._note_request(pending, setup)
                pending.tool_schemas = setup.tool_schemas
                outcome = await self._atake_notes(pending, call)
            return await asyncio.to_thread(self._finish_cut, pending, outcome, setup)

    # ----------------------------------------------------------------- arrivals

    def _prepare(
        self,
        session: str,
        given: Sequence[BaseMessage],
        state: Mapping[str, Any] | None,
        setup: ModelSetup,
    ) -> _Pending:
        kstate: dict[str, Any] = json.loads(json.dumps(dict(state or {})))
        if not kstate:
            self._warn_if_archive_outlived_state(session)
        messages = [_with_id(m) for m in given]
        # where messages enter: a forged keeper tag is ordinary content from here on, and a
        # tool call left without its result (a recursion limit, a crash) is closed
        messages, forged = verified(messages, lambda: self._secret(session))
        messages, _closed = close_unanswered_calls(messages)
        messages, shrunk = self._observe(session, messages, kstate, setup)
        notes = self.notes(session)
        plan, request_tokens = self._plan(messages, kstate, setup, notes)
        if plan is None and request_tokens > self.config.budget:
            # what was kept in view as already noted may leave with the next cut instead
            messages, unkept = _unkeep(messages)
            if unkept:
                shrunk = True
                plan, request_tokens = self._plan(messages, kstate, setup, notes)
        for _ in range(8):
            if plan is not None or request_tokens <= self.config.budget:
                break
            messages, more = self._shrink_in_view(session, messages, kstate, setup)
            if not more:
                break
            shrunk = True
            plan, request_tokens = self._plan(messages, kstate, setup, notes)
        if plan is None and request_tokens > self.config.budget:
            # the last resort: excerpt the biggest messages in view, wherever they are
            layout = self._layout(messages)
            messages = self._shrink_largest(
                session, messages, kstate.get("items", {}), setup, start=layout.head_end
            )
            shrunk = True
            plan, request_tokens = self._plan(messages, kstate, setup, notes)
        counters = self.counters(session)
        if plan is None:  # sent as it is; a cut records the window it leaves (``_finish_cut``)
            counters.peak_window = max(counters.peak_window, request_tokens)
        log.debug(
            "step session=%s messages=%d request_tokens=%d notes_at=%d budget=%d",
            session,
            len(messages),
            request_tokens,
            self.config.notes_threshold,
            self.config.budget,
        )
        if plan is None and request_tokens > self.config.budget:
            parts = self._fixed_parts(messages, setup)
            listed = " + ".join(f"{name} {size}" for name, size in parts.items() if size)
            raise WindowTooSmallError(
                f"the request is {request_tokens} tokens, over the budget of "
                f"{self.config.budget} (window {self.config.window} - reply reserve "
                f"{self.config.reserve}) by {request_tokens - self.config.budget}, and "
                f"nothing more can be cut or excerpted. Its fixed part: {listed} = "
                f"{sum(parts.values())} tokens. Raise the window, lower reply_reserve, or "
                "shorten the largest part."
            )
        moved = self.archive.get_value(session, MOVED_KEYS) if plan is not None else None
        entries = self.archive.get_value(session, MOVED_ENTRIES) if plan is not None else None
        return _Pending(
            session,
            messages,
            kstate,
            plan,
            notes,
            replaced=bool(forged or shrunk),
            archived_keys=frozenset(moved or ()),
            moved_entries=dict(entries or {}),
        )

    def _plan(
        self,
        messages: list[BaseMessage],
        kstate: Mapping[str, Any],
        setup: ModelSetup,
        notes: Notes,
    ) -> tuple[CutPlan | None, int]:
        """The cut to make now (None: none), and the request's size as it stands."""
        layout = self._layout(messages)
        request_tokens = self._count(setup, messages)
        plan = None
        if self._notes_due(kstate, request_tokens, layout, messages):
            open_at = open_question_index(messages, self.detector, start=layout.head_end)
            request_cost = self._request_cost()

            def fits(boundary: int) -> bool:
                size = self._count(setup, messages[:boundary]) + request_cost
                return size <= self.config.budget

            plan = plan_cut(messages, layout, open_question=open_at, notes_call_fits=fits)
            if plan is not None and plan.kept_count:
                plan = self._drop_kept_if_too_big(plan, messages, notes, setup)
            if open_at is not None and not self._leaves_room(plan, messages, notes, setup):
                # the work on an open question has outgrown the window: note and archive it,
                # keeping the question itself in view
                passing = plan_cut(messages, layout, open_question=None, notes_call_fits=fits)
                if passing is not None:
                    plan = pin_open_question(messages, passing, open_at)
        return plan, request_tokens

    def _shrink_in_view(
        self,
        session: str,
        messages: list[BaseMessage],
        kstate: Mapping[str, Any],
        setup: ModelSetup,
    ) -> tuple[list[BaseMessage], bool]:
        """Excerpt the messages kept in view beside the NOTES and the first unit not yet noted
        (a message, or a tool call with its results) until a note request fits after them
        again; each is archived whole first.

        Used when nothing can be cut: what is in view outgrew the window after the messages
        were taken in (the NOTES or the kept exchange grew, an open question's work piled up).
        """
        layout = self._layout(messages)
        items: Mapping[str, int] = kstate.get("items", {})
        open_at = open_question_index(messages, self.detector, start=layout.head_end)
        first = layout.head_end if layout.notes_index is None else layout.notes_index + 1
        end = layout.noted_start
        while end < len(messages) and (end == open_at or keeper_kind(messages[end]) is not None):
            end += 1
        end += 1
        while end < len(messages) and isinstance(messages[end], ToolMessage):
            end += 1
        end = min(end, len(messages))
        # the kept messages and the first unit not yet noted; never the question itself
        shrinkable = [
            i for i in range(first, end) if i != open_at and keeper_kind(messages[i]) is None
        ]
        if not shrinkable:
            return messages, False
        fixed = [m for i, m in enumerate(messages[:end]) if i not in shrinkable]
        room = self.config.budget - self._request_cost() - self._count(setup, fixed)
        sizes = [self.tokens.count_messages([messages[i]]) for i in shrinkable]
        level = _water_level(sizes, room, self.config.message_tokens)
        result = list(messages)
        changed = False
        for index, size in zip(shrinkable, sizes, strict=True):
            if size > level:
                message = messages[index]
                shrunk = self._archive_whole(session, message, items.get(str(message.id)), level)
                changed = changed or shrunk is not message
                result[index] = shrunk
        return result, changed

    def _shrink_largest(
        self,
        session: str,
        messages: list[BaseMessage],
        items: Mapping[str, int],
        setup: ModelSetup,
        *,
        start: int,
    ) -> list[BaseMessage]:
        """Excerpt the biggest messages from ``start`` on (not the keeper's own) until the
        request and a note request fit the budget; each is archived whole first."""
        target = self.config.budget - self._request_cost()
        result = list(messages)
        sizes = {
            i: self.tokens.count_messages([m])
            for i, m in enumerate(messages)
            if i >= start and keeper_kind(m) is None and not isinstance(m, SystemMessage)
        }
        for index in sorted(sizes, key=lambda i: -sizes[i]):
            excess = self._count(setup, result) - target
            if excess <= 0:
                break
            message = result[index]
            cap = max(MIN_EXCERPT_TOKENS, sizes[index] - excess)
            result[index] = self._archive_whole(session, message, items.get(str(message.id)), cap)
        return result

    def _leaves_room(
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
        return self._count(setup, window) + self._notes_estimate(notes) <= self.config.budget

    def _notes_estimate(self, notes: Notes) -> int:
        """The NOTES' size after the next cut: grown by what it notes, fitted to their budget."""
        grown = self.tokens.count_text(render_notes(notes)) * 5 // 4 + 256
        return min(grown, self.config.notes_tokens + NOTES_FRAME_TOKENS)

    def _drop_kept_if_too_big(
        self, plan: CutPlan, messages: Sequence[BaseMessage], notes: Notes, setup: ModelSetup
    ) -> CutPlan:
        """Keep the newest exchange only if the window after the cut leaves room to work."""
        notes_estimate = self._notes_estimate(notes)
        after = [*messages[: plan.layout.head_end], *messages[plan.keep_from :]]
        if self._count(setup, after) + notes_estimate <= self.config.notes_threshold:
            return plan
        return replace(plan, keep_from=plan.boundary)

    def _observe(
        self,
        session: str,
        messages: list[BaseMessage],
        kstate: dict[str, Any],
        setup: ModelSetup,
    ) -> tuple[list[BaseMessage], bool]:
        """Number new inputs, fit each new message to the room it needs, and place the RULES
        (and retrieved sentences) after new questions. True when a message was excerpted."""
        seen = set(kstate.get("seen", []))
        items: dict[str, int] = dict(kstate.get("items", {}))
        last_item = int(kstate.get("last_item", 0))
        numbered = bool(kstate.get("numbered", False))
        rules = self.notes(session).rules
        counters = self.counters(session)
        caps = self._message_caps(session, messages, seen, setup)
        result: list[BaseMessage] = []
        new_input = shrunk = False
        for message in messages:
            msg_id = str(message.id)
            if not _is_fresh(message, seen):
                seen.add(msg_id)
                result.append(message)
                continue
            seen.add(msg_id)
            self._log_if_oversized(session, message)
            is_question = self.detector.is_question(message)
            if self.items.is_new_input(message):
                new_input = True
                stated = self.items.stated_number(message)
                if stated is not None:
                    last_item, numbered = stated, True
                elif not (numbered and is_question):
                    last_item += 1
            items[msg_id] = last_item
            cap = caps[msg_id]
            if self.tokens.count_messages([message]) > cap:
                message = self._archive_whole(session, message, last_item, cap)
                shrunk = True
            result.append(message)
            if is_question:
                extra = self._beside_question(session, message, rules)
                for added in extra:
                    seen.add(str(added.id))
                    result.append(added)
                counters.rules_injected += sum(1 for m in extra if keeper_kind(m) == "rules")
        if new_input:
            with self._lock:
                self._set_guard(session, after_new_input(self._guard(session)))
        live_ids = {str(m.id) for m in result}
        kstate["seen"] = [i for i in seen if i in live_ids]
        kstate["items"] = {k: v for k, v in items.items() if k in live_ids}
        kstate["last_item"] = last_item
        kstate["numbered"] = numbered
        kstate.setdefault("notes_item", 0)
        return result, shrunk

    def _message_caps(
        self,
        session: str,
        messages: Sequence[BaseMessage],
        seen: set[str],
        setup: ModelSetup,
    ) -> dict[str, int]:
        """The most each new message may take in view, by id.

        A cut can pass any message but never splits a tool call from its results, so each such
        unit (one message, or a call with its results) must fit a note request beside the fixed
        part: system prompt and tools, the pinned task, the NOTES, the note request and what is
        repeated beside a question. Within a unit the room is shared so that small messages stay
        whole and only the big ones are cut down, none beyond the message limit.
        """
        layout = self._layout(messages)
        parts = self._fixed_parts(messages, setup, seen)
        # what was kept in view beside the NOTES is in every note request too, but it is not
        # fixed: when it leaves no room it is excerpted (_shrink_in_view), never refused
        kept = sum(
            self.tokens.count_messages([m])
            for m in messages[layout.head_end : layout.noted_start]
            if keeper_kind(m) != "notes" and not _is_fresh(m, seen)
        )
        beside = self._beside_cost(self.notes(session))
        room = self.config.budget - sum(parts.values())
        caps: dict[str, int] = {}
        for unit in _units(messages):
            fresh = [m for m in unit if _is_fresh(m, seen)]
            if not fresh:
                continue
            fixed = sum(self.tokens.count_messages([m]) for m in unit if not _is_fresh(m, seen))
            if any(self.detector.is_question(m) for m in fresh):
                fixed += beside
            sizes = [self.tokens.count_messages([m]) for m in fresh]
            share = _water_level(sizes, room - fixed - kept, self.config.message_tokens)
            if share < MIN_EXCERPT_TOKENS and kept:
                share = _water_level(sizes, room - fixed, self.config.message_tokens)
            floor = MIN_EXCERPT_TOKENS + pointer_cost(
                excerpt_ref(session, "x"), self.tokens.count_text
            )
            least = sum(min(size, floor) for size in sizes)
            if room < least:
                need = sum(parts.values()) + least
                listed = " + ".join(f"{name} {size}" for name, size in parts.items() if size)
                raise WindowTooSmallError(
                    f"the fixed part of a request does not fit: {listed} + the new input's "
                    f"excerpt (at least {floor} tokens a message) = {need} tokens, "
                    f"over the budget of {self.config.budget} (window {self.config.window} - "
                    f"reply reserve {self.config.reserve}) by "
                    f"{need - self.config.budget}. Raise the window, lower reply_reserve, or "
                    "shorten the largest part."
                )
            caps.update((str(m.id), max(share, floor)) for m in fresh)
        with self._lock:
            self._caps[session] = max(MIN_EXCERPT_TOKENS, min(room, self.config.message_tokens))
        return caps

    def _fixed_parts(
        self, messages: Sequence[BaseMessage], setup: ModelSetup, seen: set[str] | None = None
    ) -> dict[str, int]:
        """What every note request carries whatever is cut, by part, in tokens (the pinned
        task counted only once taken in, when ``seen`` is given)."""
        layout = self._layout(messages)
        head = [m for m in messages[: layout.head_end] if seen is None or not _is_fresh(m, seen)]
        tools = self.tokens.count_messages([], setup.tool_schemas) if setup.tools else 0
        system_and_tools = self._count(setup, [m for m in head if isinstance(m, SystemMessage)])
        return {
            "system prompt": system_and_tools - tools,
            "tools": tools,
            "pinned task": self._count(setup, head) - system_and_tools,
            # the note request that notes a unit carries the NOTES: as they are in view now,
            # and as a later cut may grow them, up to their budget
            "NOTES": max(
                self.config.notes_tokens + NOTES_FRAME_TOKENS,
                sum(self.tokens.count_messages([m]) for m in messages if keeper_kind(m) == "notes"),
            ),
            "note request": self._request_cost(),
        }

    def _request_cost(self) -> int:
        rewrite = self.config.notes_mode == "rewrite"
        text = REWRITE_REQUEST_TEXT if rewrite else notes_request_text(0)
        return self.tokens.count_messages([keeper_message(text, "notes_request")])

    def _beside_cost(self, notes: Notes) -> int:
        cost = 0
        if self.config.rules_next_to_questions and notes.rules:
            cost += self.tokens.count_text(render_rules_block(notes.rules)) + 8
        if self.config.show_retrieved > 0:
            cost += self.config.budget // 4
        return cost

    def _archive_whole(
        self, session: str, message: BaseMessage, item: int | None, cap: int
    ) -> BaseMessage:
        """Archive ``message`` word for word now, and return its excerpt (same id) for the view.

        A later cut archives the excerpt's id again, which the archive skips: the turn is in it
        exactly once, whole.
        """
        msg_id = str(message.id)
        ref = excerpt_ref(session, msg_id)
        size = self.tokens.count_messages([message])
        cap = max(cap, pointer_cost(ref, self.tokens.count_text) + MIN_EXCERPT_TOKENS)
        if size <= cap:
            return message  # an excerpt would be no smaller than the message itself
        turn = _archived_turn(session, message, item)
        self.archive.commit_cut(
            session, cut_key=f"whole-{cut_key(session, [], msg_id)}", turns=[turn], notes=None
        )
        self.archive.put_value(session, f"ref:{ref}", msg_id)
        self._sync_index(session)
        target = max(MIN_EXCERPT_TOKENS, cap // 2)
        while True:
            excerpt = shrink_message(
                message,
                tokens=target,
                ref=ref,
                page_tokens=self.config.page_tokens,
                count=self.tokens.count_text,
            )
            size = self.tokens.count_messages([excerpt])
            if size <= cap or target <= MIN_EXCERPT_TOKENS:
                return excerpt
            target = max(MIN_EXCERPT_TOKENS, target - (size - cap) - 8)

    def _warn_if_archive_outlived_state(self, session: str) -> None:
        archived = self.archive.turn_count(session)
        if archived:
            log.warning(
                "session=%s starts afresh but its archive already holds %d turns: the graph "
                "state was lost (an in-memory checkpointer with a file archive?). Pair the "
                "archive with a persistent checkpointer (SqliteSaver), or use a new thread id",
                session,
                archived,
            )

    def _log_if_oversized(self, session: str, message: BaseMessage) -> None:
        size = self.tokens.count_messages([message])
        if size > self.config.budget // 2:
            log.warning(
                "oversized message session=%s id=%s role=%s tokens=%d budget=%d: it alone takes "
                "over half the budget",
                session,
                message.id,
                role_of(message),
                size,
                self.config.budget,
            )

    def _beside_question(
        self, session: str, question: BaseMessage, rules: Sequence[str]
    ) -> list[BaseMessage]:
        added: list[BaseMessage] = []
        qid = str(question.id)
        if self.config.rules_next_to_questions and rules:
            added.append(self._own(session, render_rules_block(rules), "rules", f"rules-{qid}"))
        if self.config.show_retrieved > 0:
            per_query = [
                self.passages_retriever.search(q, session=session, k=self.config.show_retrieved)
                for q in question_queries(question)
            ]
            hits = merge_hits(per_query, self.config.show_retrieved * max(1, len(per_query)))
            block = render_retrieved_block(hits)
            # the passages stay in view with their open question: keep them to a quarter of the
            # budget, dropping the lowest-ranked first, so the question's own work has room
            while hits and self.tokens.count_text(block) > self.config.budget // 4:
                hits = hits[: len(hits) * 3 // 4]
                block = render_retrieved_block(hits)
            added.append(self._own(session, block, "retrieved", f"retrieved-{qid}"))
        return added

    def _layout(self, messages: Sequence[BaseMessage]) -> Layout:
        kept = 0
        for message in messages:
            if keeper_kind(message) == "notes":
                kept = _kept_of(text_of(message))
                break
        return find_layout(messages, pinned_head=self.config.pinned_head, kept=kept)

    def _notes_due(
        self,
        kstate: Mapping[str, Any],
        request_tokens: int,
        layout: Layout,
        messages: Sequence[BaseMessage],
    ) -> bool:
        if layout.noted_start >= len(messages):
            return False
        if request_tokens >= self.config.notes_threshold:
            return True
        every = self.config.notes_every_items
        if every is None:
            return False
        new_items = int(kstate["last_item"]) - int(kstate["notes_item"])
        if new_items >= every or layout.notes_index is None:
            return new_items >= every
        due = items_due(
            every=every,
            notes_tokens=self.tokens.count_messages([messages[layout.notes_index]]),
            new_tokens=self.tokens.count_messages(messages[layout.noted_start :]),
            new_items=new_items,
        )
        return new_items >= due

    def _count(self, setup: ModelSetup, messages: Sequence[BaseMessage]) -> int:
        return self.tokens.count_messages(setup.render(messages), setup.tool_schemas)

    # ----------------------------------------------------------------- note taking

    def _note_request(self, pending: _Pending, setup: ModelSetup) -> list[BaseMessage]:
        assert pending.plan is not None
        if self.config.notes_mode == "rewrite":
            text = REWRITE_REQUEST_TEXT
        else:
            text = notes_request_text(0)
        convo = setup.render(pending.messages[: pending.plan.boundary])
        if self.config.notes_mode == "in_place" and pending.moved_entries:
            named = named_in(pending.moved_entries, self._noted_text(pending))
            room = self.config.budget - self.tokens.count_messages(
                [*convo, keeper_message(text, "notes_request")], setup.tool_schemas
            )
            block, pending.recalled = recall_block(
                [(key, pending.moved_entries[key]) for key in named],
                room=max(0, min(room - 16, self.config.notes_tokens)),
                count_text=self.tokens.count_text,
            )
            if block:
                text = f"{text}\n{block}"
        return [*convo, keeper_message(text, "notes_request")]

    def _noted_text(self, pending: _Pending) -> str:
        """The text of the turns being noted: question sets change nothing, and search results
        are copies of what is already noted, so neither may demand (or supply) a note; the
        pinned task is in view in every request, so it is a source notes may quote too."""
        assert pending.plan is not None
        sources = [*range(pending.plan.layout.head_end), *pending.plan.noted]
        return "\n".join(
            text_of(message)
            for message in (pending.messages[i] for i in sources)
            if keeper_kind(message) is None
            and not isinstance(message, SystemMessage)
            and not self.detector.is_question(message)
            and not (isinstance(message, ToolMessage) and message.name == SEARCH_TOOL_NAME)
        )

    def _reuse_committed(self, pending: _Pending) -> NoteOutcome | Notes | None:
        """A cut committed before a crash is finished from the archive, not asked again."""
        assert pending.plan is not None
        leaving = [pending.messages[i] for i in pending.plan.leaving]
        boundary_id = str(pending.messages[pending.plan.boundary - 1].id)
        pending.key = cut_key(pending.session, [str(m.id) for m in leaving], boundary_id)
        if self.archive.find_cut(pending.session, pending.key) is None:
            return None
        latest = self.archive.latest_notes(pending.session)
        return notes_from_json(latest.data_json) if latest else pending.notes

    def _take_notes(self, pending: _Pending, call: NoteCall) -> NoteOutcome | Notes:
        dialogue = self._note_dialogue(pending)
        try:
            request = next(dialogue)
            while True:
                request = dialogue.send(call(*request))
        except StopIteration as done:
            result: NoteOutcome | Notes = done.value
            return result

    async def _atake_notes(self, pending: _Pending, call: AsyncNoteCall) -> NoteOutcome | Notes:
        dialogue = self._note_dialogue(pending)
        try:
            request = next(dialogue)
            while True:
                request = dialogue.send(await call(*request))
        except StopIteration as done:
            result: NoteOutcome | Notes = done.value
            return result

    def _note_dialogue(
        self, pending: _Pending
    ) -> Generator[tuple[list[BaseMessage], Mapping[str, Any]], AIMessage, NoteOutcome | Notes]:
        """The note-taking conversation, as a generator of model requests.

        The sync and async steps pump the same generator; only the model call differs.
        """
        assert pending.plan is not None
        counters = self.counters(pending.session)
        counters.note_requests += 1
        convo = list(pending.request)
        thinking_on = self._note_kwargs(thinking=True)
        if self.config.notes_mode == "rewrite":
            return (yield from self._rewrite_dialogue(pending, convo, thinking_on))
        recalled_keys = {key for key, _ in pending.recalled}
        taking = NoteTaking(
            notes=with_recalled(pending.notes, pending.recalled),
            noted_text=self._noted_text(pending),
            checks=self.checks,
            max_reasks=self.config.max_reasks,
            tracked_names=self.config.tracked_names,
            instruction_text=self._instruction_text(pending),
            max_rules=self.config.max_rules,
            archived_keys=pending.archived_keys - recalled_keys,
        )
        step: Ask | Done = taking.first_step()
        last_text = ""
        while isinstance(step, Ask):
            if step.text is not None:
                convo = [*convo, AIMessage(content=last_text)]
                text = self._fit_reask(step.text, convo, pending.tool_schemas)
                if text is None:
                    log.info("reask skipped session=%s: it does not fit", pending.session)
                    step = taking.give_up()  # a re-ask that does not fit is not sent
                    break
                convo.append(keeper_message(text, "notes_reask"))
                log.info("reask session=%s: %s", pending.session, _first_line(text))
            reply = yield from self._ask_once(pending.session, convo, thinking_on)
            last_text = text_of(reply)
            step = taking.receive(last_text)
        assert isinstance(step, Done)
        outcome = step.outcome
        if pending.recalled:
            touched = {c.key for c in outcome.changes if isinstance(c, SetLine | UnsetLine)}
            settled = settle_recalled(pending.notes, outcome.notes, pending.recalled, touched)
            outcome = replace(outcome, notes=settled)
            pending.recalled = tuple(e for e in pending.recalled if e[0] in touched)
        counters.reasks += outcome.reasks
        counters.garbage_note_lines += outcome.garbage_lines
        counters.dropped_note_lines += len(outcome.dropped)
        if not outcome.usable:
            counters.empty_note_replies += 1
        if not outcome.usable or outcome.dropped:
            log.warning(
                "notes refused session=%s usable=%s dropped_lines=%d reasks=%d",
                pending.session,
                outcome.usable,
                len(outcome.dropped),
                outcome.reasks,
            )
        return outcome

    def _fit_reask(
        self, text: str, convo: Sequence[BaseMessage], schemas: list[dict[str, Any]]
    ) -> str | None:
        """The re-ask, shortened to its first lines when all of them do not fit after
        ``convo``; None when not even the header and one questioned line fit."""
        room = self.config.budget - self.tokens.count_messages(convo, schemas)
        lines = text.split("\n")

        def cost(kept: int) -> int:
            shown = "\n".join(lines[:kept])
            return self.tokens.count_messages([keeper_message(shown, "notes_reask")])

        if cost(len(lines)) <= room:
            return text
        low, high = 0, len(lines)
        while low < high:
            middle = (low + high + 1) // 2
            if cost(middle) + 16 <= room:
                low = middle
            else:
                high = middle - 1
        if low < 2:
            return None
        return "\n".join([*lines[:low], f"(and {len(lines) - low} more lines like these)"])

    def _instruction_text(self, pending: _Pending) -> str:
        """What the user and the system prompt said in the request: the only text a RULE may
        quote. Inputs delivered by an item tool are the user's inputs; other tool results and
        model replies never count."""
        assert pending.plan is not None
        sources = [*range(pending.plan.layout.head_end), *pending.plan.noted]
        texts = [text_of(m) for m in pending.request if isinstance(m, SystemMessage)]
        for message in (pending.messages[i] for i in sources):
            if keeper_kind(message) is not None or isinstance(message, SystemMessage | AIMessage):
                continue
            if isinstance(message, ToolMessage) and message.name not in self.config.item_tools:
                continue
            texts.append(text_of(message))
        return "\n".join(texts)

    def _rewrite_dialogue(
        self, pending: _Pending, convo: list[BaseMessage], kwargs: Mapping[str, Any]
    ) -> Generator[tuple[list[BaseMessage], Mapping[str, Any]], AIMessage, Notes]:
        """The earlier form: the model rewrites the whole NOTES; rules are restored after."""
        counters = self.counters(pending.session)
        for attempt in range(self.config.max_reasks + 1):
            reply = yield from self._ask_once(pending.session, convo, kwargs)
            rewritten = parse_rewrite(text_of(reply))
            if rewritten is not None:
                merged, _repairs = merge_rewrite(
                    pending.notes,
                    rewritten,
                    accept=_instruction_from(self._instruction_text(pending)),
                    max_rules=self.config.max_rules,
                )
                return merged
            if attempt < self.config.max_reasks:
                counters.reasks += 1
                convo = [
                    *convo,
                    AIMessage(content=text_of(reply)),
                    keeper_message(
                        "[NOTES CHECK] Your reply had no NOTES block. Write the complete NOTES "
                        "with the sections RULES, STATE and OPEN, one '- ' line per entry.",
                        "notes_reask",
                    ),
                ]
        counters.empty_note_replies += 1
        return pending.notes

    def _ask_once(
        self, session: str, convo: list[BaseMessage], kwargs: Mapping[str, Any]
    ) -> Generator[tuple[list[BaseMessage], Mapping[str, Any]], AIMessage, AIMessage]:
        """One note call; a reply that thought to its limit is asked again without thinking."""
        counters = self.counters(session)
        reply = yield (convo, kwargs)
        counters.notes_calls += 1
        counters.add_usage(reply, management=True)
        policy = self.config.thinking
        if thought_to_limit(reply) and policy.retry_empty_without_thinking:
            counters.thinking_retries += 1
            reply = yield (convo, self._note_kwargs(thinking=False))
            counters.notes_calls += 1
            counters.add_usage(reply, management=True)
        return strip_reasoning(reply)

    def _note_kwargs(self, *, thinking: bool) -> dict[str, Any]:
        policy = self.config.thinking
        kwargs: dict[str, Any] = {}
        if policy.reasoning_effort is not None:
            kwargs["reasoning_effort"] = policy.reasoning_effort
        kwargs.update(policy.on if thinking else policy.off)
        return kwargs

    # ----------------------------------------------------------------- finishing

    def _finish_without_cut(self, pending: _Pending, given: Sequence[BaseMessage]) -> StepResult:
        self._save_counters(pending.session)
        given_ids = [m.id for m in given]
        ids = [m.id for m in pending.messages]
        changed = ids != given_ids or pending.replaced
        rewritten = changed and (ids[: len(given_ids)] != given_ids or pending.replaced)
        return StepResult(pending.messages, pending.state, changed, rewritten)

    def _finish_cut(
        self, pending: _Pending, outcome: NoteOutcome | Notes, setup: ModelSetup
    ) -> StepResult:
        plan, session, messages = pending.plan, pending.session, pending.messages
        assert plan is not None
        items: dict[str, int] = pending.state["items"]
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
        for keep_kept in (True, False):
            if not keep_kept:
                # the newest exchange kept in view does not fit beside the new NOTES: it leaves
                plan = replace(plan, keep_from=plan.boundary)
            notes_message = self._own(
                session, render_notes(notes, kept=plan.kept_count), "notes", f"notes-{pending.key}"
            )
            window = [
                *messages[: plan.layout.head_end],
                notes_message,
                *(messages[i] for i in plan.pinned),
                *messages[plan.keep_from :],
            ]
            size = self._count(setup, window)
            if size <= self.config.budget or plan.keep_from == plan.boundary:
                break
        if size > self.config.budget:
            window = self._shrink_largest(
                session, window, items, setup, start=plan.layout.head_end + 1
            )
            size = self._count(setup, window)
        if size > self.config.budget:
            raise WindowTooSmallError(
                f"after a cut the request is still {size} tokens, over the budget of "
                f"{self.config.budget} (window {self.config.window} - reply reserve "
                f"{self.config.reserve}): what must stay in view (system prompt, task, "
                "NOTES within notes_budget, any open question) does not fit. Raise the "
                "window, lower reply_reserve or notes_budget, or shorten the system prompt."
            )
        leaving = [*messages[: plan.layout.head_end], *(messages[i] for i in plan.leaving)]
        turns = [
            _archived_turn(session, m, items.get(str(m.id)))
            for m in leaving
            if keeper_kind(m) is None and not (m is messages[0] and isinstance(m, SystemMessage))
        ]
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
        record = self.archive.commit_cut(
            session,
            cut_key=pending.key,
            turns=turns,
            notes=NotesDraft(
                first_item=notes.first_item,
                last_item=notes.last_item,
                text=rendered,
                data_json=notes_to_json(notes),
            ),
        )
        self._track_moved_keys(session, notes, fitted.moved_state)
        if fitted.moved_state or pending.moved_entries:
            entries = track_moved(
                pending.moved_entries,
                notes,
                fitted.moved_state,
                back=[key for key, _ in pending.recalled],
            )
            self.archive.put_value(session, MOVED_ENTRIES, entries)
        self._sync_index(session)
        state = dict(pending.state)
        state["notes_item"] = int(state.get("last_item", 0))
        live = {str(m.id) for m in window}
        state["seen"] = [i for i in state["seen"] if i in live] + [str(notes_message.id)]
        state["items"] = {k: v for k, v in items.items() if k in live}
        counters = self.counters(session)
        counters.cuts += 1
        counters.archive_turns = self.archive.turn_count(session)
        counters.notes_tokens = self.tokens.count_text(rendered)
        counters.notes_entries_moved += len(fitted.moved_state) + len(fitted.moved_open)
        counters.peak_window = max(counters.peak_window, size)
        self._save_counters(session)
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

    def _track_moved_keys(
        self, session: str, notes: Notes, moved: Sequence[tuple[str, str]]
    ) -> None:
        """Remember which keys are in the archive and not the NOTES (a SET brings one back)."""
        before = self.archive.get_value(session, MOVED_KEYS) or []
        if not before and not moved:
            return
        held = {key for key, _ in notes.state}
        keys = [key for key in before if key not in held] + [key for key, _ in moved]
        self.archive.put_value(session, MOVED_KEYS, list(dict.fromkeys(keys)))

    def _sync_index(self, session: str) -> None:
        """Index archived turns the retriever has not seen yet (also after a crash)."""
        retrievers: tuple[Retriever, ...] = (self.retriever,)
        if self.passages_retriever is not self.retriever:
            retrievers = (self.retriever, self.passages_retriever)
        catch_up(self.archive, session, retrievers, unit=self.config.passages)

    # ----------------------------------------------------------------- the model's side

    def work_kwargs(self, session: str, messages: Sequence[BaseMessage]) -> dict[str, Any]:
        """Call kwargs for the agent's own next model call.

        Thinking stays on while a question is open (without it a measured run repeated one
        search 790 times); the one reply after a stop line is sampled with some randomness.
        """
        layout = self._layout(messages)
        open_at = open_question_index(messages, self.detector, start=layout.head_end)
        kwargs = self._note_kwargs(thinking=open_at is not None)
        with self.session(session):
            guard = self._guard(session)
            if guard.sample_next:
                kwargs.update(self.config.thinking.sample_after_stop)
                self._set_guard(session, replace(guard, sample_next=False))
        return kwargs

    def record_reply(self, session: str, reply: AIMessage) -> AIMessage:
        """Count a work reply and strip its reasoning before it is stored."""
        with self.session(session):
            counters = self.counters(session)
            counters.model_calls += 1
            counters.add_usage(reply, management=False)
            self._save_counters(session)
        return with_storable_calls(strip_reasoning(reply))

    def retry_kwargs(
        self, session: str, kwargs: Mapping[str, Any], reply: BaseMessage
    ) -> dict[str, Any] | None:
        """Whether a work reply is asked again, and with which call kwargs (None: it stands).

        A reply that thought to its limit and wrote nothing is asked again without thinking; an
        empty reply once more with some randomness, so it can come out different. Every adapter
        (node, middleware, proxy) asks here, so they retry alike.
        """
        policy = self.config.thinking
        if thought_to_limit(reply):
            if not policy.retry_empty_without_thinking:
                return None
            self._count_retry(session, "thinking_retries")
            cleaned = {k: v for k, v in kwargs.items() if k not in policy.on}
            return {**cleaned, **policy.off}
        if is_empty_reply(reply) and policy.retry_empty:
            self._count_retry(session, "empty_retries")
            return {**kwargs, **policy.sample_after_stop}
        return None

    def _count_retry(self, session: str, field: str) -> None:
        with self.session(session):
            counters = self.counters(session)
            setattr(counters, field, getattr(counters, field) + 1)
            self._save_counters(session)

    def search(
        self,
        session: str,
        query: object = None,
        from_item: object = None,
        to_item: object = None,
        *,
        read: object = None,
        page: object = None,
    ) -> str:
        """The archive search tool's body, guards included; see :meth:`run_search_tool`."""
        args = {"query": query, "from_item": from_item, "to_item": to_item}
        if read is not None:
            args.update(read=read, page=page)
        return self.run_search_tool(session, args)

    def run_search_tool(self, session: str, args: object) -> str:
        """Answer one ``search_archive`` call from the model's raw arguments.

        Never raises for anything the model can send: bad arguments get a "Refused: …" text
        (:func:`~keeper_middleware.search_args.parse_search_args`). The guards' state is read,
        decided and written under one lock, so parallel searches cannot race past them. The
        reply is sized to the room a message has in view.
        """
        parsed = parse_search_args(args)
        if isinstance(parsed, Refusal):
            log.info("search refused session=%s: %s", session, parsed.text)
            with self.session(session):
                self.counters(session).search_refusals += 1
                self._save_counters(session)
            return parsed.text
        if isinstance(parsed, ReadArgs):
            command = SearchCommand(query="", read=parsed.ref, page=parsed.page)
        else:
            command = SearchCommand(
                query=parsed.query, from_item=parsed.from_item, to_item=parsed.to_item
            )
        with self.session(session):
            counters = self.counters(session)
            decision = decide(self._guard(session), command, budget=self.config.search_budget)
            self._set_guard(session, decision.state)
            if decision.verdict != "run":
                log.info(
                    "search %s session=%s key=%r",
                    "stopped" if decision.verdict == "stop" else "refused",
                    session,
                    command.key[:200],
                )
                counters.search_refusals += 1
                counters.search_stops += decision.verdict == "stop"
            else:
                counters.searches += 1
            self._save_counters(session)
            with self._lock:
                room = self._caps.get(session, self.config.message_tokens)
        if decision.verdict != "run":
            return decision.message
        if isinstance(parsed, ReadArgs):
            return self._read(session, parsed, room)
        hits = self.retriever.search(
            parsed.query,
            session=session,
            k=self.config.search_scan,
            from_item=parsed.from_item,
            to_item=parsed.to_item,
        )
        return render_results(
            command,
            hits,
            shown=self.config.search_results,
            scanned=self.config.search_scan,
            max_tokens=max(MIN_EXCERPT_TOKENS, room - 16),
            count=self.tokens.count_text,
        )

    def forget(self, session: str) -> None:
        """Erase a session everywhere the keeper keeps it: archive, NOTES, values, indexes."""
        with self.session(session), self._lock:
            self.archive.delete_session(session)
            self.retriever.delete_session(session)
            if self.passages_retriever is not self.retriever:
                self.passages_retriever.delete_session(session)
            self._counters.pop(session, None)
            self._saved_counters.pop(session, None)
            self._secrets.pop(session, None)
            self._caps.pop(session, None)

    def _read(self, session: str, args: ReadArgs, room: int) -> str:
        """One page of an archived message (what an excerpt's pointer leads to)."""
        msg_id = self.archive.get_value(session, f"ref:{args.ref}")
        turn = self.archive.turn(session, msg_id if isinstance(msg_id, str) else args.ref)
        if turn is None:
            return (
                f'Refused: no archived message has the reference "{args.ref[:80]}"; copy it '
                "from an excerpt's pointer line."
            )
        text = archived_text(turn.content, turn.tool_calls_json)
        page_tokens = max(MIN_EXCERPT_TOKENS, min(self.config.page_tokens, room - 64))
        chunk, pages = read_page(text, args.page, page_tokens, self.tokens.count_text)
        if not chunk:
            return f"Refused: page {args.page} does not exist; the message has {pages} page(s)."
        where = f" (item {turn.item})" if turn.item is not None else ""
        head = f'[READ "{args.ref}"] page {args.page} of {pages}{where}, {turn.role} message:'
        tail = (
            f'\n[next: search_archive(read="{args.ref}", page={args.page + 1})]'
            if args.page < pages
            else "\n[end of the message]"
        )
        return f"{head}\n{chunk}{tail}"

    def close(self) -> None:
        if self.passages_retriever is not self.retriever:
            self.passages_retriever.close()
        self.retriever.close()
        self.archive.close()


@functools.lru_cache(maxsize=64)
def _notes_of(data_json: str) -> Notes:
    """The notes a stored version holds, read once: every step reads the latest version, and
    reading thousands of entries again each time made a step's cost grow with the NOTES."""
    return notes_from_json(data_json)


@functools.lru_cache(maxsize=64)
def _kept_of(notes_text: str) -> int:
    """How many messages after a NOTES message are already noted (read once per NOTES text)."""
    return parse_notes(notes_text)[1]


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def archive_namespace(archive: ArchiveStore | str | Path) -> str:
    """A server collection name of one archive: the file's absolute path hashed (the same file
    reopened finds its passages again); an in-memory archive gets a name of its own; a
    PostgreSQL archive its server, database and schema hashed (without the password), so every
    replica of one archive shares its collection."""
    if isinstance(archive, PostgresArchive):
        where_db = f"{redact_url(archive.url)}#{archive.schema}"
        return f"keeper-{hashlib.sha256(where_db.encode()).hexdigest()[:16]}"
    where = archive if isinstance(archive, str | Path) else getattr(archive, "path", None)
    if where is None or str(where) == ":memory:":
        return f"keeper-{uuid.uuid4().hex[:16]}"
    digest = hashlib.sha256(str(Path(where).resolve()).encode()).hexdigest()[:16]
    return f"keeper-{digest}"


def _archived_turn(session: str, message: BaseMessage, item: int | None) -> ArchivedTurn:
    tool_calls = message.tool_calls if isinstance(message, AIMessage) else []
    content = text_of(strip_reasoning(message) if isinstance(message, AIMessage) else message)
    return ArchivedTurn(
        session=session,
        msg_id=str(message.id),
        item=item,
        role=role_of(message),
        content=storable_text(content),
        tool_calls_json=storable_text(json.dumps(tool_calls, ensure_ascii=False, default=str)),
        tool_call_id=message.tool_call_id if isinstance(message, ToolMessage) else None,
        name=storable_text(message.name) if message.name else message.name,
        reasoning=storable_text(reasoning_of(message)),
    )


def _unkeep(messages: Sequence[BaseMessage]) -> tuple[list[BaseMessage], bool]:
    """The messages with the NOTES no longer counting any message as kept in view: those are
    noted again by the next cut (a repeat the checks accept) and may leave the window with it."""
    result = list(messages)
    for index, message in enumerate(result):
        if keeper_kind(message) == "notes":
            notes, kept = parse_notes(text_of(message))
            if not kept:
                return result, False
            text = render_notes(notes, kept=0)
            result[index] = message.model_copy(update={"content": text})
            return result, True
    return result, False


def _units(messages: Sequence[BaseMessage]) -> list[list[BaseMessage]]:
    """The messages in the groups a cut never splits: a tool call with its results, or one."""
    units: list[list[BaseMessage]] = []
    for message in messages:
        if isinstance(message, ToolMessage) and units:
            units[-1].append(message)
        else:
            units.append([message])
    return units


def _water_level(sizes: Sequence[int], room: int, limit: int) -> int:
    """The largest cap ``c <= limit`` with ``sum(min(size, c)) <= room``: the small messages
    keep their size and the big ones share what is left alike."""
    if sum(sizes) <= room and max(sizes) <= limit:
        return limit
    low, high = 0, min(limit, max(sizes))
    while low < high:
        middle = (low + high + 1) // 2
        if sum(min(size, middle) for size in sizes) <= room:
            low = middle
        else:
            high = middle - 1
    return low


def _is_fresh(message: BaseMessage, seen: set[str]) -> bool:
    """A message this keeper has not taken in yet (its own messages and the system prompt are
    never new inputs)."""
    return (
        str(message.id) not in seen
        and keeper_kind(message) is None
        and not isinstance(message, SystemMessage)
    )


def _instruction_from(source: str) -> Callable[[str], bool]:
    """Whether a rule is an instruction quoted from ``source`` (what the user and system said)."""
    return lambda rule: looks_like_instruction(rule) and quoted_in(rule, source)


def _database_of(archive: ArchiveStore) -> tuple[str | None, str]:
    """(URL, schema) of an archive kept in a database, so its keyword index can live beside it."""
    if isinstance(archive, PostgresArchive):
        return archive.url, archive.schema
    return None, "keeper"


def _with_id(message: BaseMessage) -> BaseMessage:
    if message.id:
        return message
    return message.model_copy(update={"id": str(uuid.uuid4())})
