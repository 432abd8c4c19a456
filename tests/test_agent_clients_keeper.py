"""Codex CLI and Claude Code, the real clients, through keeper-proxy in front of the scripted
upstream (127.0.0.1 only): a coding session long enough for several cuts, in one resumed
conversation. Each client finishes every prompt with the right answer; every tool result it sent
is archived or in view exactly once; the NOTES hold the task's rule and the files' checksums;
the question about the first file is answered through the proxy's own archive search, offered
in the upstream API's own tool format and never seen by the client; every note call is bounded
by the reply reserve; the session is the client's own conversation (its header); no connection
goes beyond the loopback. Each client runs twice: with the upstream speaking the client's API
(passed through) and with a Chat Completions upstream (translated), as for llama.cpp or vLLM.
"""

from __future__ import annotations

import pytest

from tests.agent_clients import ClaudeSession, CodexSession, locate
from tests.agent_upstream import OutsideTrafficSentinel
from tests.coding_session import CodingSession
from tests.keeper_stack import (
    RULE,
    Stack,
    audit_session,
    check_upstream_shapes,
    keeper_stack,
    searches_answered,
)

pytestmark = pytest.mark.agent_client

# four work prompts of seven commands each, then a question about the first file read: 33
# requests a client, about 30K tokens of tool output (a file is about 1.2K tokens)
SESSION = CodingSession(files=24, file_bytes=4000, per_task=6)
# the clients' own prompt and tools are large (Codex 13K tokens, Claude Code 17.6K, counted as
# the keeper counts): each window leaves room for six to eight files between cuts
CODEX_WINDOW = 32_768
CLAUDE_WINDOW = 40_960


@pytest.fixture
def sentinel():
    with OutsideTrafficSentinel() as refusing:
        yield refusing


def check_session(stack: Stack, name: str, api: str) -> None:
    assert stack.proxy.sessions() == [name]
    counts = audit_session(stack, name)
    assert counts["cuts"] >= 2, counts
    assert counts["results"] == SESSION.command_count()
    assert counts["searches"] >= 1
    notes = stack.proxy.keeper.notes(name)
    assert RULE in notes.rules
    assert ("part01.txt", "46b9f5964d37") in notes.state
    answered = searches_answered(stack, api)
    assert any("part01.txt checksum: 46b9f5964d37" in text for text in answered)
    check_upstream_shapes(stack, api)


@pytest.mark.parametrize("upstream_api", ["responses", "chat"])
def test_codex_exec_works_through_the_keeper(tmp_path, sentinel, upstream_api):
    binary = locate("codex")
    with keeper_stack(SESSION, tmp_path, upstream_api=upstream_api, window=CODEX_WINDOW) as stack:
        codex = CodexSession(binary, stack.url, tmp_path, sentinel.environment())
        SESSION.write(codex.workspace)
        outcomes = [codex.send(prompt) for prompt in SESSION.prompts()]
        for outcome, expected in zip(outcomes, SESSION.expected_answers(), strict=True):
            assert outcome.process.returncode == 0, outcome.explain()
            assert outcome.final == expected, outcome.explain()
            assert "search_archive" not in outcome.process.stdout
        check_session(stack, f"default:codex-{codex.thread_id}", upstream_api)
        calls = stack.upstream.calls(upstream_api)
        if upstream_api == "responses":  # Codex's own items and tools reach the model as sent
            assert all(r.body["store"] is False for r in calls)
            assert any("encrypted_content" in str(r.body["input"]) for r in calls)
            assert all(r.body["tools"][0]["name"] == "exec_command" for r in calls)
    assert sentinel.attempts == []


@pytest.mark.parametrize("upstream_api", ["messages", "chat"])
def test_claude_print_works_through_the_keeper(tmp_path, sentinel, upstream_api):
    binary = locate("claude")
    with keeper_stack(SESSION, tmp_path, upstream_api=upstream_api, window=CLAUDE_WINDOW) as stack:
        claude = ClaudeSession(binary, stack.root, tmp_path, sentinel.environment())
        SESSION.write(claude.workspace)
        outcomes = [claude.send(prompt) for prompt in SESSION.prompts()]
        for outcome, expected in zip(outcomes, SESSION.expected_answers(), strict=True):
            assert outcome.process.returncode == 0, outcome.explain()
            assert outcome.final == expected, outcome.explain()
            assert "search_archive" not in outcome.process.stdout
        check_session(stack, f"default:claude-{claude.session_id}", upstream_api)
        if upstream_api == "messages":  # signed thinking blocks reach the model verbatim
            assert any('"signature": "sig-' in str(r.body) or "'signature': 'sig-" in str(r.body)
                       for r in stack.upstream.calls("messages")[1:])  # fmt: skip
    assert sentinel.attempts == []
