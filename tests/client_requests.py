"""Request bodies shaped like the ones Codex CLI 0.169, Claude Code 2.1.328 and the Agents SDK
send (recorded against a server on 127.0.0.1), trimmed to what the front doors' tests need: the
fields, item kinds and quirks the proxy must read (Codex's developer prompt, reasoning items with
``content: null``, namespace tools, ``status`` on echoed calls; Claude Code's system message
inside the conversation, moving ``cache_control`` marks, string-or-blocks content, thinking
blocks with signatures, beta fields)."""

from __future__ import annotations

import json
from typing import Any

PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
SHELL_PARAMETERS = {
    "type": "object",
    "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}},
    "required": ["cmd"],
    "additionalProperties": False,
}
CODEX_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "exec_command", "description": "Run a command.",
     "strict": False, "parameters": SHELL_PARAMETERS},
    {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
     "tools": [{"type": "function", "name": "spawn_agent", "description": "Start one.",
                "strict": False, "parameters": {"type": "object", "properties": {
                    "task": {"type": "string"}}}}]},
    {"type": "web_search", "external_web_access": False},
]  # fmt: skip


def codex_body(*history: dict[str, Any], stream: bool = True) -> dict[str, Any]:
    """A Codex request: its prompt as two developer messages, the environment as a user
    message, then ``history``."""
    return {
        "model": "scripted-model",
        "stream": stream,
        "input": [
            {"type": "message", "id": "msg_dev1", "role": "developer",
             "content": [{"type": "input_text", "text": "You are a coding agent running in the Codex CLI."}]},
            {"type": "message", "id": "msg_dev2", "role": "developer",
             "content": [{"type": "input_text", "text": "<skills_instructions>none</skills_instructions>"}]},
            {"type": "message", "id": "msg_env", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context><cwd>/w</cwd></environment_context>"}]},
            *history,
        ],
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a23441-814c-7bc1-b9d0-0f73787eb532",
        "client_metadata": {"turn_id": "t1"},
    }  # fmt: skip


def user_item(text: str, item_id: str = "msg_u1") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "user",
            "content": [{"type": "input_text", "text": text}]}  # fmt: skip


def codex_step(step: int, command: str, output: str) -> list[dict[str, Any]]:
    """One tool step as Codex echoes it: reasoning (``content: null``), the call, its output."""
    call = f"call_{step}"
    return [
        {"type": "reasoning", "id": f"rs_{step}", "content": None,
         "summary": [{"type": "summary_text", "text": f"Step {step}."}],
         "encrypted_content": f"ENC-{step}"},
        {"type": "function_call", "status": "completed", "id": f"fc_{step}",
         "name": "exec_command", "arguments": json.dumps({"cmd": command}), "call_id": call},
        {"type": "function_call_output", "id": f"fco_{step}", "call_id": call,
         "output": f"Chunk ID: 1\nProcess exited with code 0\nOutput:\n{output}"},
    ]  # fmt: skip


CLAUDE_TOOLS: list[dict[str, Any]] = [
    {"name": "Bash", "description": "Run a command.",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                                                       "description": {"type": "string"}},
                      "required": ["command"]}},
    {"name": "Read", "description": "Read a file.",
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}},
    {"name": "DeferredToolPlaceholder", "description": "Deferred.", "defer_loading": True,
     "input_schema": {"type": "object", "properties": {}}},
]  # fmt: skip
CLAUDE_SESSION = "47fc4d04-9b53-44d4-997c-6d34fe5ac1e4"


def claude_body(
    *history: dict[str, Any], stream: bool = True, first: bool = False
) -> dict[str, Any]:
    """A Claude Code request: three system blocks, the prompt with a system reminder, the
    environment as a ``role: "system"`` message (blocks in the first request, a string later),
    then ``history``; the one rolling cache mark on the last block of the last message."""
    environment = "# Environment\n - Primary working directory: /w"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nAttribution rules.\n</system-reminder>"},
            {"type": "text", "text": "TASK-1: list the folder."}]},
        {"role": "system", "content": [{"type": "text", "text": environment}] if first else environment},
        *history,
    ]  # fmt: skip
    messages = json.loads(json.dumps(messages))
    last = messages[-1]
    if isinstance(last["content"], list):
        last["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return {
        "model": "claude-opus-5-5",
        "messages": messages,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328.ccf;"},
            {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "You are an agent working with the user.",
             "cache_control": {"type": "ephemeral"}},
        ],
        "tools": CLAUDE_TOOLS,
        "metadata": {"user_id": json.dumps({"device_id": "d" * 64, "account_uuid": "",
                                            "session_id": CLAUDE_SESSION})},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "stream": stream,
    }  # fmt: skip


def claude_step(step: int, command: str, output: str) -> list[dict[str, Any]]:
    """One tool step as Claude Code sends it back: thinking (signed), the call, its result."""
    call = f"toolu_{step}"
    return [
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"Step {step}.", "signature": f"sig-{step}"},
            {"type": "tool_use", "id": call, "name": "Bash",
             "input": {"command": command, "description": "Run it"}}]},
        {"role": "user", "content": [
            {"tool_use_id": call, "type": "tool_result", "content": output, "is_error": False}]},
    ]  # fmt: skip
