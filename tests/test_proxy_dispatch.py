"""The agent's routes skip Starlette's layers and answer exactly as through them: the same
response, and for an error no handler caught, Starlette's own 500."""

from __future__ import annotations

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keeper_middleware.integrations.proxy.doors.dispatch import ProxyApp


async def _echo(request: Request) -> Response:
    return JSONResponse({"path": request.url.path, "body": (await request.body()).decode()})


async def _broken(request: Request) -> Response:
    raise RuntimeError("a bug in a handler")


def _app(hot: bool) -> ProxyApp:
    routes = [Route("/echo", _echo, methods=["POST"]), Route("/broken", _broken, methods=["POST"])]
    return ProxyApp(hot={"/echo": _echo, "/broken": _broken} if hot else {}, routes=routes)


async def _answers(app: ProxyApp, method: str, path: str) -> tuple[int, bytes, str]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        got = await client.request(method, path, content=b"hello")
    return got.status_code, got.content, got.headers.get("content-type", "")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/echo"), ("POST", "/broken"), ("GET", "/echo"), ("POST", "/echo/"), ("POST", "/x")],
)
async def test_a_hot_route_answers_as_starlette_does(method: str, path: str) -> None:
    assert await _answers(_app(True), method, path) == await _answers(_app(False), method, path)


@pytest.mark.anyio
async def test_an_uncaught_error_is_starlettes_plain_500() -> None:
    status, body, kind = await _answers(_app(True), "POST", "/broken")
    assert (status, body) == (500, b"Internal Server Error")
    assert kind.startswith("text/plain")
