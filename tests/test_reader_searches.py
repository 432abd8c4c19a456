"""With the search tool, the simulated reader searches for what its context lacks and only that:
it answers from the results and searches again for what they still lack, takes "no matches" as
unknown, narrows a list cut short later half first, never resends a refused command, obeys the
stop line, and makes at most four searches a turn in question order."""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from keeper_bench.reader import SimulatedReader
from tests.reader_stories import ITEM_2, SEARCH_TOOL, answers, questions, search_result, story


def test_with_the_search_tool_it_searches_for_what_its_context_lacks():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    reply = reader.invoke([*story(ITEM_2), questions("What value does domo86 hold now?")])
    # domo86 needs its set (before item 2) and kibu12's value at the held change.
    assert [call["args"] for call in reply.tool_calls] == [{"query": "domo86", "to_item": 1}]
    assert reply.response_metadata["finish_reason"] == "tool_calls"


def test_it_answers_from_search_results_and_searches_again_for_what_they_still_lack():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    history = [*story(ITEM_2), questions("What value does domo86 hold now?")]
    first = reader.invoke(history)
    history += [
        first,
        search_result(
            first.tool_calls[0],
            (
                'Found 1 match for "domo86".\nitem 1: The clerk recorded domo86 at three hundred and '
                "forty-two. → next: Mira Holt recorded kibu12 at 5."
            ),
        ),
    ]
    second = reader.invoke(history)
    # The next sentence is shown but is not a match: kibu12 is still searched for properly.
    assert [call["args"] for call in second.tool_calls] == [{"query": "kibu12", "to_item": 1}]
    history += [
        second,
        search_result(
            second.tool_calls[0],
            (
                'Found 2 matches for "kibu12".\nitem 1: Mira Holt recorded kibu12 at 5. → next: The market was quiet.\n'
                "item 2: Next on the list was kibu12. → next: Mira Holt took 9 from it."
            ),
        ),
    ]
    assert answers(reader.invoke(history)) == {1: "328"}


def test_a_search_that_finds_nothing_gives_unknown_and_is_not_sent_again():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    history = [*story(ITEM_2), questions("What value did zaro55 hold at the end of item 1?")]
    first = reader.invoke(history)
    assert first.tool_calls[0]["args"] == {"query": "zaro55", "to_item": 1}
    history += [first, search_result(first.tool_calls[0], 'No matches for "zaro55".')]
    assert answers(reader.invoke(history)) == {1: "unknown"}


def test_a_list_cut_short_is_narrowed_later_half_first():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    batches = [f"Item {n}.\nThe day passed quietly." for n in range(1, 41)]
    history = [
        *story(*batches[30:]),
        questions("What value did domo86 hold at the end of item 20?"),
    ]
    first = reader.invoke(history)
    assert first.tool_calls[0]["args"] == {"query": "domo86", "to_item": 20}
    cut = 'Showing 1 of 12 matches for "domo86" (the list is cut short; these are the nearest to the query; narrow it with from_item/to_item).\nitem 3: Mira Holt took 4 from domo86. → next: The day passed.'
    history += [first, search_result(first.tool_calls[0], cut)]
    second = reader.invoke(history)
    assert second.tool_calls[0]["args"] == {"query": "domo86", "from_item": 11, "to_item": 20}


def test_a_refused_command_is_not_sent_again_and_the_stop_line_is_obeyed():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    history = [*story(ITEM_2), questions("What value did domo86 hold at the end of item 1?")]
    first = reader.invoke(history)
    history += [first, search_result(first.tool_calls[0], "Refused: that search was just made.")]
    assert answers(reader.invoke(history)) == {1: "unknown"}

    stopped = [
        *story(ITEM_2),
        questions("What value did domo86 hold at the end of item 1?"),
        HumanMessage("Stop searching now and answer with what you have."),
    ]
    reply = reader.invoke(stopped)
    assert reply.tool_calls == [] and answers(reply) == {1: "unknown"}


def test_it_searches_at_most_four_times_per_turn_in_question_order():
    reader = SimulatedReader().bind_tools([SEARCH_TOOL])
    names = ["aaa01", "bbb02", "ccc03", "ddd04", "eee05"]
    reply = reader.invoke(
        [*story(ITEM_2), questions(*(f"What value does {n} hold now?" for n in names))]
    )
    assert [call["args"]["query"] for call in reply.tool_calls] == names[:4]
