"""``keeper-bench run``: drive one arm through a stream and write a run folder.

The run folder is the one ``keeper-bench grade/audit/report`` read (see ``cli.py``): ``run.json``,
``answers.jsonl``, ``notes.jsonl``, ``calls.jsonl``, plus ``grade.json``, ``audit.json`` and
``costs.json`` at the end. The keeper's archive (``archive.sqlite3``), a LangGraph SQLite
checkpointer (``checkpoints.sqlite3``) and ``progress.json`` live there too, so a run that was
interrupted resumes where it stopped: steps already done are skipped, and a step cut short is
finished from its last checkpoint rather than sent again.

Batches reach the agent as user messages, or (``--delivery tool``) through a ``read_next_batch``
tool the model calls; questions always arrive as user messages.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_bench.audit import MEMORY_FILES, MemoryKind
from keeper_bench.cli import Command, audit_run, costs_of_run, grade_run
from keeper_bench.costs import CostSummary
from keeper_bench.grader import GradeResult
from keeper_bench.reader.messages import READ_TOOL
from keeper_bench.recording import CallRecorder
from keeper_bench.run_folder import (
    PROGRESS_FILE,
    JsonlAppender,
    SummaryLog,
    complete_lines,
    prepare_run_dir,
    read_progress,
    write_json_atomic,
)
from keeper_bench.run_options import (
    DELIVERIES,
    RunOptions,
    make_model,
    resolve_stream,
)
from keeper_bench.steps import SYSTEM_PROMPT, BatchFeeder, Step, plan_steps
from keeper_bench.streams import (
    read_stream,
)
from keeper_middleware.errors import MissingDependencyError
from keeper_middleware.keeper import Keeper
from keeper_middleware.messages.facts import text_of

THREAD = "bench"
CHECKPOINTS_FILE = "checkpoints.sqlite3"
ARCHIVE_FILE = "archive.sqlite3"
STREAM_PASSAGES = "sentences"
"""What the benchmark's arms index on its generated streams (every arm alike)."""


# -- the arm ------------------------------------------------------------------------------------
@dataclass(slots=True)
class ArmHandle:
    """A built arm, and what the runner reads from it afterwards."""

    graph: Any
    keeper: Keeper | None
    close: Callable[[], None]
    memory_kind: str = "notes"
    """What the versions in the keeper's archive are ("notes", or a self-editing arm's
    "pinned" state); the audit reads them as that kind."""

    @property
    def has_notes(self) -> bool:
        return self.keeper is not None

    def notes_versions(self, session: str) -> Iterator[dict[str, Any]]:
        """Every saved NOTES version, oldest first, read from the archive a few at a time."""
        if self.keeper is None:
            return
        for v in self.keeper.archive.notes_versions(session):
            yield {
                "version": v.version,
                "first_item": v.first_item,
                "last_item": v.last_item,
                "text": v.text,
            }

    def counters(self, session: str) -> dict[str, Any] | None:
        return None if self.keeper is None else dict(self.keeper.counters(session).to_json())


def make_retriever_for(options: RunOptions, archive: Path) -> Any:
    """The retriever an arm gets: ``keyword`` by name, else one built with the chosen embedder
    (its files beside the archive, where the arms keep theirs) whose searches wait for every
    vector, so a run's answers never depend on how fast the background embedded them."""
    if options.retriever == "keyword":
        return options.retriever
    from keeper_middleware.retrievers.embedders import HashingEmbedder, MiniLMEmbedder
    from keeper_middleware.retrievers.factory import make_retriever

    embedder = HashingEmbedder() if options.embedder == "hashing" else MiniLMEmbedder()
    return make_retriever(options.retriever, path=archive.with_suffix(".index"), embedder=embedder)


def build_arm_handle(
    options: RunOptions,
    model: BaseChatModel,
    *,
    tools: Sequence[Any],
    archive: Path,
    checkpointer: Any,
) -> ArmHandle:
    from keeper_bench.arms import ARM_OPTIONS, ARMS, build_arm

    if options.arm not in ARMS:
        raise ValueError(f"unknown arm {options.arm!r}; choose one of: {', '.join(ARMS)}")
    # no arm is told anything about the stream (the keeper's checks get no pattern for its
    # names); the streams' batches are long stories asked about one sentence at a time, and the
    # simulated reader reads "item N: sentence" lines: the benchmark indexes sentences, set here
    # rather than through the product's default (whole messages, chosen on LoCoMo)
    extra: dict[str, Any] = {"passages": STREAM_PASSAGES}
    if options.delivery == "tool" and "item_tools" in ARM_OPTIONS[options.arm]:
        extra["item_tools"] = (READ_TOOL,)
    arm = build_arm(
        options.arm,
        model,
        window=options.window,
        tools=tuple(tools),
        system_prompt=SYSTEM_PROMPT,
        retriever=make_retriever_for(options, archive),
        archive=archive,
        checkpointer=checkpointer,
        **extra,
    )
    return ArmHandle(arm.graph, arm.keeper, arm.close, arm.memory_kind)


@dataclass(frozen=True, slots=True)
class RunResult:
    run_dir: Path
    grade: GradeResult
    costs: CostSummary | None
    audit: dict[str, Any] | None
    resumed_from_step: int
    seconds: float


# -- one step -----------------------------------------------------------------------------------
def _last_reply(values: Mapping[str, Any]) -> str:
    for message in reversed(list(values.get("messages", []))):
        if isinstance(message, AIMessage):
            return text_of(message)
    return ""


def _run_step(graph: Any, step: Step, config: dict[str, Any], *, first: bool) -> Mapping[str, Any]:
    """Run a step, or finish it from its checkpoint when an earlier process was cut short in it.

    Only the ``first`` step this process runs can have been begun by another one (every later
    step starts after one this process finished), so only it reads the checkpoint first: for
    an arm whose state holds the whole stream, that read cost as much as the step."""
    if first:
        snapshot = graph.get_state(config)
        if snapshot.metadata and snapshot.metadata.get("bench_step") == step.index:
            if not snapshot.next:
                return dict(snapshot.values)  # done before the interruption
            return dict(graph.invoke(None, config, durability="sync"))
    message: BaseMessage = HumanMessage(step.message, id=f"step-{step.index}")
    return dict(graph.invoke({"messages": [message]}, config, durability="sync"))


def run_arm(
    options: RunOptions,
    run_dir: Path | str,
    *,
    progress: bool = True,
    on_step: Callable[[Step, Mapping[str, Any]], None] | None = None,
) -> RunResult:
    """Drive ``options.arm`` through the stream into ``run_dir``; resume if it holds a part run."""
    from keeper_bench.checkpoints import open_checkpointer

    folder = Path(run_dir)
    run = prepare_run_dir(options, folder)
    state = read_progress(folder)
    done = int(state["steps_done"])
    started = time.perf_counter()
    calls_path = folder / "calls.jsonl"
    call_count = len(complete_lines(calls_path))
    answered = {
        (int(r["after_item"]), bool(r["final"]))
        for r in map(json.loads, complete_lines(folder / "answers.jsonl"))
    }
    write_answer = JsonlAppender(folder / "answers.jsonl")
    write_call = JsonlAppender(calls_path)
    recorder = CallRecorder(
        start_index=call_count,
        sink=lambda record: write_call(record.to_json()),
        summary_sink=SummaryLog(folder / MEMORY_FILES["summary"]),
    )
    # the steps are read from the stream as the run goes (a 10M-token stream is 40 MB of text);
    # only their number is counted up front, for the progress bar
    total = sum(1 for _ in plan_steps(read_stream(options.stream), options.delivery))
    bar = _progress_bar(total, done, progress, run.get("label", options.arm))

    def save_progress(**changes: Any) -> None:
        state.update(changes)
        write_json_atomic(folder / PROGRESS_FILE, state)

    feeder = BatchFeeder(state, save_progress, recorder) if options.delivery == "tool" else None
    saver = open_checkpointer(folder / CHECKPOINTS_FILE)
    arm: ArmHandle | None = None
    try:
        arm = build_arm_handle(
            options,
            make_model(options),
            tools=(feeder.tool,) if feeder else (),
            archive=folder / ARCHIVE_FILE,
            checkpointer=saver,
        )
        recorder.restart_clock()
        prunes = not keeps_deltas(arm.graph)
        steps = plan_steps(read_stream(options.stream), options.delivery)
        for step in itertools.islice(steps, done, None):
            recorder.item = step.first_item
            if feeder is not None:
                feeder.begin(step)
            values = _run_step(
                arm.graph, step, _step_config(step, recorder), first=step.index == done
            )
            recorder.item = step.last_item
            question = step.question
            if question is not None:
                key = (int(question["after_item"]), bool(question["final"]))
                if key not in answered:
                    reply = _last_reply(values)
                    write_answer(
                        {"after_item": key[0], "final": key[1], "reply": reply, "step": step.index}
                    )
                    answered.add(key)
            save_progress(steps_done=step.index + 1, served={})
            if prunes:
                saver.keep_only_latest(THREAD)
            if on_step is not None:
                on_step(step, values)
            bar.update(1)
            bar.set_postfix(tokens=f"{step.history_tokens:,}", answers=len(answered))
        save_progress(finished=True)
        audit = _finish(folder, arm)
    finally:
        bar.close()
        if arm is not None:
            arm.close()
        saver.conn.close()
    return RunResult(
        folder, grade_run(folder), costs_of_run(folder), audit, done, time.perf_counter() - started
    )


def keeps_deltas(graph: Any) -> bool:
    """Whether a graph rebuilds a channel from the writes of earlier checkpoints (Deep Agents
    keeps its messages in a ``DeltaChannel``): its older checkpoints must then be kept."""
    from langgraph.channels.delta import DeltaChannel

    channels = getattr(graph, "channels", {}) or {}
    return any(isinstance(channel, DeltaChannel) for channel in channels.values())


def _step_config(step: Step, recorder: CallRecorder) -> dict[str, Any]:
    return {
        "configurable": {"thread_id": THREAD},
        "callbacks": [recorder],
        "metadata": {"bench_step": step.index},
        # one thing at a time: the tool calls of a reply run in their order, so the search
        # guards (which refuse a repeat of the search just before) see the same order in every
        # run; in parallel, which search came "just before" was a race between threads
        "max_concurrency": 1,
        "recursion_limit": 200 + 6 * len(step.batches),
    }


class _NoBar:
    """What ``--quiet`` gets: no progress bar, and no need for tqdm."""

    def update(self, _steps: int) -> None: ...

    def set_postfix(self, **_values: Any) -> None: ...

    def close(self) -> None: ...


def _progress_bar(total: int, done: int, shown: bool, label: str) -> Any:
    if not shown:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:
        raise MissingDependencyError(
            "tqdm",
            "",
            needed_by="The progress bar (or pass --quiet)",
            distribution="keeper-bench",
        ) from exc

    return tqdm(
        total=total,
        initial=done,
        desc=label,
        unit="step",
        disable=not shown,
        dynamic_ncols=True,
        mininterval=0.5,
    )


# -- after the run ------------------------------------------------------------------------------
def _finish(folder: Path, arm: ArmHandle) -> dict[str, Any] | None:
    """Notes versions, grade, audit and costs files for a finished run. The audit covers every
    memory the arm keeps: the keeper's NOTES versions, or the summaries recorded as they were
    written; an arm that keeps neither has nothing to audit (None).

    The NOTES versions go from the archive to notes.jsonl and from there to the audit one at a
    time (`audit_run` reads the file line by line): a long run's versions add up to gigabytes.
    """
    grade = grade_run(folder)
    write_json_atomic(folder / "grade.json", grade.to_json())
    costs = costs_of_run(folder)
    if costs is not None:
        write_json_atomic(folder / "costs.json", costs.to_json())
    counters = arm.counters(THREAD)
    if counters is not None:
        write_json_atomic(folder / "keeper_counters.json", counters)
    if arm.has_notes:
        kind = cast(MemoryKind, arm.memory_kind)
        with (folder / MEMORY_FILES[kind]).open("w", encoding="utf-8") as handle:
            for version in arm.notes_versions(THREAD):
                record = version if kind == "notes" else {**version, "kind": kind}
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    result = audit_run(folder)
    if result is None:
        return None
    audit = result.to_json()
    write_json_atomic(folder / "audit.json", audit)
    return audit


# -- the command --------------------------------------------------------------------------------
def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``run``, ``compare`` and ``demo`` share."""
    parser.add_argument(
        "--stream",
        required=True,
        help="a stream folder, or a preset SIZE[:FAMILY+FAMILY...] (e.g. small:rules+overdrawn)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of a preset stream")
    parser.add_argument(
        "--model",
        default="sim",
        help="sim (the simulated reader), local (a llama.cpp server started for the run) or openai:URL[:MODEL] for an OpenAI-compatible server",
    )
    parser.add_argument("--window", type=int, default=32_768, help="live window in tokens")
    parser.add_argument("--delivery", choices=DELIVERIES, default="messages")
    parser.add_argument("--retriever", default="keyword", help="keyword, embedding or hybrid")
    parser.add_argument(
        "--embedder", default=None, help="hashing or minilm (embedding and hybrid retrievers)"
    )
    parser.add_argument(
        "--faults",
        default="",
        help="simulated reader faults: none, realistic, or rates such as "
        "misread=0.05,empty_reply=0.02 (realistic,seed=3 sets the seed)",
    )
    parser.add_argument(
        "--rot",
        type=float,
        default=0.0,
        help="simulated reader context rot: the chance of overlooking a sentence 100K tokens "
        "back (0 off; 0.25 the stated realistic setting)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per model call")
    parser.add_argument("--max-tokens", type=int, default=None, help="reply limit for a real model")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def options_from_args(args: argparse.Namespace, arm: str, stream: Path) -> RunOptions:
    return RunOptions.create(
        arm=arm,
        stream=stream,
        model=args.model,
        window=args.window,
        delivery=args.delivery,
        retriever=args.retriever,
        embedder=args.embedder,
        faults=args.faults,
        rot=args.rot,
        timeout=args.timeout,
        max_tokens=args.max_tokens,
    )


def _configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arm", required=True, help="the arm to run (see graphs/arms.py)")
    add_run_arguments(parser)
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/ARM)")


def _run_run(args: argparse.Namespace) -> int:
    out = args.out or Path("runs") / args.arm
    stream = resolve_stream(args.stream, out / "stream", seed=args.seed)
    with contextlib.ExitStack() as stack:
        if args.model == "local":
            # a local llama.cpp server (SmolLM2 by default) started for this run and stopped after:
            # a plumbing check, never a quality score
            from keeper_middleware.integrations.llama_server import LocalLlamaServer

            server = stack.enter_context(LocalLlamaServer())
            args.model = f"openai:{server.base_url}:{server.model_alias}"
            args.max_tokens = args.max_tokens or 64
        result = run_arm(options_from_args(args, args.arm, stream), out, progress=not args.quiet)
    print(result.grade.markdown())
    if result.audit is not None:
        print(json.dumps({k: v for k, v in result.audit.items() if not isinstance(v, list)}))
    print(f"run folder: {out} ({result.seconds:.1f} s)")
    return 0


def register_commands(register: Callable[[Command], None]) -> None:
    register(
        Command(
            "run",
            "drive one arm through a stream into a run folder (resumes an interrupted run)",
            _configure_run,
            _run_run,
        )
    )


def iter_steps(options: RunOptions) -> Iterator[Step]:
    """The steps a run of ``options`` goes through (for tools that want to preview a run)."""
    return plan_steps(read_stream(options.stream), options.delivery)
