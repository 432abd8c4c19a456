"""The keeper engine end to end through create_keeper_agent, with a scripted model."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import (
    ConfigurationError,
    Keeper,
    KeeperConfig,
    ModelSetup,
    WindowTooSmallError,
    create_keeper_agent,
)
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.state_view import model_view
from keeper_middleware.tokens.counting import ApproximateTokenCounter
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

SMALL = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=5)
THREAD = {"configurable": {"thread_id": "t1"}}


def run_story(agent, items: int, *, question_every: int = 0, rule: str = "always answer in digits"):
    agent.invoke({"messages": [HumanMessage(f"Task: read the items. Rule: {rule}.")]}, THREAD)
    out = None
    for i in range(1, items + 1):
        out = agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, THREAD
        )
        if question_every and i % question_every == 0:
            out = agent.invoke({"messages": [HumanMessage(f"Questions: what is c{i}?")]}, THREAD)
    return out


def test_notes_carry_every_value_and_the_archive_every_turn():
    keeper = Keeper(SMALL)
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
    )
    run_story(agent, 30)
    notes = keeper.notes("t1")
    assert notes.state_dict() == {f"c{i}": str(i * 3) for i in range(1, notes.last_item + 1)}
    assert notes.rules == ("always answer in digits.",)
    counters = keeper.counters("t1")
    assert counters.cuts >= 5
    ids = [t.msg_id for t in keeper.archive.turns("t1")]
    assert len(ids) == len(set(ids)), "a turn was archived twice"
    texts = [t.content for t in keeper.archive.turns("t1")]
    assert any("set c1 to 3" in t for t in texts)


def test_window_is_never_exceeded_and_system_prompt_never_dropped():
    model = ScriptedChatModel(default=StoryModel())
    keeper = Keeper(SMALL)
    agent = create_keeper_agent(
        model, system_prompt="You are careful.", keeper=keeper, checkpointer=InMemorySaver()
    )
    run_story(agent, 40, question_every=10)
    counter = ApproximateTokenCounter()
    for received in model.received:
        assert isinstance(received.messages[0], SystemMessage)
        assert received.messages[0].content == "You are careful."
        assert counter.count_messages(received.messages) <= SMALL.window


def test_a_note_request_is_rendered_like_a_work_call():
    model = ScriptedChatModel(default=StoryModel())
    agent = create_keeper_agent(
        model, system_prompt="SYS", config=SMALL, checkpointer=InMemorySaver()
    )
    run_story(agent, 8)
    work = [r for r in model.received if keeper_kind(r.messages[-1]) is None]
    notes = [r for r in model.received if keeper_kind(r.messages[-1]) == "notes_request"]
    assert notes, "no notes were taken"
    assert notes[0].tools == work[0].tools == ["search_archive"]
    assert notes[0].messages[0] == work[0].messages[0]
    # the request rides on the conversation the server already read: the last work call's
    # messages are a prefix of the note request
    before = [
        r
        for r in model.received[: model.received.index(notes[0])]
        if keeper_kind(r.messages[-1]) is None
    ][-1]
    sent = notes[0].messages
    assert [m.content for m in before.messages] == [m.content for m in sent[: len(before.messages)]]


def test_tool_call_pairs_are_never_split():
    @tool
    def lookup(name: str) -> str:
        """Look a name up."""
        return f"{name} is a counter. " + "More detail follows here. " * 15

    def reply(messages: list[BaseMessage]):
        last = messages[-1]
        if keeper_kind(last) in ("notes_request", "notes_reask"):
            return StoryModel()(messages)
        if isinstance(last, HumanMessage):
            return AIMessage(
                "",
                tool_calls=[
                    {
                        "name": "lookup",
                        "args": {"name": "x"},
                        "id": f"c{len(messages)}",
                        "type": "tool_call",
                    }
                ],
            )
        return "done"

    model = ScriptedChatModel(default=reply)
    keeper = Keeper(SMALL)
    agent = create_keeper_agent(model, [lookup], keeper=keeper, checkpointer=InMemorySaver())
    run_story(agent, 30)
    assert keeper.counters("t1").cuts > 3
    for received in model.received:
        calls: set[str] = set()
        for message in received.messages:
            if isinstance(message, AIMessage):
                calls |= {c["id"] for c in message.tool_calls}
            if isinstance(message, ToolMessage):
                assert message.tool_call_id in calls, "a tool result was sent without its call"


def test_an_open_question_is_never_cut_out_of_view():
    asked: list[list[BaseMessage]] = []

    def reply(messages):
        last = messages[-1]
        if keeper_kind(last) in ("notes_request", "notes_reask"):
            return StoryModel()(messages)
        if (
            "Questions" in text_of(last)
            or keeper_kind(last) == "rules"
            or isinstance(last, ToolMessage)
        ):
            asked.append(messages)
            searches = sum(isinstance(m, ToolMessage) for m in messages)
            if searches < 12:
                return AIMessage(
                    "",
                    tool_calls=[
                        {
                            "name": "search_archive",
                            "args": {"query": f"c{searches + 1}"},
                            "id": f"s{len(asked)}",
                            "type": "tool_call",
                        }
                    ],
                )
            return "1. 3"
        return "ok"

    keeper = Keeper(KeeperConfig(window=3000, reply_reserve=256, notes_every_items=5))
    agent = create_keeper_agent(
        ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    run_story(agent, 12)
    agent.invoke({"messages": [HumanMessage("Questions: what was c1 at the start?")]}, THREAD)
    assert keeper.counters("t1").cuts >= 2
    for messages in asked:
        assert any("what was c1 at the start?" in text_of(m) for m in messages)


def test_a_reply_that_thought_to_its_limit_is_asked_again_without_thinking():
    thinking_off = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    config = KeeperConfig(
        window=4096,
        reply_reserve=512,
        thinking=__import__("keeper_middleware").ThinkingPolicy(off=thinking_off),
    )
    empty = AIMessage(
        "",
        response_metadata={"finish_reason": "length"},
        additional_kwargs={"reasoning_content": "hmm " * 100},
    )
    model = ScriptedChatModel(script=[empty, "the answer"])
    keeper = Keeper(config)
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("hello")]}, THREAD)
    assert text_of(out["messages"][-1]) == "the answer"
    again = model.received[1].kwargs
    assert again["extra_body"] == thinking_off["extra_body"]
    if model.received[0].kwargs == thinking_off:  # sent without thinking already: sampled too
        assert again.get("temperature") == 0.7
    assert keeper.counters("t1").thinking_retries == 1


def test_reasoning_is_stripped_from_what_is_kept():
    reply = AIMessage(
        "<think>long private musing</think>The answer.",
        additional_kwargs={"reasoning_content": "more musing"},
    )
    model = ScriptedChatModel(script=[reply])
    agent = create_keeper_agent(model, config=SMALL, checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("hello")]}, THREAD)
    kept = out["messages"][-1]
    assert kept.content == "The answer."
    assert "reasoning_content" not in kept.additional_kwargs


def test_reasoning_effort_is_forwarded_on_every_call():
    config = KeeperConfig(
        window=2048,
        reply_reserve=256,
        notes_every_items=3,
        thinking=__import__("keeper_middleware").ThinkingPolicy(reasoning_effort="medium"),
    )
    model = ScriptedChatModel(default=StoryModel())
    agent = create_keeper_agent(model, config=config, checkpointer=InMemorySaver())
    run_story(agent, 6)
    assert model.received and all(
        r.kwargs.get("reasoning_effort") == "medium" for r in model.received
    )


def test_sessions_are_isolated():
    keeper = Keeper(SMALL)
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
    )
    run_story(agent, 12)
    assert keeper.search("t1", "c3").startswith("Found")
    assert keeper.search("other", "c3").startswith("No matches")
    assert keeper.notes("other").state == ()


def test_bad_configuration_says_how_to_fix_it():
    with pytest.raises(ConfigurationError, match="at least 1024"):
        KeeperConfig(window=100)
    with pytest.raises(ConfigurationError, match="'in_place'"):
        KeeperConfig(notes_mode="summary")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="fraction"):
        KeeperConfig(notes_at=("fraction", 1.5))


def test_what_must_stay_in_view_not_fitting_is_a_clear_error():
    keeper = Keeper(KeeperConfig(window=1024, reply_reserve=128, notes_every_items=1))
    setup = ModelSetup(system_prompt="SYS " * 900)
    messages = [
        HumanMessage("task", id="h0"),
        HumanMessage("Item 1. short", id="h1"),
        AIMessage("ok", id="a1"),
        HumanMessage("Item 2. hi", id="h2"),
    ]
    with pytest.raises(WindowTooSmallError, match="Raise the window"):
        keeper.step("s", messages, None, setup, lambda m, k: AIMessage("NO CHANGES"))


@pytest.mark.anyio
async def test_async_and_sync_paths_reach_the_same_notes():
    def run_sync():
        keeper = Keeper(SMALL)
        agent = create_keeper_agent(
            ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
        )
        run_story(agent, 15)
        return keeper.notes("t1"), [t.content for t in keeper.archive.turns("t1")]

    keeper = Keeper(SMALL)
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
    )
    await agent.ainvoke(
        {"messages": [HumanMessage("Task: read the items. Rule: always answer in digits.")]}, THREAD
    )
    for i in range(1, 16):
        await agent.ainvoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, THREAD
        )
    sync_notes, sync_turns = run_sync()
    assert keeper.notes("t1").state == sync_notes.state
    assert [t.content for t in keeper.archive.turns("t1")] == sync_turns


def test_a_system_message_in_the_middle_of_a_history_is_archived_when_it_leaves():
    keeper = Keeper(KeeperConfig(window=2048, reply_reserve=512))
    msgs = [HumanMessage("Task", id="t"), SystemMessage("Reminder: be brief.", id="sys-mid")]
    msgs += [HumanMessage(f"Item {i}: " + "words " * 120, id=f"i{i}") for i in range(1, 12)]
    result = keeper.step(
        "s", msgs, None, ModelSetup(system_prompt="sys"), lambda m, k: AIMessage("NO CHANGES")
    )
    assert result.cut
    in_view = {m.id for m in result.messages}
    archived = {t.msg_id for t in keeper.archive.turns("s")}
    assert "sys-mid" in in_view | archived


def test_work_on_an_open_question_that_outgrows_the_window_is_cut_but_the_question_stays():
    asked: list[list[BaseMessage]] = []

    def reply(messages):
        last = messages[-1]
        if keeper_kind(last) in ("notes_request", "notes_reask"):
            return StoryModel()(messages)
        if (
            "Questions" in text_of(last)
            or keeper_kind(last) == "rules"
            or isinstance(last, ToolMessage)
        ):
            asked.append(messages)
            if len(asked) < 30 and "Stop searching now" not in text_of(last):
                query = f"c{len(asked) % 12 + 1} day quietly"  # long result lists
                return AIMessage(
                    "",
                    tool_calls=[
                        {
                            "name": "search_archive",
                            "args": {"query": query},
                            "id": f"s{len(asked)}",
                            "type": "tool_call",
                        }
                    ],
                )
            return "1. 3"
        return "ok"

    keeper = Keeper(KeeperConfig(window=2048, reply_reserve=256, notes_every_items=5))
    agent = create_keeper_agent(
        ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    run_story(agent, 12)
    cuts = keeper.counters("t1").cuts
    out = agent.invoke({"messages": [HumanMessage("Questions: what was c1 at the start?")]}, THREAD)
    assert keeper.counters("t1").cuts > cuts, "the searches outgrew the window and were cut"
    assert text_of(out["messages"][-1]) == "1. 3"
    for messages in asked:
        assert any("what was c1 at the start?" in text_of(m) for m in messages)


def test_questions_and_search_results_never_demand_a_note():
    def reply(messages):
        last = messages[-1]
        if keeper_kind(last) in ("notes_request", "notes_reask"):
            return StoryModel()(messages)
        if "Questions" in text_of(last) or keeper_kind(last) == "rules":
            return AIMessage(
                "",
                tool_calls=[
                    {
                        "name": "search_archive",
                        "args": {"query": "c77", "to_item": 9},
                        "id": "s1",
                        "type": "tool_call",
                    }
                ],
            )
        if isinstance(last, ToolMessage):
            return "1. unknown"
        return "ok"

    config = KeeperConfig(
        window=4096, reply_reserve=256, notes_every_items=4, tracked_names=r"\bc\d+\b"
    )
    keeper = Keeper(config)
    agent = create_keeper_agent(
        ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    run_story(agent, 3)
    agent.invoke({"messages": [HumanMessage("Questions: what is c77 at item 2?")]}, THREAD)
    run_story_from = 4
    for i in range(run_story_from, 9):
        agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, THREAD
        )
    assert keeper.counters("t1").cuts >= 1
    assert keeper.counters("t1").reasks == 0


def test_a_reask_that_would_not_fit_beside_the_reply_is_sent_without_it():
    calls: list[list[BaseMessage]] = []

    def reply(messages: list[BaseMessage], kwargs) -> AIMessage:
        calls.append(messages)
        # a usable first reply with one contradicted line, padded with a long ramble
        return AIMessage(
            "SET c1 = 3\nSET c2 = 99 (= 650 - 27)\n" + "I also thought about it. " * 400
        )

    keeper = Keeper(KeeperConfig(window=2048, reply_reserve=256, notes_every_items=2))
    messages = [HumanMessage("Task: read.", id="t")]
    messages += [
        HumanMessage(batch(i, f"Today we set c{i} to {i * 3}.", filler=5), id=f"b{i}")
        for i in (1, 2)
    ]
    result = keeper.step("s", messages, None, ModelSetup(system_prompt="SYS"), reply)
    assert result.cut
    assert len(calls) == 3, "each re-ask is sent, without the reply too long to send back"
    for reask in calls[1:]:
        assert not any("I also thought about it." in text_of(m) for m in reask)
        size = keeper.tokens.count_messages(reask)
        assert size <= keeper.config.budget
    assert keeper.notes("s").state_dict() == {"c1": "3"}


def test_an_empty_reply_is_asked_again_once_with_some_randomness():
    model = ScriptedChatModel(script=[AIMessage(""), "the answer"])
    keeper = Keeper(SMALL)
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("hello")]}, THREAD)
    assert text_of(out["messages"][-1]) == "the answer"
    assert model.received[1].kwargs.get("temperature", 0) > 0
    assert keeper.counters("t1").empty_retries == 1

    twice = ScriptedChatModel(script=[AIMessage(""), AIMessage(""), "late"])
    agent = create_keeper_agent(twice, config=SMALL, checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("hello")]}, THREAD)
    assert text_of(out["messages"][-1]) == "", "only one retry: the second empty reply stands"


def test_a_forced_tool_choice_applies_to_work_calls_only():
    @tool
    def lookup(name: str) -> str:
        """Look a name up."""
        return f"{name} is a counter."

    def after_user_input(messages: list[BaseMessage]):
        return (
            "lookup"
            if isinstance(messages[-1], HumanMessage) and keeper_kind(messages[-1]) is None
            else None
        )

    def reply(messages: list[BaseMessage]):
        if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
            return StoryModel()(messages)
        if isinstance(messages[-1], HumanMessage):
            return AIMessage(
                "",
                tool_calls=[
                    {
                        "name": "lookup",
                        "args": {"name": "x"},
                        "id": f"c{len(messages)}",
                        "type": "tool_call",
                    }
                ],
            )
        return "done"

    model = ScriptedChatModel(default=reply)
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=3))
    agent = create_keeper_agent(
        model, [lookup], keeper=keeper, checkpointer=InMemorySaver(), tool_choice=after_user_input
    )
    run_story(agent, 6)
    assert keeper.counters("t1").cuts >= 1
    notes_calls = [r for r in model.received if keeper_kind(r.messages[-1]) == "notes_request"]
    forced = [r for r in model.received if r.kwargs.get("tool_choice") == "lookup"]
    assert notes_calls and all("tool_choice" not in r.kwargs for r in notes_calls)
    assert forced and all(isinstance(r.messages[-1], HumanMessage) for r in forced)


def test_passages_shown_next_to_a_question_take_at_most_a_quarter_of_the_budget():
    config = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=2, show_retrieved=50)
    keeper = Keeper(config)
    from keeper_middleware.archive.records import ArchivedTurn

    seen = [
        ArchivedTurn(
            session="t1",
            msg_id=f"seen-{i}",
            item=i,
            role="human",
            content=f"c{i % 5} was seen near the old mill at dawn again.",
        )
        for i in range(400)
    ]
    keeper.archive.commit_cut("t1", cut_key="seen", turns=seen, notes=None)
    keeper._sync_index("t1")
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=InMemorySaver()
    )
    out = agent.invoke(  # the graph's branch is the one the seeded cut made
        {
            "messages": [HumanMessage("Questions: where was c1? where was c2?")],
            "keeper": {"head": "seen"},
        },
        THREAD,
    )
    view = model_view(out["messages"], out["keeper"])  # what the model is sent
    block = next(m for m in view if keeper_kind(m) == "retrieved")
    assert text_of(block).count("\n") >= 1
    assert ApproximateTokenCounter().count_text(text_of(block)) <= config.budget // 4
