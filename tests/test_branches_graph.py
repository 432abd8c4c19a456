"""The keeper's memory follows the graph: time travel, replays, update_state, edits by id,
RemoveMessage, an interrupt resumed after another branch ran, and two forks run alternately each
leave the branch being run with exactly the memory a fresh thread fed that branch's history has
(archived text, NOTES, the RULES shown at a question, search), through every entry point with
checkpoints (create_keeper_agent, KeeperMiddleware, keeper_pre_model_hook, a KeeperNode in a
hand-built graph) on InMemorySaver and SqliteSaver, and in the postgres tier on PostgresSaver
with the archive in PostgreSQL."""

from __future__ import annotations

import shutil

import pytest
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from keeper_middleware import Keeper, create_keeper_agent
from keeper_middleware.errors import ArchiveError
from tests.branch_runs import (
    CONFIG,
    ENTRY_POINTS,
    TASK,
    Put,
    Run,
    checkpointer_of,
    control,
    feed,
    keeper_for,
    make_run,
    memory_of,
    rules_at_questions,
    story,
    unnoted,
)
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel

pytestmark = pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:langgraph.warnings.LangGraphDeprecatedSinceV10"
)
# items 1-5, then a sixth that states a rule and a counter only this branch knows; the keeper
# cuts at items 3, 6 and 9 (every three items)
COMMON = [(TASK, "task")] + [
    (story(i, f"Today we set c{i} to {i * 3}."), f"item-{i}") for i in range(1, 6)
]
LEFT = [
    (story(6, "Today we set zeta to 9.") + "\nRule: answer in French.", "left-6"),
    (story(7, "Today we set c7 to 21."), "left-7"),
    (story(8, "Today we set c8 to 24."), "left-8"),
    (story(9, "Today we set c9 to 27."), "left-9"),
]
RIGHT = [
    (story(6, "Today we set omega to 5.") + "\nRule: say it twice.", "right-6"),
    (story(7, "Today we added 4 to c1."), "right-7"),
    (story(8, "Today we set c8 to 80."), "right-8"),
    (story(9, "Today we set c9 to 90."), "right-9"),
]
QUESTION = ("Item 10. Questions: 1. What value does c1 hold now?", "question")


@pytest.fixture(params=["memory", "sqlite"])
def saver_kind(request):
    return request.param


def completed_after(run: Run, item_id: str):
    """The finished checkpoint whose last input is ``item_id`` (on any branch)."""
    for snapshot in run.completed():
        humans = [m for m in snapshot.values["messages"] if isinstance(m, HumanMessage)]
        if humans and humans[-1].id == item_id:
            return snapshot
    raise AssertionError(f"no finished checkpoint after {item_id}")


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_time_travel_before_a_cut_forgets_the_abandoned_branch(entry, saver_kind, tmp_path):
    with checkpointer_of(saver_kind, tmp_path) as saver:
        run = make_run(entry, saver, keeper_for(saver_kind, tmp_path))
        feed(run, COMMON + LEFT + [QUESTION])
        assert "answer in French." in run.keeper.notes("t").rules  # the left branch cut it in
        before = completed_after(run, "item-5")  # the cut at item 6 had not happened yet
        feed(run, [*RIGHT, QUESTION], before.config)
        mine = run.memory()
        assert mine == control(COMMON + RIGHT + [QUESTION])
        assert "answer in French." not in mine.rules
        assert "say it twice." in mine.rules
        assert dict(mine.found)["zeta"] == ()  # said only on the branch the user left
        assert dict(mine.found)["omega"]
        # the question on each branch was shown that branch's RULES, and only those
        shown = rules_at_questions(run.model)
        assert "answer in French." in shown[0] and "say it twice." not in shown[0]
        assert "say it twice." in shown[1] and "answer in French." not in shown[1]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_time_travel_after_a_cut_keeps_what_that_cut_noted(entry, saver_kind, tmp_path):
    with checkpointer_of(saver_kind, tmp_path) as saver:
        run = make_run(entry, saver, keeper_for(saver_kind, tmp_path))
        feed(run, COMMON + LEFT + [QUESTION])
        after = completed_after(run, "left-6")  # right after the cut that noted the rule
        assert run.keeper.head_of("t", after.values) is not None
        later = [(story(7, "Today we set c7 to 70."), "after-7"), QUESTION]
        feed(run, later, after.config)
        mine = run.memory()
        assert mine == control(COMMON + LEFT[:1] + later)
        assert "answer in French." in mine.rules
        assert dict(mine.found)["zeta"]


def test_a_replay_without_new_input_reuses_the_cut_and_changes_no_memory(tmp_path):
    run = make_run("agent", InMemorySaver())
    feed(run, COMMON + LEFT[:1])
    versions = len(list(run.keeper.archive.notes_versions("t")))
    records = run.keeper.archive.turn_count("t")
    remembered = run.memory()
    calls = len(run.model.received)
    # the checkpoint where item 6 had arrived and the keeper had not yet run (the cut is next)
    pending = next(
        s
        for s in run.graph.get_state_history(run.config())
        if s.next == ("keeper",) and s.values["messages"][-1].id == "left-6"
    )
    run.graph.invoke(None, pending.config)
    assert run.memory() == remembered
    assert len(list(run.keeper.archive.notes_versions("t"))) == versions  # no NOTES again
    assert run.keeper.archive.turn_count("t") == records  # nothing archived twice
    notes_calls = [r for r in run.model.received[calls:] if "NOTES REQUEST" in str(r.messages)]
    assert notes_calls == []  # the cut was found, not asked for again


def test_update_state_on_an_old_checkpoint_continues_from_that_checkpoint(tmp_path):
    run = make_run("agent", InMemorySaver())
    feed(run, COMMON + LEFT + [QUESTION])
    old = completed_after(run, "item-4")
    # a message added to the old checkpoint, then the conversation goes on from there
    added = Put(
        (
            HumanMessage(
                story(5, "Today we set c5 to 55.") + "\nRule: answer in French.", id="added-5"
            ),
        )
    )
    feed(run, [added, *RIGHT[:3]], old.config)
    mine = run.memory()
    assert mine == control([*COMMON[:5], added, *RIGHT[:3]])
    assert "answer in French." in mine.rules
    assert "zeta" not in str(mine.turns)


def test_an_edited_message_is_archived_with_its_new_text_and_found(tmp_path):
    run = make_run("agent", InMemorySaver())
    feed(run, COMMON[:5])
    assert "item-4" in unnoted(run)  # no NOTES account for it yet
    edited = (story(4, "Today we set c4 to 400."), "item-4")  # same id, new text
    feed(run, [Put((HumanMessage(edited[0], id=edited[1]),)), *COMMON[5:], *LEFT[:2]])
    mine = run.memory()
    assert mine == control([*COMMON[:4], edited, *COMMON[5:], *LEFT[:2]])
    texts = [text for _, _, text in mine.turns]
    assert edited[0] in texts and COMMON[4][0] not in texts
    assert ("c4", "400") in mine.state
    assert any("400" in text for text, _ in dict(mine.found)["c4"])


def test_a_same_id_resend_with_new_content_is_archived_not_lost(tmp_path):
    run = make_run("agent", InMemorySaver())
    feed(run, COMMON + LEFT)
    assert any(t.msg_id == "item-4" for t in run.keeper.turns("t"))  # archived by a cut
    # the id comes back with new text (an app that reuses ids): a new record, never skipped
    resent = story(10, "Today we set c4 to 999.")
    feed(run, [(resent, "item-4"), (story(11, "Today nothing changed."), "more-11")])
    feed(run, [(story(12, "Today nothing changed."), "more-12")])
    archived = [t for t in run.keeper.turns("t") if t.msg_id == "item-4"]
    assert [t.content for t in archived] == [COMMON[4][0], resent]
    found = run.keeper.retrieve("t", "c4", head=run.head())
    assert any("999" in hit.passage.text for hit in found)


def test_removed_messages_never_reach_the_branch_memory(tmp_path):
    run = make_run("agent", InMemorySaver())
    feed(run, COMMON[:5])
    assert "item-4" in unnoted(run)
    messages = run.state().values["messages"]
    at = next(i for i, m in enumerate(messages) if m.id == "item-4")
    reply = messages[at + 1]
    assert isinstance(reply, AIMessage)
    removal = Put((RemoveMessage(id="item-4"), RemoveMessage(id=reply.id)))
    feed(run, [removal, *COMMON[5:], *LEFT])
    mine = run.memory()
    assert mine == control(COMMON[:4] + COMMON[5:] + LEFT)
    assert "c4" not in str(mine.turns) and "c4" not in dict(mine.state)


def test_removing_kept_messages_does_not_pass_later_ones_off_as_noted(tmp_path):
    run = make_run("agent", InMemorySaver())
    feed(run, COMMON)  # the cut at item 5 keeps item 5 and its reply in view, as noted
    messages = run.state().values["messages"]
    kept = [m.id for m in messages if m.id == "item-5"]
    assert kept and "item-5" not in unnoted(run)
    at = next(i for i, m in enumerate(messages) if m.id == "item-5")
    removal = Put((RemoveMessage(id="item-5"), RemoveMessage(id=messages[at + 1].id)))
    feed(run, [removal, *LEFT])
    # item 6 moved up into the kept places: it is noted all the same, rule and counter
    mine = run.memory()
    assert "answer in French." in mine.rules
    assert ("zeta", "9") in mine.state


def test_two_forks_of_one_checkpoint_run_alternately_each_with_its_own_memory(saver_kind, tmp_path):
    with checkpointer_of(saver_kind, tmp_path) as saver:
        run = make_run("agent", saver, keeper_for(saver_kind, tmp_path))
        feed(run, COMMON)
        fork = completed_after(run, "item-5").config
        left_config = right_config = fork
        for left, right in zip(LEFT, RIGHT, strict=True):
            run.say(left[0], left_config, msg_id=left[1])
            left_config = run.state().config
            run.say(right[0], right_config, msg_id=right[1])
            right_config = run.state().config
            done = LEFT.index(left) + 1
            assert run.memory(left_config) == control(COMMON + LEFT[:done])
            assert run.memory(right_config) == control(COMMON + RIGHT[:done])
        # nothing of one fork is copied for the other: each record is stored once
        every = list(run.keeper.archive.turns("t"))
        assert len({(t.msg_id, t.digest) for t in every}) == len(every)


@tool
def approve(what: str) -> str:
    """Ask a person to approve something."""
    answer = interrupt(f"approve {what}?")
    return f"approved: {answer}"


def approving(messages):
    """Asks for approval when told to, once; otherwise the story model."""
    last = messages[-1]
    if isinstance(last, HumanMessage) and "approval" in str(last.content):
        return AIMessage(
            "", tool_calls=[{"name": "approve", "args": {"what": "it"}, "id": "call-approve"}]
        )
    return STORY(messages)


STORY = StoryModel()


def test_an_interrupt_resumed_after_another_branch_ran_resumes_its_own_memory(saver_kind, tmp_path):
    with checkpointer_of(saver_kind, tmp_path) as saver:
        keeper = keeper_for(saver_kind, tmp_path)
        model = ScriptedChatModel(default=approving)
        agent = create_keeper_agent(model, [approve], keeper=keeper, checkpointer=saver)
        run = Run(keeper=keeper, graph=agent, model=model)
        asking = (story(6, "Needs approval.") + "\nRule: answer in French.", "ask-6")
        feed(run, [*COMMON, asking])
        waiting = run.state()
        assert waiting.next == ("tools",)  # interrupted, waiting for a person
        fork = completed_after(run, "item-5").config
        feed(run, RIGHT[:3], fork)  # another branch runs meanwhile, and cuts
        # the person answers: the interrupted branch resumes with its own memory, and cuts
        run.graph.invoke(Command(resume="yes"), waiting.config)
        feed(run, LEFT[1:3])
        resumed = run.memory()
        reference_keeper = Keeper(CONFIG)
        reference = Run(
            keeper=reference_keeper,
            graph=create_keeper_agent(
                ScriptedChatModel(default=approving),
                [approve],
                keeper=reference_keeper,
                checkpointer=InMemorySaver(),
            ),
            model=model,
            thread="control",
        )
        feed(reference, [*COMMON, asking])
        reference.graph.invoke(Command(resume="yes"), reference.config())
        feed(reference, LEFT[1:3])
        assert resumed == reference.memory()
        assert "answer in French." in resumed.rules
        assert "say it twice." not in resumed.rules


@pytest.mark.postgres
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_postgres_checkpoints_and_archive_follow_the_branch(entry, postgres_url, pg_schema):
    archive = f"{postgres_url}?schema={pg_schema}"
    with checkpointer_of("postgres", None, postgres_url) as saver:
        run = make_run(entry, saver, Keeper(CONFIG, archive=archive))
        run.thread = f"pg-{pg_schema}-{entry}"
        feed(run, COMMON + LEFT + [QUESTION])
        before = completed_after(run, "item-5")
        feed(run, [*RIGHT, QUESTION], before.config)
        mine = memory_of(run.keeper, run.thread, run.head())
        assert mine == control(COMMON + RIGHT + [QUESTION])
        assert "answer in French." not in mine.rules
        run.keeper.close()


@pytest.mark.parametrize("entry", ["agent", "middleware"])
def test_ainvoke_follows_the_branch_as_invoke_does(entry):
    import asyncio

    run = make_run(entry, InMemorySaver())

    async def afeed(steps, config=None):
        for text, msg_id in steps:
            await run.graph.ainvoke(
                {"messages": [HumanMessage(text, id=msg_id)]}, config or run.config()
            )
            config = None

    async def scenario():
        await afeed([*COMMON, *LEFT])
        before = completed_after(run, "item-5")
        await afeed([*RIGHT, QUESTION], before.config)

    asyncio.run(scenario())
    assert run.memory() == control([*COMMON, *RIGHT, QUESTION])


def test_a_graph_without_a_checkpointer_handed_its_history_keeps_one_branch():
    """No checkpointer: the caller hands the history back each time and the keeper's state is
    lost between runs; the NOTES message in view names the branch's latest cut."""
    keeper = Keeper(CONFIG)
    agent = create_keeper_agent(
        ScriptedChatModel(default=StoryModel()), keeper=keeper, checkpointer=None
    )
    messages = []
    for text, msg_id in [*COMMON, *LEFT]:
        messages.append(HumanMessage(text, id=msg_id))
        messages = agent.invoke({"messages": messages}, {"configurable": {"thread_id": "t"}})[
            "messages"
        ]
    assert keeper.counters("t").cuts >= 2
    assert [c.parent is None for c in keeper.archive.cuts("t")].count(True) == 1  # one line
    assert "item 1:" in keeper.search("t", "c1")
    assert keeper.notes("t").rules == ("keep every figure exact.", "answer in French.")


def test_a_thread_whose_archive_was_erased_is_told_so_and_loses_nothing_more():
    run = make_run("agent", InMemorySaver())
    feed(run, [*COMMON, *LEFT[:2]])
    run.keeper.forget("t")  # the archive forgets; the checkpoints still name its cuts
    with pytest.raises(ArchiveError, match="holds no NOTES"):
        feed(run, [(story(8, "Today we set c8 to 8."), "more-8")])


def test_a_thread_whose_archive_lost_its_latest_cuts_goes_on_from_no_cut(caplog, tmp_path):
    """An archive put back from a backup older than the checkpoints: the state names a cut the
    archive no longer holds, and the branch starts afresh from no cut, with a warning."""
    saver, path, backup = InMemorySaver(), tmp_path / "archive.sqlite3", tmp_path / "backup"
    run = make_run("agent", saver, Keeper(CONFIG, archive=path))
    feed(run, COMMON)
    run.keeper.close()
    shutil.copy(path, backup)
    run = make_run("agent", saver, Keeper(CONFIG, archive=path))
    feed(run, LEFT)
    run.keeper.close()
    shutil.copy(backup, path)
    run = make_run("agent", saver, Keeper(CONFIG, archive=path))
    more = [(story(i, f"Today we set c{i} to {i}."), f"more-{i}") for i in range(10, 16)]
    with caplog.at_level("WARNING", logger="keeper_middleware"):
        feed(run, more)
    assert "has no cut" in caplog.text
    assert any(c.parent is None for c in list(run.keeper.archive.cuts("t"))[1:])
    run.keeper.close()
