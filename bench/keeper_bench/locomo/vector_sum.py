"""A message scored as its best sentence plus its own vector, as a benchmark option (``msum``).

The product scores a message at the best of its vectors (its own and one per sentence). Here
the nearest ``POOL`` passages by that rule are re-scored as ``best sentence + weight × message``
(cosines of the query with the stored vectors), so a message whose one sentence is near the
question but whose whole is about something else falls behind one near in both. ``msum`` is
weight 1, ``msum=X`` another weight. Measured in ``bench/results/locomo_recall_round13.md``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from keeper_middleware.retrievers.base import Hit, Spans
from keeper_middleware.retrievers.embedders import embed_query
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.named_context import POOL


class SumEmbeddingRetriever(EmbeddingRetriever):
    """:class:`EmbeddingRetriever` whose first ``POOL`` hits are re-scored by the sum rule."""

    def __init__(self, *args: Any, message_weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._message_weight = message_weight

    def search_written(
        self,
        query: str,
        *,
        session: str,
        k: int = 10,
        from_item: int | None = None,
        to_item: int | None = None,
        within: Spans | None = None,
    ) -> list[Hit]:
        found = super().search_written(
            query,
            session=session,
            k=max(k, POOL),
            from_item=from_item,
            to_item=to_item,
            within=within,
        )
        if not found:
            return found
        import numpy as np

        vector = np.array(embed_query(self._embedder, query), dtype=np.float32)
        positions = [hit.passage.position for hit in found]
        got = self._collection.get(
            where={"$and": [{"session": session}, {"position": {"$in": positions}}]},
            include=["embeddings", "metadatas"],
        )
        message: dict[int, float] = {}
        sentence: dict[int, float] = {}
        for embedding, meta in zip(got["embeddings"], got["metadatas"] or [], strict=True):
            row = np.array(embedding, dtype=np.float32)
            cosine = float(row @ vector / (np.linalg.norm(row) * np.linalg.norm(vector) or 1.0))
            position = int(meta["position"])
            if meta.get("sentence") is None:
                message[position] = cosine
            else:
                sentence[position] = max(sentence.get(position, -1.0), cosine)
        rescored = []
        for hit in found:
            position = hit.passage.position
            own = message.get(position, hit.score)
            best = sentence.get(position, own)
            rescored.append(replace(hit, score=best + self._message_weight * own))
        rescored.sort(key=lambda h: (-h.score, -h.passage.position))
        return rescored[:k]
