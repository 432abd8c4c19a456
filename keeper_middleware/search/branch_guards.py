"""The search guards' state as a branch's own messages carry it (pure).

The guards remember the searches since the last new input (``guards``). Kept beside the graph,
keyed by thread, that memory served the wrong branch: after time travel a search was refused
as a repeat of one made only on the branch the user left. So each search's result carries the
guards' state after it (``ToolMessage.artifact``), and the next search works out its own from
the messages of the branch it runs on: the newest such state since the last new input, then the
searches made before it in the same reply (a reply may ask for several at once; they are
decided in the order the reply lists them, whichever runs first). The state forks, replays and
resumes with the messages; a resumed tool node decides its searches again exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from keeper_middleware.search.args import ReadArgs, Refusal, parse_search_args
from keeper_middleware.search.guards import GuardState, SearchCommand, decide
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

GUARD_ARTIFACT = "keeper_guard"
"""Key of the guards' state after a search, in its result's ``artifact``."""
STEP_ARTIFACT = "keeper_step"
"""Key of how many searches the guards had decided since the last new input, then."""


@dataclass(frozen=True, slots=True)
class GuardBefore:
    """The guards' state a search meets, and how many searches were decided before it."""

    state: GuardState
    step: int

    def artifact(self, after: GuardState) -> dict[str, Any]:
        """What the search's result carries: the state after it."""
        return {GUARD_ARTIFACT: after.to_json(), STEP_ARTIFACT: self.step + 1}


def command_of(args: object) -> SearchCommand | None:
    """The guards' view of a search call's arguments (None: refused before any guard)."""
    parsed = parse_search_args(args)
    if isinstance(parsed, Refusal):
        return None
    if isinstance(parsed, ReadArgs):
        return SearchCommand(query="", read=parsed.ref, page=parsed.page)
    return SearchCommand(query=parsed.query, from_item=parsed.from_item, to_item=parsed.to_item)


def carried(message: BaseMessage) -> tuple[GuardState, int] | None:
    """The guards' state a search result carries, and its step (None: it carries none)."""
    if not isinstance(message, ToolMessage) or message.name != SEARCH_TOOL_NAME:
        return None
    artifact = message.artifact
    if not isinstance(artifact, Mapping) or GUARD_ARTIFACT not in artifact:
        return None
    step = artifact.get(STEP_ARTIFACT)
    return GuardState.from_json(artifact[GUARD_ARTIFACT]), int(step) if isinstance(step, int) else 0


def _newest(messages: Sequence[BaseMessage]) -> tuple[GuardState, int] | None:
    best: tuple[GuardState, int] | None = None
    for message in messages:
        found = carried(message)
        if found is not None and (best is None or found[1] > best[1]):
            best = found
    return best


def guard_before(
    messages: Sequence[BaseMessage],
    call_id: str,
    is_new_input: Callable[[BaseMessage], bool],
    *,
    budget: int | None,
) -> GuardBefore | None:
    """The guards' state the search call ``call_id`` meets on the branch ``messages`` hold
    (None: no reply there asks for it, so the messages cannot say)."""
    at = next(
        (
            i
            for i in range(len(messages) - 1, -1, -1)
            if isinstance(messages[i], AIMessage)
            and any(call.get("id") == call_id for call in messages[i].tool_calls)  # type: ignore[attr-defined]
        ),
        None,
    )
    if at is None:
        return None
    start = next((i + 1 for i in range(at - 1, -1, -1) if is_new_input(messages[i])), 0)
    newest = _newest(messages[start:at])
    if newest is None:
        state, step = GuardState(budget=budget), 0
    else:  # the reply that asks now is the one sampled after a stop, if there was one
        state, step = replace(newest[0], sample_next=False), newest[1]
    reply = messages[at]
    assert isinstance(reply, AIMessage)
    for call in reply.tool_calls:
        if call.get("id") == call_id:
            break
        if call.get("name") != SEARCH_TOOL_NAME:
            continue
        command = command_of(call.get("args"))
        if command is not None:
            state = decide(state, command, budget=budget).state
            step += 1
    return GuardBefore(state, step)


def sample_now(messages: Sequence[BaseMessage]) -> bool | None:
    """Whether the next model call is the one reply sampled after a stop line, as the results
    since the last reply say (None: they carry no guards' state)."""
    last = next(
        (i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AIMessage)), None
    )
    if last is None:
        return None
    newest = _newest(messages[last + 1 :])
    return None if newest is None else newest[0].sample_next


def withheld_now(
    messages: Sequence[BaseMessage], is_new_input: Callable[[BaseMessage], bool]
) -> bool | None:
    """Whether the search tool is withheld from the next model call, as the branch's search
    results since its last new input say (None: none since then carries the guards' state)."""
    start = next((i + 1 for i in range(len(messages) - 1, -1, -1) if is_new_input(messages[i])), 0)
    newest = _newest(messages[start:])
    return None if newest is None else newest[0].withheld
