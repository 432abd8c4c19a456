"""A scripted repair agent: replays a correct fix sequence at real message sizes.

It is not a model and scores nothing: it exists so the whole marathon harness (planting, tickets,
the shell, the three ways of running, grading, the NOTES audit) runs end to end in CI with the
messages a real repair agent produces: whole-suite test logs, whole-file reads of 45K-200K
characters, one shell command per turn. Its answers are labelled "scripted agent (plumbing)".

It keeps its place per ticket itself (the newest ``Ticket N.`` message it is sent names the
ticket), answers the keeper's note requests with the notices' instructions as RULE lines, and
answers the audit ticket from the plan, after an archive search when it has the tool.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from pydantic import ConfigDict, Field, PrivateAttr

from keeper_bench.marathon.defects import describe
from keeper_bench.marathon.grading import FIXES_FILE, RECIPES_FILE
from keeper_bench.marathon.sandbox import TOOL_NAME
from keeper_bench.marathon.testrun import own_test_classes
from keeper_bench.marathon.tickets import NOTICES, Ticket, fixes_before_log

SCRIPTED_AGENT = "scripted agent (plumbing)"
_TICKET = re.compile(r"^\s*Ticket (\d+)\.", re.MULTILINE)
PYTEST = "python -m pytest -q -p no:cacheprovider -o addopts="


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "") if isinstance(part, dict) else str(part) for part in content
    )


def fix_command(path: str, line_number: int, fixed_line: str) -> str:
    """A shell command that replaces one line of a file (what a careful agent sends)."""
    return (
        "python - <<'PY'\n"
        "import pathlib\n"
        f"p = pathlib.Path({path!r})\n"
        "lines = p.read_text().splitlines(keepends=True)\n"
        f"lines[{line_number - 1}] = {fixed_line + chr(10)!r}\n"
        "p.write_text(''.join(lines))\n"
        "PY"
    )


def repaired_line(planted_line: str, col: int, old: str, new: str, kind: str) -> str:
    """The planted line with the defect's token put back."""
    if kind == "dropped_not":
        return planted_line[:col] + "not " + planted_line[col:]
    return planted_line[:col] + old + planted_line[col + len(new) :]


class ScriptedRepairAgent(BaseChatModel):
    """Replays the plan's fixes; see the module docstring."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tickets: list[Any] = Field(repr=False)
    """The marathon's :class:`Ticket` sequence."""
    planted_lines: dict[str, list[str]] = Field(repr=False)
    """The library files as planted (path → lines), to write each repair against."""
    test_classes: dict[str, list[str]] = Field(repr=False)
    bound_tools: list[str] = Field(default_factory=list)
    _steps: dict[int, int] = PrivateAttr(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return "scripted-repair-agent"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        names = [
            getattr(tool, "name", None)
            or (tool.get("function", {}).get("name") if isinstance(tool, dict) else None)
            or "?"
            for tool in tools
        ]
        clone = self.model_copy(update={"bound_tools": names})
        clone._steps = self._steps  # one place in the sequence, however often it is bound
        return clone

    # -- what to send next ------------------------------------------------------------------------
    def _ticket_in_view(self, messages: Sequence[BaseMessage]) -> int:
        for message in reversed(messages):
            if isinstance(message, HumanMessage):
                match = _TICKET.match(_text(message))
                if match:
                    return int(match.group(1))
        return self._steps.get(0, 1)

    def _notes_reply(self, messages: Sequence[BaseMessage]) -> str:
        sent = "\n".join(_text(m) for m in messages if isinstance(m, HumanMessage))
        rules = [f"RULE: {n.instruction}" for n in NOTICES if n.instruction in sent]
        return "\n".join(rules) or "NO CHANGES"

    def _actions(
        self, ticket: Ticket, in_force: set[str]
    ) -> list[tuple[str, dict[str, Any]] | str]:
        if ticket.notice is not None:
            return [f"Noted: {ticket.notice.instruction}."]
        if ticket.kind == "audit":
            expected = fixes_before_log(self.tickets)
            answer = f"{len(expected)}: {', '.join(expected)}"
            if "search_archive" in self.bound_tools:
                return [("search_archive", {"query": "Fixed"}), answer]
            return [answer]
        assert ticket.defect is not None
        defect = ticket.defect.defect
        own = " ".join(own_test_classes(defect.function, self.test_classes))
        index = sum(1 for t in self.tickets[: ticket.number] if t.defect is not None) - 1
        first_look = f"{PYTEST} tests" if index == 0 else f"{PYTEST} {own}"
        planted = self.planted_lines[defect.path][defect.line - 1].rstrip("\n")
        line = repaired_line(planted, defect.col, defect.old, defect.new, defect.kind)
        if "fixed_comment" in in_force:
            line += "  # fixed"
        read = (
            f"cat {defect.path}"
            if index % 3 == 0
            else f"sed -n '{max(1, defect.line - 40)},{defect.line + 25}p' {defect.path}"
        )
        actions: list[tuple[str, dict[str, Any]] | str] = [
            (TOOL_NAME, {"command": first_look}),
            (TOOL_NAME, {"command": read}),
            (TOOL_NAME, {"command": fix_command(defect.path, defect.line, line)}),
        ]
        if "fixes_log" in in_force:
            entry = f"{defect.function}: {describe(defect)}"
            actions.append((TOOL_NAME, {"command": f"echo {entry!r} >> {FIXES_FILE}"}))
        if "recipes_log" in in_force and defect.path.endswith("recipes.py"):
            actions.append((TOOL_NAME, {"command": f"echo {defect.function} >> {RECIPES_FILE}"}))
        actions.append((TOOL_NAME, {"command": f"{PYTEST} {own}"}))
        actions.append(f"Fixed {defect.function}: {describe(defect)}.")
        return actions

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        last = _text(messages[-1]) if messages else ""
        if "[NOTES REQUEST]" in last or "[NOTES CHECK]" in last:
            return ChatResult(
                generations=[ChatGeneration(message=AIMessage(self._notes_reply(messages)))]
            )
        number = self._ticket_in_view(messages)
        self._steps[0] = number  # the ticket being worked, for requests after a cut
        ticket = self.tickets[number - 1]
        in_force = {t.notice.key for t in self.tickets[: number - 1] if t.notice is not None}
        actions = self._actions(ticket, in_force)
        step = min(self._steps.get(number, 0), len(actions) - 1)
        self._steps[number] = step + 1
        action = actions[step]
        if isinstance(action, str):
            reply = AIMessage(action)
        else:
            name, args = action
            reply = AIMessage(
                "",
                tool_calls=[
                    {"name": name, "args": args, "id": f"call_{number}_{step}", "type": "tool_call"}
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])
