"""One registry of the arms (ways of managing context) and one way to build any of them.

Every arm is a compiled LangGraph graph with the same interface: invoke it with
``{"messages": [...]}`` and ``config={"configurable": {"thread_id": ...}}``; the thread is the
conversation. So a notebook swaps arms with one argument::

    arm = build_arm("notes_retrieval", model, window=32_768, retriever="hybrid")
    arm.graph.invoke({"messages": [HumanMessage("Item 1. ...")]}, {"configurable": {"thread_id": "t"}})

Settings an arm has no use for (``retriever`` for window-drop, ``domain`` for the peers) are
accepted and ignored, so the same call builds every arm; an option no arm knows is an error.
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
from keeper_middleware.graphs import baselines, keeper_arms, peers, rag
from keeper_middleware.graphs.baselines import WindowPolicy, default_reply_reserve
from keeper_bench.arms.self_edit import Style, self_edit_graph
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
        ArmInfo(
            "self_edit",
            "self-editing, read mode: the model keeps `name value` lines pinned at the top with "
            "memory tools; processed batches leave the window",
            False,
        ),
        ArmInfo(
            "self_edit_archive",
            "self-editing with the same pinned lines; what leaves the window goes word for word "
            "to an archive the model searches",
            True,
        ),
        ArmInfo(
            "self_edit_rules",
            "self_edit_archive whose pinned state also holds permanent RULE: lines (edits that "
            "remove or reword one are rejected), read before answering",
            True,
        ),
        ArmInfo(
            "free_notes",
            "archive and search with free-text notes edited by the model in place of the "
            "`name value` lines; nothing said about rules",
            True,
        ),
        ArmInfo(
            "peer_langchain_summarization",
            "LangChain create_agent + SummarizationMiddleware, defaults, trigger at 75%",
            False,
        ),
        ArmInfo(
            "peer_langchain_summarization_tuned",
            "LangChain SummarizationMiddleware with trim_tokens_to_summarize=None (summarises all "
            "it evicts), trigger at 75%",
            False,
        ),
        ArmInfo(
            "peer_langmem_summarization",
            "langmem SummarizationNode (running summary), defaults, trigger at 75%",
            False,
        ),
        ArmInfo(
            "peer_langmem_summarization_tuned",
            "langmem SummarizationNode with its summary budget matched to the keeper's NOTES "
            "budget, trigger at 75%",
            False,
        ),
        ArmInfo(
            "peer_deepagents",
            "Deep Agents create_deep_agent, defaults (history offloaded to a file and "
            "summarised at 85% of the window, from the model's profile)",
            False,
        ),
        ArmInfo(
            "peer_deepagents_tuned",
            "Deep Agents with its summarisation triggered at 75% of the window, like every arm",
            False,
        ),
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
    "self_edit": frozenset({"pinned_head", "item_tools"}),
    "self_edit_archive": frozenset({"pinned_head", "item_tools"}),
    "self_edit_rules": frozenset({"pinned_head", "item_tools"}),
    "free_notes": frozenset({"pinned_head", "item_tools"}),
    "peer_langchain_summarization": frozenset({"summarize_at"}),
    "peer_langchain_summarization_tuned": frozenset({"summarize_at"}),
    "peer_langmem_summarization": frozenset({"summarize_at"}),
    "peer_langmem_summarization_tuned": frozenset({"summarize_at"}),
    "peer_deepagents": frozenset(),
    "peer_deepagents_tuned": frozenset({"summarize_at"}),
}
PEER_SETTINGS: dict[str, tuple[str, str]] = {
    "peer_langchain_summarization": ("peer_langchain_summarization", "defaults"),
    "peer_langchain_summarization_tuned": ("peer_langchain_summarization", "tuned"),
    "peer_langmem_summarization": ("peer_langmem_summarization", "defaults"),
    "peer_langmem_summarization_tuned": ("peer_langmem_summarization", "tuned"),
    "peer_deepagents": ("peer_deepagents", "defaults"),
    "peer_deepagents_tuned": ("peer_deepagents", "tuned"),
}
"""Each peer arm's peer and setting: every table shows a peer at its defaults and tuned."""


def default_retrieved_per_question(window: int) -> int:
    """20 sentences per question at a 32K window (the measured setting), fewer in smaller ones."""
    return max(2, min(20, window // 1600))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Request:
    """Everything ``build_arm`` was given, resolved once."""

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
    if name not in ARMS:
        raise ConfigurationError(f"unknown arm {name!r}; choose one of: {', '.join(ARMS)}")
    allowed = SHARED_OPTIONS | ARM_OPTIONS[name]
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ArgumentTypeError(
            f"arm {name!r} takes no option {', '.join(unknown)}; its options are: "
            f"{', '.join(sorted(allowed))}"
        )
    request = _Request(
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
    return _BUILDERS[name](request)


def _saver(request: _Request) -> Checkpointer:
    return request.checkpointer if request.checkpointer is not None else InMemorySaver()


def _common(request: _Request) -> dict[str, Any]:
    return {
        "tools": request.tools,
        "system_prompt": request.system_prompt,
        "checkpointer": _saver(request),
        "name": request.name,
    }


def _build_window_drop(request: _Request) -> Arm:
    graph = baselines.window_drop_graph(
        request.model,
        policy=request.policy(),
        token_counter=request.options.get("token_counter"),
        **_common(request),
    )
    return Arm(request.name, graph, description=ARMS[request.name].description)


def _build_compaction(request: _Request) -> Arm:
    graph = baselines.compaction_graph(
        request.model,
        policy=request.policy(),
        keep_tool_results=int(request.options.get("keep_tool_results", 3)),
        token_counter=request.options.get("token_counter"),
        **_common(request),
    )
    return Arm(request.name, graph, description=ARMS[request.name].description)


def _build_summarize(request: _Request) -> Arm:
    graph = baselines.summarize_graph(
        request.model,
        policy=request.policy(),
        summarize_at=request.options.get("summarize_at", ("fraction", 0.75)),
        keep_turns=int(request.options.get("keep_turns", 2)),
        summary_tokens=request.options.get("summary_tokens", baselines.SUMMARY_BUDGET),
        token_counter=request.options.get("token_counter"),
        **_common(request),
    )
    return Arm(request.name, graph, description=ARMS[request.name].description)


def _build_rag(request: _Request) -> Arm:
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
        **_common(request),
    )
    return Arm(request.name, graph, retriever=store, description=ARMS[request.name].description)


def _build_keeper(request: _Request) -> Arm:
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
        checkpointer=_saver(request),
    )
    return Arm(
        arm,
        graph,
        keeper=keeper,
        retriever=keeper.passages_retriever,
        description=ARMS[arm].description,
    )


SELF_EDIT_STYLES: dict[str, tuple[Style, bool]] = {
    "self_edit": ("lines", False),
    "self_edit_archive": ("lines", True),
    "self_edit_rules": ("rules", True),
    "free_notes": ("prose", True),
}
"""Each self-editing arm's pinned-state style, and whether it archives what leaves the window."""


def _build_self_edit(request: _Request) -> Arm:
    """The pinned state gets the keeper's NOTES budget; the archive and its search are the
    keeper's own (the read mode's archive holds its memory versions only)."""
    style, archived = SELF_EDIT_STYLES[request.name]
    base = request.keeper_config or KeeperConfig()
    config = replace(base, window=request.window, reply_reserve=request.reply_reserve)
    if "passages" in request.options:
        config = replace(config, passages=str(request.options["passages"]))
    keeper = Keeper(
        config,
        archive=request.archive if request.archive is not None else ":memory:",
        retriever=request.retriever if archived else "keyword",
        token_counter=request.options.get("token_counter"),
    )
    graph = self_edit_graph(
        request.model,
        keeper,
        style=style,
        archive=archived,
        policy=request.policy(),
        budget=keeper_arms.notes_budget(config),
        token_counter=request.options.get("token_counter"),
        item_tools=tuple(request.options.get("item_tools", ())),
        **_common(request),
    )
    return Arm(
        request.name,
        graph,
        keeper=keeper,
        retriever=keeper.retriever if archived else None,
        description=ARMS[request.name].description,
        memory_kind="pinned",
    )


def _build_langchain_peer(request: _Request) -> Arm:
    tuned = request.name.endswith("_tuned")
    graph = peers.langchain_summarization_graph(
        request.model,
        window=request.window,
        summarize_at=request.options.get("summarize_at", ("fraction", 0.75)),
        trim_tokens_to_summarize=None if tuned else "default",
        **_common(request),
    )
    return Arm(request.name, graph, description=ARMS[request.name].description)


def matched_summary_tokens(request: _Request) -> int:
    """The keeper's NOTES budget for this window and reply reserve (see ``notes_budget``)."""
    base = request.keeper_config or KeeperConfig()
    config = replace(base, window=request.window, reply_reserve=request.reply_reserve)
    return keeper_arms.notes_budget(config)


def _build_langmem_peer(request: _Request) -> Arm:
    tuned = request.name.endswith("_tuned")
    graph = peers.langmem_summarization_graph(
        request.model,
        window=request.window,
        reply_reserve=request.reply_reserve,
        summarize_at=request.options.get("summarize_at", ("fraction", 0.75)),
        tools=request.tools,
        system_prompt=request.system_prompt,
        checkpointer=request.checkpointer,  # None: one that can restore langmem's summary
        name=request.name,
        summary_tokens=matched_summary_tokens(request) if tuned else None,
    )
    return Arm(request.name, graph, description=ARMS[request.name].description)


def _build_deepagents_peer(request: _Request) -> Arm:
    tuned = request.name.endswith("_tuned")
    graph = peers.deepagents_graph(
        request.model,
        window=request.window,
        summarize_at=request.options.get("summarize_at", ("fraction", 0.75)) if tuned else None,
        **_common(request),
    )
    return Arm(request.name, graph, description=ARMS[request.name].description)


_BUILDERS: dict[str, Callable[[_Request], Arm]] = {
    "window_drop": _build_window_drop,
    "compaction": _build_compaction,
    "summarize": _build_summarize,
    "rag": _build_rag,
    "notes": _build_keeper,
    "notes_retrieval": _build_keeper,
    "notes_rewrite": _build_keeper,
    "self_edit": _build_self_edit,
    "self_edit_archive": _build_self_edit,
    "self_edit_rules": _build_self_edit,
    "free_notes": _build_self_edit,
    "peer_langchain_summarization": _build_langchain_peer,
    "peer_langchain_summarization_tuned": _build_langchain_peer,
    "peer_langmem_summarization": _build_langmem_peer,
    "peer_langmem_summarization_tuned": _build_langmem_peer,
    "peer_deepagents": _build_deepagents_peer,
    "peer_deepagents_tuned": _build_deepagents_peer,
}
