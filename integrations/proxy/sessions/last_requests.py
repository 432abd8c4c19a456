"""The last chat request of each session served lately, kept to read the next one at once.

An agent resends its whole history on every call; what the proxy keeps of a session's last
request (:class:`~..conversation.resent.Resent`) confirms the resent part of the next one in one
comparison. Only the sessions served most recently are kept (each entry holds its request's
parsed JSON); a session past them is read whole once, then kept again. Worker threads of
different sessions read and write here at once, so every change is made under a lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from keeper_middleware.integrations.proxy.conversation.resent import Resent

__all__ = ["RESENT_SESSIONS", "LastRequests"]

RESENT_SESSIONS = 4096
"""Sessions whose last request is kept to read the next one incrementally."""


class LastRequests:
    """The last request of at most ``most`` sessions, the least recently served dropped first.

    Args:
        most: sessions kept at most.
    """

    def __init__(self, most: int = RESENT_SESSIONS) -> None:
        self.most = most
        self._kept: OrderedDict[str, Resent] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session: str) -> Resent | None:
        return self._kept.get(session)

    def keep(self, session: str, resent: Resent) -> Resent:
        """Keep ``resent`` as the session's last request (the session becomes the most recent);
        ``resent``, with its messages' JSON when the check of the request before serialized
        them (:meth:`.Resent.followed_by`)."""
        with self._lock:
            before = self._kept.get(session)
            if before is not None:  # its check may have serialized these messages already
                resent = before.followed_by(resent)
            self._kept[session] = resent
            self._kept.move_to_end(session)
            while len(self._kept) > self.most:
                self._kept.popitem(last=False)
        return resent

    def answered(
        self, session: str, known: Resent, message: dict[str, Any], pair: tuple[int | None, str]
    ) -> None:
        """The reply ``message`` the agent got joins the request ``known`` it answers
        (:meth:`.Resent.answered`), unless a later request of the session came in between."""
        with self._lock:
            if self._kept.get(session) is known:
                self._kept[session] = known.answered(message, pair)

    def forget(self, session: str) -> None:
        with self._lock:
            self._kept.pop(session, None)
