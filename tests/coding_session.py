"""A long scripted coding session that a real agent client can play against a scripted model.

The session is a folder of numbered source files (``part01.txt`` ...), each opening with a
checksum line, and a list of tasks the user gives one prompt at a time: read a run of files with
shell commands, then answer a question about the first file read. The scripted model
(``next_reply``) is a pure function of what one request shows, in any API: it reads the
conversation as ``Turn`` items (``tests.api_wire`` parses each API into them) and answers with a
``Reply``: the next shell command, a search of the archive, or the task's final text.

It is stateless on purpose. Which step comes next is written in the call id of the tool call it
issued (``call_t1_s04``), and every client sends back the id it was given, so the script holds
when a proxy cuts old turns out of the conversation, when a client retries a request, and when a
client compacts its own history. The final answers quote what came back from the tools, so a
client whose commands did not run, or whose results never reached the model, gets a wrong answer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEARCH_TOOL = "search_archive"
NOTE_PREFIXES = ("[NOTES REQUEST]", "[NOTES CHECK]")


# ----------------------------------------------------------------------------- what a request shows


@dataclass(frozen=True)
class UserText:
    text: str


@dataclass(frozen=True)
class AssistantText:
    text: str


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    text: str


Item = UserText | AssistantText | ToolCall | ToolResult


@dataclass(frozen=True)
class Turn:
    """One request as the scripted model reads it, whatever API carried it."""

    system: str
    items: tuple[Item, ...]
    tools: tuple[str, ...]

    def user_texts(self) -> list[str]:
        return [item.text for item in self.items if isinstance(item, UserText)]

    def is_note_call(self) -> bool:
        last = self.items[-1] if self.items else None
        return isinstance(last, UserText) and last.text.startswith(NOTE_PREFIXES)


@dataclass(frozen=True)
class Reply:
    """What the scripted model answers: text, tool calls, or both (reasoning is optional)."""

    text: str | None = None
    calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None


class ScriptError(ValueError):
    """A request the script cannot place: the upstream answers it with a 400 naming why."""


# ----------------------------------------------------------------------------- the session


# how each client's shell tool takes a command (the tool names the clients offer)
SHELL_TOOLS: dict[str, Callable[[str], dict[str, Any]]] = {
    "exec_command": lambda command: {"cmd": command},  # Codex CLI (unified exec)
    "shell": lambda command: {"command": ["bash", "-lc", command]},  # Codex CLI, older tool
    "Bash": lambda command: {"command": command, "description": "Read the workspace"},  # Claude
    "run_shell": lambda command: {"command": command},  # the tests' own function tools
}


def checksum(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:12]


def file_text(name: str, size: int) -> str:
    """A file opening with its checksum line, padded with numbered lines to about ``size``."""
    head = f"{name} checksum: {checksum(name)}\n"
    lines = [head]
    number = 1
    while sum(map(len, lines)) < size:
        lines.append(
            f"{name} line {number:04d}: def step_{number}(value): return value + {number}\n"
        )
        number += 1
    return "".join(lines)


@dataclass(frozen=True)
class Task:
    """One prompt of the session: a run of shell commands then a final answer, or a question."""

    marker: str
    prompt: str
    commands: tuple[str, ...] = ()
    question_about: str | None = None


@dataclass(frozen=True)
class CodingSession:
    """The files to write and the prompts to send, in order.

    ``files`` files of about ``file_bytes`` bytes each; the work tasks read them ``per_task`` at
    a time (``cat`` of each, with an ``ls`` first), and the last task asks for the checksum of
    the first file, which by then lies far back in the conversation.
    """

    files: int = 12
    file_bytes: int = 4000
    per_task: int = 6
    tasks: tuple[Task, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = self.file_names()
        tasks: list[Task] = []
        for start in range(0, len(names), self.per_task):
            chunk = names[start : start + self.per_task]
            number = len(tasks) + 1
            tasks.append(
                Task(
                    marker=f"TASK-{number}",
                    prompt=(
                        f"TASK-{number}: review {chunk[0]} to {chunk[-1]} in this folder. "
                        "Rule: report every checksum in capitals."
                    ),
                    commands=("ls", *(f"cat {name}" for name in chunk)),
                )
            )
        tasks.append(
            Task(
                marker="QUESTION-1",
                prompt=f"QUESTION-1: what checksum did {names[0]} hold?",
                question_about=names[0],
            )
        )
        object.__setattr__(self, "tasks", tuple(tasks))

    def file_names(self) -> list[str]:
        return [f"part{i:02d}.txt" for i in range(1, self.files + 1)]

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name in self.file_names():
            (folder / name).write_text(file_text(name, self.file_bytes))

    def prompts(self) -> list[str]:
        return [task.prompt for task in self.tasks]

    def expected_answers(self) -> list[str]:
        """The final text each prompt must end with when every tool result came back."""
        answers = []
        for task in self.tasks:
            if task.question_about:
                name = task.question_about
                answers.append(f"{task.marker}: {name} held checksum {checksum(name).upper()}.")
            else:
                last = task.commands[-1].split()[-1]
                answers.append(
                    f"{task.marker} done: {len(task.commands)} commands; "
                    f"the last file read was {last}, checksum {checksum(last).upper()}."
                )
        return answers

    def command_count(self) -> int:
        return sum(len(task.commands) for task in self.tasks)

    def task(self, marker: str) -> Task:
        for task in self.tasks:
            if task.marker == marker:
                return task
        raise ScriptError(f"no task {marker!r} in this session")


# ----------------------------------------------------------------------------- the scripted model

CALL_ID = re.compile(r"call_t(?P<task>\d+)_(?P<step>s\d+|search)")
CHECKSUM_LINE = re.compile(r"(?P<name>part\d+\.txt) checksum: (?P<sum>[0-9a-f]{12})")


def call_id(task_index: int, step: int | str) -> str:
    return f"call_t{task_index}_{step if isinstance(step, str) else f's{step:02d}'}"


def shell_call(turn: Turn, task_index: int, step: int, command: str) -> ToolCall:
    for name, arguments in SHELL_TOOLS.items():
        if name in turn.tools:
            return ToolCall(call_id(task_index, step), name, arguments(command))
    raise ScriptError(
        f"the request offers no shell tool the script knows ({sorted(SHELL_TOOLS)}); "
        f"it offers {list(turn.tools)}"
    )


def current_task(session: CodingSession, turn: Turn) -> tuple[int, Task]:
    """The task of the newest user prompt that names one (clients add user texts of their own)."""
    for text in reversed(turn.user_texts()):
        for index, task in enumerate(session.tasks):
            if task.marker in text:
                return index, task
    raise ScriptError("no user prompt in the request names a task of the session")


def checksums_in(texts: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for text in texts:
        for match in CHECKSUM_LINE.finditer(text):
            found[match["name"]] = match["sum"]
    return found


def answer_question(task: Task, visible: dict[str, str]) -> str:
    name = task.question_about or ""
    if name in visible:
        return f"{task.marker}: {name} held checksum {visible[name].upper()}."
    return f"{task.marker}: {name} is not in what I can see."


def next_reply(session: CodingSession, turn: Turn) -> Reply:
    """The scripted model's answer to one request (note calls are the upstream's business)."""
    last = turn.items[-1] if turn.items else None
    if isinstance(last, ToolResult):
        match = CALL_ID.fullmatch(last.call_id)
        if match is None:
            raise ScriptError(f"a tool result for a call the script never made: {last.call_id!r}")
        task_index = int(match["task"])
        task = session.tasks[task_index]
        if match["step"] == "search":
            return Reply(text=answer_question(task, checksums_in([last.text])))
        step = int(match["step"][1:]) + 1
        if step < len(task.commands):
            return Reply(calls=(shell_call(turn, task_index, step, task.commands[step]),))
        seen = checksums_in([last.text])
        name = task.commands[-1].split()[-1]
        summary = seen.get(name, "none seen").upper()
        return Reply(
            text=f"{task.marker} done: {len(task.commands)} commands; "
            f"the last file read was {name}, checksum {summary}."
        )
    task_index, task = current_task(session, turn)
    if task.question_about:
        results = [item.text for item in turn.items if isinstance(item, ToolResult)]
        visible = checksums_in(results)
        if task.question_about not in visible and SEARCH_TOOL in turn.tools:
            query = {"query": f"{task.question_about} checksum"}
            return Reply(
                reasoning="The file was read long ago; search the archive.",
                calls=(ToolCall(call_id(task_index, "search"), SEARCH_TOOL, query),),
            )
        return Reply(text=answer_question(task, visible))
    return Reply(
        reasoning=f"Start {task.marker} by listing the folder.",
        calls=(shell_call(turn, task_index, 0, task.commands[0]),),
    )


def arguments_json(call: ToolCall) -> str:
    return json.dumps(dict(call.arguments))
