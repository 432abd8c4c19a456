"""One OpenAI chat message ⇄ one LangChain message, and the upstream's request (pure).

The proxy reads an agent's messages into LangChain messages (what the keeper engine works on)
and renders the keeper's window back into an upstream request. Rendering is deterministic: the
same messages always give the same JSON, so consecutive upstream requests (main calls and note
calls alike) share their prefix and the server's prefix cache serves it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import is_
from typing import Any

import orjson
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

from keeper_middleware.errors import MalformedDataError
from keeper_middleware.integrations.proxy.conversation.form import OWN_FIELDS, RequestError
from keeper_middleware.integrations.proxy.conversation.plain_forms import plain_form

__all__ = [
    "SYSTEM_ROLES",
    "ListedForms",
    "assistant_from_openai",
    "body_json",
    "content_of",
    "joined_forms",
    "message_from_openai",
    "message_to_openai",
    "upstream_body",
]

SYSTEM_ROLES = ("system", "developer")
_ROLES = ("system", "developer", "user", "assistant", "tool")


def content_of(raw: Mapping[str, Any], position: int) -> str | list[dict[str, Any]]:
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


def message_from_openai(raw: object, position: int = 0, msg_id: str | None = None) -> BaseMessage:
    """One OpenAI chat message as a LangChain message; reasoning the agent sends back is dropped.
    ``msg_id``: the id it is made with (the session's, for a message taken in: made once, not
    made and then copied to carry it)."""
    if not isinstance(raw, dict) or raw.get("role") not in _ROLES:
        raise RequestError(
            f"messages[{position}] must be an object with a 'role' among {list(_ROLES)}.",
            param=f"messages[{position}].role",
        )
    role = raw["role"]
    if role == "assistant":
        return assistant_from_openai(raw, position, id=msg_id)
    content = content_of(raw, position)
    name = raw.get("name") if isinstance(raw.get("name"), str) else None
    if role in SYSTEM_ROLES:
        return SystemMessage(content=content, id=msg_id)  # type: ignore[arg-type]
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise RequestError(
                f"messages[{position}] is a tool result without a 'tool_call_id'.",
                param=f"messages[{position}].tool_call_id",
            )
        return ToolMessage(
            content=content,  # type: ignore[arg-type]
            tool_call_id=call_id,
            name=name,
            id=msg_id,
        )
    return HumanMessage(content=content, name=name, id=msg_id)  # type: ignore[arg-type]


def assistant_from_openai(raw: Mapping[str, Any], position: int = 0, **fields: Any) -> AIMessage:
    """An OpenAI assistant message (its role not looked at) as an AIMessage made with
    ``fields`` (its id, a reply's usage and metadata), not made and then copied to carry them.

    Raises:
        RequestError: its content or a tool call is malformed.
    """
    content = content_of(raw, position)
    name = raw.get("name") if isinstance(raw.get("name"), str) else None
    calls, invalid = _tool_calls(raw.get("tool_calls"), position)
    return AIMessage(
        content=content,  # type: ignore[arg-type]
        name=name,
        tool_calls=calls,
        invalid_tool_calls=invalid,
        **fields,
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
    rendered = plain_form(message)
    if rendered is None:
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


def _call_json(call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    return {
        "id": call_id or "",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def upstream_body(
    messages: Sequence[BaseMessage],
    tools: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    call_kwargs: Mapping[str, Any],
    as_openai: Callable[[BaseMessage], dict[str, Any]] = message_to_openai,
) -> dict[str, Any]:
    """One non-streaming upstream request (``as_openai``: :func:`message_to_openai` or a memo
    of it; a memo with a ``many`` method lists the messages' forms in one call).

    ``call_kwargs`` are the keeper's (``reasoning_effort``, thinking on/off): in the shape a
    ``ChatOpenAI`` call takes them, so ``extra_body`` is merged at the top level as it would be.
    """
    body: dict[str, Any] = {k: v for k, v in params.items() if k not in OWN_FIELDS}
    for key, value in call_kwargs.items():
        if key == "extra_body" and isinstance(value, Mapping):
            body.update(value)
        else:
            body[key] = value
    many = getattr(as_openai, "many", None)  # a memo listing a whole window at once
    body["messages"] = many(messages) if many is not None else [as_openai(m) for m in messages]
    if tools:
        body["tools"] = [dict(t) for t in tools]
    body["stream"] = False
    return body


class ListedForms(list[dict[str, Any]]):
    """A window's upstream forms (an ordinary list to every reader) that also carries their
    JSON, kept from call to call by the session's window forms, so that the upstream body is
    written from it (:func:`body_json`) instead of serializing every message in view again: a
    request that appends a message or two serializes those alone.

    The forms are the memo's, which no one changes (callers only read them); a list changed
    after it was made (a form replaced, added or removed) is serialized whole, as any list."""

    __slots__ = ("_joined", "_made")

    def __init__(self, forms: list[dict[str, Any]], joined: bytes | None) -> None:
        super().__init__(forms)
        self._made = forms
        """The forms as listed (the caller's list is a copy of it, which it may change)."""
        self._joined = joined
        """``orjson.dumps`` of each form, joined by commas (:func:`joined_forms`)."""

    def json(self) -> bytes | None:
        """``orjson.dumps(self)`` from the kept JSON; None when the list was changed since it
        was made (or a form cannot be serialized): serialize it then."""
        joined, made = self._joined, self._made
        if joined is None or len(self) != len(made) or not all(map(is_, self, made)):
            return None
        return b"".join((b"[", joined, b"]"))  # one copy


def joined_forms(joined: bytes | None, forms: Iterable[dict[str, Any]]) -> bytes | None:
    """The JSON of a list's forms (``orjson.dumps`` of each, joined by commas, without the
    brackets), ``joined`` being those of the forms before ``forms``; None when one cannot be
    serialized (the body is then serialized whole, which says why). Adding to it copies bytes
    once; it serializes only ``forms``."""
    if joined is None:
        return None
    try:
        added = b",".join(map(orjson.dumps, forms))
    except orjson.JSONEncodeError:
        return None
    if joined and added:  # a form's JSON is never empty: empty is no form
        return b"".join((joined, b",", added))  # one copy
    return joined or added


def body_json(body: Mapping[str, Any]) -> bytes:
    """``orjson.dumps(body)``, byte for byte; its ``messages``, when they are
    :class:`ListedForms` unchanged since they were listed, are written from their kept JSON
    (an ``orjson.Fragment`` in the same place among the keys).

    Raises:
        orjson.JSONEncodeError: a value JSON cannot hold, as ``orjson.dumps`` raises it.
    """
    forms = body.get("messages")
    if type(forms) is ListedForms and (listed := forms.json()) is not None:
        return orjson.dumps({**body, "messages": orjson.Fragment(listed)})
    return orjson.dumps(body)
