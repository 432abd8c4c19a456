"""The power-user tier: what a LangGraph power user does with a thread (forks driven alternately
and at once past several cuts, time travel and replays through ``get_state_history``, a keeper
agent as a subgraph with checkpoints of its own and an ``interrupt`` inside, two keeper agents in
one parent graph, stateless subagents called in turn and through ``Send``, ``Send`` fan-out of
model nodes, every ``durability``, ``batch`` and ``asyncio`` runs of several threads, a run
cancelled in a note call, a process killed at a fork's first cut), each on a SQLite file archive
with SqliteSaver and on PostgreSQL with PostgresSaver. Every branch ends with the memory (archived
turns, NOTES, search) of a control: a fresh thread fed that branch's history; no archived turn
is lost or doubled, and every later invoke works."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send

from keeper_middleware import Keeper, KeeperGraphState, create_keeper_agent
from keeper_middleware.archive.records import TIP
from tests.branch_runs import CONFIG, Run, answer_with_rules, feed, memory_of, story
from tests.fake_model import ScriptedChatModel
from tests.power_graphs import PERSONAS, Batch, Desk, Pair, fan_graph, sign_off, signing
from tests.power_runs import (
    COMMON,
    LEFT,
    QUESTION,
    RIGHT,
    Backend,
    assert_whole,
    branch,
    completed_after,
    control_memory,
    fork_tip,
    held_run,
    one_node_graph,
    tip,
    waiting_for_keeper,
)
from tests.story_model import StoryModel

pytestmark = pytest.mark.power_user
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request, tmp_path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", tmp_path)
    url, schema = request.getfixturevalue("postgres_url"), request.getfixturevalue("pg_schema")
    return Backend("postgres", tmp_path, url, schema)


# ---------------------------------------------------------------- forks and time travel


def test_a_fork_before_a_cut_driven_alternately_past_several_cuts(backend):
    with backend.saver() as saver:
        run = backend.run(saver, "fork")
        feed(run, list(COMMON))
        tips = {"left": tip(run), "right": tip(run)}  # the next cut has not happened
        shared = run.head(tips["left"])
        heads: dict[str, list[str | None]] = {"left": [], "right": []}
        for left, right in zip(LEFT, RIGHT, strict=True):
            for side, (text, msg_id) in (("left", left), ("right", right)):
                run.say(text, tips[side], msg_id=msg_id)
                tips[side] = tip(run)
                heads[side].append(run.head(tips[side]))
        for side, steps in (("left", LEFT), ("right", RIGHT)):
            mine = run.memory(tips[side])
            assert mine == control_memory(COMMON + steps)
            assert_whole(run.keeper, run.thread, run.head(tips[side]))
            assert len(set(heads[side]) - {shared}) >= 2  # several cuts of its own
        assert not (set(heads["left"]) & set(heads["right"])) - {shared}
        assert "answer in French." in run.memory(tips["left"]).rules
        assert "answer in French." not in run.memory(tips["right"]).rules

        # back to an old checkpoint of each branch (after its first cut), and on from there
        for side, steps in (("left", LEFT), ("right", RIGHT)):
            old = completed_after(run, steps[1][1])
            later = ((steps[1][0].replace("Today", "Later"), f"{side}-again-8"), QUESTION)
            feed(run, list(later), dict(old.config))
            mine = run.memory()
            assert mine == control_memory(COMMON + steps[:2] + later)
            assert_whole(run.keeper, run.thread, run.head())
        # a replay of each branch from a checkpoint where an input waited for the keeper: the
        # cut it made then is found, not made again
        for steps in (LEFT, RIGHT):
            pending = waiting_for_keeper(run, steps[3][1])
            cuts = run.keeper.counters(run.thread).cuts
            run.graph.invoke(None, dict(pending.config))
            assert run.memory() == control_memory(COMMON + steps[:4])
            assert run.keeper.counters(run.thread).cuts == cuts
        # the branches left behind kept their memory
        assert run.memory(tips["left"]) == control_memory(COMMON + LEFT)
        assert run.memory(tips["right"]) == control_memory(COMMON + RIGHT)


# ---------------------------------------------------------------- graph shapes


def test_a_keeper_agent_as_a_subgraph_node_remembers_as_its_own_thread(backend):
    with backend.saver() as saver:
        keeper = backend.keeper()
        model = ScriptedChatModel(default=StoryModel(answer=answer_with_rules))
        agent = create_keeper_agent(model, keeper=keeper)  # the parent's checkpointer
        graph = one_node_graph(KeeperGraphState, "assistant", agent, saver)
        thread = backend.thread("sub")
        config = {"configurable": {"thread_id": thread}}
        steps = COMMON + LEFT[:4] + (QUESTION,)
        for text, msg_id in steps:
            graph.invoke({"messages": [HumanMessage(text, id=msg_id)]}, config)
        head = keeper.head_of(thread, graph.get_state(config).values)
        assert memory_of(keeper, thread, head) == control_memory(steps)
        assert_whole(keeper, thread, head)


@pytest.mark.parametrize("engines", [1, 2])
def test_two_keeper_agents_in_one_parent_graph_share_one_archive(backend, engines):
    """Each agent keeps its own checkpoints (``checkpointer=True``: a namespace of its own) and
    its own memory, though both archive under the parent's thread in one archive, through one
    shared ``Keeper`` or one engine each."""
    with backend.saver() as saver:
        shared = backend.keeper()
        keepers = {"research": shared, "write": shared if engines == 1 else backend.keeper()}
        agents = {
            name: create_keeper_agent(
                ScriptedChatModel(default=StoryModel(answer=answer_with_rules)),
                keeper=keeper,
                checkpointer=True,
            )
            for name, keeper in keepers.items()
        }

        def node_of(name: str) -> Any:
            def node(state: Pair) -> dict[str, Any]:
                out = agents[name].invoke({"messages": [HumanMessage(state[name])]})
                return {"replies": [f"{name}: {out['messages'][-1].content}"]}

            return node

        parent = StateGraph(Pair)
        for name in agents:
            parent.add_node(name, node_of(name))
            parent.add_edge(START, name)
            parent.add_edge(name, END)
        graph = parent.compile(checkpointer=saver)
        thread = backend.thread("pair")
        config = {"configurable": {"thread_id": thread}}
        research, write = COMMON + LEFT[:4] + (QUESTION,), COMMON + RIGHT[:4] + (QUESTION,)
        for (r, _), (w, _) in zip(research, write, strict=True):
            graph.invoke({"research": r, "write": w, "replies": []}, config)
        for name, steps in (("research", research), ("write", write)):
            tuple_ = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": name}})
            assert tuple_ is not None, f"no checkpoint in the {name} namespace"
            keeper = keepers[name]
            head = keeper.head_of(thread, tuple_.checkpoint["channel_values"])
            assert memory_of(keeper, thread, head) == control_memory(steps)
            assert_whole(keeper, thread, head)


@pytest.mark.parametrize("fan_out", [False, True])
def test_a_stateless_keeper_subagent_remembers_only_each_call(backend, fan_out):
    """A keeper agent invoked from a node without checkpoints of its own starts afresh at every
    call, on the parent's thread, one call after another or several at once (``Send``, a
    map-reduce of subagents): each call has the memory of a fresh thread fed that call's
    messages, and nothing of another call."""
    calls = (COMMON + LEFT[:4] + (QUESTION,), COMMON + RIGHT[:4] + (QUESTION,))
    batches = [[text for text, _ in steps] for steps in calls]
    with backend.saver() as saver:
        keeper = backend.keeper()
        agent = create_keeper_agent(
            ScriptedChatModel(default=StoryModel(answer=answer_with_rules)), keeper=keeper
        )
        outs: dict[tuple[str, ...], dict[str, Any]] = {}

        def helper(state: Batch) -> dict[str, Any]:
            texts = state["texts"]
            outs[tuple(texts)] = agent.invoke({"messages": [HumanMessage(t) for t in texts]})
            return {}

        thread = backend.thread(f"stateless-{fan_out}")
        config = {"configurable": {"thread_id": thread}}
        if fan_out:
            parent = StateGraph(Batch)
            parent.add_node("helper", helper)
            parent.add_conditional_edges(
                START, lambda s: [Send("helper", {"texts": b}) for b in s["batches"]], ["helper"]
            )
            parent.add_edge("helper", END)
            parent.compile(checkpointer=saver).invoke({"texts": [], "batches": batches}, config)
        else:
            graph = one_node_graph(Batch, "helper", helper, saver)
            for texts in batches:
                graph.invoke({"texts": texts}, config)
        for texts in batches:
            control_keeper = Keeper(CONFIG)
            fresh = create_keeper_agent(
                ScriptedChatModel(default=StoryModel(answer=answer_with_rules)),
                keeper=control_keeper,
            )
            values = fresh.invoke(
                {"messages": [HumanMessage(t) for t in texts]},
                {"configurable": {"thread_id": "control"}},
            )
            head = keeper.head_of(thread, outs[tuple(texts)])
            assert memory_of(keeper, thread, head) == memory_of(
                control_keeper, "control", control_keeper.head_of("control", values)
            )
            assert_whole(keeper, thread, head)


def test_an_interrupt_inside_a_keeper_subgraph_resumes_with_its_memory(backend):
    """A person signs off in the middle of a keeper agent that is a subgraph with checkpoints of
    its own (``checkpointer=True``); the parent resumes it with ``Command(resume=...)``."""
    asking = (story(6, "Needs a sign-off.") + "\nRule: answer in French.", "ask-6")
    steps = (*COMMON, asking)
    later = LEFT[1:4]
    with backend.saver() as saver:
        keeper = backend.keeper()
        agent = create_keeper_agent(
            ScriptedChatModel(default=signing), [sign_off], keeper=keeper, checkpointer=True
        )

        def desk(state: Desk) -> dict[str, Any]:
            said = HumanMessage(state["ask"], id=state["ask_id"])
            out = agent.invoke({"messages": [said]})
            return {"replies": [str(out["messages"][-1].content)]}

        graph = one_node_graph(Desk, "desk", desk, saver)
        thread = backend.thread("desk")
        config = {"configurable": {"thread_id": thread}}
        for text, msg_id in steps:
            graph.invoke({"ask": text, "ask_id": msg_id, "replies": []}, config)
        assert graph.get_state(config).interrupts, "the sign-off did not wait for a person"
        graph.invoke(Command(resume="yes"), config)
        for text, msg_id in later:
            graph.invoke({"ask": text, "ask_id": msg_id, "replies": []}, config)
        inner = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": "desk"}})
        head = keeper.head_of(thread, inner.checkpoint["channel_values"])
        mine = memory_of(keeper, thread, head)
        assert_whole(keeper, thread, head)

        # the control: the same agent on a thread of its own, signed off the same way
        plain = create_keeper_agent(
            ScriptedChatModel(default=signing), [sign_off], keeper=keeper, checkpointer=saver
        )
        run = Run(keeper=keeper, graph=plain, model=ScriptedChatModel(), thread=thread + "-c")
        feed(run, list(steps))
        plain.invoke(Command(resume="yes"), run.config())
        feed(run, list(later))
        assert mine == run.memory()
        assert "answer in French." in mine.rules


def test_send_fan_out_of_several_model_nodes_on_one_thread(backend):
    steps = COMMON + LEFT[:4] + (QUESTION,)
    with backend.saver() as saver:
        keeper = backend.keeper()
        memories = []
        for send in (True, False):
            graph = fan_graph(keeper, saver, send=send)
            thread = backend.thread(f"fan-{send}")
            config = {"configurable": {"thread_id": thread}}
            for text, msg_id in steps:
                graph.invoke({"messages": [HumanMessage(text, id=msg_id)]}, config)
            head = keeper.head_of(thread, graph.get_state(config).values)
            memories.append(memory_of(keeper, thread, head))
            assert_whole(keeper, thread, head)
        fanned, control = memories
        assert fanned == control
        assert keeper.counters(backend.thread("fan-True")).cuts >= 2
        replies = [t for t in fanned.turns if t[0] == "ai"]
        assert len(replies) % PERSONAS == 0 and replies  # every persona's reply, once


# ---------------------------------------------------------------- durability


@pytest.mark.parametrize("durability", ["exit", "async", "sync"])
def test_every_durability_keeps_each_branch_memory(backend, durability):
    with backend.saver() as saver:
        run = backend.run(saver, f"durable-{durability}")

        def say_all(steps, config=None):
            for text, msg_id in steps:
                message = HumanMessage(text, id=msg_id)
                run.graph.invoke(
                    {"messages": [message]}, config or run.config(), durability=durability
                )
                config = None

        left = COMMON + LEFT[:4] + (QUESTION,)
        say_all(left)
        assert run.memory() == control_memory(left)
        say_all((*RIGHT[:4], QUESTION), dict(completed_after(run, "item-5").config))
        assert run.memory() == control_memory(COMMON + RIGHT[:4] + (QUESTION,))
        assert_whole(run.keeper, run.thread, run.head())


# ---------------------------------------------------------------- at once


def test_batch_over_three_threads_on_one_archive(backend):
    """``graph.batch`` runs the threads' inputs at once in a pool of OS threads."""
    stories = {
        "b-left": LEFT[:5],
        "b-right": RIGHT[:5],
        "b-third": branch("kappa", "be brief.")[:5],
    }
    with backend.saver() as saver:
        run = backend.run(saver, "batch")
        configs = [{"configurable": {"thread_id": backend.thread(name)}} for name in stories]
        histories = [COMMON + steps for steps in stories.values()]
        for step in range(len(histories[0])):
            inputs = [
                {"messages": [HumanMessage(history[step][0], id=history[step][1])]}
                for history in histories
            ]
            run.graph.batch(inputs, configs)
        for config, history in zip(configs, histories, strict=True):
            thread = config["configurable"]["thread_id"]
            head = run.keeper.head_of(thread, run.graph.get_state(config).values)
            assert memory_of(run.keeper, thread, head) == control_memory(history)
            assert_whole(run.keeper, thread, head)


# ---------------------------------------------------------------- async


def test_two_threads_at_once_on_one_archive(backend):
    async def scenario() -> None:
        async with backend.asaver() as saver:
            keeper = backend.keeper()
            runs = {side: backend.run(saver, f"async-{side}", keeper) for side in ("l", "r")}

            async def afeed(side: str, steps) -> None:
                run = runs[side]
                for text, msg_id in steps:
                    message = HumanMessage(text, id=msg_id)
                    await run.graph.ainvoke({"messages": [message]}, run.config())

            left, right = COMMON + LEFT[:7], COMMON + RIGHT[:7]
            await asyncio.gather(afeed("l", left), afeed("r", right))
            for side, steps in (("l", left), ("r", right)):
                run = runs[side]
                values = (await run.graph.aget_state(run.config())).values
                head = keeper.head_of(run.thread, values)
                assert memory_of(keeper, run.thread, head) == control_memory(steps)
                assert_whole(keeper, run.thread, head)

    asyncio.run(scenario())


def test_two_branches_of_one_thread_run_at_once(backend):
    """Both forks of one thread driven concurrently (a UI's two tabs on one conversation)."""

    async def scenario() -> None:
        async with backend.asaver() as saver:
            run = backend.run(saver, "both")
            for text, msg_id in COMMON:
                await run.graph.ainvoke({"messages": [HumanMessage(text, id=msg_id)]}, run.config())
            fork = dict((await run.graph.aget_state(run.config())).config)

            async def afeed(steps) -> None:
                config = fork
                for text, msg_id in steps:
                    await run.graph.ainvoke({"messages": [HumanMessage(text, id=msg_id)]}, config)
                    done = await asyncio.to_thread(completed_after, run, msg_id)
                    config = dict(done.config)

            await asyncio.gather(afeed(LEFT[:5]), afeed(RIGHT[:5]))
            for steps in (LEFT[:5], RIGHT[:5]):
                tip_of = await asyncio.to_thread(completed_after, run, steps[-1][1])
                head = run.keeper.head_of(run.thread, tip_of.values)
                assert memory_of(run.keeper, run.thread, head) == control_memory(COMMON + steps)
                assert_whole(run.keeper, run.thread, head)

    asyncio.run(scenario())


def test_a_run_cancelled_in_a_note_call_leaves_no_half_cut(backend):
    async def scenario() -> None:
        async with backend.asaver() as saver:
            run, model = held_run(backend, saver, "cancelled")
            for text, msg_id in COMMON[:3]:  # the task and items 1-2: no cut yet
                await run.graph.ainvoke({"messages": [HumanMessage(text, id=msg_id)]}, run.config())
            before = [t for t in run.keeper.turns(run.thread)]
            counters = run.keeper.counters(run.thread)
            entered, release = model.hold()
            text, msg_id = COMMON[3]  # item 3: the keeper cuts, and its note call waits
            task = asyncio.create_task(
                run.graph.ainvoke({"messages": [HumanMessage(text, id=msg_id)]}, run.config())
            )
            await asyncio.wait_for(entered.wait(), 60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert list(run.keeper.turns(run.thread)) == before  # nothing of the cut
            assert run.keeper.counters(run.thread).cuts == counters.cuts
            assert run.keeper.notes(run.thread).rules == ()
            release.set()
            # the user sends item 3 again, then goes on
            for text, msg_id in COMMON[3:] + LEFT[:4] + (QUESTION,):
                await run.graph.ainvoke({"messages": [HumanMessage(text, id=msg_id)]}, run.config())
            values = (await run.graph.aget_state(run.config())).values
            head = run.keeper.head_of(run.thread, values)
            mine = memory_of(run.keeper, run.thread, head)
            assert mine == control_memory(COMMON + LEFT[:4] + (QUESTION,))
            assert_whole(run.keeper, run.thread, head)

    asyncio.run(scenario())


# ---------------------------------------------------------------- a process killed


@pytest.mark.parametrize("moment", ["commit", "note call", "unsaved input"])
def test_a_process_killed_at_a_forks_first_cut_loses_nothing(backend, moment):
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.power_runs",
            backend.kind,
            str(backend.tmp),
            backend.url or "",
            backend.schema or "",
            moment,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "bench")])},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    with backend.saver() as saver:  # the process restarts: a new keeper on the same stores
        run = backend.run(saver, "killed")
        # the fork's latest checkpoint LangGraph saved (with the default durability, "async", the
        # one where the killed input arrived may not have been written, or only its input task's
        # writes): resumed if work was pending, and the inputs it does not hold sent again, up to
        # the one that cut
        saved = fork_tip(run, {msg_id for _, msg_id in RIGHT}, "item-5")
        if saved.next or saved.tasks:
            run.graph.invoke(None, dict(saved.config))
            saved = run.state()
        said = {m.id for m in saved.values["messages"] if isinstance(m, HumanMessage)}
        done = 1 + max((i for i, (_, msg_id) in enumerate(RIGHT) if msg_id in said), default=-1)
        if moment == "unsaved input":
            assert done < 2, "the input the process was killed on was saved after all"
        feed(run, list(RIGHT[done:2]), dict(saved.config))
        # the killed cut is made then (killed in its note call), or found committed
        assert len(run.model.default.note_requests) == (0 if moment == "commit" else 1)
        feed(run, list((*RIGHT[max(done, 2) : 4], QUESTION)), tip(run))
        assert run.memory() == control_memory(COMMON + RIGHT[:4] + (QUESTION,))
        assert_whole(run.keeper, run.thread, run.head())
        feed(run, list((*LEFT[2:4], QUESTION)), dict(completed_after(run, LEFT[1][1]).config))
        left = run.memory()
        assert left == control_memory(COMMON + LEFT[:4] + (QUESTION,))
        assert_whole(run.keeper, run.thread, run.head())
        assert memory_of(run.keeper, run.thread, TIP) == left
        # every cut counted once: the killed one when it was found again
        cuts = list(run.keeper.archive.cuts(run.thread))
        assert run.keeper.counters(run.thread).cuts == len(cuts)
