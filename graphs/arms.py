"""One registry of the arms (ways of managing context) and one way to build any of them.

Every arm is a compiled LangGraph graph with the same interface: invoke it with
``{"messages": [...]}`` and ``config={"configurable": {"thread_id": ...}}``; the thread is the
conversation. So a notebook swaps arms with one argument::

    arm = build_arm("notes_retrieval", model, window=32_768, retriever="hybrid")
    arm.graph.invoke({"messages": [HumanMessage("Item 1. ...")]}, {"configurable": {"thread_id": "t"}})

Settings an arm has no use for (``retriever`` for window-drop, ``domain`` for the baselines) are
accepted and ignored, so the same call builds every arm; an option no arm knows is an error.

These are the arms the product ships. The benchmark (the keeper-bench distribution) adds its
own, the peers and the self-editing arms, with a registry of its own built on ``arm_request``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig
from keeper_middleware.errors import ArgumentTypeError, ConfigurationError
from keeper_middleware.graphs import baselines, keeper_arms, rag
from keeper_middleware.graphs.baselines import WindowPolicy, default_reply_reserve
from keeper_middleware.keeper import Keeper, Tool
from keeper_middleware.retrievers.base import Retriever
from keeper_middleware.retrievers.factory import make_retriever


@dataclass(frozen=True, slots=True)
class ArmInfo:
    name: str
    description: str
    uses_retriever: bool


@dataclass(frozen=True, slots=True)
class Arm:
    """A built arm: the graph to drive, and what a runner reads afterwards."""

    name: str
    graph: CompiledStateGraph[Any, Any, Any, Any]
    keeper: Keeper | None = None
    """The engine of the arms that keep notes; every NOTES version is in ``keeper.archive``."""
    retriever: Retriever | None = None
    description: str = ""
    memory_kind: str = "notes"
    """What the versions in ``keeper.archive`` are: the keeper's "notes", or the "pinned" state
    a self-editing arm's model wrote (read as free text by an audit)."""

    def close(self) -> None:
        """Close the archive and the retriever (files, background indexing)."""
        if self.keeper is not None:
            self.keeper.close()
        elif self.retriever is not None:
            self.retriever.close()


ARMS: dict[str, ArmInfo] = {
    info.name: info
    for info in (
        ArmInfo("window_drop", "oldest turns dropped when the window fills; nothing kept", False),
        ArmInfo(
            "compaction",
            "old tool output replaced by a stub and old reasoning removed, then oldest turns dropped",
            False,
        ),
        ArmInfo(
            "summarize",
            "at 75% of the window the model writes a summary that replaces the older turns",
            False,
        ),
        ArmInfo(
            "rag",
            "retrieval only: inputs stored on arrival, best-matching sentences shown at questions",
            True,
        ),
        ArmInfo("notes", "the keeper: in-place notes, archive search, rules re-injection", True),
        ArmInfo(
            "notes_retrieval",
            "the keeper plus retrieved archive sentences shown at each set of questions",
            True,
        ),
        ArmInfo("notes_rewrite", "the keeper with full-rewrite notes (the earlier form)", True),
    )
}

SHARED_OPTIONS = frozenset(
    {"reply_reserve", "token_counter", "domain", "retrieved_per_question", "passages"}
)
"""Options every arm accepts (and ignores where it has no use for them)."""
ARM_OPTIONS: dict[str, frozenset[str]] = {
    "window_drop": frozenset({"pinned_head"}),
    "compaction": frozenset({"pinned_head", "keep_tool_results"}),
    "summarize": frozenset({"pinned_head", "summarize_at", "keep_turns", "summary_tokens"}),
    "rag": frozenset({"pinned_head", "item_tools"}),
    "notes": frozenset({"item_tools"}),
    "notes_retrieval": frozenset({"item_tools"}),
    "notes_rewrite": frozenset({"item_tools"}),
}
"""Each arm's own options, beside ``SHARED_OPTIONS``."""


def default_retrieved_per_question(window: int) -> int:
    """20 sentences per question at a 32K window (the measured setting), fewer in smaller ones."""
    return max(2, min(20, window // 1600))


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmRequest:
    """Everything ``build_arm`` was given, checked and resolved once: what an arm builder reads.

    A registry of more arms (the benchmark's peers, say) builds one with ``arm_request`` and
    hands it to its own builders, so every arm takes the same arguments."""

    name: str
    model: BaseChatModel
    window: int
    tools: tuple[Tool, ...]
    system_prompt: str | None
    retriever: Retriever | str
    archive: ArchiveStore | str | Path | None
    keeper_config: KeeperConfig | None
    checkpointer: Checkpointer
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def reply_reserve(self) -> int:
        given = self.options.get("reply_reserve")
        return int(given) if given is not None else default_reply_reserve(self.window)

    @property
    def per_question(self) -> int:
        given = self.options.get("retrieved_per_question")
        return int(given) if given is not None else default_retrieved_per_question(self.window)

    def policy(self) -> WindowPolicy:
        return WindowPolicy(
            window=self.window,
            reply_reserve=self.reply_reserve,
            pinned_head=int(self.options.get("pinned_head", 1)),
        )


def build_arm(
    name: str,
    model: BaseChatModel,
    *,
    window: int,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    retriever: Retriever | str = "keyword",
    archive: ArchiveStore | str | Path | None = None,
    keeper_config: KeeperConfig | None = None,
    checkpointer: Checkpointer = None,
    **options: Any,
) -> Arm:
    """Build the arm ``name`` (see ``ARMS``) around ``model`` with a live window of ``window``.

    ``retriever`` ("keyword", "embedding", "hybrid" or a ``Retriever``) is used by the arms that
    retrieve; ``archive`` is where the keeper arms archive (in memory when None) and, for
    ``rag``, where its index lives. ``keeper_config`` is the base of the keeper arms' settings
    (the window and the arm's own setting are applied to it). With no ``checkpointer`` the
    conversation lives in memory for as long as the graph does.

    Options: ``reply_reserve`` (default: 4,096 or an eighth of a small window), ``passages``
    ("sentences" or "messages": what the retrieving arms index as one passage),
    ``retrieved_per_question`` (rag, notes_retrieval), ``domain="counters"`` (the keeper arms
    track the benchmark's counter names), ``token_counter``, ``pinned_head``,
    ``keep_tool_results`` (compaction), ``summarize_at`` / ``keep_turns`` (summaries),
    ``item_tools`` (tools whose results are new inputs).
    """
    request = arm_request(
        name,
        model,
        known=ARM_OPTIONS,
        window=window,
        tools=tools,
        system_prompt=system_prompt,
        retriever=retriever,
        archive=archive,
        keeper_config=keeper_config,
        checkpointer=checkpointer,
        options=options,
    )
    return _BUILDERS[name](request)


def arm_request(
    name: str,
    model: BaseChatModel,
    *,
    known: Mapping[str, frozenset[str]],
    window: int,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    retriever: Retriever | str = "keyword",
    archive: ArchiveStore | str | Path | None = None,
    keeper_config: KeeperConfig | None = None,
    checkpointer: Checkpointer = None,
    options: Mapping[str, Any] | None = None,
) -> ArmRequest:
    """Check ``name`` against ``known`` (each arm's own options) and the options against
    ``SHARED_OPTIONS`` plus the arm's own, then gather the arguments into one ``ArmRequest``.

    Args:
        name: The arm to build.
        model: The chat model the arm drives.
        known: The arms a registry builds, each with its own options (``ARM_OPTIONS`` here).
        window: The live window in tokens.
        tools: The agent's tools.
        system_prompt: The agent's system prompt.
        retriever: What the retrieving arms search with.
        archive: Where the keeper arms archive.
        keeper_config: The base of the keeper arms' settings.
        checkpointer: Where the conversation's state lives.
        options: The arm's options (see ``build_arm``).

    Raises:
        ConfigurationError: ``name`` is not in ``known``.
        ArgumentTypeError: an option the arm does not take.
    """
    options = dict(options or {})
    if name not in known:
        elsewhere = (
            " (the benchmark's own arms, the peers and the self-editing ones, come with the "
            "keeper-bench distribution)"
            if known is ARM_OPTIONS
            else ""
        )
        raise ConfigurationError(
            f"unknown arm {name!r}; choose one of: {', '.join(known)}{elsewhere}"
        )
    allowed = SHARED_OPTIONS | known[name]
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ArgumentTypeError(
            f"arm {name!r} takes no option {', '.join(unknown)}; its options are: "
            f"{', '.join(sorted(allowed))}"
        )
    return ArmRequest(
        name=name,
        model=model,
        window=window,
        tools=tuple(tools),
        system_prompt=system_prompt,
        retriever=retriever,
        archive=archive,
        keeper_config=keeper_config,
        checkpointer=checkpointer,
        options=options,
    )


def saver(request: ArmRequest) -> Checkpointer:
    """The request's checkpointer, or one in memory for as long as the graph lives."""
    return request.checkpointer if request.checkpointer is not None else InMemorySaver()


def graph_arguments(request: ArmRequest) -> dict[str, Any]:
    """The arguments every prebuilt graph takes (tools, system prompt, checkpointer, name)."""
    return {
        "tools": request.tools,
        "system_prompt": request.system_prompt,
        "checkpointer": saver(request),
        "name": request.name,
    }


def _build_window_drop(request: ArmRequest) -> Arm:
    graph = baselines.window_drop_graph(
        request.model,
        policy=request.policy(),
        token_counter=request.options.get("token_counter"),
        **graph_arguments(request),
    )
    return Arm(request.name, graph, description=ARMS[request.name].description)


def _build_compaction(request: ArmRequest) -> Arm:
    graph = baselines.compaction_graph(
        request.model,
        policy=request.policy(),
        keep_tool_results=int(request.options.get("keep_tool_results", 3)),
        token_counter=request.options.get("token_counter"),
        **graph_arguments(request),
    )
    return Arm(request.name, graph, description=ARMS[request.name].description)


def _build_summarize(request: ArmRequest) -> Arm:
    graph = baselines.summarize_graph(
        request.model,
        policy=request.policy(),
        summarize_at=request.options.get("summarize_at", ("fraction", 0.75)),
        keep_turns=int(request.options.get("keep_turns", 2)),
        summary_tokens=request.options.get("summary_tokens", baselines.SUMMARY_BUDGET),
        token_counter=request.options.get("token_counter"),
        **graph_arguments(request),
    )
    return Arm(request.name, graph, description=ARMS[request.name].description)


def _build_rag(request: ArmRequest) -> Arm:
    archive = request.archive
    index = None
    if isinstance(archive, str | Path) and str(archive) != ":memory:":
        index = Path(archive).with_suffix(".index")
    store = make_retriever(request.retriever, path=index)
    graph = rag.rag_graph(
        request.model,
        store,
        policy=request.policy(),
        per_question=request.per_question,
        token_counter=request.options.get("token_counter"),
        item_tools=tuple(request.options.get("item_tools", ())),
        passages=str(request.options.get("passages", "sentences")),
        **graph_arguments(request),
    )
    return Arm(request.name, graph, retriever=store, description=ARMS[request.name].description)


def _build_keeper(request: ArmRequest) -> Arm:
    arm = cast(keeper_arms.KeeperArm, request.name)
    config = keeper_arms.keeper_arm_config(
        arm,
        window=request.window,
        reply_reserve=request.options.get("reply_reserve"),
        base=request.keeper_config,
        retrieved_per_question=request.per_question,
        domain=request.options.get("domain"),
        item_tools=tuple(request.options.get("item_tools", ())),
    )
    if "passages" in request.options:
        config = replace(config, passages=str(request.options["passages"]))
    graph, keeper = keeper_arms.keeper_arm_graph(
        arm,
        request.model,
        config=config,
        tools=request.tools,
        system_prompt=request.system_prompt,
        archive=request.archive,
        retriever=request.retriever,
        token_counter=request.options.get("token_counter"),
        checkpointer=saver(request),
    )
    return Arm(
        arm,
        graph,
        keeper=keeper,
        retriever=keeper.passages_retriever,
        description=ARMS[arm].description,
    )


_BUILDERS: dict[str, Callable[[ArmRequest], Arm]] = {
    "window_drop": _build_window_drop,
    "compaction": _build_compaction,
    "summarize": _build_summarize,
    "rag": _build_rag,
    "notes": _build_keeper,
    "notes_retrieval": _build_keeper,
    "notes_rewrite": _build_keeper,
}
