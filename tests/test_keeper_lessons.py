"""One regression test per lesson from failed runs (keeper-lab-report, "Lessons from failed runs").

Each test is named after its lesson; the lesson's number is the report's.
"""

from __future__ import annotations

import re

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, ModelSetup, ThinkingPolicy, create_keeper_agent
from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import parse_notes
from keeper_middleware.search.guards import STOP_LINE
from keeper_middleware.state_view import model_view
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch, note_lines

SMALL = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=5)
THREAD = {"configurable": {"thread_id": "t1"}}
RULE = "any figure below zero is reported as the single word overdrawn"


def start(agent, rule: str = RULE) -> None:
    agent.invoke({"messages": [HumanMessage(f"Task: read the items. Rule: {rule}.")]}, THREAD)


def feed(agent, first: int, last: int) -> dict:
    out: dict = {}
    for i in range(first, last + 1):
        out = agent.invoke(
            {"messages": [HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."))]}, THREAD
        )
    return out


def archive_with(keeper: Keeper, session: str, sentences: list[tuple[int, str]]) -> None:
    """Put ``sentences`` in the session's archive (one archived turn each, at its item) and index
    them, as cuts would have."""
    turns = [
        ArchivedTurn(
            session=session, msg_id=f"{session}-seed-{pos}", item=item, role="human", content=text
        )
        for pos, (item, text) in enumerate(sentences)
    ]
    keeper.archive.commit_cut(
        session, cut_key=f"seed-{len(turns)}-{turns[0].msg_id}", turns=turns, notes=None
    )
    keeper._sync_index(session)


def test_lesson_1_the_notes_request_comes_after_the_turns_it_notes():
    story = StoryModel()
    agent = create_keeper_agent(
        ScriptedChatModel(default=story), config=SMALL, checkpointer=InMemorySaver()
    )
    start(agent)
    feed(agent, 1, 6)
    request = story.note_requests[0]
    assert keeper_kind(request[-1]) == "notes_request"
    assert text_of(request[-1]).startswith(
        "[NOTES REQUEST] Write down what the turns since the NOTES changed."
    )
    assert any("set c5 to 15" in text_of(m) for m in request[:-1])


def test_lesson_2_a_rule_is_pinned_and_repeated_next_to_every_question():
    model = ScriptedChatModel(default=StoryModel())
    keeper = Keeper(SMALL)
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    start(agent)
    for round_ in range(1, 6):
        feed(agent, (round_ - 1) * 10 + 1, round_ * 10)
        agent.invoke({"messages": [HumanMessage(f"Questions: what is c{round_}?")]}, THREAD)
    assert keeper.notes("t1").rules == (f"{RULE}.",)
    asked = [
        r.messages
        for r in model.received
        if any("Questions: what is" in text_of(m) for m in r.messages[-2:])
    ]
    assert len(asked) == 5
    for messages in asked:
        assert keeper_kind(messages[-1]) == "rules"
        assert f"- {RULE}." in text_of(messages[-1])


def test_lesson_2_a_question_that_sets_off_the_first_cut_has_the_rules_it_wrote_beside_it():
    model = ScriptedChatModel(default=StoryModel())
    keeper = Keeper(SMALL)
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    start(agent)
    for i in range(1, 4):  # inputs without item numbers: the question is an item of its own
        agent.invoke({"messages": [HumanMessage(f"Today we set c{i} to {i * 3}.")]}, THREAD)
    assert keeper.counters("t1").cuts == 0
    agent.invoke({"messages": [HumanMessage("Questions: what is c1?")]}, THREAD)
    assert keeper.counters("t1").cuts == 1  # the question's own step made the first NOTES
    asked = [
        r.messages
        for r in model.received
        if any("Questions: what is c1?" in text_of(m) for m in r.messages[-2:])
    ]
    assert asked
    for messages in asked:
        assert keeper_kind(messages[-1]) == "rules"
        assert f"- {RULE}." in text_of(messages[-1])


def test_lesson_3_thinking_stays_on_while_a_question_is_open():
    on, off = {"reasoning_effort": "high"}, {"reasoning_effort": "none"}
    keeper = Keeper(KeeperConfig(thinking=ThinkingPolicy(on=on, off=off)))
    reading = [HumanMessage("task", id="t"), HumanMessage("Item 1. story", id="b1")]
    asking = [*reading, AIMessage("ok", id="a1"), HumanMessage("Questions: what is c1?", id="q")]
    searching = [
        *asking,
        AIMessage(
            "",
            id="a2",
            tool_calls=[
                {"name": "search_archive", "args": {"query": "c1"}, "id": "s", "type": "tool_call"}
            ],
        ),
        ToolMessage("No matches", tool_call_id="s", id="r"),
    ]
    answered = [*searching, AIMessage("1. 3", id="a3"), HumanMessage("Item 2. story", id="b2")]
    assert keeper.work_kwargs("s", reading) == off
    assert keeper.work_kwargs("s", asking) == on
    assert keeper.work_kwargs("s", searching) == on
    assert keeper.work_kwargs("s", answered) == off


def test_lesson_4_after_three_refusals_the_model_is_told_to_stop_and_its_reply_is_sampled():
    keeper = Keeper(KeeperConfig())
    archive_with(keeper, "s", [(1, "The clerk recorded domo86 at six.")])
    replies = [keeper.search("s", "domo86") for _ in range(4)]
    assert replies[0].startswith("Found 1 match")
    assert replies[1].startswith("Refused:") and replies[2].startswith("Refused:")
    assert replies[3].endswith(STOP_LINE)
    kwargs = keeper.work_kwargs("s", [HumanMessage("Questions: what is domo86?", id="q")])
    assert kwargs["temperature"] > 0
    assert "temperature" not in keeper.work_kwargs(
        "s", [HumanMessage("Questions: what is domo86?", id="q")]
    )
    assert keeper.counters("s").search_stops == 1


def test_lesson_5_each_match_is_shown_with_the_sentence_that_follows_it():
    keeper = Keeper(KeeperConfig())
    archive_with(
        keeper, "s", [(4, "Next on the list was nipewe33."), (4, "Mira Holt took ten from it.")]
    )
    result = keeper.search("s", "nipewe33")
    assert "item 4: Next on the list was nipewe33. → next: Mira Holt took ten from it." in result


def test_lesson_6_a_loop_of_three_searches_is_refused_the_third_time_round():
    keeper = Keeper(KeeperConfig())
    archive_with(keeper, "s", [(1, "alpha one."), (2, "beta two."), (3, "gamma three.")])
    loop = ["alpha", "beta", "gamma"] * 3
    replies = [keeper.search("s", q) for q in loop]
    assert all(r.startswith("Found") for r in replies[:6])
    assert replies[6].startswith("Refused:") and "twice since the last new input" in replies[6]
    keeper._set_guard(
        "s",
        __import__("keeper_middleware.search.guards", fromlist=["after_new_input"]).after_new_input(
            keeper._guard("s")
        ),
    )
    assert keeper.search("s", "alpha").startswith("Found"), "new input lets the search run again"


def test_lesson_7_a_rule_named_in_any_reply_to_one_request_is_kept():
    replies = iter(
        [
            f"RULE: {RULE}.\nSET c1 = 3\nSET c2 = 99 (= 650 - 27)",  # first names the rule, invents working
            "SET c1 = 3\nSET c2 = 6",  # the re-ask leaves the rule out
        ]
    )

    def reply(messages):
        if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
            return next(replies)
        return "ok"

    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=2))
    agent = create_keeper_agent(
        ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    start(agent)
    feed(agent, 1, 2)
    notes = keeper.notes("t1")
    assert notes.rules == (f"{RULE}.",)
    assert notes.state_dict() == {"c1": "3", "c2": "6"}
    assert keeper.counters("t1").reasks == 1


def test_lesson_8_search_results_of_a_turn_that_ended_empty_are_still_in_view():
    calls = {"n": 0}

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
                        "args": {"query": "c1"},
                        "id": "s1",
                        "type": "tool_call",
                    }
                ],
            )
        if isinstance(last, ToolMessage):
            calls["n"] += 1
            return ""  # the turn ends empty
        return "ok"

    # the questions must come just before a cut: find how many items put them there (the NOTES
    # count toward the every-5-items cadence, so the cut's item depends on their size)
    for last in range(5, 16):
        calls["n"] = 0
        model = ScriptedChatModel(default=reply)
        keeper = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=5))
        agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
        start(agent)
        feed(agent, 1, last)
        agent.invoke({"messages": [HumanMessage("Questions: what was c1?")]}, THREAD)
        cuts = keeper.counters("t1").cuts
        feed(agent, last + 1, last + 1)  # the next input brings a cut (the window has room)
        if keeper.counters("t1").cuts == cuts + 1:
            break
    assert keeper.counters("t1").cuts == cuts + 1
    nxt = model.received[-1].messages
    assert any(keeper_kind(m) == "notes" for m in nxt)
    assert any(
        isinstance(m, ToolMessage)
        and "item 1: Item 1. »Today we set c1 to 3.«" in text_of(m)  # the message, its match marked
        for m in nxt
    )
    assert any("Questions: what was c1?" in text_of(m) for m in nxt)


def test_lesson_9_search_counts_only_in_the_contents_own_numbers():
    keeper = Keeper(KeeperConfig())
    archive_with(
        keeper,
        "s",
        [
            (150, "dope10 was set to six."),
            (151, "The rain went on."),
            (332, "dope10 was set to nine."),
        ],
    )
    result = keeper.search("s", "dope10", to_item=331)
    assert result.splitlines()[1] == "item 150: dope10 was set to six. → next: The rain went on."
    assert "332" not in result.split("\n", 1)[1]
    assert "message" not in result


def test_lesson_10_a_list_cut_short_says_so_in_its_first_line():
    keeper = Keeper(KeeperConfig(search_results=3))
    archive_with(keeper, "s", [(i, f"domo86 changed in round {i}.") for i in range(1, 8)])
    first, *rest = keeper.search("s", "domo86").splitlines()
    assert first.startswith("Showing 3 of 7 matches") and "cut short" in first
    assert len(rest) == 3


def test_lesson_11_the_kept_exchange_is_labelled_and_not_noted_twice():
    story = StoryModel()
    keeper = Keeper(
        KeeperConfig(window=4096, reply_reserve=256, notes_every_items=3, tracked_names=r"\bc\d+\b")
    )
    agent = create_keeper_agent(
        ScriptedChatModel(default=story), keeper=keeper, checkpointer=InMemorySaver()
    )
    start(agent)
    out = feed(agent, 1, 3)
    view = model_view(out["messages"], out["keeper"])  # what the model is sent
    notes_message = next(m for m in view if keeper_kind(m) == "notes")
    assert parse_notes(text_of(notes_message))[1] == 1
    assert (
        "The next message was kept in view from before these notes; it is already noted."
        in text_of(notes_message)
    )
    feed(agent, 4, 6)
    second = story.note_requests[1]
    lines = note_lines(second[:-1])  # the items after the kept one, up to the cut
    assert lines and lines == [f"SET c{i} = {i * 3}" for i in range(4, 4 + len(lines))]
    assert "already noted" in text_of(second[-1]) or "already noted" in text_of(notes_message)


def test_lesson_11_a_line_about_a_name_the_noted_turns_never_mention_is_left_out():
    def reply(messages):
        if keeper_kind(messages[-1]) == "notes_request":
            return "SET c1 = 3\nSET c77 = 40"
        return "ok"

    keeper = Keeper(
        KeeperConfig(window=4096, reply_reserve=256, notes_every_items=1, tracked_names=r"\bc\d+\b")
    )
    agent = create_keeper_agent(
        ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    start(agent)
    feed(agent, 1, 1)
    assert keeper.notes("t1").state_dict() == {"c1": "3"}
    assert keeper.counters("t1").dropped_note_lines == 1


def test_lesson_12_a_questioned_note_never_falls_back_to_another_path():
    sent: list[str] = []

    def reply(messages):
        kind = keeper_kind(messages[-1])
        if kind in ("notes_request", "notes_reask"):
            sent.append(text_of(messages[-1]).splitlines()[0])
            if kind == "notes_request":
                return "SET c1 = 3\nSET c2 = 99 (= 650 - 27)"
            return "I am not sure what you want."
        return "ok"

    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=2))
    agent = create_keeper_agent(
        ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    start(agent)
    feed(agent, 1, 2)
    assert keeper.notes("t1").state_dict() == {"c1": "3"}, (
        "first reply stands without the questioned line"
    )
    assert not any("Rewrite" in s for s in sent), "no full rewrite was asked for"
    assert keeper.counters("t1").reasks == 2


def test_lesson_13_invented_working_is_caught_and_asked_again():
    story = StoryModel(invent_working_first=True)
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=2))
    agent = create_keeper_agent(
        ScriptedChatModel(default=story), keeper=keeper, checkpointer=InMemorySaver()
    )
    start(agent)
    feed(agent, 1, 2)
    assert keeper.notes("t1").state_dict() == {"c1": "3", "c2": "6"}
    assert keeper.counters("t1").reasks == 1


def test_lesson_14_a_value_the_text_does_not_contradict_is_kept():
    def reply(messages):
        kind = keeper_kind(messages[-1])
        if kind in ("notes_request", "notes_reask"):
            # 9 is not in the text, but nothing contradicts it (the key names counters it has)
            return "SET c1 = 3\nSET total of c1 and c2 = 9"
        return "ok"

    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=2))
    agent = create_keeper_agent(
        ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    start(agent)
    feed(agent, 1, 2)
    assert keeper.notes("t1").state_dict() == {"c1": "3", "total of c1 and c2": "9"}


def test_notes_calls_keep_thinking_on():
    on = {"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}}
    model = ScriptedChatModel(default=StoryModel())
    config = KeeperConfig(
        window=4096, reply_reserve=256, notes_every_items=2, thinking=ThinkingPolicy(on=on)
    )
    agent = create_keeper_agent(model, config=config, checkpointer=InMemorySaver())
    start(agent)
    feed(agent, 1, 2)
    notes_calls = [r for r in model.received if keeper_kind(r.messages[-1]) == "notes_request"]
    assert notes_calls and all(r.kwargs == on for r in notes_calls)


def test_bad_note_replies_are_handled_and_counted():
    story = StoryModel(empty_notes_replies=1, garbage_first=False)
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=2))
    agent = create_keeper_agent(
        ScriptedChatModel(default=story), keeper=keeper, checkpointer=InMemorySaver()
    )
    start(agent)
    feed(agent, 1, 2)
    assert keeper.notes("t1").state_dict() == {"c1": "3", "c2": "6"}
    counters = keeper.counters("t1")
    assert counters.reasks == 1 and counters.notes_calls == 2

    garbage = StoryModel(garbage_first=True)
    keeper2 = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=2))
    agent2 = create_keeper_agent(
        ScriptedChatModel(default=garbage), keeper=keeper2, checkpointer=InMemorySaver()
    )
    start(agent2)
    feed(agent2, 1, 2)
    assert keeper2.notes("t1").state_dict() == {"c1": "3", "c2": "6"}
    assert keeper2.counters("t1").garbage_note_lines == 2


def test_a_reply_that_drops_the_rules_cannot_lose_them():
    story = StoryModel(drop_rules_first=True)
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=256, notes_every_items=2))
    agent = create_keeper_agent(
        ScriptedChatModel(default=story), keeper=keeper, checkpointer=InMemorySaver()
    )
    start(agent)
    feed(agent, 1, 4)
    assert keeper.notes("t1").rules == (f"{RULE}.",)


def test_a_rule_stated_once_survives_fifty_cuts_word_for_word():
    model = ScriptedChatModel(default=StoryModel())
    keeper = Keeper(KeeperConfig(window=2048, reply_reserve=256, notes_every_items=2))
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    start(agent)
    i = 0
    while keeper.counters("t1").cuts < 50:
        i += 1
        feed(agent, i, i)
        if i % 7 == 0:
            agent.invoke({"messages": [HumanMessage(f"Questions: what is c{i}?")]}, THREAD)
    versions = list(keeper.archive.notes_versions("t1"))
    assert len(versions) >= 50
    assert all(f"- {RULE}." in v.text for v in versions)
    asked = [
        r.messages
        for r in model.received
        if re.match(r"Questions: what is", text_of(r.messages[-2]) if len(r.messages) > 1 else "")
    ]
    assert asked and all(f"- {RULE}." in text_of(m[-1]) for m in asked)


def test_setup_renders_the_system_prompt_once():
    setup = ModelSetup(system_prompt="SYS")
    assert [m.type for m in setup.render([HumanMessage("a")])] == ["system", "human"]
