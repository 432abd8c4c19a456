"""Message content as text: every content block, in the order it came (pure).

Messages carry more than text. A tool result may be a list of JSON blocks, an Anthropic-style
reply carries ``tool_use`` blocks and the next user turn ``tool_result`` blocks, a user may send
an image or a PDF. The archive keeps text, and what it keeps is what search finds and what a
read gives back, so each block becomes text here, once, for every path into the archive:

- text (``text``, ``text-plain``, a bare string) word for word;
- ``tool_use`` / ``tool_call`` as a header line naming the tool and the call id, then the
  arguments as JSON; ``tool_result`` as a header naming the call it answers, then its own
  content (a string or blocks, rendered the same way);
- ``json`` blocks, and any block of a kind not listed here, as JSON;
- an image, a file, a document or audio as a one-line placeholder that names its kind, its
  media type and size, and any file name, title, alt text or URL: the bytes themselves are
  not kept (a plain-text document keeps its text);
- reasoning (``reasoning``, ``thinking``, ``redacted_thinking``) is left out: it is kept apart
  from the reply it led to (:func:`keeper_middleware.messages.facts.reasoning_of`).

Consecutive text blocks join with nothing between them (the text of a message that only
has text blocks is exactly their concatenation); any other block stands on lines of its own.
The shapes are those of OpenAI Chat Completions and Responses, Anthropic Messages and
LangChain's standard content blocks, so a front door for any of them can use
:func:`content_as_text` as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["block_as_text", "content_as_text"]

REASONING_TYPES = frozenset({"reasoning", "thinking", "redacted_thinking"})
_TEXT_TYPES = frozenset({"text", "text-plain", "input_text", "output_text"})
_IMAGE_TYPES = frozenset({"image", "image_url", "input_image"})
_FILE_TYPES = frozenset({"file", "input_file", "document"})
_AUDIO_TYPES = frozenset({"audio", "input_audio"})
_CALL_TYPES = frozenset({"tool_use", "tool_call", "server_tool_use", "server_tool_call"})
_RESULT_TYPES = frozenset({"tool_result", "server_tool_result", "web_search_tool_result"})
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[^,]*)?;base64,", re.IGNORECASE)
_BINARY_KEYS = ("data", "base64", "file_data", "image_base64")
_SHOWN_URL = 300
"""The most characters of a URL a placeholder shows (a long signed URL is mostly noise)."""


def content_as_text(content: str | Sequence[Any]) -> str:
    """A message's content as the text the archive keeps and search reads (see the module).

    Args:
        content: a message's ``content``: a string, or a list of strings and content blocks.

    Returns:
        The text: a string as it is; text blocks word for word; every other block as text.
    """
    if isinstance(content, str):
        return content
    out = ""
    apart = False  # the last piece was a block of its own: text after it starts a new line
    for part in content:
        text = _text_of_text_block(part)
        if text is not None:
            if apart and text and not out.endswith("\n"):
                out += "\n"
            out += text
            apart = False
            continue
        rendered = block_as_text(part)
        if not rendered:
            continue
        if out and not out.endswith("\n"):
            out += "\n"
        out += rendered
        apart = True
    return out


def block_as_text(block: object) -> str:
    """One content block as text ("" for reasoning, which is kept apart).

    Args:
        block: a string or a content block (a mapping with a ``type``).
    """
    text = _text_of_text_block(block)
    if text is not None:
        return text
    if not isinstance(block, Mapping):
        return _json(block)
    kind = str(block.get("type") or "")
    if kind in REASONING_TYPES:
        return ""
    if kind in _CALL_TYPES:
        args = block.get("input", block.get("args", block.get("arguments")))
        header = _header(kind, block.get("name"), ("id", block.get("id")))
        return f"{header} {_json(args if args is not None else {})}"
    if kind in _RESULT_TYPES:
        error = ", error" if block.get("is_error") or block.get("status") == "error" else ""
        call_id = block.get("tool_use_id") or block.get("tool_call_id") or block.get("id")
        header = _header(kind, None, ("for", call_id)).removesuffix("]") + f"{error}]"
        inner = block.get("content", block.get("output"))
        body = content_as_text(_as_content(inner)) if inner is not None else ""
        return f"{header}\n{body}" if body else header
    if kind == "json":
        return _json(block.get("json", block.get("data")))
    if kind in _IMAGE_TYPES:
        return _placeholder("image", block)
    if kind in _FILE_TYPES:
        plain = _plain_document(block)
        return plain if plain is not None else _placeholder("file", block)
    if kind in _AUDIO_TYPES:
        return _placeholder("audio", block)
    return _json(_without_binary(block))


def _text_of_text_block(part: object) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping) and part.get("type") in _TEXT_TYPES:
        text = part.get("text")
        return text if isinstance(text, str) else ("" if text is None else str(text))
    return None


def _as_content(value: object) -> str | Sequence[Any]:
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return value
    return [value]


def _header(kind: str, name: object, labelled: tuple[str, object]) -> str:
    parts = [kind]
    if name:
        parts.append(str(name))
    label, value = labelled
    if value:
        parts.append(f"{label}={value}")
    return "[" + " ".join(parts) + "]"


def _placeholder(kind: str, block: Mapping[str, Any]) -> str:
    """``[image: image/png, 12,345 bytes, alt "a cat"]``: what a block of bytes was, never the
    bytes themselves."""
    source = _source_of(block)
    media = (
        source.get("media_type")
        or source.get("mime_type")
        or block.get("mime_type")
        or block.get("media_type")
    )
    url = source.get("url") if isinstance(source.get("url"), str) else None
    size: int | None = None
    data = next((source[k] for k in _BINARY_KEYS if isinstance(source.get(k), str)), None)
    if url and _DATA_URL.match(url):
        data, url = url, None
    if data is not None and (found := _DATA_URL.match(data)):
        media = media or found.group("type")
        data = data[found.end() :]
    if data is not None:
        size = _base64_bytes(data)
    details: list[str] = []
    if kind == "audio" and source.get("format"):
        details.append(str(source["format"]))
    if media:
        details.append(str(media))
    if size is not None:
        details.append(f"{size:,} bytes")
    for key in ("filename", "title", "name"):
        value = source.get(key) or block.get(key)
        if value:
            details.append(f"{key} {json.dumps(str(value), ensure_ascii=False)}")
            break
    alt = _alt_text(block, source)
    if alt:
        details.append(f"alt {json.dumps(alt, ensure_ascii=False)}")
    file_id = source.get("file_id") or block.get("file_id") or block.get("id")
    if url:
        details.append(url if len(url) <= _SHOWN_URL else url[:_SHOWN_URL] + "…")
    elif file_id and size is None:
        details.append(f"file id {file_id}")
    return f"[{kind}: {', '.join(details)}]" if details else f"[{kind}]"


def _source_of(block: Mapping[str, Any]) -> Mapping[str, Any]:
    """Where a block keeps its bytes and their description: Anthropic's ``source``, OpenAI's
    ``image_url`` / ``file`` / ``input_audio``, or the block itself (LangChain's blocks)."""
    for key in ("source", "image_url", "file", "input_audio"):
        inner = block.get(key)
        if isinstance(inner, Mapping):
            return inner
        if isinstance(inner, str) and key == "image_url":
            return {"url": inner}
    return block


def _alt_text(block: Mapping[str, Any], source: Mapping[str, Any]) -> str | None:
    for holder in (block, source, block.get("extras"), block.get("metadata")):
        if isinstance(holder, Mapping):
            for key in ("alt", "alt_text", "caption", "context"):
                value = holder.get(key)
                if isinstance(value, str) and value:
                    return value
    return None


def _plain_document(block: Mapping[str, Any]) -> str | None:
    """A document block that holds text (Anthropic's ``text`` and ``content`` sources): its
    text, under a header; None for a document of bytes."""
    source = block.get("source")
    if not isinstance(source, Mapping):
        return None
    title = block.get("title")
    header = f"[document {json.dumps(str(title), ensure_ascii=False)}]" if title else "[document]"
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return f"{header}\n{source['data']}"
    if source.get("type") == "content" and source.get("content") is not None:
        return f"{header}\n{content_as_text(_as_content(source['content']))}"
    return None


def _base64_bytes(data: str) -> int:
    """How many bytes base64 text decodes to (without decoding it)."""
    stripped = "".join(data.split())
    return max(0, len(stripped) * 3 // 4 - stripped[-2:].count("="))


def _without_binary(value: Any) -> Any:
    """``value`` with any long base64 payload replaced by how many bytes it held."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in _BINARY_KEYS and isinstance(item, str) and len(item) > 256:
                out[key] = f"<{_base64_bytes(item):,} bytes>"
            else:
                out[key] = _without_binary(item)
        return out
    if isinstance(value, list | tuple):
        return [_without_binary(item) for item in value]
    return value


def _json(value: object) -> str:
    return json.dumps(_without_binary(value), ensure_ascii=False, default=str)
