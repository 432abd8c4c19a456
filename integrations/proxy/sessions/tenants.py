"""Who is calling, and which session a request belongs to.

API keys map to *tenants*; a tenant may hold several keys (one per service, rotated), and every
session is stored under its tenant's name, so no request can reach another tenant's session,
whatever id it names. Keys come from a keys file (one ``tenant key`` pair per line) or from the
environment (``KEEPER_PROXY_KEYS=acme:key1,acme:key2,beta:key3``); only their SHA-256 is kept in
memory and no key is ever logged. A proxy without keys serves one tenant, ``default``.

An *admin* key (whose own chats are tenant ``admin``) sees every tenant's sessions (``/keeper/sessions/<tenant>:<id>``); a *metrics* key
reads ``/metrics`` and nothing else.

Within a tenant a session is named by ``X-Keeper-Session``. Without it, by a hash of the
request's ``user`` field, system prompt and first user message: two callers of one tenant that
send the same ``user`` (or none) and open a conversation the same way share a session. When
several end users sit behind one key, have the client send ``X-Keeper-Session`` or ``user``, and
start the proxy with ``--require-session`` so a request with neither is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from langchain_core.messages import BaseMessage, HumanMessage

from keeper_middleware.errors import ConfigurationError, KeeperError

__all__ = [
    "DEFAULT_TENANT",
    "KEYS_ENV",
    "SESSION_HEADER",
    "Caller",
    "SessionIdError",
    "Tenants",
    "fallback_session",
    "parse_keys",
    "resolve_session",
    "split_stored",
    "stored_name",
]

SESSION_HEADER = "X-Keeper-Session"
DEFAULT_TENANT = "default"
ADMIN_TENANT = "admin"
"""The tenant an admin key's own chat requests are stored under."""
KEYS_ENV = "KEEPER_PROXY_KEYS"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class SessionIdError(KeeperError, ValueError):
    """A session id that cannot be used (it names rows and files, so its alphabet is small)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """What a request's key allows."""

    tenant: str | None
    """The tenant whose sessions it serves; None for a metrics-only key."""
    admin: bool = False
    metrics: bool = False


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_keys(text: str, *, source: str, env: bool = False) -> dict[str, str]:
    """key → tenant from ``tenant key`` pairs, one a line (``#`` starts a comment), or with
    ``env`` from ``tenant:key`` pairs separated by commas."""
    pairs: list[tuple[str, str]] = []
    lines = text.split(",") if env else text.splitlines()
    for number, line in enumerate(lines, 1):
        line = line.strip() if env else line.split("#", 1)[0].strip()
        if not line:
            continue
        tenant, _, key = line.partition(":") if env else line.partition(" ")
        tenant, key = tenant.strip(), key.strip()
        if not _NAME.fullmatch(tenant) or not key:
            raise ConfigurationError(
                f"{source}, entry {number}: expected 'tenant key' (or 'tenant:key'), with a "
                "tenant name of 1 to 128 of A-Z a-z 0-9 . _ -"
            )
        pairs.append((tenant, key))
    keys: dict[str, str] = {}
    for tenant, key in pairs:
        if keys.get(key, tenant) != tenant:
            raise ConfigurationError(
                f"{source}: one key is given to two tenants; give each its own"
            )
        keys[key] = tenant
    return keys


class Tenants:
    """Keys to callers. Holds only the keys' SHA-256, so a memory dump or log shows none."""

    def __init__(
        self,
        keys: Mapping[str, str] | None = None,
        *,
        admin_keys: Iterable[str] = (),
        metrics_keys: Iterable[str] = (),
    ) -> None:
        self._callers: dict[str, Caller] = {
            _digest(k): Caller(tenant=t) for k, t in (keys or {}).items()
        }
        for key in admin_keys:
            self._callers[_digest(key)] = Caller(tenant=ADMIN_TENANT, admin=True, metrics=True)
        self.metrics_protected = False
        for key in metrics_keys:
            self.metrics_protected = True
            self._callers.setdefault(_digest(key), Caller(tenant=None, metrics=True))
        self.open = not self._callers

    def __repr__(self) -> str:
        return f"Tenants({len(self._callers)} keys, open={self.open})"

    @classmethod
    def from_sources(
        cls,
        *,
        api_key: str | None = None,
        keys_file: str | Path | None = None,
        environ: Mapping[str, str] | None = None,
        admin_key: str | None = None,
        metrics_key: str | None = None,
    ) -> Tenants:
        """Keys from every source given: one ``api_key`` (tenant ``default``), a keys file, and
        ``KEEPER_PROXY_KEYS`` in ``environ`` (default: the process environment)."""
        keys: dict[str, str] = {}
        if api_key:
            keys[api_key] = DEFAULT_TENANT
        if keys_file is not None:
            path = Path(keys_file)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot read the keys file {path}: {exc.strerror}"
                ) from exc
            keys |= parse_keys(text, source=f"keys file {path}")
        env = os.environ if environ is None else environ
        if env.get(KEYS_ENV):
            keys |= parse_keys(env[KEYS_ENV], source=KEYS_ENV, env=True)
        return cls(
            keys,
            admin_keys=[admin_key] if admin_key else (),
            metrics_keys=[metrics_key] if metrics_key else (),
        )

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller for an ``Authorization`` header; None when the key is missing or unknown."""
        if self.open:
            return Caller(tenant=DEFAULT_TENANT, admin=True, metrics=True)
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        return self._callers.get(_digest(key.strip()))

    def may_read_metrics(self, caller: Caller) -> bool:
        """With a metrics key set, only it and admin keys read ``/metrics``; else any caller."""
        return caller.metrics or caller.admin or not self.metrics_protected


def check_name(value: str, what: str) -> str:
    if not _NAME.fullmatch(value):
        raise SessionIdError(
            f"{what} {value[:40]!r} is not a valid {'tenant' if what == 'tenant' else 'session'} "
            "id: use 1 to 128 of the characters A-Z a-z 0-9 . _ -"
        )
    return value


def stored_name(tenant: str, session: str) -> str:
    """The name a session is stored under: its tenant's name, a colon, its id."""
    return f"{tenant}:{session}"


def split_stored(name: str) -> tuple[str, str]:
    tenant, _, session = name.partition(":")
    return (tenant, session) if session else (DEFAULT_TENANT, tenant)


def resolve_session(
    header: str | None,
    user: object,
    system_prompt: str | None,
    messages: Sequence[BaseMessage],
    *,
    require: bool = False,
) -> str:
    """The session id (within the caller's tenant): the header when given, else a hash."""
    if header is not None:
        return check_name(header, SESSION_HEADER)
    if require and not (isinstance(user, str) and user):
        raise SessionIdError(
            f"this proxy serves several users per key: send an {SESSION_HEADER} header or a "
            "'user' field naming the end user"
        )
    return fallback_session(system_prompt, messages, user if isinstance(user, str) else None)


def fallback_session(
    system_prompt: str | None, messages: Sequence[BaseMessage], user: str | None = None
) -> str:
    """``auto-<hash>`` of ``user``, the system prompt and the first user message."""
    first = next((m for m in messages if isinstance(m, HumanMessage)), messages[0])
    opening: list[object] = [system_prompt or "", first.content]
    if user:
        opening.append(user)
    text = json.dumps(opening, sort_keys=True, ensure_ascii=False, default=str)
    return "auto-" + hashlib.sha256(text.encode()).hexdigest()[:32]
