"""The agent clients people run (Codex CLI, Claude Code), found where `make clients` installed
them and run as scripted sessions against a base URL on 127.0.0.1.

Each client runs in a fresh home folder with no user configuration, no telemetry, no update
checks and no side requests, with an ``OutsideTrafficSentinel`` as its HTTP(S) proxy so that any
connection beyond the loopback is refused and recorded. ``CodexSession`` and ``ClaudeSession``
send the prompts of a ``CodingSession`` one invocation at a time, resuming the same conversation,
and return what the client printed, parsed from its JSON event stream.

The settings written here are the ones a user needs to point these clients at a server of
their own (the keeper proxy, in the next tier): a Codex ``config.toml`` with a Responses model
provider, and Claude Code's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PINS_FILE = Path(__file__).resolve().parent.parent / "scripts" / "agent_clients.json"
PINS: dict[str, dict[str, str]] = json.loads(PINS_FILE.read_text())
CLIENT_TIMEOUT = 240  # seconds for one invocation (a prompt's whole tool loop)
API_KEY = "sk-keeper-test"


def clients_folder() -> Path:
    default = Path.home() / ".cache" / "keeper-middleware" / "agent-clients"
    return Path(os.environ.get("KEEPER_AGENT_CLIENTS", default))


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def locate(name: str) -> Path:
    """The pinned client's executable, or a skip naming why (a failure in CI, where
    `make test` installs the clients whenever node is present)."""
    pin = PINS[name]
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip(f"{pin['package']} needs node and npm, which are not on PATH")
    binary = clients_folder() / f"{name}-{pin['version']}" / "node_modules" / ".bin" / pin["bin"]
    problem = None
    if not binary.exists():
        problem = f"{binary} is missing"
    else:
        shown = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        if pin["version"] not in shown.stdout:
            problem = f"{binary} --version printed {shown.stdout.strip()!r} {shown.stderr[-300:]!r}"
    if problem:
        reason = (
            f"{pin['package']}@{pin['version']} is not installed ({problem}); run `make clients`"
        )
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return binary


def base_environment(home: Path, proxies: dict[str, str]) -> dict[str, str]:
    """A minimal environment: the caller's PATH and locale, a fresh HOME, the proxy variables."""
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    home.mkdir(parents=True, exist_ok=True)
    return {**keep, "HOME": str(home), "TERM": "dumb", "NO_COLOR": "1", **proxies}


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT,
        check=False,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


@dataclass
class Outcome:
    """What one invocation printed: its final message, the commands it ran, its raw output."""

    final: str
    commands: list[tuple[str, int | None]]
    process: subprocess.CompletedProcess[str]

    def explain(self) -> str:
        return (
            f"exit {self.process.returncode}\n--- stdout\n{self.process.stdout[-4000:]}"
            f"\n--- stderr\n{self.process.stderr[-4000:]}"
        )


# ----------------------------------------------------------------------------- Codex CLI


def codex_config(base_url: str, *, model: str = "scripted-model") -> str:
    """``$CODEX_HOME/config.toml`` for a Responses provider at ``base_url``: no analytics, no
    plugin sync (which clones from a code host and calls a plugin service), no web search tool,
    no update check."""
    return f"""\
model = "{model}"
model_provider = "keeper"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.keeper]
name = "keeper"
base_url = "{base_url}"
env_key = "KEEPER_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[features]
plugins = false
"""


@dataclass
class CodexSession:
    """``codex exec`` then ``codex exec resume THREAD`` for each further prompt."""

    binary: Path
    base_url: str
    root: Path
    proxies: dict[str, str]
    thread_id: str | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    extra_config: dict[str, str] = field(default_factory=dict)  # ``-c key=value`` overrides

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    def environment(self) -> dict[str, str]:
        codex_home = self.root / "codex-home"
        codex_home.mkdir(parents=True, exist_ok=True)
        (codex_home / "config.toml").write_text(codex_config(self.base_url))
        env = base_environment(self.root / "home", self.proxies)
        return env | {"CODEX_HOME": str(codex_home), "KEEPER_API_KEY": API_KEY}

    def send(self, prompt: str) -> Outcome:
        argv = [str(self.binary), "exec", "--json", "--skip-git-repo-check", "--strict-config"]
        argv += ["--sandbox", "read-only", "-C", str(self.workspace)]
        for key, value in self.extra_config.items():
            argv += ["-c", f"{key}={value}"]
        if self.thread_id:
            argv += ["resume", self.thread_id]
        process = run([*argv, prompt], self.environment(), self.workspace)
        events = json_lines(process.stdout)
        for event in events:
            if event.get("type") == "thread.started":
                self.thread_id = self.thread_id or event.get("thread_id")
        items = [e["item"] for e in events if e.get("type") == "item.completed"]
        messages = [i.get("text", "") for i in items if i.get("type") == "agent_message"]
        commands = [
            (i.get("command", ""), i.get("exit_code"))
            for i in items
            if i.get("type") == "command_execution"
        ]
        outcome = Outcome(messages[-1] if messages else "", commands, process)
        self.outcomes.append(outcome)
        return outcome


# ----------------------------------------------------------------------------- Claude Code

QUIET_CLAUDE = {
    # no telemetry, error reports, update checks, feature flags or other side requests
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
}
CLAUDE_TOOLS = ["Bash(ls:*)", "Bash(cat:*)", "Read"]


@dataclass
class ClaudeSession:
    """``claude -p PROMPT`` then ``claude -p --resume SESSION PROMPT`` for each further prompt."""

    binary: Path
    base_url: str  # the server root, without /v1: Claude Code adds /v1/messages itself
    root: Path
    proxies: dict[str, str]
    session_id: str | None = None
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    def environment(self) -> dict[str, str]:
        env = base_environment(self.root / "home", self.proxies)
        config = self.root / "claude-config"
        config.mkdir(parents=True, exist_ok=True)
        return (
            env
            | QUIET_CLAUDE
            | {
                "CLAUDE_CONFIG_DIR": str(config),
                "ANTHROPIC_BASE_URL": self.base_url,
                "ANTHROPIC_API_KEY": API_KEY,
            }
        )

    def send(self, prompt: str) -> Outcome:
        argv = [str(self.binary), "-p", "--output-format", "stream-json", "--verbose"]
        argv += ["--allowedTools", *CLAUDE_TOOLS]
        if self.session_id:
            argv += ["--resume", self.session_id]
        process = run([*argv, "--", prompt], self.environment(), self.workspace)
        events = json_lines(process.stdout)
        results = [e for e in events if e.get("type") == "result"]
        for event in events:
            if event.get("type") == "system" and event.get("subtype") == "init":
                self.session_id = event.get("session_id") or self.session_id
        commands = []
        for event in events:
            if event.get("type") != "assistant":
                continue
            for block in event.get("message", {}).get("content", []):
                if block.get("type") == "tool_use":
                    commands.append((json.dumps(block.get("input")), None))
        final = results[-1].get("result", "") if results else ""
        outcome = Outcome(final, commands, process)
        self.outcomes.append(outcome)
        return outcome
