"""A ``POST /v1/chat/completions`` body read into the conversation form (pure).

An agent resends its whole history on every call: what the session's last request confirmed is
not checked again, and the messages that cannot fail to convert are converted only when first
read (:class:`LazyMessages`); every other message is checked here, so a bad one is refused
before anything is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

from langchain_core.messages import BaseMessage

from keeper_middleware.integrations.proxy.conversation.chat_messages import (
    SYSTEM_ROLES,
    content_of,
    message_from_openai,
)
from keeper_middleware.integrations.proxy.conversation.digests import message_key
from keeper_middleware.integrations.proxy.conversation.form import (
    OWN_FIELDS,
    ChatRequest,
    RequestError,
)
from keeper_middleware.integrations.proxy.conversation.resent import Resent

__all__ = ["LazyMessages", "parse_chat_request"]


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

    def kept(self, index: int, msg_id: str) -> BaseMessage:
        """The message at ``index`` as the session keeps it, with ``msg_id``: made once with
        it, or this request's own reading of it given the id (no copy). The reading is handed
        over: a later read of ``index`` makes it anew, without an id."""
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(index)
        made = self._converted.pop(position, None)
        if made is None:
            at = self._first + position
            return message_from_openai(self._raw[at], at, msg_id)
        made.id = msg_id  # made here for this request alone: nobody else holds it
        return made


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
    while lead < len(raw) and isinstance(raw[lead], dict) and raw[lead].get("role") in SYSTEM_ROLES:
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
        params={k: v for k, v in body.items() if k not in OWN_FIELDS},
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
    content = content_of(raw, position)
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
