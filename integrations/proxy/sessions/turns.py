"""One chat request in flight, shaped for the upstream, and the answer it gets.

Kept apart from the engine (``engine.py``) because this is the request's own data, with no I/O:
the tools the upstream is offered (the agent's, plus the archive search), the sampling limits
capped to the keeper's reply reserve, the parameters note calls may take, and the usage of every
upstream call of the turn summed into one. The engine holds sessions and calls the upstream.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keeper_middleware.integrations.proxy.conversation.form import SEARCH_TOOL_SCHEMA, ChatRequest
from keeper_middleware.integrations.proxy.conversation.params import translate_params
from keeper_middleware.integrations.proxy.conversation.resent import Resent
from keeper_middleware.integrations.proxy.conversation.wire import WireContext
from keeper_middleware.integrations.proxy.sessions.metrics import ProxyStats
from keeper_middleware.integrations.proxy.sessions.records import SessionRecord
from keeper_middleware.integrations.proxy.slots.parking import SlotLease
from keeper_middleware.integrations.proxy.upstream.apis import UpstreamApi
from keeper_middleware.integrations.proxy.upstream.client import CallTally, Forward
from keeper_middleware.keeper import ModelSetup
from keeper_middleware.search.schema import SEARCH_TOOL_NAME

FOR_NOTES = ("model",)
"""The agent's fields a note call carries besides the messages and tools: what names the model
(the prompt prefix is the messages and tools, rendered as in a work call). Everything else the
agent sets (stop, max_tokens, logprobs, temperature, response_format, ...) shapes the agent's
own replies; a note call takes the keeper's generation settings instead. An allowlist, so a
field no one has thought of yet never reaches a note call. A note call's reply is bounded by the
room the window leaves (the reply reserve), under the limit field the agent uses."""
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def _limit_field(params: Mapping[str, Any], api: str = "chat") -> str:
    """The reply-limit field the upstream takes: Responses' ``max_output_tokens``, Messages'
    ``max_tokens``; for Chat Completions the one the agent sent, else ``max_tokens`` (newer
    OpenAI models take only ``max_completion_tokens``; agents that talk to them send it)."""
    if api == "responses":
        return "max_output_tokens"
    if api == "messages":
        return "max_tokens"
    return "max_completion_tokens" if "max_completion_tokens" in params else "max_tokens"


def new_id() -> str:
    """A message id the proxy gives what it adds to a session's window: 64 random bits from
    the ``random`` module, which is seeded from the system at start and again in a forked
    child (``uuid4`` reads the system's randomness on every call, a system call per id)."""
    return f"p-{random.getrandbits(64):016x}"


@dataclass(slots=True)
class Answer:
    """One request's answer: the last upstream envelope, the agent's message, the finish
    reason, the usage of every upstream call of the turn, and the text already streamed."""

    data: dict[str, Any]
    message: dict[str, Any]
    reason: str
    usage: dict[str, Any] | None
    streamed: dict[str, str] = field(default_factory=dict)
    streamed_logprobs: dict[str, int] = field(default_factory=dict)
    """How many log probabilities of each list were streamed already."""
    call: int = 0
    """The number of the upstream work call that gave the answer (the streamed pieces of each
    call carry theirs)."""


@dataclass(slots=True)
class Turn:
    """One request in flight: what every upstream call of it shares."""

    session: str
    setup: ModelSetup
    tools: tuple[dict[str, Any], ...]
    params: Mapping[str, Any]
    note_params: Mapping[str, Any]
    auth: str | None
    forward: Forward | None
    started: float = field(default_factory=time.perf_counter)
    existed: bool = True
    """Whether the session was stored before this request (set when it is taken in)."""
    tally: CallTally = field(default_factory=CallTally)
    counted: bool = False
    """Whether the request's calls and time were added to the session's counters."""
    unsaved: SessionRecord | None = None
    """The record as taken in, while it is not saved yet (saved with the reply, or with the
    counters if the request fails)."""
    usage: dict[str, int] = field(default_factory=dict)
    streamed: dict[str, str] = field(default_factory=dict)
    streamed_logprobs: dict[str, int] = field(default_factory=dict)
    lease: SlotLease | None = None
    """The server slot every upstream call of the request is pinned to (slot parking)."""
    search_tool: dict[str, Any] | None = None
    """The archive search in the upstream's tool format, when the proxy offers it (the agent
    has no tool of that name): one of ``tools``, by identity."""
    context: WireContext | None = None
    """What the client's front door read besides the neutral request (None: Chat Completions)."""
    reply_id: str | None = None
    """The id the final reply gets in the session (a Responses front door names its response
    by it), instead of a fresh one."""
    main_calls: int = 0
    """Work calls made so far (search rounds and retries each make one)."""
    carried: str = ""
    """Text passed on to a streaming agent by earlier upstream calls of this request (before a
    search round): the agent's reply begins with it."""
    withheld: bool = False
    """Whether the archive search was left out of the last work call (past the session's
    stop line): its search calls, if any, are not answered."""
    resent: Resent | None = None
    """What the session keeps of this request to read the next one (:mod:`.resent`), once it
    is taken in: the reply joins it."""

    def add_usage(self, data: Mapping[str, Any]) -> None:
        """Add one upstream call's usage (and its cached prompt tokens) to the turn's."""
        usage = data.get("usage")
        if not isinstance(usage, dict):
            return
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = usage.get(key)
            if isinstance(value, int):
                self.usage[key] = self.usage.get(key, 0) + value
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(cached, int):
            self.usage["cached_tokens"] = self.usage.get("cached_tokens", 0) + cached

    def count_into(self, stats: ProxyStats) -> ProxyStats:
        """``stats`` (the session's counters) with the request's upstream calls and time added,
        once: a save that failed after counting is not counted twice."""
        if self.counted:
            return stats
        self.counted = True
        tally, elapsed = self.tally, time.perf_counter() - self.started
        stats.requests += 1
        stats.upstream_calls += tally.calls
        stats.upstream_retries += tally.retries
        stats.upstream_failures += tally.failures
        stats.upstream_seconds += tally.seconds
        stats.backoff_seconds += tally.waited
        stats.added_seconds += max(0.0, elapsed - tally.seconds - tally.waited)
        return stats

    def summed_usage(self) -> dict[str, Any] | None:
        """The turn's usage in OpenAI's shape, or None when no call reported any."""
        if not self.usage:
            return None
        summed: dict[str, Any] = {k: v for k, v in self.usage.items() if k != "cached_tokens"}
        if "cached_tokens" in self.usage:
            summed["prompt_tokens_details"] = {"cached_tokens": self.usage["cached_tokens"]}
        return summed


def shape_turn(
    session: str,
    request: ChatRequest,
    auth: str | None,
    forward: Forward | None,
    *,
    reserve: int,
    api: UpstreamApi | None = None,
    setup: Callable[[str | None, tuple[dict[str, Any], ...]], ModelSetup] | None = None,
) -> Turn:
    """The request as every upstream call of it is sent: the search tool added to the agent's
    tools, and reply limits no larger than ``reserve`` (the room the window leaves). ``api``
    is the upstream's (default: Chat Completions); the keeper counts the tools in their chat
    form whatever API carries them. ``setup`` makes the keeper's setup of a system prompt and
    tools (:meth:`.SessionSetups.setup`; default: a new one)."""
    own = [t["function"]["name"] for t in request.tools]
    offered = SEARCH_TOOL_NAME not in own
    neutral = (*request.tools, SEARCH_TOOL_SCHEMA) if offered else tuple(request.tools)
    if api is None or (api.name == "chat" and request.api == "chat"):
        tools, search = neutral, SEARCH_TOOL_SCHEMA if offered else None
        params = dict(request.params)
        note_fields: tuple[str, ...] = FOR_NOTES
    else:
        search = dict(api.search_tool) if offered else None
        tools = (*api.tools(request), *([search] if search is not None else []))
        params = translate_params(request.params, request.api, api.name)
        note_fields = api.note_fields
    for key in LIMIT_FIELDS:  # the window leaves room for reply_reserve tokens, no more
        if isinstance(params.get(key), int) and params[key] > reserve:
            params[key] = reserve
    note_params = {k: params[k] for k in note_fields if k in params}
    note_params[_limit_field(params, api.name if api is not None else "chat")] = reserve
    return Turn(
        session=session,
        setup=(setup or _new_setup)(request.system_prompt, neutral),
        tools=tuple(tools),
        params=params,
        note_params=note_params,
        auth=auth,
        forward=forward,
        search_tool=search,
        context=request.context,
    )


def _new_setup(system_prompt: str | None, tools: tuple[dict[str, Any], ...]) -> ModelSetup:
    return ModelSetup(system_prompt=system_prompt, tools=tools)
