"""The archive search tool's guards: what ends a loop of searches.

Every rule here is a fix for a measured failure: the same search twice in a row is refused; a
search sent a third time since the last new input is refused (the archive has not changed); after
three refusals in a row the model is told to stop and answer, and that reply is sampled with some
randomness (a refusal alone did not end a loop of 362 identical searches); past a budget of
searches between two new inputs every search is stopped. After the stop line the tool is
withheld until new input arrives: a model that ignores the line (the same query, or a new one
each time) otherwise searched on until LangGraph's recursion limit ended the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.reinjection.additions import question_queries
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

STOP_LINE = "Stop searching now and answer with what you have."
NO_ANSWER = (
    "(No answer: the model asked for more archive searches after the searches for this input "
    "ran out. Ask again to go on.)"
)
"""The reply a run ends with when the model, no longer offered the search tool, only asked to
search again: the run's last message is never empty."""
SPENT_LINE = "Refused: stopped, answer now."
"""The refusal of a search after the stop line was given (a few tokens)."""


@dataclass(frozen=True, slots=True)
class SearchCommand:
    """One search, normalised so that repeats are recognised."""

    query: str
    from_item: int | None = None
    to_item: int | None = None
    read: str | None = None
    """A read of one archived message (``page`` of it) instead of a search."""
    page: int = 1

    @property
    def key(self) -> str:
        if self.read is not None:
            return f"read|{self.read}|{self.page}"
        return f"{' '.join(self.query.casefold().split())}|{self.from_item}|{self.to_item}"


@dataclass(frozen=True, slots=True)
class GuardState:
    """What the guards remember; JSON-like so it persists beside the archive."""

    last_key: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    refusals_in_row: int = 0
    sample_next: bool = False
    since_input: int = 0
    """Searches run since the last new input (reads of an archived message do not count)."""
    withheld: bool = False
    """The stop line was given: the model is not offered the tool until new input arrives."""
    budget: int | None = None
    """The searches this input's turn may run (:func:`turn_budget`); None: the caller's."""

    def to_json(self) -> dict[str, object]:
        return {
            "last_key": self.last_key,
            "counts": dict(self.counts),
            "refusals_in_row": self.refusals_in_row,
            "sample_next": self.sample_next,
            "since_input": self.since_input,
            "withheld": self.withheld,
            "budget": self.budget,
        }

    @classmethod
    def from_json(cls, data: object) -> GuardState:
        if not isinstance(data, dict):
            return cls()
        counts = data.get("counts") or {}
        return cls(
            last_key=data.get("last_key"),
            counts={str(k): int(v) for k, v in counts.items()},
            refusals_in_row=int(data.get("refusals_in_row") or 0),
            sample_next=bool(data.get("sample_next")),
            since_input=int(data.get("since_input") or 0),
            withheld=bool(data.get("withheld")),
            budget=int(budget) if isinstance(budget := data.get("budget"), int) else None,
        )


Verdict = Literal["run", "refuse", "stop"]


@dataclass(frozen=True, slots=True)
class GuardDecision:
    verdict: Verdict
    message: str
    """The refusal or stop text; empty when the search runs."""
    state: GuardState


def decide(
    state: GuardState, command: SearchCommand, *, budget: int | None = None
) -> GuardDecision:
    """Run, refuse or stop a search, and the guard state after it (pure).

    ``budget`` is how many searches may run between two new inputs; past it every search is
    stopped (a model that searches with a new query each time is never caught by the repeat
    guards: 127 of 128 such searches ran before the budget). The state's own budget, set for
    its input's turn (:func:`turn_budget`), wins over it.
    """
    key = command.key
    reading = command.read is not None
    if state.withheld and not reading:
        # the stop line was given already (in this reply, fifty calls at once): each call
        # past it is answered in a few tokens, not the line again, so a burst stays small
        return GuardDecision("stop", SPENT_LINE, replace(state, refusals_in_row=0))
    if state.budget is not None:
        budget = state.budget
    if budget is not None and not reading and state.since_input >= budget:
        return GuardDecision(
            "stop",
            f"Refused: {state.since_input} searches have run since the last new input, the "
            f"most allowed. {STOP_LINE}",
            replace(state, refusals_in_row=0, sample_next=True, withheld=True),
        )
    reason = ""
    if key == state.last_key:
        reason = (
            "Refused: this is the same search as the one just before; its results are above. "
            "Use them, or search for something else."
        )
    elif state.counts.get(key, 0) >= 2:
        reason = (
            "Refused: this search was already sent twice since the last new input, and the "
            "archive has not changed. Use the results you have."
        )
    if not reason:
        counts = {**state.counts, key: state.counts.get(key, 0) + 1}
        ran = state.since_input + (0 if reading else 1)
        return GuardDecision(
            "run",
            "",
            replace(state, last_key=key, counts=counts, refusals_in_row=0, since_input=ran),
        )
    refusals = state.refusals_in_row + 1
    if refusals >= 3:
        return GuardDecision(
            "stop",
            f"{reason}\n{STOP_LINE}",
            replace(state, refusals_in_row=0, sample_next=True, withheld=True),
        )
    return GuardDecision("refuse", reason, replace(state, refusals_in_row=refusals))


def after_new_input(state: GuardState, *, budget: int | None = None) -> GuardState:
    """New input arrived: the archive may have changed, so every search may run again (and
    the tool is offered again). ``budget``: the searches the new input's turn may run (None:
    the caller's budget)."""
    return GuardState(sample_next=state.sample_next, budget=budget)


def turn_budget(budget: int | None, per_question: int, questions: int) -> int | None:
    """The searches a turn may run: ``budget``, or ``per_question`` for each of the questions
    its input asks when that is more (a set of eleven questions needs more searches than a
    set of one; a budget of ten for both left a long set's last answers unsearched)."""
    if budget is None:
        return None
    return max(budget, per_question * questions)


def input_budget(budget: int | None, per_question: int, asked: BaseMessage | None) -> int | None:
    """The searches the turn of the input ``asked`` may run (:func:`turn_budget`), its
    questions counted as the lines that end in "?" (a message without one asks one)."""
    questions = len(question_queries(asked)) if asked is not None else 1
    return turn_budget(budget, per_question, questions)


def without_search_calls(reply: AIMessage) -> AIMessage:
    """``reply`` without its calls to the search tool (the same object when it has none).

    Used on a reply to a call that was not offered the tool: a model that calls it anyway
    (a scripted one, or a server that ignores the tool list) is not searching, it is looping,
    and the call would only be refused again. What else the reply says or calls stands."""
    calls = [c for c in reply.tool_calls if c["name"] != SEARCH_TOOL_NAME]
    invalid = [c for c in reply.invalid_tool_calls if c.get("name") != SEARCH_TOOL_NAME]
    if len(calls) == len(reply.tool_calls) and len(invalid) == len(reply.invalid_tool_calls):
        return reply
    update: dict[str, object] = {"tool_calls": calls, "invalid_tool_calls": invalid}
    content = reply.content
    kept: list[object] = (
        [b for b in content if not _is_search_block(b)] if isinstance(content, list) else []
    )
    if not calls and not invalid and not _has_text(reply.content, kept):
        # nothing left but the searches: the run's last word must still say something
        update["content"] = NO_ANSWER
        return reply.model_copy(update=update)
    if isinstance(reply.content, list):  # a provider that also lists calls as content blocks
        update["content"] = kept
    return reply.model_copy(update=update)


def _is_search_block(block: object) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") in ("tool_use", "tool_call")
        and block.get("name") == SEARCH_TOOL_NAME
    )


def _has_text(content: object, kept: Sequence[object]) -> bool:
    """Whether a reply's content says anything once its search blocks are gone."""
    if isinstance(content, str):
        return bool(content.strip())
    for block in kept:
        if isinstance(block, str) and block.strip():
            return True
        if (
            isinstance(block, dict)
            and block.get("type") == "text"
            and str(block.get("text", "")).strip()
        ):
            return True
    return False
