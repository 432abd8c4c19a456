"""Responses ids: opaque to whoever holds one, resolved through the archive.

A response id is ``resp_`` and 32 random hex digits: it tells nothing of the session it continues
(a session's name can carry what a user typed into a client). What it stands for is kept in the
archive as a handle (:mod:`keeper_middleware.archive.handles`): the session, under its tenant's
stored name; the id the reply has in the session; whether it may be continued (``store``). An id
therefore resolves after a restart and on every replica on one archive, and only for its own
tenant: another tenant's id gets the same error as an id never given
(:func:`~keeper_middleware.integrations.proxy.sessions.history.unknown_response`), so an id tells
nobody whether it names something elsewhere. A handle goes with its session (``DELETE
/keeper/sessions/{id}``).

Ids of the earlier form (``resp_k``, the session's name in hex, a dot, a nonce) are still read as
they were, within the caller's tenant, so a client mid-conversation across the upgrade continues.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any

from keeper_middleware.archive.handles import HandleStore
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.integrations.proxy.conversation.form import RequestError
from keeper_middleware.integrations.proxy.sessions.history import unknown_response
from keeper_middleware.integrations.proxy.sessions.tenants import stored_name

__all__ = ["ResponseIds", "legacy_response_id"]

_log = logging.getLogger(__name__)
_OPAQUE = re.compile(r"resp_[0-9a-f]{32}")
_LEGACY = re.compile(r"resp_([kx])((?:[0-9a-f]{2}){1,128})\.([0-9a-f]{1,32})")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


class ResponseIds:
    """Issues response ids and resolves them for a tenant, through the archive's handles.

    Args:
        archive: the keeper's archive; one without handles (a store of one's own) keeps the
            ids in this process only, which a warning says once.
    """

    def __init__(self, archive: ArchiveStore) -> None:
        if isinstance(archive, HandleStore):
            self.handles: HandleStore = archive
        else:
            _log.warning(
                "the archive %r keeps no handles: Responses ids resolve in this process only, "
                "not after a restart or on another replica",
                archive,
            )
            self.handles = _ProcessHandles()

    def issue(self, tenant: str, session: str, *, stored: bool) -> tuple[str, str]:
        """A new answer's response id, and the id its reply gets in the session; ``stored``:
        whether the id may be continued (the request's ``store``)."""
        answer = f"resp_{secrets.token_hex(16)}"
        reply = f"r-{secrets.token_hex(8)}"
        kept = {"session": session, "reply": reply, "stored": stored}
        self.handles.put_handle(stored_name(tenant, session), answer, kept)
        return answer, reply

    def resolve(self, tenant: str, value: str) -> tuple[str, str]:
        """(session, the reply's id in it) a ``previous_response_id`` continues, for a caller of
        ``tenant``.

        Raises:
            RequestError: the id is not one this proxy gave this tenant (malformed, never given,
                another tenant's, or its session deleted: one error for all), or it was
                created with ``store=false``.
        """
        if _LEGACY.fullmatch(value):
            return legacy_response_id(value)
        found = self.handles.find_handle(value) if _OPAQUE.fullmatch(value) else None
        if found is None:
            raise unknown_response()
        name, kept = found
        if not isinstance(kept, dict) or name != stored_name(tenant, str(kept.get("session"))):
            raise unknown_response()
        if kept.get("stored") is not True:
            raise _not_stored(value)
        return str(kept["session"]), str(kept["reply"])


def legacy_response_id(value: str) -> tuple[str, str]:
    """(session, reply id) of an id of the earlier form, which carried the session in hex.

    Raises:
        RequestError: the id is malformed, or was created with ``store=false``.
    """
    match = _LEGACY.fullmatch(value)
    if match is None:
        raise unknown_response()
    flag, hexed, nonce = match.groups()
    try:
        session = bytes.fromhex(hexed).decode()
    except UnicodeDecodeError:
        raise unknown_response() from None
    if not _NAME.fullmatch(session):
        raise unknown_response()
    if flag == "x":
        raise _not_stored(value)
    return session, f"r-{nonce}"


def _not_stored(value: str) -> RequestError:
    return RequestError(
        f"Response {value[:80]!r} was created with store=false, so it cannot be continued; "
        "send the whole conversation in 'input', or leave store on.",
        param="previous_response_id",
    )


class _ProcessHandles:
    """Handles kept in this process (an archive without them)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[str, Any]] = {}

    def put_handle(self, session: str, handle: str, value: Any) -> None:
        self._kept[handle] = (session, value)

    def find_handle(self, handle: str) -> tuple[str, Any] | None:
        return self._kept.get(handle)
