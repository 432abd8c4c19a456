"""Each tenant's stored bytes, counted against its disk quota.

A team's proxy serves many tenants on one archive; a quota keeps one of them from filling the
disk. What a tenant's sessions stored is summed once (from the sessions' counters), then kept up
to date as requests store more and sessions are erased, so a request never walks every session.
"""

from __future__ import annotations

from collections.abc import Callable

from keeper_middleware.errors import ConfigurationError, KeeperError
from keeper_middleware.integrations.proxy.sessions.metrics import ProxyStats
from keeper_middleware.integrations.proxy.sessions.tenants import split_stored

__all__ = ["QuotaError", "TenantQuota"]


class QuotaError(KeeperError):
    """Storing a request would take its tenant past its disk quota."""


class TenantQuota:
    """The bytes each tenant's sessions stored, and the quota they may not pass.

    Args:
        limit: bytes a tenant may store (None: no limit).
        stats: a session's counters (their ``stored_bytes`` is what the session stored).
        sessions: every session's stored name.

    Raises:
        ConfigurationError: ``limit`` is not a positive number of bytes.
    """

    def __init__(
        self,
        limit: int | None,
        stats: Callable[[str], ProxyStats],
        sessions: Callable[[], list[str]],
    ) -> None:
        if limit is not None and limit <= 0:
            raise ConfigurationError(
                "tenant_quota_bytes must be a positive number of bytes, or None"
            )
        self.limit = limit
        self._stats, self._sessions = stats, sessions
        self._used: dict[str, int] = {}

    def used(self, tenant: str) -> int:
        """Bytes the tenant's sessions stored (computed once, then kept up to date)."""
        if tenant not in self._used:
            self._used[tenant] = sum(
                self._stats(s).stored_bytes
                for s in self._sessions()
                if split_stored(s)[0] == tenant
            )
        return self._used[tenant]

    def charge(self, session: str, size: int, *, check: bool = True) -> None:
        """Count ``size`` bytes against the session's tenant.

        Raises:
            QuotaError: with ``check``, the bytes would take the tenant past its quota.
        """
        tenant = split_stored(session)[0]
        if check and self.limit is not None and size:
            used = self.used(tenant)
            if used + size > self.limit:
                raise QuotaError(
                    f"tenant {tenant!r} has stored {used:,} bytes; this request would take it "
                    f"past its quota of {self.limit:,} bytes. Delete sessions it no longer "
                    "needs (DELETE /keeper/sessions/<id>) or ask for a larger quota."
                )
        if tenant in self._used:
            self._used[tenant] += size
        self._stats(session).stored_bytes += size

    def erased(self, session: str) -> None:
        """The session is being erased: what it stored no longer counts."""
        tenant = split_stored(session)[0]
        if tenant in self._used:
            self._used[tenant] -= self._stats(session).stored_bytes
