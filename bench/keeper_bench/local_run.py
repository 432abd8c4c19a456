"""The ``notes`` arm against a real local model: SmolLM2-135M on a llama.cpp server (a plumbing check).

SmolLM2-135M cannot answer the benchmark's questions (0/5 on the story questions, measured), so a
run here says nothing about quality. What it shows is that the whole pipeline holds against a real
server: every model call is bounded (``max_tokens``, a timeout), the note replies the real model
writes (mostly malformed) go through the checks, the run reaches the end and is graded, and the
costs (prompt, cached and completion tokens as the server reports them) are recorded.

The run is the benchmark runner's own (``run_arm``): same run folder, grade, audit and costs, with
the model ``openai:URL`` and a bounded ``max_tokens`` (an unbounded reply from SmolLM2 can run to
the end of its context, minutes per call on two cores). The server is llama.cpp's ``llama-server``,
started by ``LocalLlamaServer``. A stream can be cut to its first batches so a run stays short.

    python -m keeper_bench.local_run --stream tiny --batches 10 --window 2048 --out runs/local
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from pydantic import SecretStr

from keeper_bench.run_options import RunOptions, resolve_stream
from keeper_bench.runner import RunResult, run_arm
from keeper_bench.streams import STREAM_FILE, read_stream
from keeper_middleware.integrations.llama_server import LlamaServerConfig, LocalLlamaServer

PLUMBING_LABEL = "notes on SmolLM2-135M (plumbing check, not quality)"


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalModelSettings:
    """How every call to the local server is bounded."""

    max_tokens: int = 64
    """The reply limit of every call, note calls included."""
    timeout: float = 120.0
    """Seconds one call may take (a shared 2-core machine can be slow)."""
    max_retries: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= 4096:
            raise ValueError(f"max_tokens={self.max_tokens}; pass a reply limit such as 64")
        if self.timeout <= 0:
            raise ValueError(f"timeout={self.timeout}; pass a positive number of seconds")
        if self.max_retries < 0:
            raise ValueError(f"max_retries={self.max_retries}; pass 0 or more")


@dataclass(frozen=True, slots=True)
class LocalRunResult:
    run: RunResult
    stream: Path
    batches: int
    """How many batches of the stream the run read."""
    server_startup_seconds: float | None


def truncate_stream(source: Path | str, target: Path | str, *, batches: int) -> Path:
    """A copy of the stream that ends after its first ``batches`` batches (and the question set
    right after them, if there is one); the ledger and spec are copied as they are.

    Grading reads the question sets of the copy, so a short run is graded on what it read.
    """
    if batches < 1:
        raise ValueError(f"batches={batches}; keep at least one batch")
    origin, folder = Path(source), Path(target)
    kept: list[dict[str, Any]] = []
    seen = 0
    for record in read_stream(origin):
        if record["type"] == "batch":
            if seen == batches:
                break
            seen += 1
        kept.append(record)
    if not any(record["type"] == "questions" for record in kept):
        raise ValueError(
            f"the first {batches} batches of {origin} are followed by no question set; "
            "keep more batches"
        )
    folder.mkdir(parents=True, exist_ok=True)
    for extra in origin.iterdir():
        if extra.is_file() and extra.name != STREAM_FILE:
            shutil.copy2(extra, folder / extra.name)
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in kept)
    (folder / STREAM_FILE).write_text(lines, encoding="utf-8")
    return folder


def local_chat_model(server: LocalLlamaServer, settings: LocalModelSettings) -> BaseChatModel:
    """A ``ChatOpenAI`` for the local server: bounded replies, a timeout, usage on streams."""
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        base_url=server.base_url,
        api_key=SecretStr("unused"),
        model=server.model_alias,
        max_tokens=settings.max_tokens,  # type: ignore[call-arg]  # pydantic alias of max_tokens
        timeout=settings.timeout,
        max_retries=settings.max_retries,
        temperature=0,
        stream_usage=True,
    )


def run_notes_arm_locally(
    stream_dir: Path | str,
    out_dir: Path | str,
    window: int,
    *,
    batches: int | None = None,
    settings: LocalModelSettings | None = None,
    server: LocalLlamaServer | None = None,
    ctx: int = 8192,
    progress: bool = False,
) -> LocalRunResult:
    """Runs the ``notes`` arm on a stream against SmolLM2 and grades it.

    Starts a server (and stops it after) unless a running ``server`` is given. ``batches`` cuts
    the stream to its first batches (the copy is written beside the run, under ``out_dir``).
    """
    chosen = settings or LocalModelSettings()
    folder = Path(out_dir)
    stream = Path(stream_dir)
    if batches is not None:
        stream = truncate_stream(stream, folder / "stream", batches=batches)
    read = sum(1 for record in read_stream(stream) if record["type"] == "batch")
    with contextlib.ExitStack() as stack:
        if server is None:
            server = stack.enter_context(LocalLlamaServer(LlamaServerConfig(ctx=ctx)))
        options = RunOptions.create(
            arm="notes",
            stream=stream,
            model=f"openai:{server.base_url}:{server.model_alias}",
            window=window,
            timeout=chosen.timeout,
            max_tokens=chosen.max_tokens,
            label=PLUMBING_LABEL,
        )
        result = run_arm(options, folder / "run", progress=progress)
        return LocalRunResult(result, stream, read, server.startup_seconds)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the notes arm against SmolLM2-135M on a local llama.cpp server "
        "(a plumbing check: the model cannot answer the questions)."
    )
    parser.add_argument("--stream", default="tiny", help="a stream folder or a preset (tiny)")
    parser.add_argument("--batches", type=int, default=None, help="read only the first N batches")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=Path("runs") / "local-notes")
    args = parser.parse_args(argv)
    stream = resolve_stream(args.stream, args.out / "full-stream")
    result = run_notes_arm_locally(
        stream,
        args.out,
        args.window,
        batches=args.batches,
        settings=LocalModelSettings(max_tokens=args.max_tokens, timeout=args.timeout),
        progress=True,
    )
    print(result.run.grade.markdown())
    if result.run.costs is not None:
        print(json.dumps(result.run.costs.to_json()))
    print(
        f"run folder: {result.run.run_dir} ({result.run.seconds:.1f} s, {result.batches} batches)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
