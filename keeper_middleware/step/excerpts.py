"""A message too big for the room it needs stands in view as a bounded excerpt (pure).

A 200K-character tool result, a 40K-character paste or one huge model reply used to make every
later request impossible: the note request could never fit after it, so the thread raised
``WindowTooSmallError`` for good although the input was already in it. Now such a message is
archived word for word when it arrives, and in view it keeps its id, role and tool-call pairing
but its text becomes the head and the tail with one plain pointer line between them. The model
follows the pointer with ``search_archive(read=REF, page=N)`` and reads the rest page by page;
pages are sized to the budget like everything the keeper adds.

Sizes come from a ``count`` function (the keeper's token counter), so the bounds hold for
whatever counter is configured.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.messages.facts import text_of

Count = Callable[[str], int]

EXCERPT_TAG = "[EXCERPT]"
MIN_EXCERPT_TOKENS = 48
"""Below this an excerpt is only its pointer line: the least a message can take in view."""


def excerpt_ref(session: str, msg_id: str) -> str:
    """A short reference for an excerpted message (a message id can be a 36-character uuid,
    which costs dozens of tokens in every pointer line)."""
    digest = hashlib.blake2b(f"{session}\0{msg_id}".encode("utf-8", "surrogatepass"), digest_size=5)
    return "m" + digest.hexdigest()


def pointer_line(ref: str, omitted: int, pages: int) -> str:
    """The line that tells the model where the rest is and how to read it."""
    return (
        f"{EXCERPT_TAG} {omitted} more characters are in the archive: read them with "
        f'search_archive(read="{ref}", page=1) (pages 1 to {pages}).'
    )


def pointer_cost(ref: str, count: Count) -> int:
    """What the pointer line of an excerpt of a message with this reference costs at most."""
    return count(pointer_line(ref, 10**9, 10**6)) + 2


def stub_line(ref: str) -> str:
    """The whole text of a message at its smallest: only where it is and how to read it.

    A burst of tool results (fifty at once, or five hundred) can leave each of them less room
    than an excerpt's head, tail and full pointer take; each then stands in view as this line
    alone, and is read back whole from the archive."""
    return f'{EXCERPT_TAG} archived whole: search_archive(read="{ref}")'


def smallest_form(message: BaseMessage, ref: str) -> BaseMessage:
    """``message`` as small as it can stand in view: same id, role, name and tool-call ids;
    its text and each tool-call argument longer than :func:`stub_line` replaced by it.

    The same message object when nothing in it is longer than the stub."""
    stub = stub_line(ref)
    update: dict[str, Any] = {}
    if len(text_of(message)) > len(stub):
        update["content"] = stub
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = [
            {**call, "args": _smallest_args(call.get("args"), stub)} for call in message.tool_calls
        ]
        if calls != list(message.tool_calls):
            update["tool_calls"] = calls
            update["invalid_tool_calls"] = []
    return message.model_copy(update=update) if update else message


def _smallest_args(args: object, stub: str) -> object:
    if not isinstance(args, dict):
        return {"excerpt": stub} if len(json.dumps(args, default=str)) > len(stub) else args
    smallest: dict[str, object] = {}
    for key, value in args.items():
        if value is None or isinstance(value, bool | int | float):
            smallest[key] = value
        elif isinstance(value, str):
            smallest[key] = stub if len(value) > len(stub) else value
        else:
            dumped = json.dumps(value, ensure_ascii=False, default=str)
            smallest[key] = stub if len(dumped) > len(stub) else value
    return smallest


def fit_prefix(text: str, tokens: int, count: Count) -> int:
    """The length of the longest prefix of ``text`` within ``tokens`` (as ``count`` counts)."""
    if tokens <= 0 or not text:
        return 0
    if count(text) <= tokens:
        return len(text)
    low, high = 0, min(len(text), tokens * 16)
    while count(text[:high]) <= tokens and high < len(text):  # a counter more generous than 16
        low, high = high, min(len(text), high * 2)
    while low < high:
        middle = (low + high + 1) // 2
        if count(text[:middle]) <= tokens:
            low = middle
        else:
            high = middle - 1
    return low


def fit_suffix(text: str, tokens: int, count: Count) -> int:
    """The length of the longest suffix of ``text`` within ``tokens``."""
    return fit_prefix(text[::-1], tokens, lambda t: count(t[::-1]))


def page_chars(text: str, page_tokens: int, count: Count) -> int:
    """Characters per page, from the text's own density (one count of the whole text): the
    first guess at each page's length, kept when the page is within ``page_tokens``."""
    total = max(1, count(text))
    return max(1, int(len(text) * page_tokens * 0.9 / total))


def page_spans(text: str, page_tokens: int, count: Count) -> tuple[tuple[int, int], ...]:
    """Where each page of ``text`` starts and ends: every character on exactly one page, and
    each page within ``page_tokens`` (as ``count`` counts; a single character heavier than a
    page is a page of its own).

    A page takes the length the text's density suggests; a page that comes out over its size
    (a dense stretch, CJK or digits, in a light text) ends where it fits, and the next page
    starts right there. Clipping such a page instead left its tail on no page at all (5.4K of
    a 48K-character message). Pages are worked out once per text and page size.
    """
    return _spans(text, page_tokens, count)


@functools.lru_cache(maxsize=16)
def _spans(text: str, page_tokens: int, count: Count) -> tuple[tuple[int, int], ...]:
    if not text:
        return ((0, 0),)
    size = page_chars(text, page_tokens, count)
    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if count(text[start:end]) > page_tokens:
            end = start + max(1, fit_prefix(text[start:end], page_tokens, count))
        spans.append((start, end))
        start = end
    return tuple(spans)


def page_count(text: str, page_tokens: int, count: Count) -> int:
    return len(page_spans(text, page_tokens, count))


def read_page(text: str, page: int, page_tokens: int, count: Count) -> tuple[str, int]:
    """(page ``page`` of ``text``, the number of pages); a page past the end is empty.

    Reading pages 1 to N in turn gives back ``text`` exactly (:func:`page_spans`)."""
    spans = page_spans(text, page_tokens, count)
    if not 1 <= page <= len(spans):
        return "", len(spans)
    start, end = spans[page - 1]
    return text[start:end], len(spans)


def excerpt(text: str, *, tokens: int, ref: str, page_tokens: int, count: Count) -> str:
    """The head and tail of ``text`` around a pointer line, within ``tokens`` (when at least
    the pointer fits; the caller refuses sizes below :data:`MIN_EXCERPT_TOKENS`)."""
    pages = page_count(text, page_tokens, count)
    pointer = pointer_line(ref, len(text), pages)
    room = tokens - count(pointer) - 2
    head = fit_prefix(text, max(0, room * 2 // 3), count)
    tail = fit_suffix(text[head:], max(0, room - count(text[:head])), count)
    omitted = len(text) - head - tail
    pointer = pointer_line(ref, omitted, pages)
    parts = [text[:head], pointer, text[len(text) - tail :] if tail else ""]
    return "\n".join(p for p in parts if p)


def shrink_message(
    message: BaseMessage,
    *,
    tokens: int,
    ref: str,
    page_tokens: int,
    count: Count,
) -> BaseMessage:
    """A copy of ``message`` that takes at most about ``tokens`` in view: same id, role, name and
    tool-call ids; the text (and any long tool-call argument) excerpted around a pointer."""
    text = text_of(message)
    calls: list[Any] = list(message.tool_calls) if isinstance(message, AIMessage) else []
    update: dict[str, Any] = {}
    if calls:
        args_tokens = sum(count(json.dumps(c.get("args"), ensure_ascii=False)) for c in calls)
        share = max(MIN_EXCERPT_TOKENS, tokens // (len(calls) + (1 if text else 0)))
        if args_tokens > tokens // 2:
            update["tool_calls"] = [
                {**call, "args": _shrink_args(call.get("args"), share, ref, page_tokens, count)}
                for call in calls
            ]
            update["invalid_tool_calls"] = []
            tokens = share
    if count(text) > tokens:
        update["content"] = excerpt(
            text, tokens=tokens, ref=ref, page_tokens=page_tokens, count=count
        )
    if not update:
        return message
    return message.model_copy(update=update)


def excerpt_within(
    message: BaseMessage,
    *,
    cap: int,
    ref: str,
    page_tokens: int,
    count: Count,
    count_message: Callable[[BaseMessage], int],
) -> BaseMessage:
    """:func:`shrink_message` aimed lower until the excerpt, frame included, is within ``cap``
    by ``count_message`` (the excerpt's text is sized by ``count``, which cannot see the frame
    a message adds); below what a head, a tail and a full pointer take, the message's
    :func:`smallest_form`."""
    target = max(MIN_EXCERPT_TOKENS, cap // 2)
    while True:
        shrunk = shrink_message(
            message, tokens=target, ref=ref, page_tokens=page_tokens, count=count
        )
        size = count_message(shrunk)
        if size <= cap:
            return shrunk
        if target <= MIN_EXCERPT_TOKENS:
            smallest = smallest_form(message, ref)
            return smallest if count_message(smallest) < size else shrunk
        target = max(MIN_EXCERPT_TOKENS, target - (size - cap) - 8)


def _shrink_args(args: object, tokens: int, ref: str, page_tokens: int, count: Count) -> object:
    """Tool-call arguments with each long string value excerpted (the keys stay, so the call
    still reads as what it was)."""
    if not isinstance(args, dict):
        return {
            "excerpt": excerpt(
                str(args), tokens=tokens, ref=ref, page_tokens=page_tokens, count=count
            )
        }
    values = [v for v in args.values() if isinstance(v, str)]
    share = max(MIN_EXCERPT_TOKENS, tokens // max(1, len(values)))
    shrunk: dict[str, object] = {}
    for key, value in args.items():
        if isinstance(value, str) and count(value) > share:
            shrunk[key] = excerpt(
                value, tokens=share, ref=ref, page_tokens=page_tokens, count=count
            )
        elif value is None or isinstance(value, str | int | float | bool):
            shrunk[key] = value
        else:
            dumped = json.dumps(value, ensure_ascii=False, default=str)
            shrunk[key] = (
                value
                if count(dumped) <= share
                else excerpt(dumped, tokens=share, ref=ref, page_tokens=page_tokens, count=count)
            )
    return shrunk


def archived_text(content: str, tool_calls_json: str) -> str:
    """What a read pages through: the archived text, and the tool calls when there were any."""
    if tool_calls_json in ("", "[]"):
        return content
    return (
        f"{content}\n[tool calls] {tool_calls_json}"
        if content
        else f"[tool calls] {tool_calls_json}"
    )
