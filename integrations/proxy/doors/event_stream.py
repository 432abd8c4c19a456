"""A streamed answer written to the agent: Starlette's ``StreamingResponse`` without its task group.

On a server that speaks ASGI below 2.4 (uvicorn says 2.3), Starlette streams inside an anyio
task group, with a second task listening for the client's disconnect; that group costs more
Python calls per streamed request than the rest of the proxy's own work on the event loop. Here
the body is written in the request's own task, exactly as ``StreamingResponse.stream_response``
writes it (the same messages, byte for byte), and one plain task waits for the disconnect: when
the client hangs up, the writing is cancelled at once, as the task group cancels it, and the
call returns normally. ASGI 2.4 and later (where a write to a closed connection raises
``OSError``) keep Starlette's own path.
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["EventStream"]


class EventStream(StreamingResponse):
    """A ``StreamingResponse`` (same arguments, same messages) that writes without a task group."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _spec(scope) >= (2, 4):
            await super().__call__(scope, receive, send)
            return
        writer = asyncio.current_task()
        assert writer is not None
        listener = asyncio.ensure_future(self.listen_for_disconnect(receive))
        writing = [True]

        def hung_up(done: asyncio.Future[None]) -> None:
            if writing[0] and not done.cancelled():  # a disconnect, or a failure to read
                writer.cancel()

        listener.add_done_callback(hung_up)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not listener.done() or listener.cancelled() or writer.uncancel() > 0:
                raise  # not (only) the disconnect's cancellation: someone else's
            listener.result()  # a failure to read the client's messages is raised here
        finally:
            writing[0] = False  # a disconnect from now on cancels nothing
            listener.cancel()
        if self.background is not None:
            await self.background()


def _spec(scope: Scope) -> tuple[int, ...]:
    return tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))
