"""One contract, every backend: adding a backend is one line in ``BACKENDS``.

Each backend is built by a factory from a folder; calling the factory again with the same folder
reopens what was stored (for in-memory backends the persistence test is skipped).
"""

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore

from keeper_middleware.retrievers.base import Hit, Passage, Retriever
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.factory import make_retriever
from keeper_middleware.retrievers.hybrid import HybridRetriever
from keeper_middleware.retrievers.keyword import KeywordRetriever
from keeper_middleware.retrievers.postgres_keyword import PostgresKeywordRetriever
from keeper_middleware.retrievers.sentences import passages_from_text
from keeper_middleware.retrievers.tantivy_keyword import TantivyKeywordRetriever
from keeper_middleware.retrievers.vectorstore import VectorStoreRetriever

Factory = Callable[[Path], Retriever]
HASHING = HashingEmbedder()


class HashingEmbeddings(Embeddings):
    """The hashing embedder as LangChain ``Embeddings``, for the vector-store adapter."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [list(v) for v in HASHING(list(texts))]

    def embed_query(self, text: str) -> list[float]:
        return list(HASHING([text])[0])


def langchain_chroma(folder: Path) -> Any:
    from langchain_chroma import Chroma

    return Chroma(
        collection_name="keeper",
        embedding_function=HashingEmbeddings(),
        persist_directory=str(folder / "lc-chroma"),
        collection_metadata={"hnsw:space": "cosine"},
    )


BACKENDS = [
    pytest.param((lambda d: KeywordRetriever(d / "kw.sqlite3"), True), id="keyword-file"),
    pytest.param((lambda d: KeywordRetriever(), False), id="keyword-memory"),
    pytest.param(
        (lambda d: TantivyKeywordRetriever(d / "tantivy"), True), id="keyword-tantivy-folder"
    ),
    pytest.param((lambda d: TantivyKeywordRetriever(), False), id="keyword-tantivy-memory"),
    pytest.param(
        (lambda d: EmbeddingRetriever(d / "chroma", embedder=HASHING), True),
        id="embedding-hashing-persistent",
    ),
    pytest.param(
        (lambda d: EmbeddingRetriever(embedder=HASHING), False), id="embedding-hashing-ephemeral"
    ),
    pytest.param(
        (lambda d: make_retriever("hybrid", path=d, embedder=HASHING), True), id="hybrid-hashing"
    ),
    pytest.param(
        (
            lambda d: HybridRetriever(KeywordRetriever(), EmbeddingRetriever(embedder=HASHING)),
            False,
        ),
        id="hybrid-memory",
    ),
    pytest.param(
        (lambda d: EmbeddingRetriever(d / "chroma"), True),
        id="embedding-minilm",
        marks=pytest.mark.real_model,
    ),
    pytest.param(
        (lambda d: make_retriever(InMemoryVectorStore(HashingEmbeddings())), False),
        id="langchain-in-memory-vectorstore",
    ),
    pytest.param(
        (lambda d: VectorStoreRetriever(langchain_chroma(d)), True), id="langchain-chroma"
    ),
    pytest.param(
        (lambda d, url, schema: PostgresKeywordRetriever(url, schema=schema), True),
        id="keyword-postgres",
        marks=pytest.mark.postgres,
    ),
    pytest.param(
        (
            lambda d, url, schema: make_retriever(
                "hybrid", embedder=HASHING, database=url, schema=schema
            ),
            False,
        ),
        id="hybrid-postgres",
        marks=pytest.mark.postgres,
    ),
]

STORY = (
    "The clerk recorded domo86 at three hundred and forty-two. Ten were taken from it. "
    "The rain kept on. Mira added four to kalo17. The miller counted the sacks twice. "
    "A cart rolled past the gate."
)


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    factory, persistent = request.param
    made: list[Retriever] = []

    on_postgres = "postgres" in request.node.callspec.id

    def build() -> Retriever:
        if on_postgres:
            url, schema = (
                request.getfixturevalue("postgres_url"),
                request.getfixturevalue("pg_schema"),
            )
            retriever = factory(tmp_path, url, schema)
        else:
            retriever = factory(tmp_path)
        made.append(retriever)
        return retriever

    build.persistent = persistent
    yield build
    for retriever in made:
        retriever.close()


@pytest.fixture
def retriever(backend):
    return backend()


def texts(hits: list[Hit]) -> list[str]:
    return [hit.passage.text for hit in hits]


def story(session: str = "s1", item: int = 1, start: int = 0, text: str = STORY) -> list[Passage]:
    return passages_from_text(session, item, text, start)


def test_is_a_retriever(retriever):
    assert isinstance(retriever, Retriever)


def test_finds_the_sentence_that_names_the_counter_first(retriever):
    retriever.add(story())
    hits = retriever.search("domo86", session="s1", k=3)
    assert hits[0].passage == Passage(
        session="s1", item=1, position=0,
        text="The clerk recorded domo86 at three hundred and forty-two.",
    )  # fmt: skip
    assert all(a.score >= b.score for a, b in itertools.pairwise(hits))


def test_each_hit_carries_the_sentence_that_follows_it(retriever):
    retriever.add(story())
    hit = retriever.search("domo86", session="s1", k=1)[0]
    assert hit.next_text == "Ten were taken from it."


def test_the_last_sentence_has_no_next_text_until_one_arrives(retriever):
    retriever.add(story())
    last = retriever.search("cart rolled gate", session="s1", k=1)[0]
    assert (last.passage.position, last.next_text) == (5, "")
    retriever.add(story(item=2, start=6, text="The gate was shut at dusk."))
    again = retriever.search("cart rolled gate", session="s1", k=5)
    assert {h.passage.position: h.next_text for h in again}[5] == "The gate was shut at dusk."


def test_k_limits_the_number_of_hits(retriever):
    retriever.add(story())
    assert len(retriever.search("the", session="s1", k=2)) <= 2
    assert len(retriever.search("domo86 kalo17 rain cart miller", session="s1", k=2)) == 2


def test_item_range_is_inclusive_on_both_ends(retriever):
    for item in range(1, 6):
        retriever.add(story(item=item, start=item * 10, text=f"Batch {item} moved domo86."))
    hits = retriever.search("domo86", session="s1", k=10, from_item=2, to_item=4)
    assert sorted(h.passage.item for h in hits) == [2, 3, 4]
    assert sorted(
        h.passage.item for h in retriever.search("domo86", session="s1", from_item=4)
    ) == [4, 5]
    assert sorted(h.passage.item for h in retriever.search("domo86", session="s1", to_item=1)) == [
        1
    ]


def test_sessions_never_see_each_other(retriever):
    retriever.add(story(session="alice"))
    retriever.add(story(session="bob", text="Bob has his own domo86 of nine."))
    assert texts(retriever.search("domo86", session="bob", k=10)) == [
        "Bob has his own domo86 of nine."
    ]
    assert all(h.passage.session == "alice" for h in retriever.search("domo86", session="alice"))
    assert retriever.search("domo86", session="carol") == []
    assert (retriever.count("alice"), retriever.count("bob"), retriever.count("carol")) == (6, 1, 0)


def test_passages_added_after_a_search_are_found_by_the_next(retriever):
    retriever.add(story())
    assert not any("zuvo31" in t for t in texts(retriever.search("zuvo31", session="s1")))
    for item in range(2, 12):  # many small adds, searched in between
        retriever.add(story(item=item, start=item * 10, text=f"Batch {item} recorded zuvo31."))
        found = retriever.search("zuvo31", session="s1", k=20)
        assert {h.passage.item for h in found if "zuvo31" in h.passage.text} == set(
            range(2, item + 1)
        )


def test_re_adding_a_position_replaces_it(retriever):
    retriever.add(story())
    retriever.add(
        [Passage(session="s1", item=1, position=0, text="The clerk recorded vela44 at nine.")]
    )
    assert retriever.count("s1") == 6
    assert "vela44" in retriever.search("vela44", session="s1", k=1)[0].passage.text
    assert all("domo86" not in t for t in texts(retriever.search("domo86", session="s1")))


def test_delete_session_removes_only_that_session(retriever):
    retriever.add(story(session="gone"))
    retriever.add(story(session="kept"))
    retriever.delete_session("gone")
    assert retriever.count("gone") == 0
    assert retriever.search("domo86", session="gone") == []
    assert retriever.count("kept") == 6
    assert retriever.search("domo86", session="kept")[0].passage.session == "kept"


def test_unicode_text_is_found_and_returned_intact(retriever):
    retriever.add(story(text="Zoë paid 5 € for the café. Ärger folgte bald. 東京は晴れ"))
    hit = retriever.search("café Zoë", session="s1", k=1)[0]
    assert hit.passage.text == "Zoë paid 5 € for the café."
    assert hit.next_text == "Ärger folgte bald. 東京は晴れ"


@pytest.mark.parametrize("query", ["", "   ", "?!...", '"', "*", "AND OR NOT", "(domo86"])
def test_empty_punctuation_and_operator_queries_are_safe(retriever, query):
    retriever.add(story())
    hits = retriever.search(query, session="s1")
    if not any(ch.isalnum() for ch in query):
        assert hits == []
    assert isinstance(hits, list)


def test_a_very_long_passage_is_stored_and_found(retriever):
    long_text = "The ledger of domo86 " + " ".join(f"entry{i}" for i in range(2_000)) + "."
    retriever.add([Passage(session="s1", item=1, position=0, text=long_text)])
    hits = retriever.search("ledger domo86", session="s1", k=1)
    assert hits[0].passage.text == long_text


def test_bad_search_arguments_say_what_to_do(retriever):
    with pytest.raises(ValueError, match="positive"):
        retriever.search("domo86", session="s1", k=0)
    with pytest.raises(ValueError, match="swap"):
        retriever.search("domo86", session="s1", from_item=5, to_item=2)


def test_results_survive_close_and_reopen(backend):
    if not backend.persistent:
        pytest.skip("this backend keeps its index in memory")
    first = backend()
    first.add(story())
    first.add(story(session="s2", text="Another domo86 story."))
    before = first.search("domo86 taken", session="s1", k=4, from_item=1)
    first.close()
    second = backend()
    assert second.search("domo86 taken", session="s1", k=4, from_item=1) == before
    assert (second.count("s1"), second.count("s2")) == (6, 1)


def test_adding_from_another_thread_while_searching_loses_nothing(retriever):
    def writer() -> None:
        for item in range(1, 21):
            retriever.add(story(item=item, start=item * 10, text=f"Batch {item} recorded zuvo31."))

    thread = threading.Thread(target=writer)
    thread.start()
    while thread.is_alive():
        retriever.search("zuvo31", session="s1", k=5)
    thread.join()
    assert retriever.count("s1") == 20
    assert len(retriever.search("zuvo31", session="s1", k=50)) == 20


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        (None, KeywordRetriever),
        ("keyword", KeywordRetriever),
        ("embedding", EmbeddingRetriever),
        ("hybrid", HybridRetriever),
    ],
)
def test_one_argument_chooses_the_backend(tmp_path, spec, kind):
    retriever = make_retriever(spec, path=tmp_path, embedder=HASHING)
    assert isinstance(retriever, kind)
    retriever.close()


def test_an_object_passes_through_the_factory():
    mine = KeywordRetriever()
    assert make_retriever(mine) is mine
    mine.close()


@pytest.mark.parametrize("spec", ["bm25", "keyword+http://127.0.0.1:1", ""])
def test_an_unknown_spec_lists_the_choices(spec):
    with pytest.raises(ValueError, match="use 'keyword', 'embedding', 'hybrid'"):
        make_retriever(spec)


def test_a_non_retriever_object_is_refused():
    with pytest.raises(TypeError, match="retriever must be a Retriever"):
        make_retriever(42)  # type: ignore[arg-type]


def test_within_returns_only_the_branchs_passages_and_its_next_sentence(retriever):
    """A forked thread's index holds every branch's passages: positions 0-5 are shared, 6-11
    another branch's, 12-17 this branch's. A search within this branch never returns the other
    branch's, even when they would rank first, and shows as the next sentence of its last shared
    passage the first of its own."""
    from keeper_middleware.retrievers.base import Spans

    shared = story(text="The clerk recorded domo86 at three. " * 5 + "A cart rolled past the gate.")
    other = passages_from_text("s1", 2, "Ten were taken from domo86 on the left. " * 6, len(shared))
    mine = passages_from_text(
        "s1", 2, "Mira added four to domo86 on the right. " * 6, len(shared) + len(other)
    )
    retriever.add([*shared, *other, *mine])
    branch = Spans.ordered([(0, len(shared)), (mine[0].position, mine[-1].position + 1)])
    hits = retriever.search("domo86 left", session="s1", k=20, within=branch)
    assert hits and all(hit.passage.position in branch for hit in hits)
    assert not any("left" in hit.passage.text for hit in hits)
    last_shared = [h for h in hits if h.passage.position == len(shared) - 1]
    cart = retriever.search("cart gate", session="s1", k=3, within=branch)
    assert cart[0].passage.position == len(shared) - 1
    assert cart[0].next_text == mine[0].text  # the branch's next, not the other's
    assert retriever.search("domo86", session="s1", k=5, within=Spans()) == []
    assert last_shared == [] or last_shared[0].next_text == mine[0].text
    # a branch that took up the cart sentence after its own (another branch indexed it first):
    # it comes last in the branch's order, so nothing is shown after it
    later = Spans.ordered(
        [
            (0, len(shared) - 1),
            (mine[0].position, mine[-1].position + 1),
            (len(shared) - 1, len(shared)),
        ]
    )
    cart = retriever.search("cart gate", session="s1", k=3, within=later)
    assert cart[0].passage.position == len(shared) - 1 and cart[0].next_text == ""


def test_a_hit_in_a_passage_of_several_sentences_marks_the_sentence_that_matched(retriever):
    from keeper_middleware.retrievers.passages import excerpt

    text = "Item 3. Mira set c3 to 3. The clerk checked the ledger."
    retriever.add([Passage(session="s1", item=3, position=0, text=text)])
    hit = retriever.search("c3", session="s1", k=1)[0]
    assert hit.sentence == 1
    assert excerpt(hit).startswith("Item 3. »Mira set c3 to 3.«")
