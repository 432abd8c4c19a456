"""The simulated reader as a summariser: the same reading skill as its notes, in the same budget.

Asked for a summary (the summarize arm's ``[SUMMARY REQUEST]``, or LangChain's and langmem's own
prompts: the last message is a user message that speaks of a summary), the reader keeps what such
a request asks for, with the care it gives a notes request:

- every rule and method sentence it sees, word for word;
- each counter's history, one line per change, with its item and its actor
  (``item 37: Mira Holt added 12 to domo86.``), and its value after its last change
  (``item 40: domo86 stood at 312.``), worked out from everything it was sent, a previous summary
  included;
- a question set that has no answer yet, word for word (langmem's node can summarise away the
  very message that asked it).

The summary has a budget: the one the request states ("within N tokens"), else the reader's own
(`SimulatedReader.summary_tokens`, by default the NOTES budget). Over budget, the oldest history
lines go first, then the values of the counters changed least recently (the keeper's NOTES
overflow the same way). What a summary arm then loses comes from its method: what it re-reads,
what it drops and how errors compound from one summary to the next. Results from it are labelled
"simulated reader".

langmem hands the model its summary in a system message; the reader reads system messages for
rules only, so :func:`summaries_in_view` shows such a summary as an ordinary message.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from keeper_bench.reader.files import FILE_TOOLS
from keeper_bench.reader.messages import open_questions
from keeper_bench.reader.misreads import NO_MISREADS, Misreads, misread
from keeper_bench.reader.text import (
    BATCH_HEAD_WORD,
    BATCH_HEAD_WORDS,
    CLERK,
    QUESTIONS_HEADS,
    Event,
    Recount,
    is_questions_message,
    read_events,
    read_questions,
    read_story,
    rule_sentences,
)
from keeper_middleware.messages.facts import keeper_kind, text_of

SUMMARY_REQUEST_TAG = "[SUMMARY REQUEST]"
LANGMEM_SUMMARY_START = "Summary of the conversation so far:"
DEEPAGENTS_SUMMARY_START = "You are in the middle of a conversation that has been summarized."
_SUMMARY_RESULTS = (
    "[SUMMARY]",  # the summarize arm's stored summary
    "Here is a summary of the conversation to date",  # LangChain's
    LANGMEM_SUMMARY_START,
    DEEPAGENTS_SUMMARY_START,  # Deep Agents' (its summary between <summary> tags)
)
_KEEPER_REQUESTS = frozenset({"notes_request", "notes_reask", "notes", "rules", "retrieved"})
_ITEM_HEAD = re.compile(rf"\b{BATCH_HEAD_WORD} (\d+)\.")
_QUESTION_LINE = re.compile(r"^\d+\. .*\?$")
_ANSWER_LINES = re.compile(r"^\s*\d+\.\s+\S", re.MULTILINE)
_SUMMARY_LINE = re.compile(r"^\s*(?:[-*]\s+)?item (\d+): (.+?)\s*$", re.MULTILINE)
_BUDGET = re.compile(r"within (\d[\d,]*) tokens")


def _every_rule(_rule: str) -> bool:
    return True


def is_summary_request(messages: Sequence[BaseMessage]) -> bool:
    """The last message asks for a summary: the summarize arm's tag, or a user message that
    speaks of one and is neither story, questions, a stored summary nor a keeper message."""
    if not messages or not isinstance(messages[-1], HumanMessage):
        return False
    last = messages[-1]
    text = text_of(last).lstrip()
    if text.startswith(SUMMARY_REQUEST_TAG):
        return True
    if keeper_kind(last) in _KEEPER_REQUESTS or text.startswith("["):
        return False
    if text.startswith(_SUMMARY_RESULTS) or text.startswith(
        tuple(f"{word} " for word in BATCH_HEAD_WORDS)
    ):
        return False
    return "summar" in text.lower() and not is_questions_message(text)


def stated_budget(request: str) -> int | None:
    """The budget a summary request states ("... within 4,096 tokens"), if any."""
    match = _BUDGET.search(request)
    return int(match.group(1).replace(",", "")) if match else None


# ---------------------------------------------------------------------------------------------
# What the summary knows: each counter's changes in order, with the value each left
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Step:
    item: int
    event: Event
    amount: int | None
    """The amount applied (a held change's is the other counter's value then); None: unknown."""
    value: int | None
    """The counter's value right after the change; None when it cannot be worked out."""


def story_pieces(
    texts: Sequence[str],
) -> tuple[list[tuple[int | None, list[Event]]], Recount | None]:
    """(item, events) in reading order: a previous summary's item lines, then story text split at
    its "Item N." heads (text before the first head belongs to no item)."""
    story: list[tuple[int | None, str]] = []
    tagged: list[tuple[int | None, list[Event]]] = []
    for text in texts:
        for line in _SUMMARY_LINE.finditer(text):
            tagged.append((int(line.group(1)), read_events(line.group(2))))
        rest = _SUMMARY_LINE.sub("", text)
        heads = list(_ITEM_HEAD.finditer(rest))
        if not heads or heads[0].start() > 0:
            story.append((None, rest[: heads[0].start()] if heads else rest))
        for number, head in enumerate(heads):
            end = heads[number + 1].start() if number + 1 < len(heads) else len(rest)
            story.append((int(head.group(1)), rest[head.start() : end]))
    read, recount = read_story([text for _, text in story])
    pieces = [(item, events) for (item, _), events in zip(story, read, strict=True)]
    return tagged + pieces, recount


def histories(pieces: Sequence[tuple[int | None, list[Event]]]) -> dict[str, list[Step]]:
    """Every counter's steps, replayed in reading order (an unknown start stays unknown until
    the counter is set)."""
    steps: dict[str, list[Step]] = {}
    item = 0
    for piece_item, events in pieces:
        item = piece_item if piece_item is not None else item
        for event in events:
            past = steps.setdefault(event.name, [])
            before = past[-1].value if past else None
            amount = event.amount
            if event.source is not None:
                source_steps = steps.get(event.source) or []
                amount = source_steps[-1].value if source_steps else None
            after = _after(event.kind, before, amount) if event.applied else before
            past.append(Step(item, event, amount, after))
    return steps


def _after(kind: str, before: int | None, amount: int | None) -> int | None:
    if amount is None:
        return None
    if kind == "set":
        return amount
    if before is None:
        return None
    return before + amount if kind in ("add", "add_held") else before - amount


def history_line(step: Step) -> str | None:
    """One change as a plain sentence with its item; None for a value line or an unknown amount."""
    event, amount = step.event, step.amount
    if amount is None or not event.actor:
        return None
    if event.kind == "set":
        if event.actor == CLERK:
            return f"item {step.item}: The clerk recorded {event.name} at {amount}."
        return f"item {step.item}: {event.actor} recorded {event.name} at {amount}."
    if event.kind in ("add", "add_held"):
        return f"item {step.item}: {event.actor} added {amount} to {event.name}."
    return f"item {step.item}: {event.actor} took {amount} from {event.name}."


def value_line(name: str, step: Step) -> str | None:
    if step.value is None:
        return None
    made_up = step.event.working
    working = f" (= {made_up})" if made_up is not None and step.event.kind == "set" else ""
    return f"item {step.item}: {name} stood at {step.value}{working}."


# ---------------------------------------------------------------------------------------------
# Writing it within the budget
# ---------------------------------------------------------------------------------------------
def _tokens(lines: Sequence[str]) -> int:
    return (sum(len(line) + 1 for line in lines) + 3) // 4


def fit(
    fixed: Sequence[str], values: dict[str, str], history: dict[str, list[str]], budget: int
) -> list[str]:
    """The summary's lines within ``budget`` tokens: the fixed lines (rules, an open question set)
    always; each counter's value line unless even those do not fit (the counters changed least
    recently go first); history lines newest first while room is left. Counters are written in
    the order given (least recently changed first), each with its kept history, then its value."""
    names = list(values)
    while names and _tokens([*fixed, *(values[n] for n in names)]) > budget:
        names.pop(0)
    used = _tokens([*fixed, *(values[n] for n in names)])
    newest_first = sorted(
        ((name, index) for name in names for index in range(len(history.get(name, [])))),
        key=lambda pair: (-_item_of(history[pair[0]][pair[1]]), pair[1]),
    )
    kept: set[tuple[str, int]] = set()
    for name, index in newest_first:
        cost = (len(history[name][index]) + 1 + 3) // 4
        if used + cost > budget:
            break
        kept.add((name, index))
        used += cost
    lines = list(fixed)
    for name in names:
        lines += [line for index, line in enumerate(history.get(name, [])) if (name, index) in kept]
        lines.append(values[name])
    return lines


def _item_of(line: str) -> int:
    match = _SUMMARY_LINE.match(line)
    return int(match.group(1)) if match else 0


def write_summary(
    messages: Sequence[BaseMessage],
    *,
    budget: int,
    misreads: Misreads = NO_MISREADS,
    keeps_rule: Callable[[str], bool] = _every_rule,
) -> str:
    """The summary of everything sent, the request's own text included and read first: langmem
    puts the previous summary there (after the new messages, though it comes before them in the
    story), LangChain the whole conversation, the summarize arm nothing but the request.

    ``misreads`` strike what it reads (each text, a previous summary's lines included) and a
    rule ``keeps_rule`` refuses is left out, as in a notes reply."""
    texts = [text_of(message) for message in [*messages[-1:], *messages[:-1]]]
    budget = stated_budget(texts[0]) or budget
    asked = unanswered_in_transcript(texts[0])
    texts[0] = without_file_results(texts[0])
    pieces, recount = story_pieces(texts)
    if misreads:
        read = misread([events for _, events in pieces], misreads)
        pieces = [(item, events) for (item, _), events in zip(pieces, read, strict=True)]
    steps = histories(pieces)
    order = sorted(steps, key=lambda name: (steps[name][-1].item, list(steps).index(name)))
    values: dict[str, str] = {}
    history: dict[str, list[str]] = {}
    for name in order:
        line = value_line(name, steps[name][-1])
        if line is None:
            continue
        values[name] = line
        history[name] = [h for h in map(history_line, steps[name]) if h is not None]
    fixed = [rule for rule in rule_sentences(texts) if keeps_rule(rule)]
    if recount is not None:  # begun in the last item summarised, finished in the next one
        fixed.append(recount.sentence())
    asked_at, _ = open_questions(messages[:-1])
    if asked_at is not None:  # a question set being summarised away is kept, word for word
        fixed.append(text_of(messages[asked_at]))
    elif asked is not None:  # the same, in a request that sends the conversation as text
        fixed.append(asked)
    lines = fit(fixed, values, history, budget)
    return "\n".join(lines) if lines else "Nothing to keep yet."


_TRANSCRIPT_MESSAGE = re.compile(r'<message type="(\w+)">(.*?)</message>', re.DOTALL)
_CALLED_TOOL = re.compile(r'<tool_call id="[^"]*" name="([^"]+)">')


def unanswered_in_transcript(text: str) -> str | None:
    """The last question set of a conversation sent as text (``<message type="human">``...,
    Deep Agents' summary request) that no later AI message answers, word for word."""
    asked: str | None = None
    for match in _TRANSCRIPT_MESSAGE.finditer(text):
        kind, body = match.group(1), match.group(2)
        block = question_block(body) if kind == "human" else None
        if block is not None:
            asked = block
        elif kind == "ai" and _ANSWER_LINES.search(body):
            asked = None
    return asked


def question_block(text: str) -> str | None:
    """The last question set in ``text``: its head and its numbered questions, word for word."""
    start = max(text.rfind(head) for head in QUESTIONS_HEADS)
    if start < 0:
        return None
    head, *rest = text[start:].splitlines()
    questions = list(itertools.takewhile(_QUESTION_LINE.match, rest))
    block = "\n".join([head, *questions])
    return block if read_questions(block) else None


def without_file_results(text: str) -> str:
    """A conversation sent as text without the results of its file-tool calls: a file read
    back holds older batches (and grep lines) that are not new story, and the summary already
    stands for them."""
    kept: list[str] = []
    cursor = 0
    file_call = False
    for match in _TRANSCRIPT_MESSAGE.finditer(text):
        kind, body = match.group(1), match.group(2)
        if kind == "ai":
            file_call = any(name in FILE_TOOLS for name in _CALLED_TOOL.findall(body))
        elif kind == "tool" and file_call:
            kept.append(text[cursor : match.start()])
            cursor = match.end()
    kept.append(text[cursor:])
    return "".join(kept)


def summary_in(messages: Sequence[BaseMessage]) -> str | None:
    """The summary a request carries, without its header ("" for an empty one), or None when it
    carries none: what a summarising arm's memory is at that call."""
    for message in reversed(messages):
        text = text_of(message).lstrip()
        if text.startswith(LANGMEM_SUMMARY_START):
            return text[len(LANGMEM_SUMMARY_START) :].strip()
        if text.startswith(DEEPAGENTS_SUMMARY_START):
            inside = text.partition("<summary>")[2].rpartition("</summary>")[0]
            return inside.strip()
        if text.startswith(_SUMMARY_RESULTS):
            return text.partition("\n")[2].strip()
    return None


def summaries_in_view(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The messages with langmem's summary (a system message) shown as an ordinary message."""
    return [
        HumanMessage(content=text_of(message), id=message.id)
        if isinstance(message, SystemMessage)
        and text_of(message).lstrip().startswith(LANGMEM_SUMMARY_START)
        else message
        for message in messages
    ]
