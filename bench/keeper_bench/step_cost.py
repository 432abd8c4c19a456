"""What one keeper step costs: time and memory at a 32K window over a 1M-token archive.

Run: ``python -m keeper_bench.step_cost [--archive-tokens 1000000] [--window 32768]``.
The session starts with realistic NOTES (one STATE entry for every counter the archive has seen:
thousands), and the model really writes changes: a SET line for every counter the noted turns
record, which the keeper checks, applies, fits to the NOTES budget (moving what is set least
recently to the archive) and commits. The model's reply is instant and computed outside the
timing as far as possible, so the figures are the keeper's own cost (token counting, planning,
checks, the budget, the archive transaction, indexing, search), never the model's.

Two budgets are measured: the default (the NOTES stay near it, and every cut moves entries out)
and one large enough to hold the thousands of entries (nothing moves; every check and rendering
runs over the whole STATE).
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_middleware.archive.records import ArchivedTurn, NotesDraft
from keeper_middleware.config import KeeperConfig, Size
from keeper_middleware.keeper import Keeper, ModelSetup
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.block import Notes, notes_to_json, render_notes
from keeper_middleware.notes.numbers import parse_number, to_words

SENTENCE = (
    "The clerk recorded {name} at {amount}. {actor} walked past the quiet harbour and the old mill."
)
ACTORS = ("Mira Holt", "Tomas Quill", "Ana Reyes", "Ivo Brand")
NAMES = 4999
"""Distinct counters the batches name: the archive ends up with thousands of them."""
_RECORDED = re.compile(r"recorded (ctr\d+) at ([a-z -]+?)\.")


def batch_text(item: int, sentences: int = 12) -> str:
    parts = [f"Item {item}."]
    for i in range(sentences):
        parts.append(
            SENTENCE.format(
                name=f"ctr{(item * 7 + i) % NAMES:04d}",
                amount=to_words((item * 31 + i) % 900 + 1),
                actor=ACTORS[i % 4],
            )
        )
    return " ".join(parts)


def fill_archive(keeper: Keeper, session: str, tokens: int) -> int:
    """Archive about ``tokens`` tokens of batches, as cuts would have, index them, and leave a
    NOTES version with one STATE entry per counter seen (thousands)."""
    item, written, cut = 0, 0, 0
    state: dict[str, str] = {}
    while written < tokens:
        turns = []
        for _ in range(20):
            item += 1
            text = batch_text(item)
            state.update(recorded_values(text))
            written += len(text) // 4
            turns.append(
                ArchivedTurn(
                    session=session, msg_id=f"h{item}", item=item, role="human", content=text
                )
            )
        cut += 1
        notes = Notes(state=tuple(state.items()), first_item=1, last_item=item)
        keeper.archive.commit_cut(
            session,
            cut_key=f"fill-{cut}",
            turns=turns,
            notes=NotesDraft(
                first_item=1,
                last_item=item,
                text=render_notes(notes) if written >= tokens else "[NOTES]",
                data_json=notes_to_json(notes) if written >= tokens else "{}",
            ),
        )
        keeper._sync_index(session)
    return item


def recorded_values(text: str) -> dict[str, str]:
    """What a careful note-taker reads from a batch: each counter's recorded value."""
    values: dict[str, str] = {}
    for name, words in _RECORDED.findall(text):
        number = parse_number(words)
        if number is not None:
            values[name] = str(int(number))
    return values


def window_messages(first_item: int, window: int) -> list[BaseMessage]:
    messages: list[BaseMessage] = [HumanMessage("Task: read every item.", id="task")]
    item, size = first_item, 0
    while size < window * 3:  # ~ chars; about 0.75 of the window in tokens
        item += 1
        text = batch_text(item)
        messages += [
            HumanMessage(text, id=f"w{item}"),
            AIMessage(f"Read item {item}.", id=f"a{item}"),
        ]
        size += len(text)
    return messages


def writes_changes(messages: Sequence[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
    """A model that really writes changes: a SET line for every counter the noted turns record
    (the turns after the NOTES, or all of them before the first NOTES)."""
    start = 0
    for index, message in enumerate(messages):
        if keeper_kind(message) == "notes":
            start = index + 1
    values: dict[str, str] = {}
    for message in messages[start:]:
        if keeper_kind(message) is None:
            values.update(recorded_values(text_of(message)))
    lines = [f"SET {name} = {value}" for name, value in values.items()]
    return AIMessage("\n".join(lines) or "NO CHANGES")


def measure(
    archive_tokens: int, window: int, repeats: int, notes_budget: Size | None
) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as folder:
        config = KeeperConfig(
            window=window,
            reply_reserve=4096,
            notes_every_items=None,
            notes_budget=notes_budget,
        )
        keeper = Keeper(config, archive=Path(folder) / "archive.sqlite3")
        started = time.perf_counter()
        last_item = fill_archive(keeper, "bench", archive_tokens)
        held = len(keeper.notes("bench").state)
        rows.append(
            (
                "fill + index archive",
                f"{time.perf_counter() - started:.1f} s ({last_item} items, NOTES of {held:,} "
                "entries)",
            )
        )
        setup = ModelSetup(system_prompt="You read stories.")
        plain, cuts, searches, changes = [], [], [], []
        # every step runs on the thread's one branch, at its latest cut (what a graph's state
        # names after the cuts that filled the archive)
        state: dict[str, Any] = {"head": keeper.archive.chain("bench").head}
        for r in range(repeats):
            messages = window_messages(last_item + r * 1000, window // 2)
            t0 = time.process_time()
            keeper.step("bench", messages, state, setup, writes_changes)
            plain.append(time.process_time() - t0)
            big = window_messages(last_item + r * 1000 + 500, window)
            changes.append(len(writes_changes(big, {}).content.splitlines()))  # type: ignore[union-attr]
            t0 = time.process_time()
            result = keeper.step("bench", big, state, setup, writes_changes)
            cuts.append(time.process_time() - t0)
            assert result.cut, "the full window did not cut"
            state = {"head": result.state["head"]}
            t0 = time.process_time()
            keeper.search("bench", f"ctr{r % 97:04d}")
            searches.append(time.process_time() - t0)
        notes = keeper.notes("bench")
        counters = keeper.counters("bench")
        rows.append(("step, no cut (half window)", _ms(plain)))
        rows.append(
            (
                "step with a cut (full window)",
                f"{_ms(cuts)}; {statistics.median(changes):.0f} SET lines a cut",
            )
        )
        rows.append(("archive search", _ms(searches)))
        rows.append(
            (
                "NOTES after the cuts",
                f"{len(notes.state):,} entries, {counters.notes_tokens:,} tokens (budget "
                f"{config.notes_tokens:,}); {counters.notes_entries_moved:,} entries moved to "
                "the archive",
            )
        )
        rows.append(("archive turns", str(keeper.archive.turn_count("bench"))))
        keeper.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows.append(("peak RSS of the process", f"{peak:.0f} MB"))
    return rows


def _ms(samples: list[float]) -> str:
    """CPU time, not wall time: on a shared machine the wall clock measures the neighbours."""
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return (
        f"CPU median {statistics.median(samples) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms "
        f"(n={len(samples)})"
    )


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--archive-tokens", type=int, default=1_000_000)
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--large-notes-tokens",
        type=int,
        default=11_000,
        help="the second budget, large enough for thousands of entries",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the table here (markdown)"
    )


def _run(args: argparse.Namespace) -> int:
    parts = []
    budgets: list[tuple[str, Size | None]] = [
        ("default NOTES budget", None),
        (
            f"NOTES budget of {args.large_notes_tokens:,} tokens",
            ("tokens", args.large_notes_tokens),
        ),
    ]
    for label, budget in budgets:
        rows = measure(args.archive_tokens, args.window, args.repeats, budget)
        table = [
            f"Keeper step cost: window {args.window} tokens, archive {args.archive_tokens:,} "
            f"tokens, {label} (instant scripted model that writes a SET line per recorded "
            "counter)",
            "",
            "| what | result |",
            "| --- | --- |",
        ]
        table += [f"| {a} | {b} |" for a, b in rows]
        parts.append("\n".join(table))
        print(parts[-1] + "\n", flush=True)
    text = "\n\n".join(parts)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    """Adds ``keeper-bench step-cost``."""
    from keeper_bench.cli import Command

    register(Command("step-cost", "time and memory of one keeper step", _configure, _run))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    _configure(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
