"""The self-editing arms as graphs: a context node, the model, and a tools node that applies the
model's memory edits.

Before every model call the context node

1. gives each new input its item number (the content's own numbering);
2. lets processed batches leave the window: every turn before the newest input has been worked
   through, so it goes (word for word to the archive, in the arms that have one; the read mode
   drops it), and the pinned state is then the only memory of it;
3. cuts inside the newest turn, oldest first, only when it alone outgrows the window;
4. pins the state the model wrote, with the arm's instructions, right after the task.

The archive and its search tool are the keeper's own (:class:`~keeper_middleware.Keeper`):
turns are committed with :meth:`ArchiveStore.commit_cut`, indexed with the keeper's indexing,
and searched through :func:`~keeper_middleware.archive_search_tool`, loop guards included. Each
time turns leave, the pinned state is saved beside them as a memory version, for the audit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NotRequired

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Checkpointer

from keeper_bench.arms.self_edit.memory import (
    MEMORY_TOOLS,
    TOOL_SCHEMAS,
    TOOLS_OF_STYLE,
    PinnedState,
    Style,
    apply_edit,
    render_pinned,
)
from keeper_middleware.archive.records import NotesDraft, turn_from_message
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.graphs.baselines import (
    ArmState,
    ModelCall,
    RequestSize,
    WindowPolicy,
    drop_oldest,
    head_end,
    messages_update,
)
from keeper_middleware.graphs.rag import DEFAULT_ITEM_PATTERN, DEFAULT_QUESTION_PATTERNS
from keeper_middleware.keeper import Keeper, ModelSetup, Tool
from keeper_middleware.messages.facts import is_input, keeper_kind, keeper_message, safe_boundary
from keeper_middleware.reinjection.questions import PatternQuestionDetector
from keeper_middleware.search.guards import GuardState, after_new_input
from keeper_middleware.search.indexing import catch_up
from keeper_middleware.search.tool import archive_search_tool, session_of
from keeper_middleware.step.items import LEARNED_HEAD, Counting, ItemNumbering, renumber
from keeper_middleware.tokens.counting import TokenCounter, resolve_token_counter

STATE_KEY = "self_edit"
PINNED_KIND = "pinned"
PINNED_ID = "pinned-state"
GUARD_VALUE = "search_guard"
"""Where the keeper keeps a session's search guards (reset when new input arrives)."""


class SelfEditState(ArmState):
    """The messages, and the arm's book: the pinned state and item numbering (plain JSON)."""

    self_edit: NotRequired[dict[str, Any]]


class SelfEditMemory:
    """What one self-editing arm is: its style, its memory budget, and its archive (if any)."""

    def __init__(
        self,
        style: Style,
        keeper: Keeper,
        *,
        archive: bool,
        budget: int,
        counter: TokenCounter,
    ) -> None:
        if style in ("rules", "prose") and not archive:
            raise ConfigurationError(f"the {style!r} style keeps an archive; pass archive=True")
        self.style: Style = style
        self.keeper = keeper
        self.archive = archive
        self.budget = budget
        self.counter = counter

    def load(self, book: dict[str, Any]) -> PinnedState:
        return PinnedState.from_json(book.get("memory") or {}, self.style)

    def render(self, state: PinnedState) -> str:
        return render_pinned(
            state, archive=self.archive, budget=self.budget, count=self.counter.count_text
        )

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": TOOL_SCHEMAS[name]}
            for name in TOOLS_OF_STYLE[self.style]
        ]


class ContextNode:
    """Numbers inputs, lets processed turns leave, fits the newest turn, pins the state."""

    def __init__(
        self,
        memory: SelfEditMemory,
        size: RequestSize,
        *,
        policy: WindowPolicy,
        numbering: ItemNumbering,
    ) -> None:
        self.memory = memory
        self.size = size
        self.policy = policy
        self.items = numbering
        self.detector = PatternQuestionDetector(DEFAULT_QUESTION_PATTERNS)

    def __call__(self, state: SelfEditState, config: RunnableConfig) -> dict[str, Any]:
        session = session_of(config)
        given = list(state["messages"])
        book: dict[str, Any] = json.loads(json.dumps(state.get(STATE_KEY) or {}))
        pinned = self.memory.load(book)
        live = [m for m in given if keeper_kind(m) != PINNED_KIND]
        if self._observe(live, book) and self.memory.archive:
            self._reset_guard(session)
        head = live[: head_end(live, self.policy.pinned_head)]
        rest = live[len(head) :]
        leaving = rest[: self._newest_turn(rest)]
        kept = rest[len(leaving) :]
        frame = self._pinned_message(pinned)  # sized before the leaving turns are noted
        fitted = [*head, frame, *fit_turn(kept, len(head) + 1, self.size.fits, [*head, frame])]
        fitted_ids = {str(m.id) for m in fitted}
        leaving += [m for m in kept if str(m.id) not in fitted_ids]
        if leaving:
            through = self._worked_through(leaving, book)
            pinned = PinnedState.from_json(
                {**pinned.to_json(), "through_item": max(pinned.through_item, through)},
                self.memory.style,
            )
            book["memory"] = pinned.to_json()
            self._leave(session, leaving, pinned, book)
        window = [*head, self._pinned_message(pinned), *fitted[len(head) + 1 :]]
        live_ids = {str(m.id) for m in window}
        book["seen"] = [i for i in book.get("seen", []) if i in live_ids]
        book["items"] = {k: v for k, v in book.get("items", {}).items() if k in live_ids}
        return {**messages_update(given, window), STATE_KEY: book}

    async def acall(self, state: SelfEditState, config: RunnableConfig) -> dict[str, Any]:
        return self(state, config)

    # --------------------------------------------------------------------- pure-ish parts

    def _observe(self, messages: Sequence[BaseMessage], book: dict[str, Any]) -> bool:
        """Give each message not seen before the item it belongs to; True when one was a new
        input (the archive may have changed since the last search, so the guards start over)."""
        seen = set(book.get("seen", []))
        items: dict[str, int] = dict(book.get("items", {}))
        counting = Counting.load(book)
        new_input = False
        for message in messages:
            msg_id = str(message.id)
            if msg_id in seen:
                continue
            seen.add(msg_id)
            if self.items.is_new_input(message):
                new_input = True
                question = self.detector.is_question(message)
                renumber(items, self.items.take(counting, message, question=question).renumber)
                if "first_item" not in book:
                    book["first_item"] = counting.last_item
            items[msg_id] = counting.last_item
        counting.save(book)
        book.update(seen=sorted(seen), items=items)
        return new_input

    def _newest_turn(self, rest: Sequence[BaseMessage]) -> int:
        """Where the newest turn begins: at the last new input (or the tool call that brought
        it), so a call and its results never part; 0 when there is none."""
        starts = [i for i, m in enumerate(rest) if self.items.is_new_input(m)]
        if not starts:
            return 0
        return safe_boundary(rest, starts[-1])

    def _worked_through(self, leaving: Sequence[BaseMessage], book: Mapping[str, Any]) -> int:
        """The last item among the inputs leaving: the number a batch states (a message that
        merely follows one, such as "no more batches", adds none), else the number given."""
        inputs = [m for m in leaving if self.items.is_new_input(m)]
        head = book.get(LEARNED_HEAD)
        stated = [n for m in inputs if (n := self.items.stated_number(m, head)) is not None]
        if stated or book.get("numbered"):
            return max(stated, default=0)
        items = book.get("items", {})
        return max((int(items.get(str(m.id), 0)) for m in inputs), default=0)

    def _pinned_message(self, pinned: PinnedState) -> BaseMessage:
        return keeper_message(self.memory.render(pinned), PINNED_KIND, msg_id=PINNED_ID)

    # --------------------------------------------------------------------- I/O

    def _reset_guard(self, session: str) -> None:
        archive = self.memory.keeper.archive
        guard = GuardState.from_json(archive.get_value(session, GUARD_VALUE))
        archive.put_value(session, GUARD_VALUE, after_new_input(guard).to_json())

    def _leave(
        self,
        session: str,
        leaving: Sequence[BaseMessage],
        pinned: PinnedState,
        book: dict[str, Any],
    ) -> None:
        """Archive what leaves (word for word; the read mode keeps none of it) in one
        transaction with the memory version it leaves behind, then index it."""
        keeper = self.memory.keeper
        items = book.get("items", {})
        turns = (
            [
                turn_from_message(m, session=session, item=items.get(str(m.id)))
                for m in leaving
                if m.type in ("human", "ai", "tool", "system")
            ]
            if self.memory.archive
            else []
        )
        through = pinned.through_item
        draft = None
        if through:  # a version accounts for the batches worked through so far
            first = min(int(book.get("first_item") or 1), through)
            draft = NotesDraft(
                first_item=first,
                last_item=through,
                text=self.memory.render(pinned),
                data_json=json.dumps(pinned.to_json()),
            )
        if not turns and draft is None:
            return
        ids = "|".join(str(m.id) for m in leaving)
        key = hashlib.sha256(f"{session}|{through}|{ids}".encode()).hexdigest()[:32]
        keeper.archive.commit_cut(session, cut_key=f"self-edit-{key}", turns=turns, notes=draft)
        if turns:
            catch_up(keeper.archive, session, (keeper.retriever,), unit=keeper.config.passages)


def fit_turn(
    turn: Sequence[BaseMessage],
    start: int,
    fits: Callable[[Sequence[BaseMessage]], bool],
    fixed: Sequence[BaseMessage],
) -> list[BaseMessage]:
    """The newest turn cut to fit after ``fixed``: its input (a question stays in view until it
    is answered) and the newest work on it, the oldest work going first; a tool call never
    parts from its results. When even the input alone does not fit, window-drop's cut decides
    (and says the window is too small when nothing fits)."""
    whole = list(turn)
    if fits([*fixed, *whole]):
        return whole
    first = next((i for i, m in enumerate(whole) if is_input(m) or isinstance(m, ToolMessage)), 0)
    end = first + 1
    while end < len(whole) and safe_boundary(whole, end) != end:
        end += 1
    for cut in range(end, len(whole) + 1):
        if safe_boundary(whole, cut) != cut:
            continue
        kept = [*whole[:end], *whole[cut:]]
        if fits([*fixed, *kept]):
            return kept
    return drop_oldest([*fixed, *whole], start, fits)[len(fixed) :]


class ToolsNode:
    """Runs the model's tool calls: memory edits applied to the pinned state in the order they
    were sent, every other tool (the archive search, the agent's own) by LangGraph's ToolNode."""

    def __init__(self, memory: SelfEditMemory, tools: Sequence[Tool]) -> None:
        self.memory = memory
        self.others = ToolNode(list(tools)) if tools else None  # type: ignore[arg-type]

    def __call__(self, state: SelfEditState, config: RunnableConfig) -> dict[str, Any]:
        book: dict[str, Any] = json.loads(json.dumps(state.get(STATE_KEY) or {}))
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        pinned = self.memory.load(book)
        results: list[BaseMessage] = []
        others = []
        for call in last.tool_calls:
            if call["name"] not in MEMORY_TOOLS:
                others.append(call)
                continue
            edit = apply_edit(
                pinned,
                call["name"],
                call.get("args"),
                budget=self.memory.budget,
                count=self.memory.counter.count_text,
            )
            pinned = edit.state
            results.append(
                ToolMessage(edit.reply, tool_call_id=str(call.get("id")), name=call["name"])
            )
        if others:
            if self.others is None:
                results += [
                    ToolMessage(
                        f"Refused: there is no tool named {call['name']!r}.",
                        tool_call_id=str(call.get("id")),
                        name=call["name"],
                    )
                    for call in others
                ]
            else:
                asked = last.model_copy(update={"tool_calls": others})
                ran = self.others.invoke({"messages": [asked]}, config)
                results += list(ran["messages"])
        book["memory"] = pinned.to_json()
        return {"messages": results, STATE_KEY: book}

    async def acall(self, state: SelfEditState, config: RunnableConfig) -> dict[str, Any]:
        return self(state, config)


def self_edit_graph(
    model: BaseChatModel,
    keeper: Keeper,
    *,
    style: Style,
    archive: bool,
    policy: WindowPolicy,
    budget: int,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    token_counter: TokenCounter | str | None = None,
    item_tools: Sequence[str] = (),
    checkpointer: Checkpointer = None,
    name: str = "self_edit",
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A self-editing arm: ``style`` of pinned state within ``budget`` tokens, with
    (``archive=True``) or without an archive and its search tool. ``tools`` are the agent's own;
    ``item_tools`` names those whose results are new inputs."""
    counter = resolve_token_counter(token_counter)
    memory = SelfEditMemory(style, keeper, archive=archive, budget=budget, counter=counter)
    runnable: list[BaseTool] = [archive_search_tool(keeper)] if archive else []
    agent_tools: list[Tool] = [*tools, *runnable]
    setup = ModelSetup(
        system_prompt=system_prompt, tools=(*tools, *runnable, *memory.tool_schemas())
    )
    size = RequestSize(setup, counter, policy.budget)
    context = ContextNode(
        memory, size, policy=policy, numbering=ItemNumbering(DEFAULT_ITEM_PATTERN, item_tools)
    )
    tools_node = ToolsNode(memory, agent_tools)
    model_call = ModelCall(model, setup)
    graph = StateGraph(SelfEditState)
    graph.add_node("context", RunnableLambda(context.__call__, afunc=context.acall, name="context"))
    graph.add_node("model", model_call.runnable())
    graph.add_node(
        "tools", RunnableLambda(tools_node.__call__, afunc=tools_node.acall, name="tools")
    )
    graph.add_edge(START, "context")
    graph.add_edge("context", "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "context")
    return graph.compile(checkpointer=checkpointer, name=name)
