"""Server-sent events from an upstream's stream, read by a maintained parser (httpx-sse's).

An event may carry its data over several ``data:`` lines (joined with newlines, as the SSE
standard says), comments, ``event:``, ``id:`` and ``retry:`` fields; a hand-written reader of
``data:`` lines gets multi-line events wrong. The proxy's HTTP clients (aiohttp or httpx) already
split the body into lines; the decoder turns them into events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from httpx_sse._decoders import SSEDecoder  # the decoder httpx-sse's EventSource uses

__all__ = ["sse_data"]


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The data of each event of a stream given line by line (without line ends); an event
    the stream ends without its closing blank line still counts. Events without data (a
    comment, a bare ``retry:``) are skipped."""
    decoder = SSEDecoder()
    async for line in lines:
        event = decoder.decode(line)
        if event is not None and event.data:
            yield event.data
    last = decoder.decode("")
    if last is not None and last.data:
        yield last.data
