"""Asked for notes, the simulated reader writes correct change lines that show their working and
parse: it works from the NOTES' value and skips messages already noted, says NO CHANGES when
nothing changed or a base is unknown, and answers a rewrite request with a complete NOTES
block."""

from __future__ import annotations

import ast
import operator
import re

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from keeper_bench.reader import SimulatedReader
from keeper_middleware.notes.block import Notes, parse_notes
from keeper_middleware.notes.changes import NoChanges, RuleLine, SetLine, parse_changes
from keeper_middleware.notes.numbers import amounts_in
from tests.reader_stories import (
    CONFIDENTIAL,
    ITEM_2,
    TALLY,
    item_1,
    notes_message,
    notes_request,
    story,
)


def _evaluate(working: str) -> int:
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp):
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        assert isinstance(node, ast.Constant)
        return int(node.value)

    return walk(ast.parse(working, mode="eval").body)


def test_note_changes_for_two_batches_are_correct_show_their_working_and_parse():
    history = [*story(item_1(TALLY), ITEM_2), notes_request()]
    reply = SimulatedReader().invoke(history)
    parsed = parse_changes(str(reply.content))
    assert parsed.garbage == ()
    assert parsed.changes == (
        RuleLine(TALLY),
        SetLine("domo86", "328", "342 - 10 + (5 - 9)"),
        SetLine("kibu12", "-4", "5 - 9"),
        SetLine("kelo12", "40"),
    )
    text = item_1(TALLY) + ITEM_2
    for change in parsed.changes:
        if isinstance(change, SetLine) and change.working:
            assert _evaluate(change.working) == int(change.value)
            used = {abs(int(n)) for n in re.findall(r"\d+", change.working)}
            assert used <= amounts_in(text)


def test_note_changes_work_from_the_notes_value_and_skip_messages_already_noted():
    notes = Notes(state=(("domo86", "342"), ("kibu12", "5")), first_item=1, last_item=1)
    history = [
        SystemMessage("s"),
        HumanMessage("task"),
        notes_message(notes, kept=2),
        HumanMessage("Item 1.\nMira Holt took 3 from domo86."),
        AIMessage("Read item 1."),
        HumanMessage(ITEM_2),
        AIMessage("Read item 2."),
        notes_request(),
    ]
    parsed = parse_changes(str(SimulatedReader().invoke(history).content))
    assert parsed.changes == (
        SetLine("domo86", "328", "342 - 10 + (5 - 9)"),
        SetLine("kibu12", "-4", "5 - 9"),
    )


def test_nothing_changed_gives_no_changes_and_an_unknown_base_is_skipped():
    quiet = [*story("Item 3.\nThe day passed quietly."), notes_request()]
    assert parse_changes(str(SimulatedReader().invoke(quiet).content)).changes == (NoChanges(),)
    unknown_base = [*story("Item 3.\nMira Holt took 3 from domo86."), notes_request()]
    assert parse_changes(str(SimulatedReader().invoke(unknown_base).content)).changes == (
        NoChanges(),
    )


def test_the_rewrite_request_gets_a_complete_notes_block():
    rewrite = HumanMessage(
        "[NOTES REQUEST] Rewrite the NOTES to cover everything so far.\nReply with the complete NOTES."
    )
    reply = SimulatedReader().invoke([*story(item_1(CONFIDENTIAL), ITEM_2), rewrite])
    notes, kept = parse_notes(str(reply.content))
    assert kept == 0
    assert notes.rules == (CONFIDENTIAL,)
    assert notes.state == (("domo86", "328"), ("kibu12", "-4"), ("kelo12", "40"))
    assert (notes.first_item, notes.last_item) == (1, 2)
