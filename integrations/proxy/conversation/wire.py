"""One internal message model for every API the proxy speaks: LangChain messages, with the wire
items each came from carried alongside (pure).

The keeper reasons over LangChain messages: text, tool calls (id, name, arguments) and tool
results. That is also what it archives, counts and fingerprints. A client of the Responses or the
Messages API sends more than that: item ids, reasoning items with opaque content, thinking blocks
with signatures, images, ``is_error`` flags. Each message therefore carries, in
``additional_kwargs[WIRE_KEY]``, the items or blocks it was read from, with the fingerprint of
its neutral part at that moment. When the keeper sends the message to an upstream of the same API,
and the neutral part is still what it was (the keeper did not excerpt it), the items go out
exactly as they came: thinking signatures and encrypted reasoning reach the model unchanged, and
consecutive requests share their prefix. Otherwise the message is rendered from its neutral part.
LangChain never sends ``additional_kwargs`` it does not know to a model, and the archive keeps
only the neutral part, so an image is archived as a one-line placeholder and never as its bytes.

Chat Completions is the neutral spelling: every front door reads its API into chat-shaped
messages first (:func:`~.chat_messages.message_from_openai` makes the LangChain message), and every
upstream reply is read into a chat completion, so fingerprints agree whichever API a message
came through.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.integrations.proxy.conversation.digests import digest_of
from keeper_middleware.integrations.proxy.conversation.form import WIRE_KEY

__all__ = [
    "API_NAMES",
    "WIRE_KEY",
    "ToolNames",
    "WireContext",
    "attach",
    "content_as_text",
    "foreign_items",
    "item_id",
    "native_items",
    "wire_of",
]

API_NAMES = ("chat", "responses", "messages")
"""The APIs the proxy speaks: OpenAI Chat Completions, OpenAI Responses, Anthropic Messages."""
NAMESPACE_JOIN = "__"
"""A tool inside a Responses namespace is one chat function named ``<namespace>__<name>``."""

_TEXT_TYPES = frozenset({"text", "input_text", "output_text", "text-plain"})
_IMAGE_TYPES = frozenset({"image", "image_url", "input_image"})
_FILE_TYPES = frozenset({"file", "input_file", "document"})
_BINARY_KEYS = ("data", "base64", "file_data", "image_base64")


def item_id(prefix: str) -> str:
    """An id the proxy gives an item or a response it makes (``msg_``, ``fc_``, ``rs_``, ...)."""
    return f"{prefix}_kp{random.getrandbits(96):024x}"


def attach(message: BaseMessage, api: str, items: Sequence[Any], **extra: Any) -> BaseMessage:
    """``message`` with the wire items it was read from (and the fingerprint of its neutral part
    now, so a later change to that part is noticed)."""
    wire = {"api": api, "items": list(items), "check": digest_of(message), **extra}
    kwargs = {**message.additional_kwargs, WIRE_KEY: wire}
    return message.model_copy(update={"additional_kwargs": kwargs})


def wire_of(message: BaseMessage) -> Mapping[str, Any] | None:
    wire = message.additional_kwargs.get(WIRE_KEY)
    return wire if isinstance(wire, Mapping) else None


def native_items(message: BaseMessage, api: str) -> list[Any] | None:
    """The items ``message`` came in as, when they are of ``api`` and its neutral part is
    unchanged since; None otherwise (render it from the neutral part)."""
    wire = wire_of(message)
    if wire is None or wire.get("api") != api or wire.get("check") != digest_of(message):
        return None
    return list(wire.get("items") or [])


def foreign_items(message: BaseMessage) -> tuple[str, list[Any]] | None:
    """(api, items) of a message whose neutral part is unchanged since it was read, whatever
    its API: a translation takes images from there."""
    wire = wire_of(message)
    if wire is None or wire.get("check") != digest_of(message):
        return None
    return str(wire.get("api")), list(wire.get("items") or [])


@dataclass(frozen=True, slots=True)
class WireContext:
    """What a front door read besides the neutral request, for the upstream calls of one request.

    ``api`` is the front door's. ``instructions`` and ``system_items`` are the system part as it
    came (Responses: ``instructions`` and the leading developer/system items; Messages: the
    ``system`` blocks, then any ``role: "system"`` message of the conversation as a text block),
    sent as they are to an upstream of the same API. ``tools`` are the client's own tools as it
    sent them; ``names`` maps the chat names of namespaced and custom tools back;
    ``headers`` go to every upstream call (Anthropic's version and beta headers)."""

    api: str
    instructions: str | None = None
    system_items: tuple[Any, ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()
    names: ToolNames = field(default_factory=lambda: ToolNames())
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolNames:
    """Chat function names of a Responses client's namespaced and custom tools.

    A chat function has one flat name, so ``multi_agent_v1.spawn_agent`` is the chat function
    ``multi_agent_v1__spawn_agent``; a custom (free-form) tool takes one string, ``input``."""

    namespaced: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """chat name → (namespace, name)."""
    custom: frozenset[str] = frozenset()

    @staticmethod
    def flat(namespace: str | None, name: str) -> str:
        return f"{namespace}{NAMESPACE_JOIN}{name}" if namespace else name

    def split(self, name: str) -> tuple[str | None, str]:
        """(namespace, name) of a chat function name."""
        return self.namespaced.get(name, (None, name))


def content_as_text(content: str | Sequence[Any]) -> str:
    """A message's content as the text the archive keeps and search reads: text blocks word for
    word, an image or a file as a one-line placeholder naming its kind, media type and size
    (never its bytes), reasoning left out (it is kept apart), any other block as JSON."""
    if isinstance(content, str):
        return content
    out = ""
    apart = False
    for part in content:
        text = _plain(part)
        if text is not None:
            if apart and text and not out.endswith("\n"):
                out += "\n"
            out += text
            apart = False
            continue
        rendered = _block_text(part)
        if not rendered:
            continue
        if out and not out.endswith("\n"):
            out += "\n"
        out += rendered
        apart = True
    return out


def _plain(part: object) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping) and part.get("type") in _TEXT_TYPES:
        text = part.get("text")
        return text if isinstance(text, str) else ""
    return None


def _block_text(block: object) -> str:
    if not isinstance(block, Mapping):
        return json.dumps(block, ensure_ascii=False, default=str)
    kind = str(block.get("type") or "")
    if kind in ("reasoning", "thinking", "redacted_thinking"):
        return ""
    if kind in _IMAGE_TYPES:
        return placeholder("image", block)
    if kind in _FILE_TYPES:
        source = block.get("source")
        if isinstance(source, Mapping) and source.get("type") == "text":
            return str(source.get("data") or "")
        return placeholder("file", block)
    if kind == "tool_result":
        inner = block.get("content")
        return content_as_text(inner if isinstance(inner, str | list) else [])
    return json.dumps(_without_binary(block), ensure_ascii=False, default=str)


def placeholder(kind: str, block: Mapping[str, Any]) -> str:
    """``[image: image/png, 12,345 bytes]``: what a block of bytes was, never the bytes."""
    source: Mapping[str, Any] = block
    for key in ("source", "image_url", "file"):
        inner = block.get(key)
        if isinstance(inner, Mapping):
            source = inner
            break
        if isinstance(inner, str):
            source = {"url": inner}
            break
    media = source.get("media_type") or source.get("mime_type") or block.get("mime_type")
    data = next((source[k] for k in _BINARY_KEYS if isinstance(source.get(k), str)), None)
    url = source.get("url") if isinstance(source.get("url"), str) else None
    if url and url.startswith("data:"):
        head, _, data = url.partition(",")
        media = media or head[5:].split(";")[0] or None
        url = None
    details = [str(media)] if media else []
    if data is not None:
        details.append(f"{_base64_bytes(data):,} bytes")
    name = source.get("filename") or block.get("filename") or block.get("title")
    if name:
        details.append(f"name {json.dumps(str(name), ensure_ascii=False)}")
    if url:
        details.append(url[:300])
    elif data is None and (source.get("file_id") or block.get("file_id")):
        details.append(f"file id {source.get('file_id') or block.get('file_id')}")
    return f"[{kind}: {', '.join(details)}]" if details else f"[{kind}]"


def _base64_bytes(data: str) -> int:
    stripped = "".join(data.split())
    return max(0, len(stripped) * 3 // 4 - stripped[-2:].count("="))


def _without_binary(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            k: f"<{_base64_bytes(v):,} bytes>"
            if k in _BINARY_KEYS and isinstance(v, str) and len(v) > 256
            else _without_binary(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_without_binary(v) for v in value]
    return value
