"""The simulated reader as a LangChain chat model: the reply to a request, faults included."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from keeper_bench.reader.faults import (
    NO_FAULTS,
    ReaderFaults,
    request_digest,
    runaway_reasoning,
    thinking_switched_off,
)
from keeper_bench.reader.files import (
    FILE_CALLS_PER_REPLY,
    FileCommand,
    FileView,
    circle_commands,
    command_key,
    last_answered,
    next_file_command,
    offers_files,
)
from keeper_bench.reader.logic import Finding, Gap, answer, read_view
from keeper_bench.reader.memory import edits_memory, memory_turn
from keeper_bench.reader.messages import (
    NO_MORE_BATCHES,
    READ_TOOL,
    SEARCH_TOOL,
    SearchRecord,
    message_kind,
    open_questions,
    search_args,
    stop_requested,
    story_blocks,
)
from keeper_bench.reader.misreads import misreads_for
from keeper_bench.reader.notes import rewrite_notes, write_changes
from keeper_bench.reader.rot import NO_ROT, ContextRot, with_rot
from keeper_bench.reader.summary import (
    is_summary_request,
    summaries_in_view,
    write_summary,
)
from keeper_bench.reader.text import is_questions_message
from keeper_middleware.config import KeeperConfig
from keeper_middleware.messages.facts import text_of
from keeper_middleware.search.guards import turn_budget

MODEL_NAME = "simulated-reader"
DEFAULT_SUMMARY_TOKENS = 4096
"""A summary's budget when neither the request nor the run states one: an eighth of the
benchmark's default 32K window (runs set it from their window, see ``run_options``)."""
MAX_SEARCHES_PER_TURN = 4
FinishReason = Literal["stop", "tool_calls", "length"]
Command = tuple[str, int | None, int | None]


@dataclass(frozen=True, slots=True)
class Reply:
    """What the reader says, before it becomes an AIMessage (or an HTTP response)."""

    content: str
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    finish_reason: FinishReason = "stop"
    reasoning: str = ""


def approx_tokens(text: str) -> int:
    """About four characters a token: the reader's (and its server's) token count."""
    return (len(text) + 3) // 4


def request_tokens(messages: Sequence[BaseMessage]) -> int:
    total = 0
    for message in messages:
        total += approx_tokens(text_of(message))
        if isinstance(message, AIMessage) and message.tool_calls:
            total += approx_tokens(json.dumps([c["args"] for c in message.tool_calls]))
    return total


def reply_tokens(reply: Reply) -> int:
    calls = json.dumps([args for _, args in reply.tool_calls]) if reply.tool_calls else ""
    return approx_tokens(reply.content) + approx_tokens(calls) + approx_tokens(reply.reasoning)


def call_id(digest: str, index: int) -> str:
    return "call_" + hashlib.sha256(f"{digest}/{index}".encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Choosing the reply (pure)
# ---------------------------------------------------------------------------------------------
def next_command(
    gap: Gap, attempted: set[Command], cut_short: set[Command], latest: int
) -> Command | None:
    """The search that could fill ``gap``: the gap itself, or, when that list came back cut
    short, its later half first, then its earlier half (narrowing with from_item/to_item)."""

    def normal(lo: int | None, hi: int | None) -> Command:
        return (
            gap.query,
            None if lo is None or lo <= 1 else lo,
            None if hi is None or hi >= latest else hi,
        )

    def find(command: Command, depth: int) -> Command | None:
        if command not in attempted:
            return command
        if command not in cut_short or depth > 12:
            return None
        low, high = command[1] or 1, command[2] or latest
        if low >= high:
            return None
        middle = (low + high) // 2
        for half in (normal(middle + 1, high), normal(low, middle)):
            found = find(half, depth + 1)
            if found is not None:
                return found
        return None

    return find(normal(gap.lo, gap.hi), 0)


def plan_searches(
    findings: Sequence[Finding], records: Sequence[SearchRecord], latest: int
) -> list[Command]:
    """One search per missing or unsure fact, in question order, none sent before, at most four."""
    attempted = {record.command for record in records}
    cut_short = {record.command for record in records if record.outcome == "cut_short"}
    commands: list[Command] = []
    for gap in (gap for finding in findings for gap in finding.gaps):
        command = next_command(gap, attempted, cut_short, latest)
        if command is not None and command not in commands:
            commands.append(command)
        if len(commands) == MAX_SEARCHES_PER_TURN:
            break
    return commands


def plan_file_reads(
    findings: Sequence[Finding], history: FileView, attempted: set[str], room: int
) -> list[FileCommand]:
    """The next file call for the first missing or unsure fact that has one, none sent before
    (``FILE_CALLS_PER_REPLY`` a reply, within ``room``): the file counterpart of
    ``plan_searches``."""
    commands: list[FileCommand] = []
    for gap in (gap for finding in findings for gap in finding.gaps):
        command = next_file_command(history, gap.query)
        if command is None or command_key(command) in attempted:
            continue
        if all(command_key(command) != command_key(other) for other in commands):
            commands.append(command)
        if len(commands) == min(FILE_CALLS_PER_REPLY, room):
            break
    return commands


def file_turn_budget(questions: int) -> int:
    """The file calls a question turn may make: the keeper's default search budget for a turn
    of that many questions (the same budget the archive search runs under)."""
    defaults = KeeperConfig()
    budget = turn_budget(defaults.search_budget, defaults.searches_per_question, questions)
    return budget if budget is not None else MAX_SEARCHES_PER_TURN


def _file_reply(
    messages: Sequence[BaseMessage],
    findings: Sequence[Finding],
    history: FileView,
    asked_at: int,
    faults: ReaderFaults,
    digest: str,
    *,
    circle_name: str,
) -> Reply | None:
    """File calls for what the view lacks, with the faults the archive search has: a turn
    going round in circles (``circle_searches``) grepping for its first question's name, a
    call sent again (``repeat_search``); never more than the turn's budget."""
    made = [call for call in history.calls if call.message_index > asked_at]
    room = file_turn_budget(len(findings)) - len(made)
    if room <= 0 or not findings:
        return None
    if faults.fires("circle_searches", digest):
        circle = circle_commands(history, circle_name)
        return _calls_reply([circle[len(made) % 3]])
    repeated = last_answered(messages)
    if repeated is not None and faults.fires("repeat_search", digest):
        return _calls_reply([repeated])
    commands = plan_file_reads(findings, history, {call.key for call in made}, room)
    return _calls_reply(commands) if commands else None


def _calls_reply(commands: Sequence[tuple[str, dict[str, Any]]]) -> Reply:
    return Reply("", tuple(commands), "tool_calls")


def _search_reply(commands: Sequence[Command]) -> Reply:
    calls = tuple((SEARCH_TOOL, search_args(*command)) for command in commands)
    return Reply("", calls, "tool_calls")


def _last_search_answered(messages: Sequence[BaseMessage]) -> Command | None:
    """The command whose results are the last message (not a refusal), for `repeat_search`."""
    if not messages or message_kind(messages[-1]) != "search_result":
        return None
    last = messages[-1]
    assert isinstance(last, ToolMessage)
    if text_of(last).lstrip().startswith("Refused"):
        return None
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                if call.get("id") == last.tool_call_id and call["name"] == SEARCH_TOOL:
                    args = call["args"]
                    return (str(args.get("query", "")), args.get("from_item"), args.get("to_item"))
    return None


def answer_turn(
    messages: Sequence[BaseMessage], tools: frozenset[str], faults: ReaderFaults, digest: str
) -> Reply:
    """Answer the open question set, or search for what the context lacks."""
    asked_at, questions = open_questions(messages)
    assert asked_at is not None
    view = read_view(messages, misreads=misreads_for(faults, digest))
    findings = [answer(view, question) for question in questions]
    if SEARCH_TOOL in tools and not stop_requested(messages, asked_at):
        records = [record for record in view.searches if record.message_index > asked_at]
        if faults.fires("circle_searches", digest):
            name = questions[0].name
            circle: list[Command] = [
                (name, None, None),
                (name, None, view.latest_item),
                (name, 1, None),
            ]
            return _search_reply([circle[len(records) % 3]])
        repeated = _last_search_answered(messages)
        if repeated is not None and faults.fires("repeat_search", digest):
            return _search_reply([repeated])
        commands = plan_searches(findings, records, view.latest_item)
        if commands:
            return _search_reply(commands)
    elif (
        offers_files(tools)
        and view.history.path is not None
        and is_questions_message(text_of(messages[asked_at]))
    ):  # a set known only from a summary: its turn's calls were compacted away, budget spent
        reply = _file_reply(
            messages,
            findings,
            view.history,
            asked_at,
            faults,
            digest,
            circle_name=questions[0].name,
        )
        if reply is not None:
            return reply
    return Reply("\n".join(f"{finding.number}. {finding.answer}" for finding in findings))


def notes_turn(
    messages: Sequence[BaseMessage], faults: ReaderFaults, digest: str, *, rewrite: bool
) -> Reply:
    """Note-taking (a request or a re-ask): change lines, or a whole NOTES block, read with the
    call's misreads and each rule left out at the `drop_rules` rate."""
    misreads = misreads_for(faults, digest)

    def keeps_rule(rule: str) -> bool:
        return not faults.fires_for("drop_rules", digest, rule)

    if rewrite:
        return Reply(rewrite_notes(messages, misreads=misreads, keeps_rule=keeps_rule))
    changes = write_changes(messages, misreads=misreads, keeps_rule=keeps_rule)
    return Reply("\n".join(change.render() for change in changes))


def summary_turn(
    messages: Sequence[BaseMessage], faults: ReaderFaults, digest: str, *, budget: int
) -> Reply:
    """A summary, with the same faults a notes reply can have."""
    text = write_summary(
        messages,
        budget=budget,
        misreads=misreads_for(faults, digest),
        keeps_rule=lambda rule: not faults.fires_for("drop_rules", digest, rule),
    )
    return Reply(text)


def compose_reply(
    messages: Sequence[BaseMessage],
    *,
    tools: frozenset[str] = frozenset(),
    faults: ReaderFaults = NO_FAULTS,
    digest: str = "",
    rot: ContextRot = NO_ROT,
    summary_tokens: int = DEFAULT_SUMMARY_TOKENS,
) -> Reply:
    """The reader's reply to ``messages`` (every fault except the empty/length replies).

    One reading skill answers every kind of call: a summary, a notes request, a rewrite, a
    question set or a story turn. A reader bound to memory tools (the self-editing arms) edits
    its pinned state after each batch it reads (``memory``), with the same view and faults.
    """
    messages = with_rot(summaries_in_view(messages), rot)
    if is_summary_request(messages):
        return summary_turn(messages, faults, digest, budget=summary_tokens)
    ends = [index for index, message in enumerate(messages) if message_kind(message) != "rules"]
    if not ends:
        return Reply("OK.")
    last = messages[ends[-1]]
    kind = message_kind(last)
    if kind in ("notes_request", "rewrite_request"):
        return notes_turn(messages, faults, digest, rewrite=kind == "rewrite_request")
    if kind == "reask":  # the same faults as the request it follows (its own draws)
        rewrite = any(message_kind(m) == "rewrite_request" for m in messages)
        return notes_turn(messages, faults, digest, rewrite=rewrite)
    asked_at, _ = open_questions(messages)
    if asked_at is not None:
        return answer_turn(messages, tools, faults, digest)
    if edits_memory(tools):
        calls, text = memory_turn(messages, tools, faults, digest)
        return Reply(text, calls, "tool_calls") if calls else Reply(text)
    if READ_TOOL in tools and kind == "input":
        if isinstance(last, ToolMessage) and NO_MORE_BATCHES in text_of(last):
            return Reply("Done reading.")
        return Reply("", ((READ_TOOL, {}),), "tool_calls")
    items = [block.item for block in story_blocks([last]) if block.item is not None]
    return Reply(f"Read item {items[-1]}." if items else "OK.")


def reader_reply(
    messages: Sequence[BaseMessage],
    *,
    tools: frozenset[str],
    faults: ReaderFaults,
    call_kwargs: Mapping[str, Any],
    rot: ContextRot = NO_ROT,
    summary_tokens: int = DEFAULT_SUMMARY_TOKENS,
) -> tuple[Reply, str]:
    """The full reply, the empty-reply faults included, and the request digest it was decided by."""
    temperature = call_kwargs.get("temperature")
    extra = (
        {"temperature": temperature}
        if isinstance(temperature, int | float) and temperature > 0
        else None
    )
    digest = request_digest(messages, extra=extra)
    if faults.fires("think_to_limit", digest) and not thinking_switched_off(call_kwargs):
        return Reply("", finish_reason="length", reasoning=runaway_reasoning(digest)), digest
    if faults.fires("empty_reply", digest):
        return Reply(""), digest
    reply = compose_reply(
        messages,
        tools=tools,
        faults=faults,
        digest=digest,
        rot=rot,
        summary_tokens=summary_tokens,
    )
    return reply, digest


def to_ai_message(
    reply: Reply, digest: str, input_tokens: int, call_kwargs: Mapping[str, Any]
) -> AIMessage:
    output_tokens = reply_tokens(reply)
    metadata: dict[str, Any] = {"finish_reason": reply.finish_reason, "model_name": MODEL_NAME}
    if call_kwargs.get("reasoning_effort") is not None:
        metadata["reasoning_effort"] = call_kwargs["reasoning_effort"]
    return AIMessage(
        content=reply.content,
        tool_calls=[
            {"name": name, "args": args, "id": call_id(digest, index), "type": "tool_call"}
            for index, (name, args) in enumerate(reply.tool_calls)
        ],
        additional_kwargs={"reasoning_content": reply.reasoning} if reply.reasoning else {},
        response_metadata=metadata,
        usage_metadata={
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    )


# ---------------------------------------------------------------------------------------------
# The chat model
# ---------------------------------------------------------------------------------------------
def tool_name(tool: Any) -> str:
    if isinstance(tool, str):
        return tool
    return str(convert_to_openai_tool(tool)["function"]["name"])


class SimulatedReader(BaseChatModel):
    """The benchmark's simulated reader (not a language model): see the module docstring."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_name: str = MODEL_NAME
    faults: ReaderFaults = Field(default=NO_FAULTS)
    """Fault rates and the seed that decides them; none by default."""
    rot: ContextRot = Field(default=NO_ROT)
    """How much it overlooks far back in a long context; none by default."""
    summary_tokens: int = DEFAULT_SUMMARY_TOKENS
    """A summary's budget when the request states none (the NOTES budget of the run)."""
    bound_tools: tuple[str, ...] = ()
    """Names of the tools bound with `bind_tools`; the reader calls only these."""

    @property
    def _llm_type(self) -> str:
        return MODEL_NAME

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "faults": repr(self.faults),
            "rot": repr(self.rot),
            "summary_tokens": self.summary_tokens,
        }

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """A copy that knows the bound tools' names (tool_choice and schemas are not needed)."""
        clone = self.model_copy(update={"bound_tools": tuple(tool_name(tool) for tool in tools)})
        return clone.bind(**kwargs) if kwargs else clone

    def reply(self, messages: Sequence[BaseMessage], **kwargs: Any) -> AIMessage:
        """One reply to ``messages``; what `invoke` returns, without callbacks."""
        reply, digest = reader_reply(
            messages,
            tools=frozenset(self.bound_tools),
            faults=self.faults,
            call_kwargs=kwargs,
            rot=self.rot,
            summary_tokens=self.summary_tokens,
        )
        return to_ai_message(reply, digest, request_tokens(messages), kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        message = self.reply(messages, **kwargs)
        return ChatResult(
            generations=[ChatGeneration(message=message)],
            llm_output={"model_name": self.model_name},
        )
