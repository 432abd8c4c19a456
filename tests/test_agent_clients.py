"""Codex CLI and Claude Code, the real clients (`make clients`), play the scripted coding session
against the scripted upstream over 127.0.0.1: several prompts in one resumed conversation, every
shell command run for real in a temporary workspace, every result sent back, every answer right,
and no connection tried beyond the loopback.

This tier proves the harness; the keeper proxy goes between the clients and the upstream next.
Skipped where node/npm are absent; in CI (node present) a missing client fails the tier.
"""

from __future__ import annotations

import json

import pytest

from tests import agent_clients
from tests.agent_clients import API_KEY, ClaudeSession, CodexSession, locate
from tests.agent_upstream import AgentUpstream, OutsideTrafficSentinel
from tests.coding_session import CodingSession

pytestmark = pytest.mark.agent_client

# two work prompts of seven commands each and a question about the first file read: 15 model
# turns a client, about 13K tokens of tool output
SESSION = CodingSession(files=12, file_bytes=4000, per_task=6)


@pytest.fixture
def sentinel():
    with OutsideTrafficSentinel() as refusing:
        yield refusing


@pytest.fixture
def upstream():
    return AgentUpstream(SESSION)


def test_codex_exec_plays_the_session_on_the_responses_api(tmp_path, upstream, sentinel):
    binary = locate("codex")
    with upstream.serving() as url:
        codex = CodexSession(binary, url, tmp_path, sentinel.environment())
        SESSION.write(codex.workspace)
        outcomes = [codex.send(prompt) for prompt in SESSION.prompts()]

    for outcome, expected in zip(outcomes, SESSION.expected_answers(), strict=True):
        assert outcome.process.returncode == 0, outcome.explain()
        assert outcome.final == expected, outcome.explain()
    ran = [command for outcome in outcomes for command in outcome.commands]
    assert len(ran) == SESSION.command_count()
    assert all(exit_code == 0 for _, exit_code in ran), ran
    assert len(upstream.tool_results("responses")) == SESSION.command_count()
    assert sentinel.attempts == []

    calls = upstream.calls("responses")
    assert all(r.path == "/v1/responses" and r.body["stream"] is True for r in calls)
    assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in calls)
    # one conversation: the same session id on every request, across the resumed invocations
    assert {r.headers["session-id"] for r in calls} == {codex.thread_id}
    assert {r.body["prompt_cache_key"] for r in calls} == {codex.thread_id}
    assert {r.body["store"] for r in calls} == {False}
    assert not any("previous_response_id" in r.body for r in calls)
    # the whole history is sent every time, reasoning items (with their opaque content) included
    last = calls[-1].body["input"]
    assert sum(item.get("type") == "function_call_output" for item in last) == 14
    assert any(item.get("encrypted_content", "").startswith("opaque-reasoning-") for item in last)


def test_claude_print_plays_the_session_on_the_messages_api(tmp_path, upstream, sentinel):
    binary = locate("claude")
    with upstream.serving() as url:
        claude = ClaudeSession(binary, url.removesuffix("/v1"), tmp_path, sentinel.environment())
        SESSION.write(claude.workspace)
        outcomes = [claude.send(prompt) for prompt in SESSION.prompts()]

    for outcome, expected in zip(outcomes, SESSION.expected_answers(), strict=True):
        assert outcome.process.returncode == 0, outcome.explain()
        assert outcome.final == expected, outcome.explain()
    assert len(upstream.tool_results("messages")) == SESSION.command_count()
    assert sentinel.attempts == []

    calls = upstream.calls("messages")
    assert upstream.calls() == calls  # no side requests (count_tokens, titles) in print mode
    assert all(r.path == "/v1/messages" and r.body["stream"] is True for r in calls)
    assert all(r.headers["x-api-key"] == API_KEY for r in calls)
    sessions = {r.headers["x-claude-code-session-id"] for r in calls}
    assert sessions == {claude.session_id}
    assert {json.loads(r.body["metadata"]["user_id"])["session_id"] for r in calls} == sessions
    # the prompt-caching breakpoint rides on the newest message's last block
    history = calls[-1].body["messages"]
    assert history[-1]["content"][-1].get("cache_control") == {"type": "ephemeral"}
    # thinking blocks come back verbatim, signature included
    blocks = [b for m in history if m["role"] == "assistant" for b in m["content"]]
    assert {
        "type": "thinking",
        "thinking": "Start TASK-1 by listing the folder.",
        "signature": "sig-1",
    } in blocks


def test_a_client_reaching_beyond_the_loopback_is_caught_by_the_sentinel(
    tmp_path, upstream, sentinel
):
    """The check above can fail: the same Codex with its analytics left on tries to connect out,
    and the sentinel records (and refuses) it while the session itself still finishes."""
    binary = locate("codex")
    with upstream.serving() as url:
        codex = CodexSession(binary, url, tmp_path, sentinel.environment())
        codex.extra_config = {"analytics.enabled": "true"}
        SESSION.write(codex.workspace)
        outcome = codex.send(SESSION.prompts()[0])
    assert outcome.final == SESSION.expected_answers()[0], outcome.explain()
    assert sentinel.attempts and all(a.startswith("CONNECT ") for a in sentinel.attempts)


def test_without_node_the_tier_skips_naming_why(monkeypatch):
    monkeypatch.setattr(agent_clients.shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="needs node and npm"):
        locate("codex")


@pytest.mark.parametrize(
    ("ci", "outcome"), [("", pytest.skip.Exception), ("true", pytest.fail.Exception)]
)
def test_a_missing_client_skips_here_and_fails_in_ci(monkeypatch, tmp_path, ci, outcome):
    """Where node is present, CI has run `make clients`: a client missing there is a defect."""
    monkeypatch.setattr(agent_clients.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("KEEPER_AGENT_CLIENTS", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=r"is not installed .*run `make clients`"):
        locate("claude")
