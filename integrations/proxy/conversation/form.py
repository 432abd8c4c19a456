"""OpenAI chat-completions JSON ⇄ LangChain messages, for the keeper proxy (pure functions).

The proxy reads an agent's request into LangChain messages (what the keeper engine works on),
renders the keeper's window back into an upstream request, and turns the upstream's reply into
what the agent receives, as one JSON body or as server-sent events. Every function here is pure,
so each conversion is tested without a server.

Rendering is deterministic: the same messages always give the same JSON, so consecutive upstream
requests (main calls and note calls alike) share their prefix and the server's prefix cache
serves it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, overload

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
    convert_to_openai_messages,
)

from keeper_middleware.errors import KeeperError, MalformedDataError
from keeper_middleware.integrations.proxy.conversation.resent import Fingerprints, Resent
from keeper_middleware.messages.facts import text_of
from keeper_middleware.search.schema import (
    SEARCH_TOOL_DESCRIPTION,
    SEARCH_TOOL_NAME,
    SEARCH_TOOL_PARAMETERS,
)

__all__ = [
    "SEARCH_TOOL_SCHEMA",
    "WIRE_KEY",
    "ChatRequest",
    "LazyMessages",
    "RequestError",
    "digest_of",
    "error_body",
    "message_from_openai",
    "message_key",
    "message_to_openai",
    "parse_chat_request",
    "upstream_body",
]

SEARCH_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SEARCH_TOOL_NAME,
        "description": SEARCH_TOOL_DESCRIPTION,
        "parameters": SEARCH_TOOL_PARAMETERS,
    },
}
WIRE_KEY = "keeper_wire"
"""Where a message, or a reply read from a Responses or Messages upstream, carries the items of
the API it came through (:mod:`.wire`); never sent to a chat model or a chat client."""
_SYSTEM_ROLES = ("system", "developer")
_ROLES = ("system", "developer", "user", "assistant", "tool")
_OWN_FIELDS = ("messages", "tools", "stream", "stream_options")
_TEXT_OR_NULL = (str, type(None))
_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


class RequestError(KeeperError, ValueError):
    """A request the proxy cannot take; answered with a 4xx in OpenAI's error shape."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def error_body(
    message: str,
    *,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error shape, which both the official client and LangChain read."""
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    """An agent's chat request, read and checked."""

    system_prompt: str | None
    """The leading system (or developer) messages, joined: the keeper renders it on every call."""
    messages: Sequence[BaseMessage]
    """The agent's history after the system prompt, without ids (the proxy assigns them).
    Plain user and assistant messages are converted when first read (:class:`LazyMessages`)."""
    tools: tuple[dict[str, Any], ...]
    """The agent's own tool schemas, untouched."""
    stream: bool
    include_usage: bool
    params: Mapping[str, Any]
    """Every other field (model, temperature, unknown ones), forwarded untouched."""
    keys: tuple[int | None, ...] = ()
    """A cheap key per message (:func:`message_key`), so fingerprints can be reused by position."""
    api: str = "chat"
    """The API the client spoke: ``chat``, ``responses`` or ``messages``."""
    context: Any = None
    """What the front door read besides the neutral request (a :class:`~.wire.WireContext`;
    None for Chat Completions)."""
    given_digests: tuple[str, ...] = ()
    """The messages' fingerprints, when the front door computed them already."""
    continues: str | None = None
    """For a request that sends only what follows a response of the session (Responses'
    ``previous_response_id``): the id that response's reply has in the session. The request is
    refused unless that reply is still the last message the session took in."""
    reply_id: str | None = None
    """The id to give this request's final reply in the session (instead of a fresh one)."""
    keep_dropped: bool = False
    """Messages taken in earlier that this request no longer carries stay where they are (in
    view, or archived), instead of being withdrawn: the client compacted its own history."""
    raw: Sequence[Any] = ()
    """The request's ``messages`` as parsed JSON (Chat Completions), kept with the session so
    the next request's resent part is confirmed in one comparison (:mod:`.resent`)."""
    resent_pairs: Fingerprints = ()
    """(key, fingerprint) of the leading messages confirmed to be the session's last request's:
    they were not checked, keyed or fingerprinted again."""

    @property
    def digests(self) -> tuple[str, ...]:
        if len(self.given_digests) == len(self.messages):
            return self.given_digests
        return tuple(digest_of(m) for m in self.messages)

    def digests_reusing(
        self, previous: Sequence[tuple[int | None, str]]
    ) -> tuple[tuple[int | None, str], ...]:
        """(key, fingerprint) per message, taking the fingerprint from ``previous`` wherever the
        same position holds a message with the same key. An agent resends its whole history on
        every call; fingerprinting only what changed keeps a request's cost from growing with it."""
        if len(self.keys) != len(self.messages):
            return tuple((None, d) for d in self.digests)
        pairs = list(self.resent_pairs)
        keys = self.keys
        for position in range(len(pairs), len(keys)):
            key = keys[position]
            known = previous[position] if position < len(previous) else None
            if key is not None and known is not None and known[0] == key:
                pairs.append(known)
            else:
                pairs.append((key, digest_of(self.messages[position])))
        return tuple(pairs)


class LazyMessages(Sequence[BaseMessage]):
    """Raw OpenAI messages converted on first read. An agent resends its whole history on every
    call and the proxy only needs the new messages as LangChain messages; only messages that
    cannot fail to convert (those with a :func:`message_key`) are left for later."""

    def __init__(self, raw: Sequence[Any], first: int, ready: Mapping[int, BaseMessage]) -> None:
        self._raw, self._first = raw, first
        self._converted: dict[int, BaseMessage] = dict(ready)

    def __len__(self) -> int:
        return len(self._raw) - self._first

    @overload
    def __getitem__(self, index: int) -> BaseMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[BaseMessage]: ...

    def __getitem__(self, index: int | slice) -> BaseMessage | list[BaseMessage]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(index)
        if position not in self._converted:
            at = self._first + position
            self._converted[position] = message_from_openai(self._raw[at], at)
        return self._converted[position]


def _plain_fields(raw: dict[str, Any], *, but: str) -> bool:
    """Whether every field of ``raw`` except ``but`` is a string or null (C speed: map())."""
    values = (v for k, v in raw.items() if k != but) if but in raw else raw.values()
    return all(map(isinstance, values, repeat(_TEXT_OR_NULL)))


def _call_key(call: object) -> tuple[Any, str, str] | None:
    """(id, name, arguments) of a tool call whose fields are all as they must be, else None."""
    if not isinstance(call, dict):
        return None
    function = call.get("function")
    if not isinstance(function, dict):
        return None
    name, arguments, call_id = function.get("name"), function.get("arguments"), call.get("id")
    if (
        type(name) is not str
        or type(arguments) is not str
        or not isinstance(call_id, _TEXT_OR_NULL)
    ):
        return None
    return call_id, name, arguments


def message_key(raw: object) -> int | None:
    """Python's hash of everything a message's fingerprint and conversion depend on, for a
    message that cannot fail to convert (every field as it must be), else None.

    Such a message is converted only when first needed (:class:`LazyMessages`): an agent resends
    its whole history on every call, its tool calls and tool results included, and the proxy
    needs only the new messages as LangChain messages. Equal fields, equal key; it is computed at
    C speed and lives only in the process's memory (Python seeds it per process), never in the
    archive. Reusing a wrong fingerprint would take a 64-bit collision at the same position of
    the same session.
    """
    if not isinstance(raw, dict):
        return None
    role = raw.get("role")
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if type(call_id) is not str or not call_id or not _plain_fields(raw, but=""):
            return None
        return hash((role, raw.get("content") or "", call_id))
    if role not in ("user", "assistant"):
        return None
    calls = raw.get("tool_calls")
    if calls is None:
        if not _plain_fields(raw, but=""):
            return None
        return hash((role, raw.get("content") or ""))
    if role != "assistant" or type(calls) is not list or not _plain_fields(raw, but="tool_calls"):
        return None
    keys = tuple(map(_call_key, calls))
    if None in keys:
        return None
    return hash((role, raw.get("content") or "", keys))


def parse_chat_request(body: object, resent: Resent | None = None) -> ChatRequest:
    """Read a ``POST /v1/chat/completions`` body; a :class:`RequestError` says what is wrong.

    ``resent`` is the session's last request: when this one starts with exactly its messages,
    those were checked then and are not checked, keyed or fingerprinted again (only what follows
    is); otherwise every message is."""
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object with a 'messages' list.")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("'messages' must be a non-empty list of messages.", param="messages")
    if body.get("n") not in (None, 1):
        raise RequestError(
            "The keeper proxy returns one choice; send n=1 or leave n out.", param="n"
        )
    lead = 0
    while (
        lead < len(raw) and isinstance(raw[lead], dict) and raw[lead].get("role") in _SYSTEM_ROLES
    ):
        lead += 1
    system_texts = [_text_content(raw[i], i) for i in range(lead)]
    confirmed = resent.confirmed(raw) if resent is not None else 0
    reused = resent.pairs if confirmed and resent is not None else ()
    keys: list[int | None] = [None] * len(reused)
    checked: dict[int, BaseMessage] = {}
    for i in range(lead + len(reused), len(raw)):  # only what was not confirmed
        key = message_key(raw[i])
        if key is None:
            checked[i - lead] = message_from_openai(raw[i], i)
        keys.append(key)
    messages = LazyMessages(raw, lead, checked)
    if not messages:
        raise RequestError(
            "'messages' holds only system messages; add the user's message.", param="messages"
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false.", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object.", param="stream_options")
    return ChatRequest(
        system_prompt="\n\n".join(system_texts) if system_texts else None,
        messages=messages,
        tools=_parse_tools(body.get("tools")),
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        params={k: v for k, v in body.items() if k not in _OWN_FIELDS},
        keys=tuple(keys),
        raw=raw,
        resent_pairs=reused,
    )


def _parse_tools(raw: object) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RequestError("'tools' must be a list of function tools.", param="tools")
    for position, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise RequestError(
                f"tools[{position}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'parameters': ...}}}}; other tool types are not supported by the keeper proxy.",
                param=f"tools[{position}]",
            )
    return tuple(raw)


def _text_content(raw: Mapping[str, Any], position: int) -> str:
    content = _content(raw, position)
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")


def _content(raw: Mapping[str, Any], position: int) -> str | list[dict[str, Any]]:
    content = raw.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return [dict(p) for p in content]
    raise RequestError(
        f"messages[{position}].content must be a string, a list of content parts or null.",
        param=f"messages[{position}].content",
    )


def message_from_openai(raw: object, position: int = 0) -> BaseMessage:
    """One OpenAI chat message as a LangChain message; reasoning the agent sends back is dropped."""
    if not isinstance(raw, dict) or raw.get("role") not in _ROLES:
        raise RequestError(
            f"messages[{position}] must be an object with a 'role' among {list(_ROLES)}.",
            param=f"messages[{position}].role",
        )
    role, content = raw["role"], _content(raw, position)
    name = raw.get("name") if isinstance(raw.get("name"), str) else None
    if role in _SYSTEM_ROLES:
        return SystemMessage(content=content)  # type: ignore[arg-type]
    if role == "user":
        return HumanMessage(content=content, name=name)  # type: ignore[arg-type]
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise RequestError(
                f"messages[{position}] is a tool result without a 'tool_call_id'.",
                param=f"messages[{position}].tool_call_id",
            )
        return ToolMessage(content=content, tool_call_id=call_id, name=name)  # type: ignore[arg-type]
    calls, invalid = _tool_calls(raw.get("tool_calls"), position)
    return AIMessage(
        content=content,  # type: ignore[arg-type]
        name=name,
        tool_calls=calls,
        invalid_tool_calls=invalid,
    )


def _tool_calls(raw: object, position: int) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        raise RequestError(
            f"messages[{position}].tool_calls must be a list of tool calls or null, not "
            f"{type(raw).__name__}.",
            param=f"messages[{position}].tool_calls",
        )
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for index, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(
                f"messages[{position}].tool_calls[{index}] needs function.name and "
                "function.arguments.",
                param=f"messages[{position}].tool_calls",
            )
        call_id = str(call.get("id") or "")
        arguments = function.get("arguments")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        try:
            args = (
                json.loads(text, parse_float=_finite, parse_constant=_no_constant)
                if text.strip()
                else {}
            )
        except (ValueError, RecursionError):
            args = None
        if isinstance(args, dict):
            calls.append(ToolCall(name=function["name"], args=args, id=call_id, type="tool_call"))
        else:
            invalid.append(
                InvalidToolCall(
                    name=function["name"],
                    args=text,
                    id=call_id,
                    error="not a JSON object",
                    type="invalid_tool_call",
                )
            )
    return calls, invalid


def _finite(text: str) -> float:
    """JSON numbers only: ``1e400`` would become infinity, which no JSON store can hold."""
    value = float(text)
    if math.isinf(value):
        raise MalformedDataError(f"the number {text[:20]} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise MalformedDataError(f"{name} is not a JSON number")


def message_to_openai(message: BaseMessage) -> dict[str, Any]:
    """A LangChain message as the upstream reads it (reasoning never included).

    ``convert_to_openai_messages`` does the work; what it lacks is added here: a tool call the
    model sent with arguments that were not JSON is sent back as it came (LangChain drops it,
    which would leave its result without a call), and reasoning is never included."""
    rendered = convert_to_openai_messages(message, text_format="string")
    assert isinstance(rendered, dict)
    if isinstance(message, AIMessage):
        rendered.pop("reasoning_content", None)
        calls = list(rendered.get("tool_calls") or [])
        calls += [
            _call_json(c["id"], c["name"], c["args"] if isinstance(c["args"], str) else "")
            for c in message.invalid_tool_calls
        ]
        if calls:
            rendered["tool_calls"] = calls
            rendered["content"] = rendered.get("content") or None
    return rendered


def _named(rendered: dict[str, Any], message: BaseMessage) -> dict[str, Any]:
    if message.name:
        rendered["name"] = message.name
    return rendered


def _call_json(call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    return {
        "id": call_id or "",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def digest_of(message: BaseMessage) -> str:
    """A fingerprint of what an agent message says, stable across re-serialisation.

    It ignores what clients change when they send a message back (null vs "" content, spacing in
    tool arguments, reasoning fields, think blocks, surrounding whitespace), so the reply the proxy
    returned is recognised when the agent sends it back.
    """
    content: Any = message.content
    if isinstance(content, list) and all(
        isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text") for p in content
    ):
        content = text_of(message)
    if isinstance(content, str):
        content = _THINK_BLOCK.sub("", content).strip()
    canonical: dict[str, Any] = {"role": message.type, "content": content}
    if isinstance(message, AIMessage):
        canonical["calls"] = [[c["id"], c["name"], c["args"]] for c in message.tool_calls]
        canonical["invalid"] = [[c["id"], c["name"], c["args"]] for c in message.invalid_tool_calls]
    if isinstance(message, ToolMessage):
        canonical["call_id"] = message.tool_call_id
    text = json.dumps(canonical, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def upstream_body(
    messages: Sequence[BaseMessage],
    tools: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    call_kwargs: Mapping[str, Any],
    as_openai: Callable[[BaseMessage], dict[str, Any]] = message_to_openai,
) -> dict[str, Any]:
    """One non-streaming upstream request (``as_openai``: :func:`message_to_openai` or a memo
    of it).

    ``call_kwargs`` are the keeper's (``reasoning_effort``, thinking on/off): in the shape a
    ``ChatOpenAI`` call takes them, so ``extra_body`` is merged at the top level as it would be.
    """
    body: dict[str, Any] = {k: v for k, v in params.items() if k not in _OWN_FIELDS}
    for key, value in call_kwargs.items():
        if key == "extra_body" and isinstance(value, Mapping):
            body.update(value)
        else:
            body[key] = value
    body["messages"] = [as_openai(m) for m in messages]
    if tools:
        body["tools"] = [dict(t) for t in tools]
    body["stream"] = False
    return body
