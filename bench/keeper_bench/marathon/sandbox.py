"""The agent's one tool: a shell command run in the marathon's work folder.

Each call runs one ``bash -c`` command with the work folder as its current directory, a scrubbed
environment (the folder's library first on ``PYTHONPATH``), a time limit, and no network: where
the harness may create a network namespace (``unshare -n``, as root) the command gets one of its
own with only a loopback device. Output is returned whole up to a generous cap, because real agents
do read 200K-character files and test logs; the context manager has to cope with that, not the
tool. This confines a benchmark's honest model; it is not a security boundary against a hostile one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from langchain_core.tools import BaseTool, StructuredTool

from keeper_bench.marathon.testrun import test_environment

TOOL_NAME = "shell"


def _can_unshare_network() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    return probe.returncode == 0


@dataclass
class ShellSandbox:
    project: Path
    timeout: float = 120.0
    max_output_chars: int = 1_000_000
    isolate_network: bool | None = None
    """None: isolate when the machine allows it."""
    commands: list[str] = field(default_factory=list)
    """Every command run, in order (the grader and the report read it)."""
    output_sizes: list[int] = field(default_factory=list)
    """Characters of each command's output, as the model received it."""

    def __post_init__(self) -> None:
        if self.isolate_network is None:
            self.isolate_network = _can_unshare_network()

    def run(self, command: str) -> str:
        """Run one command; the text a model sees: output, then the exit status when it failed."""
        self.commands.append(command)
        argv = ["bash", "-c", command]
        if self.isolate_network:
            argv = ["unshare", "-n", *argv]
        process = subprocess.Popen(
            argv,
            cwd=self.project,
            env=test_environment(self.project),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # a timeout stops everything the command started
        )
        try:
            stdout, _ = process.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            self.output_sizes.append(0)
            return f"[the command did not finish within {self.timeout:.0f} s and was stopped]"
        output = stdout
        if len(output) > self.max_output_chars:
            output = output[: self.max_output_chars] + (
                f"\n[output cut at {self.max_output_chars} characters]"
            )
        if process.returncode != 0:
            output += f"\n[exit status {process.returncode}]"
        output = output or "[no output]"
        self.output_sizes.append(len(output))
        return output

    def tool(self) -> BaseTool:
        """The LangChain tool the agent is given."""
        return StructuredTool.from_function(
            func=self.run,
            name=TOOL_NAME,
            description=(
                "Run one bash command in the project folder (more-itertools with its tests) and "
                "return its output. One command per call; no network."
            ),
        )
