"""Arms answering LoCoMo's questions with a model, graded as the dataset's paper does.

Each conversation is a stream: the task, then one user message per session (an item, numbered
and dated, the turns quoted so no line reads as a question), then the questions in sets of
``--per-message`` ("Questions about the conversation:" and numbered lines). The reply's
``N. answer`` lines are graded with ``grading.grade_answer``. Every model call is recorded, so
the run ends with a score table by category and a cost table.

A run folder per arm holds ``answers.jsonl`` (one record per question: conversation, category,
question, reference, answer, score) and ``calls.jsonl``; ``summary.md`` has both tables.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage

from keeper_bench.costs import CallRecord, CostSummary, summarize_costs
from keeper_bench.locomo.dataset import CATEGORIES, Conversation, Question, Session
from keeper_bench.locomo.grading import REFUSAL, grade_answer
from keeper_bench.recording import CallRecorder
from keeper_bench.report import cost_table
from keeper_middleware.messages.facts import text_of

SYSTEM_PROMPT = "You read a long conversation between two people and answer questions about it."
QUESTION_HEADER = "Questions about the conversation:"
_ANSWER_LINE = re.compile(r"^\s*[*#]*\s*(\d+)\s*[.):]\**\s*(.*?)\s*$")


def task_message(conversation: Conversation) -> str:
    first, second = conversation.speakers
    return (
        f"Task: a conversation between {first} and {second} arrives one session at a time, each "
        "as a numbered item with its date. Read every session. When questions come, answer each "
        'on its own line as "N. answer", in a few words taken from the conversation (dates as '
        f'the conversation gives them). If the conversation does not say, answer "{REFUSAL}".'
    )


def session_message(session: Session) -> str:
    """One session as one item; turns are quoted, so none of its lines ends in "?"."""
    lines = [f"Item {session.number}. Session {session.number} ({session.date}):"]
    lines += [f'{turn.speaker}: "{turn.message()}"' for turn in session.turns]
    return "\n".join(lines)


def question_message(questions: Sequence[Question]) -> str:
    lines = [QUESTION_HEADER]
    lines += [f"{n}. {q.question.strip()}" for n, q in enumerate(questions, start=1)]
    return "\n".join(lines)


def parse_answers(reply: str) -> dict[int, str]:
    """The ``N. answer`` lines of a reply (the first line for each number wins)."""
    found: dict[int, str] = {}
    for line in reply.splitlines():
        match = _ANSWER_LINE.match(line)
        if match and match.group(2):
            found.setdefault(int(match.group(1)), match.group(2))
    return found


def question_sets(questions: Sequence[Question], per_message: int) -> Iterator[list[Question]]:
    for start in range(0, len(questions), per_message):
        yield list(questions[start : start + per_message])


@dataclass(slots=True)
class ArmScore:
    arm: str
    scores: dict[int, list[float]] = field(default_factory=dict)
    records: list[CallRecord] = field(default_factory=list)

    def add(self, category: int, score: float) -> None:
        self.scores.setdefault(category, []).append(score)

    def mean(self, categories: Sequence[int]) -> float | None:
        values = [s for c in categories for s in self.scores.get(c, [])]
        return sum(values) / len(values) if values else None


def run_conversation(
    arm_name: str,
    model: BaseChatModel,
    conversation: Conversation,
    folder: Path,
    *,
    window: int,
    retriever: Any,
    per_message: int,
    score: ArmScore,
    passages: str = "sentences",
) -> None:
    """Drive one arm through one conversation, appending graded answers to ``answers.jsonl``."""
    from keeper_bench.arms import build_arm

    recorder = CallRecorder(start_index=len(score.records))
    arm = build_arm(
        arm_name,
        model,
        window=window,
        system_prompt=SYSTEM_PROMPT,
        retriever=retriever,
        archive=folder / f"{conversation.sample_id}.archive.sqlite3",
        passages=passages,
    )
    config: Any = {
        "configurable": {"thread_id": conversation.sample_id},
        "callbacks": [recorder],
        "recursion_limit": 200,
    }
    last_item = 0

    def send(text: str, step: int) -> str:
        message: BaseMessage = HumanMessage(text, id=f"{conversation.sample_id}-{step}")
        values = arm.graph.invoke({"messages": [message]}, config)
        return text_of(values["messages"][-1])

    try:
        step = 0
        send(task_message(conversation), step)
        for session in conversation.sessions:
            step += 1
            recorder.item = last_item = session.number
            send(session_message(session), step)
        with (folder / "answers.jsonl").open("a", encoding="utf-8") as out:
            for questions in question_sets(conversation.questions, per_message):
                step += 1
                recorder.item = last_item
                answers = parse_answers(send(question_message(questions), step))
                for n, question in enumerate(questions, start=1):
                    answer = answers.get(n, "")
                    value = grade_answer(answer, question.answer, question.category)
                    score.add(question.category, value)
                    record = {
                        "conversation": conversation.sample_id,
                        "category": question.category,
                        "question": question.question,
                        "reference": question.answer,
                        "answer": answer,
                        "score": round(value, 4),
                    }
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
    finally:
        arm.close()
        score.records.extend(recorder.records)
        with (folder / "calls.jsonl").open("a", encoding="utf-8") as calls:
            for call in recorder.records:
                calls.write(json.dumps(call.to_json()) + "\n")


def score_table(scores: Sequence[ArmScore], *, reader: str) -> str:
    lines = [
        f"### LoCoMo answers ({reader}): token F1 by category; category 5 is refusals counted right",
        "",
        "| arm | "
        + " | ".join(f"{c}. {name}" for c, name in CATEGORIES.items())
        + " | F1 (1–4) | all (1–5) |",
        "| --- |" + " --- |" * (len(CATEGORIES) + 2),
    ]
    for arm in scores:
        cells = []
        for category in CATEGORIES:
            values = arm.scores.get(category, [])
            cells.append(f"{sum(values) / len(values):.3f} ({len(values)})" if values else "–")
        main, every = arm.mean((1, 2, 3, 4)), arm.mean(tuple(CATEGORIES))
        lines.append(
            f"| {arm.arm} | {' | '.join(cells)} | "
            f"{'–' if main is None else f'{main:.3f}'} | {'–' if every is None else f'{every:.3f}'} |"
        )
    return "\n".join(lines) + "\n"


def costs(score: ArmScore) -> CostSummary:
    return summarize_costs(score.records, {})


def configure_answer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, required=True, help="LoCoMo's JSON file")
    parser.add_argument("--arms", default="rag", help="comma-separated arms (graphs/arms.py)")
    parser.add_argument(
        "--model",
        default="sim",
        help="openai:URL[:MODEL] for an OpenAI-compatible server, or sim (the simulated "
        "reader: plumbing only, it is not written for this dataset)",
    )
    parser.add_argument("--window", type=int, default=32_768, help="live window in tokens")
    parser.add_argument("--retriever", default="keyword", help="keyword, embedding or hybrid")
    parser.add_argument(
        "--passages",
        choices=("sentences", "messages"),
        default="messages",
        help="what the retrieving arms index as one passage",
    )
    parser.add_argument("--per-message", type=int, default=10, help="questions per message")
    parser.add_argument("--conversations", default="", help="sample ids to keep (default all)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many questions each")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per model call")
    parser.add_argument("--max-tokens", type=int, default=None, help="reply limit")
    parser.add_argument("--out", type=Path, default=Path("runs") / "locomo", help="run folder")


def run_answer_command(args: argparse.Namespace) -> int:
    from keeper_bench.locomo.dataset import load_locomo
    from keeper_bench.run_options import chat_model, parse_model

    if args.per_message < 1:
        raise ValueError(f"--per-message must be at least 1, got {args.per_message}.")
    conversations = load_locomo(args.data)
    if args.conversations:
        wanted = set(args.conversations.split(","))
        conversations = [c for c in conversations if c.sample_id in wanted]
    if args.limit:
        conversations = [_limited(c, args.limit) for c in conversations]
    kind, name = parse_model(args.model)
    reader = "simulated reader" if kind == "sim" else (name or kind)
    model = chat_model(args.model, timeout=args.timeout, max_tokens=args.max_tokens)
    scores: list[ArmScore] = []
    for arm in (a.strip() for a in args.arms.split(",") if a.strip()):
        folder = args.out / arm
        folder.mkdir(parents=True, exist_ok=True)
        for stale in ("answers.jsonl", "calls.jsonl"):
            (folder / stale).unlink(missing_ok=True)
        score = ArmScore(arm)
        for conversation in conversations:
            run_conversation(
                arm,
                model,
                conversation,
                folder,
                window=args.window,
                retriever=args.retriever,
                per_message=args.per_message,
                score=score,
                passages=args.passages,
            )
        scores.append(score)
        (folder / "costs.json").write_text(json.dumps(costs(score).to_json(), indent=1))
    summary = (
        score_table(scores, reader=reader)
        + "\n"
        + cost_table([(s.arm, costs(s)) for s in scores], reader=reader)
    )
    (args.out / "summary.md").write_text(summary, encoding="utf-8")
    print(summary)
    return 0


def _limited(conversation: Conversation, limit: int) -> Conversation:
    from dataclasses import replace

    return replace(conversation, questions=conversation.questions[:limit])
