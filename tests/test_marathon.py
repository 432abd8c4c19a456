"""The repair marathon: planting, tickets, the shell, grading, and the three ways end to end."""

from __future__ import annotations

import ast
import os
import re
import shutil
import textwrap

import pytest

from keeper_bench.marathon.defects import Defect, candidate_defects, describe, plant
from keeper_bench.marathon.grading import (
    changed_lines,
    grade_marathon,
)
from keeper_bench.marathon.planting import PlantedDefect
from keeper_bench.marathon.sandbox import ShellSandbox
from keeper_bench.marathon.scripted import fix_command, repaired_line
from keeper_bench.marathon.source import SourceMissingError, cached_sdist
from keeper_bench.marathon.tickets import (
    NOTICES,
    build_tickets,
    fixes_before_log,
    parse_audit_answer,
)

LIBRARY = textwrap.dedent(
    '''
    __all__ = ["clamp", "both", "Window"]


    def clamp(value, low, high):
        """Keep value between low and high."""
        if value < low:
            return low
        if not value <= high:
            return high
        return value + 0


    def both(a, b):
        return a and b


    class Window:
        def size(self, first, last):
            return last - first + 1


    def _private(x):
        return x < 3
    '''
)


def test_candidates_cover_every_kind_and_only_public_code():
    found = candidate_defects("lib.py", LIBRARY)
    kinds = {d.kind for d in found}
    assert kinds == {"comparison", "plus_minus", "and_or", "dropped_not"}
    assert {d.function for d in found} == {"clamp", "both", "Window"}  # never _private
    assert all("Keep value" not in LIBRARY.splitlines()[d.line - 1] for d in found)  # docstrings


@pytest.mark.parametrize("index", range(8))
def test_a_planted_defect_changes_one_token_and_the_repair_undoes_it(index):
    found = candidate_defects("lib.py", LIBRARY)
    defect = found[index % len(found)]
    planted = plant(LIBRARY, defect)
    ast.parse(planted)
    before, after = LIBRARY.splitlines(), planted.splitlines()
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [
        defect.line - 1
    ]
    repaired = repaired_line(
        after[defect.line - 1], defect.col, defect.old, defect.new, defect.kind
    )
    assert repaired == before[defect.line - 1]


def test_planting_refuses_a_token_that_is_not_there():
    defect = Defect("lib.py", 2, 0, "<", ">", "comparison", "clamp")
    with pytest.raises(ValueError, match="not at that place"):
        plant(LIBRARY, defect)


def _planted(function: str, path: str = "more_itertools/more.py", line: int = 10) -> PlantedDefect:
    test = f"tests/test_more.py::{function.title()}Tests::test_basic"
    return PlantedDefect(
        Defect(path, line, 4, "<", ">", "comparison", function), (test,), "AssertionError: 1 != 2"
    )


def _plan(count: int) -> list[PlantedDefect]:
    return [
        _planted(
            f"func{i}", "more_itertools/recipes.py" if i % 4 == 0 else "more_itertools/more.py"
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("count", [3, 13, 40])
def test_tickets_are_defects_then_notices_in_place_then_the_audit(count):
    tickets = build_tickets(_plan(count))
    assert len(tickets) == count + len(NOTICES) + 1
    assert [t.number for t in tickets] == list(range(1, len(tickets) + 1))
    assert all(t.text.startswith(f"Ticket {t.number}. ") for t in tickets)
    assert tickets[-1].kind == "audit"
    for notice in NOTICES:
        at = next(i for i, t in enumerate(tickets) if t.notice == notice)
        assert sum(t.kind == "defect" for t in tickets[:at]) == min(notice.after_defects, count)
    for ticket in tickets:
        if ticket.kind == "defect":  # the symptom, never the place
            assert "more_itertools/" not in ticket.text  # no library file named
            assert not re.search(r"\.py:\d|\bline \d", ticket.text)  # no line either


def test_the_audit_asks_for_what_was_fixed_before_the_log_existed():
    tickets = build_tickets(_plan(20))
    assert fixes_before_log(tickets) == [f"func{i}" for i in range(12)]
    assert parse_audit_answer("12: func0, func1 and func2.") == (
        12,
        frozenset({"func0", "func1", "and", "func2"}),
    )
    assert parse_audit_answer("I do not know") == (None, frozenset())


def test_changed_lines_are_the_new_and_replaced_ones():
    assert changed_lines("a\nb\nc\n", "a\nB # fixed\nc\nd\n") == ["B # fixed", "d"]


def _files(library: str, fixes: str | None = None, recipes: str | None = None) -> dict[str, str]:
    files = {"more_itertools/more.py": library, "more_itertools/recipes.py": "r\n"}
    if fixes is not None:
        files["FIXES.md"] = fixes
    if recipes is not None:
        files["RECIPES.txt"] = recipes
    return files


def test_grading_counts_fixed_clean_and_the_instruction_each_ticket_broke():
    plan = _plan(14)
    tickets = build_tickets(plan)
    snapshots, replies = [], []
    for ticket in tickets:
        if ticket.kind != "defect":
            snapshots.append((_files("x\n"), _files("x\n")))
            replies.append("")
            continue
        name = ticket.defect.defect.function
        in_force = {t.notice.key for t in tickets[: ticket.number - 1] if t.notice}
        comment = "  # fixed" if "fixed_comment" in in_force else ""
        changed = f"x = {name}{comment}\n"
        if name == "func5":
            changed = "x = func5\n"  # forgets the comment
        fixes = f"{name}: wrong\n" if "fixes_log" in in_force and name != "func13" else ""
        snapshots.append((_files("x\n", ""), _files(changed, fixes)))
        replies.append(
            "12: " + ", ".join(f"func{i}" for i in range(12)) if ticket.kind == "audit" else "ok"
        )
    replies[-1] = "12: " + ", ".join(f"func{i}" for i in range(12))
    final_failed = frozenset({plan[2].failing[0], "tests/test_more.py::OtherTests::test_x"})
    start_failed = frozenset(test for item in plan for test in item.failing)
    grade = grade_marathon(tickets, snapshots, final_failed, start_failed, replies)
    by_name = {t.function: t for t in grade.tickets}
    assert grade.fixed == 13 and not by_name["func2"].fixed
    assert by_name["func5"].broken == ("fixed_comment",)
    assert by_name["func13"].broken == ("fixes_log",)
    assert by_name["func1"].clean  # before any notice, nothing to keep
    assert grade.regressions == ("tests/test_more.py::OtherTests::test_x",)
    assert grade.audit_right is True


def test_notices_kept_means_in_every_notes_version_after_the_notice():
    tickets = build_tickets(_plan(5))
    snapshots = [(_files("x\n"), _files("x\n")) for _ in tickets]
    first = NOTICES[0]
    at = next(t.number for t in tickets if t.notice == first)
    versions = [
        (at - 1, []),
        (at, [first.instruction]),
        (at + 2, [first.instruction]),
        (at + 3, []),
    ]
    grade = grade_marathon(
        tickets, snapshots, frozenset(), frozenset(), [""] * len(tickets), versions
    )
    assert grade.notices_kept[first.key] is False  # lost in the last version
    kept = grade_marathon(
        tickets, snapshots, frozenset(), frozenset(), [""] * len(tickets), versions[:3]
    )
    assert kept.notices_kept[first.key] is True


def test_the_shell_runs_in_its_folder_reports_failures_and_stops_slow_commands(tmp_path):
    shell = ShellSandbox(tmp_path, timeout=2)
    assert shell.run("pwd").strip() == str(tmp_path)
    assert "[exit status 3]" in shell.run("exit 3")
    assert "did not finish within 2 s" in shell.run("sleep 10")
    assert shell.run("true") == "[no output]"
    assert shell.commands == ["pwd", "exit 3", "sleep 10", "true"]


def test_the_shell_output_is_whole_up_to_its_cap(tmp_path):
    shell = ShellSandbox(tmp_path, max_output_chars=300_000)
    assert len(shell.run("python3 -c 'print(\"x\" * 250_000)'")) == 250_001
    cut = shell.run("python3 -c 'print(\"x\" * 400_000)'")
    assert cut.endswith("[output cut at 300000 characters]")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
def test_the_shell_has_no_network(tmp_path):
    shell = ShellSandbox(tmp_path)
    assert shell.isolate_network
    probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9), timeout=2)'"
    assert "unreachable" in shell.run(probe).lower()


def test_a_fix_command_replaces_exactly_one_line(tmp_path):
    (tmp_path / "m.py").write_text("a = 1\nb = 2 < 3\nc = 3\n")
    ShellSandbox(tmp_path).run(fix_command("m.py", 2, "b = 2 > 3  # fixed"))
    assert (tmp_path / "m.py").read_text() == "a = 1\nb = 2 > 3  # fixed\nc = 3\n"


def test_describe_says_what_was_wrong():
    assert describe(Defect("p", 1, 0, "not", "", "dropped_not", "f")) == "a `not` was missing"
    assert describe(Defect("p", 1, 0, "<", ">", "comparison", "f")) == "`>` where `<` belongs"


# -- end to end, on the real code base ------------------------------------------------------------
def _source_or_skip() -> None:
    try:
        cached_sdist()
    except SourceMissingError:
        if os.environ.get("CI"):
            raise
        pytest.skip("the marathon source is not fetched (keeper-bench marathon-fetch)")


@pytest.mark.slow
def test_the_shipped_plans_hold_on_the_real_suite(tmp_path):
    """Each shipped defect, planted alone, still fails exactly the tests its plan names."""
    _source_or_skip()
    from keeper_bench.marathon.planting import SHIPPED_PLANS, _stored_plan, plant_all
    from keeper_bench.marathon.source import unpack_source
    from keeper_bench.marathon.testrun import run_tests

    plan = _stored_plan(SHIPPED_PLANS, 0, 3)
    assert plan is not None, "no shipped plan for seed 0"
    root = unpack_source(tmp_path)
    pristine = {
        p: (root / p).read_text() for p in ("more_itertools/more.py", "more_itertools/recipes.py")
    }
    for item in plan[:2]:
        plant_all(root, [item])
        outcome = run_tests(root, [t.rsplit("::", 1)[0] for t in item.failing])
        assert outcome.failed == frozenset(item.failing)
        for path, text in pristine.items():
            (root / path).write_text(text)


@pytest.mark.slow
@pytest.mark.timeout(900)  # three whole repair runs: about 3 CPU-minutes on 2 cores
def test_every_way_works_every_ticket_at_real_message_sizes(tmp_path):
    """Plumbing: the scripted agent fixes everything, keeps every instruction, answers the audit,
    through each way; the keeper ways stay inside their window while reading 150K-char logs."""
    _source_or_skip()
    from keeper_bench.marathon.run import MarathonOptions, prepare_project, run_marathon

    prepared = prepare_project(tmp_path / "planted", seed=0, defects=5)
    for way in ("direct", "middleware", "proxy"):
        result = run_marathon(
            MarathonOptions(way=way, out=tmp_path / way, defects=5, window=16_384), prepared
        )
        grade = result.grade
        assert result.errors == [], (way, result.errors)
        assert (grade.fixed, grade.clean) == (5, 5), (way, grade)
        assert grade.regressions == ()
        assert grade.audit_right is True
        assert result.largest_output_chars > 100_000  # a whole-suite log, as a real agent reads
        if way != "direct":
            assert result.management_calls > 0 and result.notes_versions > 0
            assert all(grade.notices_kept.values()), grade.notices_kept
