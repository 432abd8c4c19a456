"""LoCoMo in the benchmark: the loader, retrieval recall, the paper's grading, and arms answering
over a real local HTTP server (plumbing: a scripted model, not a model's score).

Every fixture is written here in the dataset's format; the dataset itself is never used by tests.
"""

import json
import threading

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from keeper_bench.cli import main
from keeper_bench.locomo import recall as recall_module
from keeper_bench.locomo.answers import (
    QUESTION_HEADER,
    parse_answers,
    session_message,
)
from keeper_bench.locomo.dataset import (
    LocomoFormatError,
    archived_text,
    load_locomo,
    split_evidence,
)
from keeper_bench.locomo.grading import grade_answer, token_f1
from keeper_bench.locomo.indexing import (
    GRANULARITIES,
    archived_turn,
    conversation_passages,
)
from keeper_bench.locomo.recall import MethodSpec, configuration, measure
from keeper_bench.locomo.streams import conversation_from_stream
from keeper_bench.run_options import resolve_stream
from keeper_bench.streams import question_sets, read_stream
from keeper_middleware.config import KeeperConfig
from keeper_middleware.integrations.proxy.cli import serve_in_thread
from keeper_middleware.retrievers.sentences import sentence_groups, split_sentences
from keeper_middleware.search.indexing import turn_passages

FILLER = [
    "Hey, how are you doing today?",
    "Wow, that's great! I'm so happy for you.",
    "Thanks! It has been a busy week with the kids.",
    "Same here, work keeps me running around.",
]


def sample(sample_id: str, facts: list[tuple[str, str, str]], sessions: int = 3) -> dict:
    """A conversation of ``sessions`` sessions; ``facts`` are (speaker, text, question) placed
    one per session after some filler, each asked about with its turn as evidence."""
    conversation: dict = {"speaker_a": "Ana", "speaker_b": "Ben"}
    qa = []
    for number in range(1, sessions + 1):
        conversation[f"session_{number}_date_time"] = f"1:00 pm on {number} May, 2023"
        turns = []
        for index, text in enumerate(FILLER, start=1):
            turns.append(
                {
                    "speaker": "Ana" if index % 2 else "Ben",
                    "dia_id": f"D{number}:{index}",
                    "text": text,
                }
            )
        if number <= len(facts):
            speaker, text, question = facts[number - 1]
            dia_id = f"D{number}:{len(turns) + 1}"
            turns.append(
                {
                    "speaker": speaker,
                    "dia_id": dia_id,
                    "text": text,
                    "blip_caption": "a photo of a red kite on a beach",
                }
            )
            qa.append(
                {
                    "question": question,
                    "answer": text.split()[-1].strip("."),
                    "evidence": [dia_id],
                    "category": 4,
                }
            )
        conversation[f"session_{number}"] = turns
    qa.append(
        {
            "question": "Where did Ana go on her trip to the moon?",
            "evidence": ["D1:1"],
            "category": 5,
            "adversarial_answer": "the crater",
        }
    )
    qa.append(
        {
            "question": "What did Ben and Ana both mention?",
            "answer": "kids, work",
            "evidence": ["D1:3; D1:4"],
            "category": 1,
        }
    )
    return {"sample_id": sample_id, "conversation": conversation, "qa": qa}


FACTS = [
    ("Ana", "I adopted a greyhound called Pepper.", "What is the name of Ana's greyhound?"),
    ("Ben", "I finally learned to play the cello.", "Which instrument did Ben learn to play?"),
    ("Ana", "We decided to move to Lisbon.", "Which city did Ana move to?"),
]


@pytest.fixture
def locomo_file(tmp_path):
    path = tmp_path / "locomo-fixture.json"
    path.write_text(json.dumps([sample("conv-a", FACTS), sample("conv-b", FACTS[::-1])]))
    return path


def test_sessions_become_dated_items_and_evidence_is_split(locomo_file):
    conversations = load_locomo(locomo_file)
    assert [c.sample_id for c in conversations] == ["conv-a", "conv-b"]
    first = conversations[0]
    assert [s.number for s in first.sessions] == [1, 2, 3]
    assert first.sessions[1].date == "1:00 pm on 2 May, 2023"
    multi_hop = next(q for q in first.questions if q.category == 1)
    assert multi_hop.evidence == ("D1:3", "D1:4")
    adversarial = next(q for q in first.questions if q.category == 5)
    assert adversarial.answer == "the crater"
    photo = next(t for t in first.turns() if t.caption)
    assert archived_text(photo, "today").endswith(
        "[shares a photo: a photo of a red kite on a beach]"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["D8:6; D9:17"], ("D8:6", "D9:17")),
        (["D1:3", "D1:3"], ("D1:3",)),
        ("D2:10,D3:1", ("D2:10", "D3:1")),
        (None, ()),
    ],
)
def test_evidence_ids_are_split_however_they_were_written(raw, expected):
    assert split_evidence(raw) == expected


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not JSON"),
        ("[]", "list of samples"),
        (json.dumps([{"qa": []}]), "'conversation' is missing"),
        (
            json.dumps([{"conversation": {"session_1": [{"speaker": "A", "text": "hi"}]}}]),
            "no dia_id",
        ),
        (json.dumps([{"conversation": {"speaker_a": "A"}, "qa": []}]), "no session_N"),
    ],
)
def test_a_file_not_in_the_format_gets_an_error_that_says_where(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(LocomoFormatError, match=message):
        load_locomo(path)


def test_a_question_with_a_bad_category_is_named(tmp_path):
    data = sample("conv-a", FACTS)
    data["qa"][0]["category"] = 9
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([data]))
    with pytest.raises(LocomoFormatError, match="qa 0: category must be 1–5"):
        load_locomo(path)


def test_a_missing_file_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="LoCoMo"):
        load_locomo(tmp_path / "nowhere.json")


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_every_passage_maps_back_to_its_turn_and_session(locomo_file, granularity):
    conversation = load_locomo(locomo_file)[0]
    indexed = conversation_passages(conversation, session="s", granularity=granularity)
    assert set(indexed.turn_of.values()) == {t.dia_id for t in conversation.turns()}
    for passage in indexed.passages:
        assert passage.item == int(indexed.turn_of[passage.position][1:].split(":")[0])
    if granularity != "sentences":
        assert all(p.context.startswith(("Ana (", "Ben (")) for p in indexed.passages)


def test_the_default_passages_are_what_the_keeper_itself_indexes(locomo_file):
    conversation = load_locomo(locomo_file)[0]
    indexed = conversation_passages(conversation, session="s", granularity="keeper")
    position = 0
    for part in conversation.sessions:
        for turn in part.turns:
            made = turn_passages(archived_turn(turn, part, "s"), KeeperConfig().passages, position)
            assert list(indexed.passages[position : position + len(made)]) == made
            assert all(
                p.context == f"{turn.speaker} ({part.date}), item {part.number}" for p in made
            )
            position += len(made)
    assert position == len(indexed.passages)
    assert MethodSpec.parse("hybrid").granularity == "keeper"


def test_each_method_says_what_it_ran_with(locomo_file, tmp_path, capsys):
    assert configuration(MethodSpec.parse("hybrid")).startswith("product defaults: ")
    assert "k_rrf 60, keyword weight 1, depth 1" in configuration(MethodSpec.parse("hybrid"))
    tuned = configuration(MethodSpec.parse("hybrid:w=1.5:qwho"))
    assert not tuned.startswith("product defaults") and "keyword weight 1.5" in tuned
    out = tmp_path / "recall.md"
    main(
        [
            "locomo",
            "recall",
            "--data",
            str(locomo_file),
            "--methods",
            "keyword,keyword:sentences",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert "keyword: product defaults: the keeper's passages (messages" in printed
    assert "Configurations:" in out.read_text()
    assert "- `keyword:sentences`: the benchmark's `sentences` passages" in out.read_text()


@pytest.mark.parametrize("method", ["hybrid:hashing:who", "hybrid:hashing:qwho", "keyword:who"])
def test_the_speaker_options_find_the_named_speakers_turns(locomo_file, method):
    result = measure(method, load_locomo(locomo_file), {})
    assert all(result.any5_by_category["4"])


@pytest.mark.parametrize(
    "method",
    [
        "keyword",
        "keyword:sentences",
        "keyword:tantivy",
        "hybrid:hashing",
        "hybrid:hashing:tantivy",
        "embedding:hashing",
        "embedding:hashing:onevector",
        "bm25s",
        "cosine:hashing",
    ],
)
def test_recall_finds_the_turn_that_names_the_answer(locomo_file, method):
    conversations = load_locomo(locomo_file)
    result = measure(method, conversations, {})
    single_hop = result.any5_by_category["4"]
    assert len(single_hop) == 2 * len(FACTS)
    assert all(single_hop), f"{method} missed a question whose words name one turn"
    assert result.rate(10) >= result.rate(5) >= result.rate(1)
    assert result.turns == sum(1 for c in conversations for _ in c.turns())
    assert len(result.latencies_ms) == result.questions


def test_recall_command_writes_a_table_for_every_method(locomo_file, tmp_path, capsys):
    out = tmp_path / "recall.md"
    main(
        [
            "locomo",
            "recall",
            "--data",
            str(locomo_file),
            "--methods",
            "keyword,bm25s,embedding:hashing",
            "--out",
            str(out),
        ]
    )
    table = out.read_text()
    for method in ("keyword", "bm25s", "embedding:hashing"):
        assert f"| {method} | 8 |" in table  # categories 1–4 only
    assert "load average" in table


@pytest.mark.parametrize("sentence_vectors", ["on", "off"])
def test_index_command_counts_the_vectors_each_message_costs(
    locomo_file, tmp_path, sentence_vectors
):
    out = tmp_path / "rate.md"
    main(
        [
            "locomo", "index", "--data", str(locomo_file), "--embedders", "hashing",
            "--sentence-vectors", sentence_vectors, "--out", str(out),
        ]
    )  # fmt: skip
    indexed = [
        conversation_passages(conversation, session="s", granularity="messages")
        for conversation in load_locomo(locomo_file)
    ]
    sentences = [len(split_sentences(p.text)) for i in indexed for p in i.passages]
    if sentence_vectors == "on":
        expected = sum(1 + (count if count > 1 else 0) for count in sentences)
    else:
        expected = len(sentences)
    row = next(line for line in out.read_text().splitlines() if line.startswith("| hashing"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == ("yes" if sentence_vectors == "on" else "no")
    assert cells[2] == str(sum(i.turns for i in indexed))
    assert cells[3].startswith(f"{expected} (")
    assert "Load average" in out.read_text()


def test_index_command_counts_fewer_vectors_when_short_sentences_join(locomo_file, tmp_path):
    out = tmp_path / "rate.md"
    main(
        [
            "locomo", "index", "--data", str(locomo_file), "--embedders", "hashing",
            "--sentence-vectors", "on", "--sentence-words", "1,6", "--out", str(out),
        ]
    )  # fmt: skip
    passages = [
        p
        for conversation in load_locomo(locomo_file)
        for p in conversation_passages(conversation, session="s", granularity="messages").passages
    ]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| hashing")]
    for row, words in zip(rows, (1, 6), strict=True):
        groups = [len(sentence_groups(split_sentences(p.text), words)) for p in passages]
        expected = sum(1 + (count if count > 1 else 0) for count in groups)
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == f"yes, {words}+ words"
        assert cells[3].startswith(f"{expected} (")


@pytest.mark.parametrize(
    ("text", "words", "short", "context"),
    [
        ("embedding:sw=6", 6, "join", True),
        ("hybrid:minilm-q8:skip=3", 3, "skip", True),
        ("embedding:baresentences", None, "join", False),
        ("embedding", None, "join", True),
    ],
)
def test_sentence_vector_options_parse(text, words, short, context):
    spec = MethodSpec.parse(text)
    assert (spec.sentence_words, spec.short, spec.sentence_context) == (words, short, context)


@pytest.mark.parametrize("text", ["keyword:paragraphs", "vector", "hybrid:w=x"])
def test_an_unknown_method_is_refused_with_the_choices(text):
    with pytest.raises(ValueError):
        MethodSpec.parse(text)


def test_grading_follows_the_paper():
    assert token_f1("7 May 2023", "7 May 2023") == 1.0
    assert token_f1("The cello!", "cello") == 1.0  # articles and punctuation do not count
    assert token_f1("running", "runs") == 1.0  # Porter stems on both sides
    assert 0 < token_f1("a greyhound called Pepper", "Pepper") < 1
    assert grade_answer("kids, work", "work, kids", 1) == 1.0
    assert grade_answer("work", "work, kids", 1) == 0.5
    assert grade_answer("Lisbon", "Lisbon; Portugal's capital", 3) == 1.0
    assert grade_answer("Not mentioned in the conversation", "the crater", 5) == 1.0
    assert grade_answer("the crater", "the crater", 5) == 0.0


def test_answers_are_read_from_numbered_lines():
    assert parse_answers("1. Pepper\n2) cello\n**3.** Lisbon\n3. again\nnote") == {
        1: "Pepper",
        2: "cello",
        3: "Lisbon",
    }


def test_no_line_of_a_session_reads_as_a_question(locomo_file):
    session = load_locomo(locomo_file)[0].sessions[0]
    text = session_message(session)
    assert text.startswith("Item 1. Session 1 (1:00 pm on 1 May, 2023):")
    assert not any(line.rstrip().endswith("?") for line in text.splitlines())


class ScriptedModel:
    """An OpenAI-compatible endpoint that answers a question set from a script and says "Noted."
    to everything else, recording what it was sent."""

    def __init__(self, script: dict[str, str]) -> None:
        self.script = script
        self.received: list[list[dict]] = []
        self.lock = threading.Lock()

    def app(self) -> Starlette:
        async def complete(request: Request) -> JSONResponse:
            body = await request.json()
            with self.lock:
                self.received.append(body["messages"])
            asked = [
                m["content"]
                for m in body["messages"]
                if m["role"] == "user" and str(m["content"]).startswith(QUESTION_HEADER)
            ]
            reply = "Noted."
            if asked:
                lines = asked[-1].splitlines()[1:]
                reply = "\n".join(
                    f"{n}. {self.script.get(line.split('. ', 1)[1], 'Not mentioned in the conversation')}"
                    for n, line in enumerate(lines, start=1)
                )
            return JSONResponse(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "scripted",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": reply},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
                }
            )

        return Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"])])


@pytest.mark.parametrize("arm", ["rag", "window_drop"])
def test_arms_answer_over_http_and_are_graded_by_category(locomo_file, tmp_path, capsys, arm):
    """Plumbing: a scripted model, so the scores say the run and grading work, nothing more."""
    script = {question: text.split()[-1].strip(".") for _, text, question in FACTS}
    model = ScriptedModel(script)
    out = tmp_path / "runs"
    with serve_in_thread(model.app()) as url:
        main(
            [
                "locomo", "answer", "--data", str(locomo_file), "--arms", arm,
                "--model", f"openai:{url}:scripted", "--window", "4096", "--per-message", "2",
                "--out", str(out),
            ]
        )  # fmt: skip
    summary = (out / "summary.md").read_text()
    row = next(line for line in summary.splitlines() if line.startswith(f"| {arm} |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[4] == "1.000 (6)"  # single-hop: the script's answers are the references
    assert cells[5] == "1.000 (2)"  # adversarial: a refusal counts as right
    assert cells[1] == "0.000 (2)"  # multi-hop: the script refused, which scores nothing
    records = [json.loads(line) for line in (out / arm / "answers.jsonl").read_text().splitlines()]
    assert len(records) == 2 * (len(FACTS) + 2)
    sent = "\n".join(str(m["content"]) for request in model.received for m in request)
    assert "Item 3. Session 3 (1:00 pm on 3 May, 2023):" in sent
    assert "### Costs (scripted)" in summary


def test_a_notes_arm_runs_with_the_simulated_reader_and_says_so(locomo_file, tmp_path):
    """Plumbing: the simulated reader is written for counter stories, not for LoCoMo, so only the
    run and its labels are checked, never its scores."""
    out = tmp_path / "runs"
    main(
        [
            "locomo", "answer", "--data", str(locomo_file), "--arms", "notes_retrieval",
            "--model", "sim", "--window", "2048", "--per-message", "3", "--out", str(out),
        ]
    )  # fmt: skip
    summary = (out / "summary.md").read_text()
    assert "### LoCoMo answers (simulated reader)" in summary
    assert "### Costs (simulated reader)" in summary
    lines = (out / "notes_retrieval" / "answers.jsonl").read_text().splitlines()
    assert len(lines) == 2 * (len(FACTS) + 2)
    assert (out / "notes_retrieval" / "calls.jsonl").read_text().strip()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_benchmark_stream_becomes_batches_as_turns_and_questions_with_their_item(seed, tmp_path):
    stream = resolve_stream("tiny:varied", tmp_path / "stream", seed=seed)
    conversation = conversation_from_stream(stream)
    batches = [r for r in read_stream(stream) if r["type"] == "batch"]
    assert [s.number for s in conversation.sessions] == [int(b["item"]) for b in batches]
    assert all(len(s.turns) == 1 and s.turns[0].speaker == "" for s in conversation.sessions)
    asked = [q for r in question_sets(stream) for q in r["questions"] if q["item"] is not None]
    assert len(conversation.questions) == sum(q["category"] != "unknown" for q in asked)
    for question in conversation.questions:
        (evidence,) = question.evidence
        assert question.asked_after is not None
        assert int(evidence[1:].partition(":")[0]) <= question.asked_after
        assert question.question.endswith("?") and question.kind != "unknown"
    indexed = conversation_passages(conversation, session="s", granularity="messages")
    assert all(p.context == "" for p in indexed.passages)  # archived as the keeper archives


@pytest.mark.parametrize("method", ["keyword", "embedding:hashing", "bm25s", "cosine:hashing"])
def test_a_stream_question_never_finds_a_batch_written_after_it_was_asked(method, tmp_path):
    stream = resolve_stream("tiny:varied", tmp_path / "stream", seed=4)
    conversation = conversation_from_stream(stream)
    seen: list[tuple[int, list[str]]] = []
    spec = MethodSpec.parse(method)
    search, close, _ = recall_module._build(spec, conversation, {})
    try:
        for question in conversation.questions:
            assert question.asked_after is not None
            seen.append((question.asked_after, search(question.question, 10, question.asked_after)))
    finally:
        close()
    assert any(found for _, found in seen)
    for asked_after, found in seen:
        assert all(int(dia_id[1:].partition(":")[0]) <= asked_after for dia_id in found)


def test_recall_command_measures_a_preset_stream_by_question_kind(tmp_path, capsys):
    main(
        [
            "locomo",
            "recall",
            "--stream",
            "tiny:varied",
            "--seeds",
            "0,1",
            "--methods",
            "keyword,bm25s",
        ]
    )
    table = capsys.readouterr().out
    assert "| keyword |" in table and "| bm25s |" in table
    assert "current" in table and "tiny:varied seed 1" in table


def test_the_mpnet_embedder_names_the_folder_it_needs(monkeypatch):
    from keeper_bench.locomo.recall import BENCH_EMBEDDERS
    from keeper_middleware.errors import ConfigurationError

    assert MethodSpec.parse("hybrid:mpnet:d=2").embedder == "mpnet"
    monkeypatch.delenv("KEEPER_BENCH_MPNET", raising=False)
    with pytest.raises(ConfigurationError, match="KEEPER_BENCH_MPNET"):
        BENCH_EMBEDDERS["mpnet"]()
