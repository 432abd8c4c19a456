"""A question turn's working set (what its searches found) is never the first thing a cut takes.

On the demo stream the keeper cut at the notes threshold in the middle of a question set: with
nothing older left to archive it archived the set's own search results, the search budget was
then spent finding them again, and the answers came out "unknown". These tests pin the fixes:
the question's work may fill the whole budget before a cut; a cut that must pass the question
keeps the newest work that fits (the oldest leaves first) and takes retrieved passages before
any of it; and a set of many questions may run more searches than a set of one.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, ModelSetup, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, keeper_message, text_of
from keeper_middleware.search.guards import (
    GuardState,
    SearchCommand,
    after_new_input,
    decide,
    input_budget,
    turn_budget,
)
from keeper_middleware.step.cut import CutPlan, Layout, pin_open_question, work_start
from tests.fake_model import ScriptedChatModel

CONFIG = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=None)
"""Budget 1,792 tokens, notes threshold 1,433: a question's results pass the threshold first."""
SETUP = ModelSetup()
QUESTION = "Questions: what was c1 at the start?"


def _note_call(messages: list[BaseMessage], kwargs: Any) -> AIMessage:
    return AIMessage(content="NO CHANGES")


def _result_text(n: int) -> str:
    return f"Result {n}: " + " ".join(f"c{n} was moved by the clerk on day {d}." for d in range(14))


def _search_round(n: int) -> list[BaseMessage]:
    call = AIMessage(
        "",
        id=f"call{n}",
        tool_calls=[{"name": "lookup", "args": {"n": n}, "id": f"t{n}", "type": "tool_call"}],
    )
    return [call, ToolMessage(_result_text(n), tool_call_id=f"t{n}", id=f"r{n}", name="lookup")]


def _results_in_view(messages: list[BaseMessage]) -> list[int]:
    return [
        int(str(m.id)[1:]) for m in messages if isinstance(m, ToolMessage) and str(m.id)[0] == "r"
    ]


def _ask_and_search(keeper: Keeper, rounds: int) -> list[tuple[int, bool, list[BaseMessage]]]:
    """Task, a question, then ``rounds`` of tool calls, a keeper step before each model call:
    (the request's size as given, whether the step cut, the window it left)."""
    messages: list[BaseMessage] = [
        HumanMessage("Task: answer questions about the counters.", id="task"),
        HumanMessage(QUESTION, id="q"),
    ]
    state = None
    seen = []
    for n in range(1, rounds + 1):
        messages = [*messages, *_search_round(n)]
        size = keeper.window.count(SETUP, messages)
        result = keeper.step("s", messages, state, SETUP, _note_call)
        seen.append((size, result.cut, list(result.messages)))
        messages, state = list(result.messages), result.state
    return seen


def test_a_question_turns_results_stay_in_view_until_the_request_reaches_the_budget():
    keeper = Keeper(CONFIG)
    steps = _ask_and_search(keeper, 12)
    past_threshold = [s for s in steps if CONFIG.notes_threshold <= s[0] <= CONFIG.budget]
    assert past_threshold, "the rounds must pass the notes threshold within the budget"
    for n, (size, cut, window) in enumerate(steps, start=1):
        if size > CONFIG.budget:
            break
        assert not cut, f"a request of {size} tokens fits the budget: nothing is cut"
        assert _results_in_view(window) == list(range(1, n + 1)), "every result is in view"


def test_a_cut_that_must_pass_the_question_keeps_the_newest_work_that_fits():
    keeper = Keeper(CONFIG)
    steps = _ask_and_search(keeper, 12)
    cuts = [(size, window) for size, cut, window in steps if cut]
    assert cuts, "the rounds must outgrow the budget"
    for _size, window in cuts:
        assert any(text_of(m) == QUESTION for m in window), "the question never leaves"
        kept = _results_in_view(window)
        assert len(kept) > 1, "more than the newest exchange stays in view"
        assert kept == list(range(kept[0], kept[-1] + 1)), "the oldest results leave first"
        size = keeper.window.count(SETUP, window)
        assert size <= CONFIG.budget
        # the old cut kept the newest exchange only, a window a third full; now the work that
        # fits under the notes threshold stays
        assert size > CONFIG.notes_threshold // 2


def _plan_over(messages: list[BaseMessage]) -> CutPlan:
    layout = Layout(head_end=1, notes_index=1, kept=0)
    return CutPlan(layout=layout, boundary=len(messages), keep_from=len(messages) - 2)


def test_retrieved_passages_leave_before_the_questions_own_work():
    messages: list[BaseMessage] = [
        HumanMessage("Task.", id="task"),
        keeper_message("NOTES", "notes"),
        HumanMessage(QUESTION, id="q"),
        keeper_message("[RULES] Rules in force", "rules"),
        keeper_message("[RETRIEVED] item 3: c1 was set to 5.", "retrieved"),
        *_search_round(1),
        *_search_round(2),
    ]
    plan = pin_open_question(messages, _plan_over(messages), 2)
    assert [keeper_kind(messages[i]) for i in plan.pinned] == [None, "rules"]
    assert 4 in plan.leaving, "the retrieved passages leave with the cut"
    assert work_start(messages, plan) == 5, "the question's work starts after the passages"


def test_a_set_of_many_questions_may_run_more_searches_than_a_set_of_one():
    assert turn_budget(10, 2, 1) == 10
    assert turn_budget(10, 2, 11) == 22
    assert turn_budget(None, 2, 11) is None
    assert turn_budget(10, 0, 11) == 10
    eleven = HumanMessage("Questions:\n" + "\n".join(f"{i}. what is c{i}?" for i in range(11)))
    assert input_budget(10, 2, eleven) == 22
    assert input_budget(10, 2, HumanMessage("Item 4. c1 went up by 3.")) == 10
    state = after_new_input(GuardState(), budget=22)
    for n in range(22):
        decision = decide(state, SearchCommand(query=f"c{n}"), budget=10)
        assert decision.verdict == "run", n
        state = decision.state
    assert decide(state, SearchCommand(query="c99"), budget=10).verdict == "stop"
    assert GuardState.from_json(state.to_json()) == state


def _searching_model(searches: int):
    sent: list[str] = []

    def reply(messages: list[BaseMessage]) -> AIMessage | str:
        last = messages[-1]
        if keeper_kind(last) in ("notes_request", "notes_reask"):
            return "NO CHANGES"
        if isinstance(last, ToolMessage):
            sent.append(text_of(last))
        if (
            isinstance(last, ToolMessage) or keeper_kind(last) == "rules" or "?" in text_of(last)
        ) and (len(sent) < searches and "Stop searching now" not in text_of(last)):
            call = {
                "name": "search_archive",
                "args": {"query": f"c{len(sent)}"},
                "id": f"s{len(sent)}",
            }
            return AIMessage("", tool_calls=[{**call, "type": "tool_call"}])
        return "1. 3"

    return reply, sent


def test_an_agent_asked_eleven_questions_is_not_stopped_after_ten_searches():
    for questions, refused_after in ((11, None), (1, 10)):
        reply, sent = _searching_model(16)
        keeper = Keeper(KeeperConfig(window=32_768))
        agent = create_keeper_agent(
            ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
        )
        thread = {"configurable": {"thread_id": f"t{questions}"}}
        agent.invoke({"messages": [HumanMessage("Task: keep the counters.")]}, thread)
        agent.invoke({"messages": [HumanMessage("Item 1. c1 was set to 3.")]}, thread)
        asked = "Questions:\n" + "\n".join(f"{i}. what is c{i}?" for i in range(1, questions + 1))
        agent.invoke({"messages": [HumanMessage(asked)]}, thread)
        refused = [i for i, text in enumerate(sent) if text.startswith("Refused")]
        if refused_after is None:
            assert not refused, f"{questions} questions: 22 searches allowed"
        else:
            assert refused and refused[0] == refused_after


def test_a_hit_shows_the_run_of_sentences_that_go_on_speaking_of_it():
    from keeper_middleware.retrievers.base import Passage
    from keeper_middleware.retrievers.keyword import KeywordRetriever
    from keeper_middleware.retrievers.passages import refers_back

    assert refers_back("Oona Wren took 13 from it.")
    assert not refers_back("The harbour smelled of fish.")
    story = [
        (8, "Attention turned to nubese23."),
        (8, "Thea Holt removed three from it."),
        (8, "Oona Wren took 13 from it."),
        (8, "Celia Brandt removed twenty-three from it."),
        (8, "The harbour smelled of fish."),
        (9, "It rained."),
    ]
    retriever = KeywordRetriever()
    retriever.add(
        [Passage(session="s", item=i, position=p, text=t) for p, (i, t) in enumerate(story)]
    )
    [hit] = retriever.search("nubese23", session="s")
    assert hit.next_text == (
        "Thea Holt removed three from it. Oona Wren took 13 from it. "
        "Celia Brandt removed twenty-three from it."
    ), "every change the run of 'it' sentences makes is shown, and no sentence after it"
    retriever.close()
