"""The part every benchmark wrapper of a retriever shares: what it does not change, it passes on.

The recall options that rewrite a query or fuse more lists (``speakers.py``, ``feedback.py``,
``query_forms.py``) wrap a backend and change only ``search`` (and what ``add`` learns).
"""

from __future__ import annotations

from keeper_middleware.retrievers.base import Retriever


class WrappedRetriever:
    """Passes ``count``, ``delete_session``, ``flush`` and ``close`` to the wrapped ``inner``."""

    def __init__(self, inner: Retriever) -> None:
        self._inner = inner

    def count(self, session: str) -> int:
        return self._inner.count(session)

    def delete_session(self, session: str) -> None:
        self._inner.delete_session(session)

    def flush(self) -> None:
        self._inner.flush()

    def close(self) -> None:
        self._inner.close()
