"""Runs of one conversation through every entry point with checkpoints, and the memory a branch
of it has, for the branch tests: each entry point (``create_keeper_agent``, ``KeeperMiddleware``
in ``create_agent``, ``keeper_pre_model_hook`` in ``create_react_agent``, a ``KeeperNode`` in a
hand-built ``StateGraph`` with the user's own model node) on each checkpointer,
fed story items by the scripted story model; a branch's memory is what a fresh thread fed that
branch's history must have too (archived text, NOTES, the RULES shown at a question, search)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from keeper_middleware import (
    Keeper,
    KeeperConfig,
    KeeperGraphState,
    KeeperNode,
    create_keeper_agent,
)
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.state_view import model_view
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

CONFIG = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=3)
TASK = "Task: read every item. Rule: keep every figure exact."
ENTRY_POINTS = ("agent", "middleware", "hook", "node")
QUERIES = ("c1", "c4", "c5", "zeta", "omega", "twice", "French")


def story(item: int, text: str) -> str:
    return batch(item, text, filler=6)


def answer_with_rules(messages: list[BaseMessage]) -> str:
    """A question's answer names the RULES the model was shown right after it."""
    for message in reversed(messages):
        if keeper_kind(message) == "rules":
            return "rules seen: " + " | ".join(text_of(message).splitlines()[1:])
    return "rules seen: none"


@dataclass
class Run:
    """One entry point on one checkpointer, with the keeper it uses."""

    keeper: Keeper
    graph: Any
    model: ScriptedChatModel
    thread: str = "t"

    def config(self) -> dict[str, Any]:
        return {"configurable": {"thread_id": self.thread}}

    def say(self, text: str, config: dict[str, Any] | None = None, *, msg_id: str | None = None):
        """One input on the branch ``config`` points at (default: the thread's latest)."""
        message = HumanMessage(text, id=msg_id) if msg_id else HumanMessage(text)
        return self.graph.invoke({"messages": [message]}, config or self.config())

    def state(self, config: dict[str, Any] | None = None) -> Any:
        return self.graph.get_state(config or self.config())

    def head(self, config: dict[str, Any] | None = None) -> str | None:
        return self.keeper.head_of(self.thread, self.state(config).values)

    def memory(self, config: dict[str, Any] | None = None) -> Memory:
        return memory_of(self.keeper, self.thread, self.head(config))

    def completed(self) -> list[Any]:
        """The thread's checkpoints that finished a run (what a chat UI offers to go back to),
        oldest first, across every branch."""
        return [
            s for s in reversed(list(self.graph.get_state_history(self.config()))) if not s.next
        ]


@dataclass(frozen=True)
class Memory:
    """What a branch remembers, as a fresh thread fed its history must remember it too."""

    turns: tuple[tuple[str, int | None, str], ...]
    rules: tuple[str, ...]
    state: tuple[tuple[str, str], ...]
    items: tuple[int | None, int | None]
    found: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = field(default=())
    """Per query, the passages found and the passage shown after each."""


def memory_of(keeper: Keeper, thread: str, head: str | None) -> Memory:
    notes = keeper.notes(thread, head=head)
    found = tuple(
        (
            query,
            tuple(
                sorted(
                    (h.passage.text, h.next_text) for h in keeper.retrieve(thread, query, head=head)
                )
            ),
        )
        for query in QUERIES
    )
    return Memory(
        turns=tuple((t.role, t.item, t.content) for t in keeper.turns(thread, head=head)),
        rules=notes.rules,
        state=tuple(sorted(notes.state)),
        items=(notes.first_item, notes.last_item),
        found=found,
    )


def rules_at_questions(model: ScriptedChatModel) -> list[str]:
    """The RULES each question was shown with, in order (the scripted answers name them)."""
    seen = []
    for received in model.received:
        last = received.messages[-1] if received.messages else None
        if last is not None and keeper_kind(last) == "notes_request":
            continue
        reply = answer_with_rules(received.messages)
        if any("?" in text_of(m) for m in received.messages if m.type == "human"):
            seen.append(reply)
    return seen


def make_run(kind: str, checkpointer: Any, keeper: Keeper | None = None) -> Run:
    keeper = keeper or Keeper(CONFIG)
    model = ScriptedChatModel(default=StoryModel(answer=answer_with_rules))
    if kind == "agent":
        graph = create_keeper_agent(model, keeper=keeper, checkpointer=checkpointer)
    elif kind == "middleware":
        from langchain.agents import create_agent

        from keeper_middleware.integrations.langchain import KeeperMiddleware

        middleware = KeeperMiddleware(model, keeper=keeper)
        graph = create_agent(model, tools=[], middleware=[middleware], checkpointer=checkpointer)
    elif kind == "hook":
        from langgraph.prebuilt import create_react_agent

        from keeper_middleware.integrations.langchain import KeeperReactState, keeper_pre_model_hook

        hook = keeper_pre_model_hook(model, keeper=keeper)
        graph = create_react_agent(
            model,
            hook.tools,
            pre_model_hook=hook,
            state_schema=KeeperReactState,
            checkpointer=checkpointer,
        )
    elif kind == "node":
        graph = hand_built_graph(model, keeper, checkpointer)
    else:
        raise ValueError(kind)
    return Run(keeper=keeper, graph=graph, model=model)


def hand_built_graph(model: ScriptedChatModel, keeper: Keeper, checkpointer: Any) -> Any:
    """The keeper's node before the user's own model node, as examples/custom_graph.py wires it."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    node = KeeperNode(keeper, model=model)
    bound = model.bind_tools(list(node.tools))

    def call_model(state: KeeperGraphState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(KeeperGraphState)
    graph.add_node("keeper", node.as_runnable())
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(list(node.tools)))
    graph.add_edge(START, "keeper")
    graph.add_edge("keeper", "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "keeper")
    return graph.compile(checkpointer=checkpointer)


def keeper_for(saver_kind: str, tmp_path: Any) -> Keeper:
    """A keeper whose archive lives where the checkpoints do: a SQLite file beside SqliteSaver's
    (what a user persisting a thread has), in memory beside InMemorySaver."""
    if saver_kind == "sqlite":
        return Keeper(CONFIG, archive=tmp_path / "archive.sqlite3")
    return Keeper(CONFIG)


@contextmanager
def checkpointer_of(kind: str, tmp_path: Any, postgres_url: str | None = None) -> Iterator[Any]:
    if kind == "memory":
        yield InMemorySaver()
    elif kind == "sqlite":
        conn = sqlite3.connect(tmp_path / "checkpoints.sqlite3", check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()
    elif kind == "postgres":
        from langgraph.checkpoint.postgres import PostgresSaver

        assert postgres_url is not None
        with PostgresSaver.from_conn_string(postgres_url) as saver:
            saver.setup()
            yield saver
    else:
        raise ValueError(kind)


@dataclass(frozen=True)
class Put:
    """A change made with ``update_state`` instead of a run: messages added, replaced by id
    (an edit) or removed (``RemoveMessage``)."""

    messages: tuple[BaseMessage, ...]


Step = tuple[str, str | None] | Put
"""An input (text, id) the graph runs on, or a change made with ``update_state``."""


def control(steps: Sequence[Step], keeper: Keeper | None = None) -> Memory:
    """The memory of a fresh thread fed ``steps`` in order, that never saw any other branch:
    the reference a branch is checked against."""
    run = make_run("agent", InMemorySaver(), keeper or Keeper(CONFIG))
    run.thread = "control"
    feed(run, steps)
    return run.memory()


def feed(run: Run, steps: Sequence[Step], config: dict[str, Any] | None = None) -> None:
    """Run ``steps`` on the branch ``config`` points at (default: the thread's latest)."""
    for step in steps:
        if isinstance(step, Put):
            config = run.graph.update_state(
                config or run.config(), {"messages": list(step.messages)}
            )
            continue
        text, msg_id = step
        run.say(text, config, msg_id=msg_id)
        config = None


def unnoted(run: Run, config: dict[str, Any] | None = None) -> list[str]:
    """The ids of the inputs in view that no NOTES account for yet (the ones an edit or a
    removal can change as if they had always been so)."""
    values = run.state(config).values
    messages = model_view(values["messages"], values.get("keeper"))  # what the model is sent
    start = run.keeper.window.layout(messages).noted_start
    return [
        str(m.id) for m in messages[start:] if isinstance(m, HumanMessage) and not keeper_kind(m)
    ]


Story = Callable[[int], str]
