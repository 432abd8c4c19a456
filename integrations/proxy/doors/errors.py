"""Errors at the Responses and Messages front doors, in each API's own shape (pure).

A failed request is told what the chat door would say (the same statuses and codes), written as
OpenAI's ``{"error": {...}}`` or Anthropic's ``{"type": "error", "error": {...}}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response

from keeper_middleware.errors import WindowTooSmallError
from keeper_middleware.integrations.proxy.conversation.form import RequestError
from keeper_middleware.integrations.proxy.sessions.quota import QuotaError
from keeper_middleware.integrations.proxy.sessions.tenants import SessionIdError
from keeper_middleware.integrations.proxy.upstream.client import (
    RetryPolicy,
    UpstreamError,
    retry_after_header,
)

__all__ = ["Failure", "JsonReply", "failure_of", "json_response"]

_log = logging.getLogger(__name__)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Failure:
    status: int
    message: str
    kind: str
    code: str | None = None
    param: str | None = None
    headers: Mapping[str, str] | None = None

    def openai(self) -> Response:
        body = {"error": {"message": self.message, "type": self.kind, "code": self.code,
                          "param": self.param}}  # fmt: skip
        return json_response(body, self.status, self.headers)

    def anthropic_error(self) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": kind, "message": self.message}

    def anthropic(self) -> Response:
        return json_response(
            {"type": "error", "error": self.anthropic_error()}, self.status, self.headers
        )


class JsonReply(Response):
    """``orjson.dumps(body)`` as ``application/json``: the status, headers and bytes that
    ``Response(orjson.dumps(body), status, headers, media_type="application/json")`` sends,
    built straight (every answer of the proxy is one; Starlette's general path renders the
    content and merges the headers in a dozen calls).

    Args:
        body: the JSON value.
        status: the HTTP status.
        headers: headers sent before ``content-length`` and ``content-type``.
    """

    media_type = "application/json"

    def __init__(
        self, body: Any, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        content = orjson.dumps(body)
        if headers:
            raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
            plain = _PLAIN.isdisjoint(k for k, _ in raw)
        else:
            raw, plain = [], True
        if not plain or status < 200 or status in (204, 304):  # Starlette's own rules then
            super().__init__(content, status, dict(headers or {}), media_type=self.media_type)
            return
        self.status_code, self.body, self.background = status, content, None
        raw.append((b"content-length", b"%d" % len(content)))
        raw.append(_JSON_TYPE)
        self.raw_headers = raw


_PLAIN = frozenset((b"content-length", b"content-type"))
_JSON_TYPE = (b"content-type", b"application/json")


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return JsonReply(body, status, headers)


def failure_of(exc: BaseException, session: str, retry: RetryPolicy) -> Failure:
    """What the client is told of a request that failed (the chat door's statuses)."""
    if isinstance(exc, UpstreamError):
        return Failure(exc.status, exc.message, "upstream_error", exc.code,
                       headers=retry_after_header(exc, retry))  # fmt: skip
    if isinstance(exc, RequestError):
        code = "previous_response_not_found" if exc.param == "previous_response_id" else None
        return Failure(exc.status, exc.message, "invalid_request_error", code, exc.param)
    if isinstance(exc, SessionIdError):
        return Failure(400, str(exc), "invalid_request_error", "invalid_session")
    if isinstance(exc, WindowTooSmallError):
        return Failure(400, str(exc), "invalid_request_error", "context_length_exceeded")
    if isinstance(exc, QuotaError):
        return Failure(413, str(exc), "invalid_request_error", "quota_exceeded")
    _log.exception("keeper proxy failed on session %s", session, exc_info=exc)
    return Failure(500, f"The keeper proxy failed: {exc!r}", "server_error")
