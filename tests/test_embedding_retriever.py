"""The chromadb embedding backend: background indexing, errors, embedders, the real model."""

import math
import random
import socket
import subprocess
import sys
import threading

import pytest

from keeper_middleware.retrievers import embedders
from keeper_middleware.retrievers.base import MissingExtraError, Passage, ServerUnavailableError
from keeper_middleware.retrievers.embedders import HashingEmbedder, MiniLMEmbedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever

HASHING = HashingEmbedder()


def passages(session: str, count: int, start: int = 0) -> list[Passage]:
    return [
        Passage(session=session, item=i, position=i, text=f"Batch {i} recorded domo86.")
        for i in range(start, start + count)
    ]


class GatedEmbedder:
    """Embeds only once the test opens the gate, and remembers whether it has been called."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls = 0

    def __call__(self, texts: list[str]) -> list[list[float]]:
        if len(texts) > 1 or "?" not in texts[0]:  # queries (one text with "?") pass at once
            self.gate.wait()
            self.calls += 1
        return HASHING(texts)


def test_add_returns_before_embedding_and_search_waits_for_the_queue():
    embedder = GatedEmbedder()
    retriever = EmbeddingRetriever(embedder=embedder)
    retriever.add(passages("s", 5))
    assert embedder.calls == 0  # add only queued the passages
    threading.Timer(0.2, embedder.gate.set).start()
    hits = retriever.search("domo86?", session="s", k=10)
    assert len(hits) == 5
    retriever.close()


def test_flush_and_close_wait_for_everything_queued(tmp_path):
    retriever = EmbeddingRetriever(tmp_path, embedder=HASHING)
    for start in range(0, 300, 30):
        retriever.add(passages("s", 30, start))
    retriever.close()
    reopened = EmbeddingRetriever(tmp_path, embedder=HASHING)
    assert reopened.count("s") == 300
    reopened.close()


def test_writes_in_chunks_no_larger_than_the_server_allows():
    retriever = EmbeddingRetriever(embedder=HASHING)
    retriever._max_batch = 7
    retriever.add(passages("s", 40))
    assert retriever.count("s") == 40
    retriever.close()


def test_a_failing_embedder_surfaces_on_the_next_call():
    def broken(texts: list[str]) -> list[list[float]]:
        raise OSError("model file unreadable")

    retriever = EmbeddingRetriever(embedder=broken)
    retriever.add(passages("s", 3))
    with pytest.raises(RuntimeError, match=r"model file unreadable.*not indexed"):
        retriever.search("domo86", session="s")
    with pytest.raises(RuntimeError, match="not indexed"):
        retriever.add(passages("s", 1, 3))


def test_a_folder_indexed_with_one_embedder_refuses_another(tmp_path):
    EmbeddingRetriever(tmp_path, embedder=HASHING).close()
    with pytest.raises(ValueError, match=r"hashing-384.*same embedder"):
        EmbeddingRetriever(tmp_path, embedder=HashingEmbedder(dim=64))


@pytest.mark.parametrize("name", ["k", "bad name", "-edge", "ünïcode"])
def test_collection_names_outside_chromas_rule_are_refused_with_the_rule(tmp_path, name):
    with pytest.raises(ValueError, match="3-512 characters"):
        EmbeddingRetriever(tmp_path, embedder=HASHING, collection=name)


def test_path_and_server_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match="either path"):
        EmbeddingRetriever(tmp_path, server="http://127.0.0.1:1", embedder=HASHING)


def test_a_server_that_is_down_is_named_with_its_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(
        ServerUnavailableError, match=f"No Chroma server answered at {url}.*chroma run"
    ):
        EmbeddingRetriever(server=url, embedder=HASHING)


def test_a_missing_chromadb_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "chromadb", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'keeper-middleware\[embeddings\]'"):
        EmbeddingRetriever(embedder=HASHING)


def test_a_missing_sentence_transformers_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(
        MissingExtraError, match=r"sentence_transformers.*keeper-middleware\[embeddings\]"
    ):
        embedders._load_minilm_once.__wrapped__()


def test_hashing_vectors_are_unit_length_and_closer_for_shared_words():
    a, b, c, empty = HASHING(["domo86 was lost", "domo86 was found", "rain over the mill", ""])
    assert all(math.isclose(sum(x * x for x in v), 1.0) for v in (a, b, c, empty))
    assert len(a) == 384

    def cos(u, v):
        return sum(x * y for x, y in zip(u, v, strict=True))

    assert cos(a, b) > cos(a, c)


def test_hashing_dimension_is_checked():
    with pytest.raises(ValueError, match="at least 8"):
        HashingEmbedder(dim=2)


@pytest.mark.real_model
def test_minilm_vectors_are_384_unit_length():
    (vector,) = MiniLMEmbedder()(["The clerk recorded domo86."])
    assert len(vector) == 384
    assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-4)


@pytest.mark.real_model
def test_minilm_finds_a_paraphrase_with_no_shared_word():
    retriever = EmbeddingRetriever()
    texts = [
        "She bought a loaf of bread at the bakery.",
        "The river flooded the lower fields.",
        "The clerk recorded domo86 at nine.",
    ]
    retriever.add([Passage(session="s", item=1, position=i, text=t) for i, t in enumerate(texts)])
    top = retriever.search("purchasing baked goods", session="s", k=1)[0]
    assert top.passage.text == texts[0]
    retriever.close()


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["minilm-int8", "minilm-q8"])
def test_onnx_minilm_vectors_agree_with_pytorch_and_keep_the_input_order(name):
    """The ONNX builds are the same model: vectors close to PyTorch's, in the order the texts
    came (they are embedded shortest first), under a name of their own."""
    texts = [
        "A much longer sentence about the support group she went to on Sunday morning.",
        "Hi!",
        "The clerk recorded domo86 at nine.",
    ]
    made = embedders.embedder_from_name(name)
    vectors = made(texts)
    reference = MiniLMEmbedder()(texts)
    for vector, expected in zip(vectors, reference, strict=True):
        assert len(vector) == 384
        assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-4)
        assert sum(a * b for a, b in zip(vector, expected, strict=True)) > 0.95
    for again, first in zip(made(texts[::-1]), vectors[::-1], strict=True):
        assert again == pytest.approx(first, abs=1e-5)
    assert embedders.embedder_from_name(embedders.embedder_name(made)).name == made.name
    assert embedders.embedder_name(made) != embedders.embedder_name(MiniLMEmbedder())


def test_an_index_written_by_another_process_is_read_back(tmp_path):
    script = (
        "from keeper_middleware.retrievers import EmbeddingRetriever, HashingEmbedder, Passage\n"
        f"r = EmbeddingRetriever({str(tmp_path)!r}, embedder=HashingEmbedder())\n"
        "r.add([Passage(session='s', item=4, position=0, text='vela44 was sealed.')])\n"
        "r.close()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    retriever = EmbeddingRetriever(tmp_path, embedder=HASHING)
    assert retriever.search("vela44", session="s")[0].passage.item == 4
    retriever.close()


def test_a_similarity_floor_turns_nearest_neighbours_into_matches():
    from keeper_middleware.retrievers import EmbeddingRetriever, HashingEmbedder, Passage

    retriever = EmbeddingRetriever(embedder=HashingEmbedder(), min_score=0.2)
    retriever.add(
        [
            Passage("s", 1, 0, "The clerk recorded domo86 at six."),
            Passage("s", 2, 1, "The rain kept on over the hills."),
        ]
    )
    hits = retriever.search("domo86", session="s", k=5)
    assert [h.passage.position for h in hits] == [0]
    retriever.close()


WORDS = ["river", "lamp", "orchard", "ladder", "violin", "harbour", "pepper", "glacier", "tunnel"]


def message(rng, sentences: int, name: str | None = None, at: int = 0) -> str:
    """A message of ``sentences`` filler sentences, the one at ``at`` naming ``name``."""
    out = []
    for index in range(sentences):
        words = rng.sample(WORDS, 4)
        if index == at and name:
            words[1] = name
        out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sentences", [3, 8, 20])
def test_a_message_scores_as_its_best_sentence_and_marks_it(seed, sentences):
    rng = random.Random(seed)
    at = rng.randrange(sentences)
    texts = [message(rng, sentences) for _ in range(30)]
    target = rng.randrange(len(texts))
    texts[target] = message(rng, sentences, "vela44", at)
    retriever = EmbeddingRetriever(embedder=HASHING)
    retriever.add([Passage(session="s", item=i, position=i, text=t) for i, t in enumerate(texts)])
    # the query is the sentence's words, not the name alone: a one-word hashing vector is
    # orthogonal to nearly every stored vector, a flat landscape where chroma's approximate
    # (HNSW) search can miss the one match; shared words give it a slope to follow
    query = texts[target].split(". ")[at].rstrip(".")
    hits = retriever.search(query, session="s", k=3)
    assert hits[0].passage.position == target
    assert hits[0].passage.text == texts[target]  # the whole message, not the sentence
    assert hits[0].sentence == at
    assert len({h.passage.position for h in hits}) == 3  # each message once
    assert retriever.count("s") == len(texts)  # passages, not vectors
    retriever.close()


@pytest.mark.parametrize("sentence_vectors", [True, False])
def test_a_message_re_added_with_fewer_sentences_leaves_no_old_sentence_behind(
    sentence_vectors, tmp_path
):
    retriever = EmbeddingRetriever(tmp_path, embedder=HASHING, sentence_vectors=sentence_vectors)
    long = "Harbour lamp glows. Orchard ladder leans. The vault held tamo12 once."
    retriever.add([Passage(session="s", item=1, position=0, text=long)])
    retriever.add([Passage(session="s", item=1, position=1, text="Glacier tunnel echoes.")])
    retriever.flush()
    retriever.add([Passage(session="s", item=1, position=0, text="River pepper violin.")])
    hits = retriever.search("tamo12 vault", session="s", k=5)
    assert {h.passage.position for h in hits} == {0, 1}
    assert all("tamo12" not in h.passage.text for h in hits)
    assert all(h.sentence == 0 for h in hits)  # one sentence each now
    assert retriever.count("s") == 2
    retriever.close()


def test_messages_re_added_together_lose_their_old_sentences_and_no_other_passage_does(tmp_path):
    retriever = EmbeddingRetriever(tmp_path, embedder=HASHING)
    long = "Harbour lamp glows. Orchard ladder leans. The vault held tamo12 once."
    retriever.add(
        [Passage(session=s, item=1, position=n, text=long) for s in ("a", "b") for n in range(3)]
    )
    retriever.flush()
    retriever.add(
        [
            Passage(session=s, item=1, position=n, text="River pepper violin.")
            for s, n in (("a", 0), ("a", 2), ("b", 1))
        ]
    )
    retriever.flush()
    ids = set(retriever._collection.get(include=[])["ids"])
    kept = {"a:1", "b:0", "b:2"}  # not re-added: their sentences stay
    assert ids == {"a:0", "a:2", "b:1"} | kept | {f"{p}#{i}" for p in kept for i in range(3)}
    retriever.close()


def test_one_vector_per_passage_when_asked(tmp_path):
    retriever = EmbeddingRetriever(tmp_path, embedder=HASHING, sentence_vectors=False)
    retriever.add([Passage(session="s", item=1, position=0, text="One. Two. Three.")])
    retriever.flush()
    assert len(retriever._collection.get(include=[])["ids"]) == 1
    retriever.close()


@pytest.mark.parametrize("seed", range(3))
def test_messages_of_many_sentences_still_give_k_distinct_hits(seed):
    rng = random.Random(seed)
    texts = [message(rng, 30, "vela44" if i % 2 else None, at=rng.randrange(30)) for i in range(12)]
    retriever = EmbeddingRetriever(embedder=HASHING)
    retriever.add([Passage(session="s", item=i, position=i, text=t) for i, t in enumerate(texts)])
    hits = retriever.search("vela44", session="s", k=10)
    assert len(hits) == 10 and len({h.passage.position for h in hits}) == 10
    assert {h.passage.position for h in hits[:6]} == {1, 3, 5, 7, 9, 11}
    retriever.close()


class RecordingEmbedder:
    """The hashing embedder, remembering the texts of every call it gets."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return HASHING(texts)


def test_a_one_sentence_message_costs_one_vector(tmp_path):
    embedder = RecordingEmbedder()
    retriever = EmbeddingRetriever(tmp_path, embedder=embedder)
    retriever.add([Passage(session="s", item=1, position=0, text="Only one sentence here.")])
    retriever.add([Passage(session="s", item=1, position=1, text="First one. Second one.")])
    retriever.flush()
    assert sum(len(call) for call in embedder.calls) == 1 + 3
    assert len(retriever._collection.get(include=[])["ids"]) == 1 + 3
    retriever.close()


@pytest.mark.parametrize("seed", range(3))
def test_vectors_are_embedded_shortest_first_and_each_stays_with_its_text(seed):
    """Each write batch goes to the model in order of length (less padding); the order must not
    change what is found: every passage and every sentence is its own nearest vector."""
    rng = random.Random(seed)
    texts = [message(rng, rng.randrange(1, 9), f"tag{n}x", at=0) for n in range(40)]
    embedder = RecordingEmbedder()
    retriever = EmbeddingRetriever(embedder=embedder, batch_size=16)
    retriever.add([Passage(session="s", item=i, position=i, text=t) for i, t in enumerate(texts)])
    retriever.flush()
    passage_calls = [call for call in embedder.calls if len(call) > 1]
    lengths = [len(text) for call in passage_calls for text in call]
    assert lengths == sorted(lengths)  # one write batch here: sorted across its calls
    assert all(len(call) <= 16 for call in passage_calls)
    stored = retriever._collection.get(include=["embeddings", "documents"])
    for document, vector in zip(stored["documents"], stored["embeddings"], strict=True):
        expected = HASHING([document])[0]
        # a sentence's vector is of "context: sentence" (no context here) or the sentence
        assert max(abs(a - b) for a, b in zip(vector, expected, strict=True)) < 1e-6
    for position, text in enumerate(texts):
        best = retriever.search(text, session="s", k=1)[0]
        assert best.passage.position == position and best.score == pytest.approx(1.0)
    retriever.close()


@pytest.mark.real_model
def test_a_minilm_query_is_the_vector_of_its_text_and_leaves_the_thread_count_alone():
    torch = pytest.importorskip("torch")
    model = MiniLMEmbedder()
    texts = ["When did Caroline go to the support group?", "Hi!"]
    before = torch.get_num_threads()
    for text, expected in zip(texts, model(texts), strict=True):
        assert model.embed_query(text) == pytest.approx(expected, abs=1e-5)
    assert torch.get_num_threads() == before


def stored_vectors(retriever: EmbeddingRetriever) -> dict[str, str]:
    got = retriever._collection.get(include=["documents"])
    return dict(zip(got["ids"], got["documents"], strict=True))


def test_a_sentence_without_a_word_has_no_vector_of_its_own(tmp_path):
    retriever = EmbeddingRetriever(tmp_path, embedder=RecordingEmbedder())
    retriever.add([Passage(session="s", item=1, position=0, text="The vault held tamo12. …")])
    retriever.flush()
    assert len(stored_vectors(retriever)) == 1  # one group: the passage's vector covers it
    retriever.close()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("short_sentences", ["join", "skip"])
def test_short_sentences_cost_no_vector_of_their_own_and_the_long_one_is_marked(
    seed, short_sentences
):
    rng = random.Random(seed)
    interjections = ["Thanks, Mel!", "Wow!", "Cute, right?", "Hey Caroline!", "Sounds great!"]
    statements = [message(rng, 1) for _ in range(3)]
    statements[1] = message(rng, 1, "vela44")
    texts: list[str] = []
    for statement in statements:
        texts += [rng.choice(interjections), statement.replace(".", " in the orchard.")]
    text = " ".join(texts)
    retriever = EmbeddingRetriever(
        embedder=HASHING, sentence_words=4, short_sentences=short_sentences
    )
    retriever.add([Passage(session="s", item=1, position=0, text=text)])
    retriever.add([Passage(session="s", item=1, position=1, text=message(rng, 4))])
    retriever.flush()
    ids = stored_vectors(retriever)
    sentence_ids = sorted(i for i in ids if i.startswith("s:0#"))
    assert len(sentence_ids) == 3  # one vector a statement, none an interjection's alone
    if short_sentences == "skip":
        assert all(ids[i] in texts[1::2] for i in sentence_ids)
    query = texts[3].rstrip(".")
    hit = retriever.search(query, session="s", k=1)[0]
    assert hit.passage.position == 0 and hit.passage.text == text
    assert hit.sentence == 3  # the statement, not the interjection it shares a vector with
    retriever.close()


@pytest.mark.parametrize(
    ("options", "field"),
    [({"sentence_words": 0}, "sentence_words"), ({"short_sentences": "drop"}, "short_sentences")],
)
def test_sentence_vector_options_are_checked(options, field):
    with pytest.raises(ValueError, match=field):
        EmbeddingRetriever(embedder=HASHING, **options)


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["minilm", "minilm-int8"])
def test_batches_side_by_side_give_each_text_its_vector_alone(name):
    """Batches run on parallel threads, one torch/onnxruntime thread each: every text gets the
    vector it gets embedded alone, in the order given, and torch's thread count is put back."""
    torch = pytest.importorskip("torch")
    rng = random.Random(7)
    texts = [message(rng, rng.randrange(1, 4)) for _ in range(40)] + ["Hi!", "…"]
    rng.shuffle(texts)
    before = torch.get_num_threads()
    made = embedders.embedder_from_name(name)
    together = made(texts)
    assert torch.get_num_threads() == before
    for text, vector in zip(texts[:6], together, strict=False):
        assert vector == pytest.approx(made([text])[0], abs=1e-4)
    single = (
        embedders.MiniLMEmbedder(threads=1, batch_size=8)
        if name == "minilm"
        else embedders.OnnxMiniLMEmbedder(threads=1, batch_size=8)
    )
    for vector, expected in zip(together, single(texts), strict=True):
        assert vector == pytest.approx(expected, abs=1e-4)


@pytest.mark.real_model
def test_concurrent_calls_share_torchs_one_thread_and_give_it_back():
    torch = pytest.importorskip("torch")
    model = MiniLMEmbedder()
    texts = [f"The clerk recorded domo{n} at nine in the morning." for n in range(30)]
    expected = model(texts)
    before = torch.get_num_threads()
    results: list[list[list[float]]] = [[] for _ in range(4)]

    def embed(slot: int) -> None:
        results[slot] = model(texts) if slot % 2 else [model.embed_query(t) for t in texts[:5]]

    threads = [threading.Thread(target=embed, args=(slot,)) for slot in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert torch.get_num_threads() == before
    for slot, made in enumerate(results):
        wanted = expected if slot % 2 else expected[:5]
        for vector, reference in zip(made, wanted, strict=True):
            assert vector == pytest.approx(reference, abs=1e-4)


@pytest.mark.real_model
def test_the_quantized_graph_is_cached_so_a_later_load_needs_no_onnx(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    load = embedders._load_onnx_minilm_once
    texts = ["When did Caroline go to the support group?", "Hi!", "The clerk recorded domo86."]
    load.cache_clear()
    try:
        first = embedders.OnnxMiniLMEmbedder(quantized=True, threads=1)(texts)
        (cached,) = (tmp_path / "keeper-middleware").glob("minilm-q8-*.onnx")
        load.cache_clear()
        monkeypatch.setitem(sys.modules, "onnxruntime.quantization", None)  # as without onnx
        again = embedders.OnnxMiniLMEmbedder(quantized=True, threads=1)(texts)
        assert again == first  # the same graph, read from the file
        cached.write_bytes(cached.read_bytes()[:1000])  # a truncated file is made again
        load.cache_clear()
        with pytest.raises(MissingExtraError, match=r"keeper-middleware\[onnx\]"):
            embedders.OnnxMiniLMEmbedder(quantized=True)(texts)
        monkeypatch.delitem(sys.modules, "onnxruntime.quantization")
        load.cache_clear()
        assert embedders.OnnxMiniLMEmbedder(quantized=True, threads=1)(texts) == first
        assert cached.stat().st_size > 1000
    finally:
        load.cache_clear()


@pytest.mark.parametrize("sentence_context", [True, False])
def test_sentence_vectors_carry_the_context_unless_told_not_to(sentence_context):
    embedder = RecordingEmbedder()
    retriever = EmbeddingRetriever(embedder=embedder, sentence_context=sentence_context)
    text = "I painted the lake. It took all summer."
    retriever.add([Passage(session="s", item=1, position=0, text=text, context="Ana (1 May)")])
    retriever.flush()
    embedded = sorted(t for call in embedder.calls for t in call)
    sentences = ["I painted the lake.", "It took all summer."]
    if sentence_context:
        sentences = [f"Ana (1 May): {s}" for s in sentences]
    assert embedded == sorted([f"Ana (1 May): {text}", *sentences])  # the message keeps it
    retriever.close()
