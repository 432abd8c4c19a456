"""What one keeper step costs: time and memory at a 32K window over a 1M-token archive.

Run: ``python -m keeper_middleware.bench.step_cost [--archive-tokens 1000000] [--window 32768]``.
The model is an instant scripted reply, so the figures are the keeper's own cost (token counting,
planning, checks, the archive transaction, indexing, search), never the model's.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_middleware.archive import ArchivedTurn, NotesDraft
from keeper_middleware.config import KeeperConfig
from keeper_middleware.keeper import Keeper, ModelSetup
from keeper_middleware.numbers import to_words

SENTENCE = (
    "The clerk recorded {name} at {amount}. {actor} walked past the quiet harbour and the old mill."
)
ACTORS = ("Mira Holt", "Tomas Quill", "Ana Reyes", "Ivo Brand")


def batch_text(item: int, sentences: int = 12) -> str:
    parts = [f"Item {item}."]
    for i in range(sentences):
        parts.append(
            SENTENCE.format(
                name=f"ctr{(item * 7 + i) % 997:02d}",
                amount=to_words((item * 31 + i) % 900 + 1),
                actor=ACTORS[i % 4],
            )
        )
    return " ".join(parts)


def fill_archive(keeper: Keeper, session: str, tokens: int) -> int:
    """Archive about ``tokens`` tokens of batches, as cuts would have, and index them."""
    item, written, cut = 0, 0, 0
    while written < tokens:
        turns = []
        for _ in range(20):
            item += 1
            text = batch_text(item)
            written += len(text) // 4
            turns.append(
                ArchivedTurn(
                    session=session, msg_id=f"h{item}", item=item, role="human", content=text
                )
            )
        cut += 1
        keeper.archive.commit_cut(
            session,
            cut_key=f"fill-{cut}",
            turns=turns,
            notes=NotesDraft(
                first_item=1,
                last_item=item,
                text="[NOTES]",
                data_json='{"rules": [], "state": [], "open": []}',
            ),
        )
        keeper._sync_index(session)
    return item


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


def instant_notes(messages: Sequence[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
    return AIMessage("NO CHANGES")


def measure(archive_tokens: int, window: int, repeats: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as folder:
        config = KeeperConfig(window=window, reply_reserve=4096, notes_every_items=None)
        keeper = Keeper(config, archive=Path(folder) / "archive.sqlite3")
        started = time.perf_counter()
        last_item = fill_archive(keeper, "bench", archive_tokens)
        rows.append(
            ("fill + index archive", f"{time.perf_counter() - started:.1f} s ({last_item} items)")
        )
        setup = ModelSetup(system_prompt="You read stories.")
        plain, cuts, searches = [], [], []
        for r in range(repeats):
            messages = window_messages(last_item + r * 1000, window // 2)
            t0 = time.perf_counter()
            keeper.step("bench", messages, None, setup, instant_notes)
            plain.append(time.perf_counter() - t0)
            big = window_messages(last_item + r * 1000 + 500, window)
            t0 = time.perf_counter()
            result = keeper.step("bench", big, None, setup, instant_notes)
            cuts.append(time.perf_counter() - t0)
            assert result.cut, "the full window did not cut"
            t0 = time.perf_counter()
            keeper.search("bench", f"ctr{r % 97:02d}")
            searches.append(time.perf_counter() - t0)
        rows.append(("step, no cut (half window)", _ms(plain)))
        rows.append(("step with a cut (full window)", _ms(cuts)))
        rows.append(("archive search", _ms(searches)))
        rows.append(("archive turns", str(keeper.archive.turn_count("bench"))))
        keeper.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows.append(("peak RSS of the process", f"{peak:.0f} MB"))
    return rows


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"median {statistics.median(samples) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms (n={len(samples)})"


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--archive-tokens", type=int, default=1_000_000)
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the table here (markdown)"
    )


def _run(args: argparse.Namespace) -> int:
    rows = measure(args.archive_tokens, args.window, args.repeats)
    table = [
        f"Keeper step cost: window {args.window} tokens, archive {args.archive_tokens:,} tokens "
        "(instant scripted model)",
        "",
        "| what | result |",
        "| --- | --- |",
    ]
    table += [f"| {a} | {b} |" for a, b in rows]
    text = "\n".join(table)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


def register_commands(register: Callable[[Any], None]) -> None:
    """Adds ``keeper-bench step-cost``."""
    from keeper_middleware.bench.cli import Command

    register(Command("step-cost", "time and memory of one keeper step", _configure, _run))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    _configure(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
