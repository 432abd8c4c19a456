"""``keeper-proxy demo``: the proxy works offline in one command, in front of a scripted
upstream, and shows it: the agent resends everything, the upstream never gets more than the
window, old turns are archived verbatim, and the NOTES hold what the note calls wrote."""

from __future__ import annotations

from keeper_middleware.integrations.proxy.cli import main
from keeper_middleware.integrations.proxy.demo import run_demo


def test_the_demo_archives_old_turns_and_keeps_notes_while_the_upstream_sees_little(tmp_path):
    lines: list[str] = []
    run = run_demo(24, window=2048, folder=tmp_path, say=lines.append)
    assert len(run.replies) == 24 and run.replies[0].startswith("Noted: Entry 1:")
    assert run.history == 2 + 2 * 24 - 1
    assert run.largest_upstream_request < run.history // 2
    report = run.report
    assert report["counters"]["cuts"] >= 1 and report["archive_turns"] >= 10
    assert "Read each entry I send and acknowledge it." in report["notes"]
    assert "P-0007 = aisle 2" in report["notes"] or "search_archive" in report["notes"]
    assert lines[-1] == "turn 24: the agent sent 49 messages"


def test_keeper_proxy_demo_runs_from_the_command_line(capsys):
    assert main(["demo", "--turns", "12"]) == 0
    shown = capsys.readouterr().out
    assert "Archived verbatim:" in shown and "[NOTES]" in shown
