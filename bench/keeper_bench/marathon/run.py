"""Run the repair marathon one way (direct, with the keeper middleware, through the proxy).

Every way gets the same planted code base, the same tickets in the same order, the same shell and
the same model; only the context management differs:

- ``direct``: ``create_agent`` with the shell tool and nothing else; the agent keeps its whole
  history (a real model stops when it outgrows the server's window);
- ``middleware``: the same agent with :class:`KeeperMiddleware`;
- ``proxy``: the same agent talking to ``keeper-proxy`` over HTTP, in front of the model.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_bench.marathon.grading import (
    FIXES_FILE,
    RECIPES_FILE,
    Files,
    MarathonGrade,
    grade_marathon,
)
from keeper_bench.marathon.planting import (
    LIBRARY_FILES,
    PlantedDefect,
    load_or_choose,
    plant_all,
)
from keeper_bench.marathon.sandbox import ShellSandbox
from keeper_bench.marathon.scripted import SCRIPTED_AGENT, ScriptedRepairAgent
from keeper_bench.marathon.source import cache_dir, unpack_source
from keeper_bench.marathon.testrun import run_tests, test_classes
from keeper_bench.marathon.tickets import Ticket, build_tickets
from keeper_bench.recording import CallRecorder
from keeper_bench.run_options import parse_model
from keeper_middleware.archive.sqlite import SQLiteArchive
from keeper_middleware.config import KeeperConfig
from keeper_middleware.notes.block import parse_notes

WAYS = ("direct", "middleware", "proxy")
SESSION = "marathon"
SYSTEM_PROMPT = (
    "You maintain the Python library more-itertools; its code and tests are in the current "
    "folder. Tickets arrive one at a time. Work each with the shell tool, one command per call: "
    "run the failing tests, read the code, fix the library (never the tests), check the tests "
    "pass, then reply with one line. Keep every standing instruction a notice gives you."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class MarathonOptions:
    way: str
    out: Path
    model: str = "scripted"
    """``scripted`` (the plumbing agent) or ``openai:URL[:MODEL]``."""
    seed: int = 0
    defects: int = 40
    window: int = 32_768
    audit: bool = True
    max_tokens: int | None = None
    timeout: float = 600.0
    recursion_limit: int = 120

    def __post_init__(self) -> None:
        if self.way not in WAYS:
            raise ValueError(f"way {self.way!r}: choose one of {', '.join(WAYS)}")
        if self.model != "scripted":
            parse_model(self.model)  # a clear error for a malformed spec
        if self.defects < 1:
            raise ValueError("defects must be at least 1")


@dataclass
class WayResult:
    way: str
    model: str
    grade: MarathonGrade
    tickets: int
    model_calls: int
    management_calls: int
    prompt_tokens: int
    completion_tokens: int
    wall_seconds: float
    largest_output_chars: int
    notes_versions: int
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        grade = self.grade
        return {
            "way": self.way,
            "model": self.model,
            "tickets": self.tickets,
            "defects": len(grade.tickets),
            "fixed": grade.fixed,
            "clean": grade.clean,
            "regressions": len(grade.regressions),
            "audit_right": grade.audit_right,
            "notices_kept": grade.notices_kept,
            "model_calls": self.model_calls,
            "management_calls": self.management_calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "wall_seconds": round(self.wall_seconds, 1),
            "largest_output_chars": self.largest_output_chars,
            "notes_versions": self.notes_versions,
            "errors": self.errors,
        }


def snapshot(project: Path) -> dict[str, str]:
    files = {}
    for name in (*LIBRARY_FILES, FIXES_FILE, RECIPES_FILE):
        path = project / name
        if path.exists():
            files[name] = path.read_text(errors="replace")
    return files


def keeper_config(window: int) -> KeeperConfig:
    """The keeper's settings for a repair agent: a ticket is an instruction set (rules beside it,
    never cut while open), and no counter-story checks."""
    return KeeperConfig(
        window=window,
        reply_reserve=min(4096, window // 8),
        question_patterns=(r"^\s*Ticket\s+\d+\.",),
        tracked_names=None,
    )


def _real_model(spec: str, options: MarathonOptions, base_url: str | None = None) -> BaseChatModel:
    from langchain_openai import ChatOpenAI

    url, name = parse_model(spec)
    return ChatOpenAI(
        base_url=base_url or url,
        model=name or "default",
        api_key="unused",  # type: ignore[arg-type]
        timeout=options.timeout,
        max_tokens=options.max_tokens,  # type: ignore[call-arg]
        max_retries=2,
        default_headers={"X-Keeper-Session": SESSION},
    )


def _notes_rules(archive: Any) -> list[tuple[int, list[str]]]:
    rules = []
    for session in archive.sessions():
        for version in archive.notes_versions(session):
            notes, _ = parse_notes(version.text)
            rules.append((version.last_item or 0, list(notes.rules)))
    return rules


@contextmanager
def _agent(
    options: MarathonOptions, model: BaseChatModel, sandbox: ShellSandbox, state_dir: Path
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The way's agent, and what the harness reads from it afterwards (a ``report`` callable)."""
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver

    shell = sandbox.tool()
    extra: dict[str, Any] = {}
    if options.way == "direct":
        yield create_agent(model, tools=[shell], system_prompt=SYSTEM_PROMPT), extra
        return
    if options.way == "middleware":
        from keeper_middleware.integrations.langchain import KeeperMiddleware

        middleware = KeeperMiddleware(
            model,
            tools=[shell],
            system_prompt=SYSTEM_PROMPT,
            config=keeper_config(options.window),
            archive=state_dir / "archive.sqlite3",
        )
        agent = create_agent(
            model,
            tools=[shell],
            system_prompt=SYSTEM_PROMPT,
            middleware=[middleware],
            checkpointer=InMemorySaver(),
        )
        extra["keeper"] = middleware.keeper
        try:
            yield agent, extra
        finally:
            extra["notes_rules"] = _notes_rules(middleware.keeper.archive)
            extra["counters"] = middleware.keeper.counters(SESSION).to_json()
            middleware.keeper.close()
        return
    # proxy
    from keeper_bench.marathon.model_server import serve_model
    from keeper_middleware.integrations.proxy import create_proxy_app
    from keeper_middleware.integrations.proxy.cli import serve_in_thread

    with ExitStack() as stack:
        if options.model == "scripted":
            upstream = stack.enter_context(serve_model(model, "scripted-repair-agent"))
        else:
            upstream = parse_model(options.model)[0]
        app = create_proxy_app(
            upstream,
            window=options.window,
            archive_dir=state_dir,
            config=keeper_config(options.window),
        )
        proxy_url = stack.enter_context(serve_in_thread(app))
        name = (
            "scripted-repair-agent"
            if options.model == "scripted"
            else parse_model(options.model)[1] or "default"
        )
        client = _real_model(f"openai:{proxy_url}:{name}", options, base_url=proxy_url)
        yield create_agent(client, tools=[shell], system_prompt=SYSTEM_PROMPT), extra
        keeper = app.state.proxy.keeper
        extra["counters"] = {s: keeper.counters(s).to_json() for s in keeper.archive.sessions()}
    archive_file = next(state_dir.glob("*.sqlite3"), None)
    if archive_file is not None:
        with SQLiteArchive(archive_file) as archive:
            extra["notes_rules"] = _notes_rules(archive)


def _last_text(messages: list[BaseMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, AIMessage) and not message.tool_calls:
            return str(message.content)
    return ""


@dataclass(frozen=True, slots=True)
class PreparedProject:
    """The planted code base every way starts from, and what its tests say before any work."""

    root: Path
    planted: list[PlantedDefect]
    start_failed: frozenset[str]


def prepare_project(folder: Path, *, seed: int, defects: int) -> PreparedProject:
    """Unpack, plant the seed's defects and run the suite once; reused by every way."""
    root = unpack_source(folder)
    planted = load_or_choose(root, cache_dir(), seed=seed, count=defects)
    plant_all(root, planted)
    return PreparedProject(root, planted, run_tests(root).failed)


def run_marathon(options: MarathonOptions, prepared: PreparedProject | None = None) -> WayResult:
    """Plant (or reuse ``prepared``), run every ticket, grade; writes ``result.json`` and
    ``tickets.jsonl`` to ``options.out``."""
    options.out.mkdir(parents=True, exist_ok=True)
    if prepared is None:
        prepared = prepare_project(
            options.out / "planted", seed=options.seed, defects=options.defects
        )
    project = options.out / "work"
    if project.exists():
        shutil.rmtree(project)
    shutil.copytree(prepared.root, project)
    planted, start_failed = prepared.planted, prepared.start_failed
    tickets = build_tickets(planted, audit=options.audit)
    sandbox = ShellSandbox(project)
    if options.model == "scripted":
        planted_lines = {name: (project / name).read_text().splitlines() for name in LIBRARY_FILES}
        model: BaseChatModel = ScriptedRepairAgent(
            tickets=tickets, planted_lines=planted_lines, test_classes=test_classes(project)
        )
        model_name = SCRIPTED_AGENT
    else:
        model = _real_model(options.model, options)
        model_name = options.model
    recorder = CallRecorder()
    snapshots: list[tuple[Files, Files]] = []
    replies: list[str] = []
    errors: list[str] = []
    history: list[BaseMessage] = []
    started = time.perf_counter()
    state_dir = options.out / "state"
    state_dir.mkdir(exist_ok=True)
    with (
        _agent(options, model, sandbox, state_dir) as (agent, extra),
        (options.out / "tickets.jsonl").open("w") as log,
    ):
        for ticket in tickets:
            recorder.item = ticket.number
            before = snapshot(project)
            reply = _work(agent, options, ticket, history, recorder, errors)
            snapshots.append((before, snapshot(project)))
            replies.append(reply)
            log.write(
                json.dumps({"ticket": ticket.number, "kind": ticket.kind, "reply": reply}) + "\n"
            )
            log.flush()
            if errors and options.way == "direct" and "context" in errors[-1].lower():
                break  # the thread cannot continue past its window
    wall = time.perf_counter() - started
    while len(snapshots) < len(tickets):  # tickets never reached
        files = snapshot(project)
        snapshots.append((files, files))
        replies.append("")
    final = run_tests(project)
    grade = grade_marathon(
        tickets, snapshots, final.failed, start_failed, replies, extra.get("notes_rules", ())
    )
    records = recorder.records
    result = WayResult(
        way=options.way,
        model=model_name,
        grade=grade,
        tickets=len(tickets),
        model_calls=sum(1 for r in records if r.kind == "work"),
        management_calls=_management_calls(records, extra.get("counters")),
        prompt_tokens=sum(r.prompt_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        wall_seconds=wall,
        largest_output_chars=max(sandbox.output_sizes, default=0),
        notes_versions=len(extra.get("notes_rules", ())),
        errors=errors,
    )
    payload = {
        **result.summary(),
        "tickets_graded": [asdict(t) for t in grade.tickets],
        "regressions_list": list(grade.regressions),
        "audit_expected": list(grade.audit_expected),
        "audit_answer": grade.audit_answer,
        "counters": extra.get("counters"),
        "seed": options.seed,
        "window": options.window,
    }
    (options.out / "result.json").write_text(json.dumps(payload, indent=1))
    return result


def _management_calls(records: list[Any], counters: Any) -> int:
    """Note calls: seen by the harness in-process; counted by the keeper behind the proxy."""
    seen = sum(1 for r in records if r.kind != "work")
    if seen or not isinstance(counters, dict):
        return seen
    per_session = counters.values() if "notes_calls" not in counters else [counters]
    return sum(int(c.get("notes_calls", 0)) for c in per_session if isinstance(c, dict))


def _work(
    agent: Any,
    options: MarathonOptions,
    ticket: Ticket,
    history: list[BaseMessage],
    recorder: CallRecorder,
    errors: list[str],
) -> str:
    config: dict[str, Any] = {
        "recursion_limit": options.recursion_limit,
        "callbacks": [recorder],
        "configurable": {"thread_id": SESSION},
    }
    message = HumanMessage(ticket.text)
    try:
        if options.way == "direct":  # no checkpointer: the harness holds the whole history
            state = agent.invoke({"messages": [*history, message]}, config)
            history[:] = state["messages"]
        else:
            state = agent.invoke({"messages": [message]}, config)
        return _last_text(state["messages"])
    except Exception as error:  # a real model may fail a ticket; the marathon goes on
        errors.append(f"ticket {ticket.number}: {type(error).__name__}: {error}"[:500])
        return ""
