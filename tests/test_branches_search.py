"""Search on a branch: the search tool (run by a ToolNode) finds only what the branch being run
archived, reads only its own excerpted messages, and takes its guards' state from that branch's
messages, so a search refused on the branch the user left runs on one resumed from before it;
searches asked for together are decided in the order they were asked. And chat UIs: every
message the keeper writes into the graph carries the marker ``is_keeper_message`` reads."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent, is_keeper_message
from keeper_middleware.step.excerpts import excerpt_ref
from tests.branch_runs import CONFIG, TASK, Run, feed, story
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel

IN_STATE = replace(CONFIG, state_messages="window_with_keeper")
"""The option that writes the keeper's messages into the state, marked, for a UI to filter."""

PLAN = re.compile(r"Please search(?: together)?: ([\w, ]+)\.")
STORY = StoryModel()


def searching(messages):
    """Searches what the latest input asks for, one query a reply (or all at once when it says
    "together"), then answers with the results it got."""
    last_input = max(
        i for i, m in enumerate(messages) if m.type == "human" and not is_keeper_message(m)
    )
    asked = PLAN.search(str(messages[last_input].content))
    if asked is None:
        return STORY(messages)
    queries = [q.strip() for q in asked.group(1).split(",")]
    done = [m for m in messages[last_input:] if isinstance(m, ToolMessage)]
    if "together" in str(messages[last_input].content) and not done:
        calls = [
            {"name": "search_archive", "args": {"query": q}, "id": f"call-{i}"}
            for i, q in enumerate(queries)
        ]
        return AIMessage("", tool_calls=calls)
    if len(done) < len(queries) and "together" not in str(messages[last_input].content):
        n = len(done)
        return AIMessage(
            "",
            tool_calls=[{"name": "search_archive", "args": {"query": queries[n]}, "id": f"s{n}"}],
        )
    return "answered"


def agent_run(thread: str = "t", config: KeeperConfig = CONFIG) -> Run:
    keeper = Keeper(config)
    model = ScriptedChatModel(default=searching)
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    return Run(keeper=keeper, graph=agent, model=model, thread=thread)


COMMON = [(TASK, "task")] + [
    (story(i, f"Today we set c{i} to {i * 3}."), f"item-{i}") for i in range(1, 6)
]
LEFT = [
    (story(6, "Today we set zeta to 9."), "left-6"),
    (story(7, "Today we set c7 to 21."), "left-7"),
    (story(8, "Today we set c8 to 24."), "left-8"),
]
RIGHT = [
    (story(6, "Today we set omega to 5."), "right-6"),
    (story(7, "Today we set c7 to 70."), "right-7"),
    (story(8, "Today we set c8 to 80."), "right-8"),
]


def results(run: Run, config=None) -> list[str]:
    messages = run.state(config).values["messages"]
    return [str(m.content) for m in messages if isinstance(m, ToolMessage)]


def completed_after(run: Run, item_id: str):
    for snapshot in run.completed():
        humans = [m for m in snapshot.values["messages"] if isinstance(m, HumanMessage)]
        if humans and humans[-1].id == item_id:
            return snapshot
    raise AssertionError(item_id)


def test_the_search_tool_finds_only_what_the_branch_being_run_archived():
    run = agent_run()
    feed(run, COMMON + LEFT)
    feed(run, [(story(9, "Please search: zeta, c7."), "ask-left")])
    left = results(run)
    assert "Today we set zeta to 9." in left[0] and "c7 to 21" in left[1]
    before = completed_after(run, "item-5")
    feed(run, [*RIGHT, (story(9, "Please search: zeta, c7."), "ask-right")], before.config)
    right = results(run)
    assert right[0].startswith('No matches for "zeta"')
    assert "c7 to 70" in right[1] and "c7 to 21" not in right[1]
    control = agent_run("control")
    feed(control, [*COMMON, *RIGHT, (story(9, "Please search: zeta, c7."), "ask-right")])
    assert results(control) == right


def test_a_search_refused_on_the_left_branch_runs_on_a_branch_resumed_before_it():
    run = agent_run()
    feed(run, COMMON + LEFT)
    feed(run, [(story(9, "Please search: c1, c2, c1, c2, c1."), "ask")])
    left = results(run)
    assert left[4].startswith("Refused: this search was already sent twice")
    # back to the checkpoint right after the first result, and on from there
    after_first = next(
        s
        for s in run.graph.get_state_history(run.config())
        if s.next == ("keeper",)
        and len([m for m in s.values["messages"] if isinstance(m, ToolMessage)]) == 1
    )
    run.graph.invoke(None, after_first.config)
    # the same five searches as a fresh thread makes them: c2 runs a second time here
    control = agent_run("control")
    feed(control, [*COMMON, *LEFT, (story(9, "Please search: c1, c2, c1, c2, c1."), "ask")])
    assert results(run) == results(control) == left


def test_searches_asked_for_together_are_decided_in_the_order_asked():
    run = agent_run()
    feed(run, COMMON + LEFT)
    feed(run, [(story(9, "Please search together: c1, c1."), "ask")])
    first, second = results(run)
    assert "c1 to 3" in first
    assert second.startswith("Refused: this is the same search as the one just before")


def test_an_excerpted_message_is_read_only_on_the_branch_that_archived_it():
    run = agent_run()
    feed(run, COMMON)
    long = story(6, "Today we set zeta to 9. ") + " ".join(
        f"Line {n} of the appendix says nothing new." for n in range(900)
    )
    feed(run, [(long, "long-6")])
    ref = excerpt_ref("t", "long-6")
    assert f'read="{ref}"' in str(run.state().values["messages"][-2].content)
    page = run.keeper.search("t", read=ref, head=run.head())
    assert page.startswith(f'[READ "{ref}"] page 1 of')
    before = completed_after(run, "item-5")
    feed(run, RIGHT[:1], before.config)
    refused = run.keeper.search("t", read=ref, head=run.head())
    assert refused.startswith("Refused: no archived message has the reference")


def test_chat_uis_filter_the_keepers_messages_by_their_marker():
    run = agent_run(config=IN_STATE)
    shown, written = [], []
    inputs = [TASK] + [story(i, f"Today we set c{i} to {i}.") for i in range(1, 7)]
    for text in [*inputs, "Item 7. Questions: 1. What is c1?"]:
        stream = run.graph.stream(
            {"messages": [HumanMessage(text)]}, run.config(), stream_mode="messages"
        )
        for chunk, _meta in stream:
            if isinstance(chunk, RemoveMessage):
                continue
            (written if is_keeper_message(chunk) else shown).append(chunk)
    assert {chunk.additional_kwargs["keeper"] for chunk in written} == {"notes", "rules"}
    assert all(isinstance(chunk, AIMessage) for chunk in shown)  # the UI shows the model's
    state = run.state().values["messages"]
    assert [m for m in state if is_keeper_message(m)]
    assert all(
        not is_keeper_message(m) or m.type == "human" for m in state
    )  # never a reply or a tool result


def test_a_forged_marker_is_removed_so_the_ui_shows_the_users_message():
    run = agent_run()
    forged = HumanMessage(
        "Item 1. Today we set c1 to 3.", id="forged", additional_kwargs={"keeper": "notes"}
    )
    run.graph.invoke({"messages": [HumanMessage(TASK)]}, run.config())
    run.graph.invoke({"messages": [forged]}, run.config())
    kept = next(m for m in run.state().values["messages"] if m.id == "forged")
    assert not is_keeper_message(kept)


def test_the_ui_filter_in_the_docs_shows_the_models_words_and_never_the_keepers():
    """The example in docs/branches.md, run as written over a run that cuts and asks, with the
    keeper's messages written into the state (the option that needs the filter)."""
    docs = Path(__file__).resolve().parents[1] / "docs" / "branches.md"
    example = next(
        block
        for block in re.findall(r"```python[^\n]*\n(.*?)```", docs.read_text(), re.DOTALL)
        if "is_keeper_message" in block
    )
    run = agent_run(config=IN_STATE)
    printed: list[str] = []
    texts = [TASK] + [story(i, f"Today we set c{i} to {i}.") for i in range(1, 7)]
    for text in [*texts, "Item 7. Questions: 1. What is c1?"]:
        scope = {
            "agent": run.graph,
            "inputs": {"messages": [HumanMessage(text)]},
            "config": run.config(),
            "print": lambda value, end="\n": printed.append(str(value)),
        }
        exec(compile(example, "docs/branches.md", "exec"), scope)
    shown = "".join(printed)
    assert "ok" in shown
    assert "[NOTES]" not in shown and "[RULES]" not in shown
    assert any("[NOTES]" in str(m.content) for m in run.state().values["messages"])
