"""Every arm the benchmark compares: the product's (``keeper_middleware.graphs.ARMS``) and its own.

The benchmark's own arms are the peers (what LangChain, langmem and Deep Agents ship for a full
window, ``peers``) and the self-editing arms (``self_edit``). They are built the same way as the
product's, from one ``ArmRequest``, so ``build_arm`` here takes exactly the arguments of
``keeper_middleware.graphs.build_arm`` and builds any arm of either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.types import Checkpointer

from keeper_bench.arms import peers
from keeper_bench.arms.self_edit import Style, self_edit_graph
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig
from keeper_middleware.graphs import arms as product
from keeper_middleware.graphs import keeper_arms
from keeper_middleware.graphs.arms import (
    SHARED_OPTIONS,
    Arm,
    ArmInfo,
    ArmRequest,
    arm_request,
    default_retrieved_per_question,
    graph_arguments,
)
from keeper_middleware.keeper import Keeper, Tool
from keeper_middleware.retrievers.base import Retriever

__all__ = [
    "ARMS",
    "ARM_OPTIONS",
    "BENCH_ARMS",
    "PEER_SETTINGS",
    "SELF_EDIT_STYLES",
    "SHARED_OPTIONS",
    "Arm",
    "ArmInfo",
    "build_arm",
    "default_retrieved_per_question",
    "matched_summary_tokens",
]

BENCH_ARMS: dict[str, ArmInfo] = {
    info.name: info
    for info in (
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
            "it evicts) and a rule-keeping prompt, trigger at 75%",
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
            "budget and a rule-keeping prompt, trigger at 75%",
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
            "Deep Agents with its summarisation triggered at 75% of the window, like every arm, "
            "and a rule-keeping prompt",
            False,
        ),
    )
}
"""The benchmark's own arms."""
ARMS: dict[str, ArmInfo] = {**product.ARMS, **BENCH_ARMS}
"""Every arm the benchmark runs: the product's first, then its own."""
BENCH_ARM_OPTIONS: dict[str, frozenset[str]] = {
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
ARM_OPTIONS: dict[str, frozenset[str]] = {**product.ARM_OPTIONS, **BENCH_ARM_OPTIONS}
"""Each arm's own options, beside ``SHARED_OPTIONS``."""
PEER_SETTINGS: dict[str, tuple[str, str]] = {
    "peer_langchain_summarization": ("peer_langchain_summarization", "defaults"),
    "peer_langchain_summarization_tuned": ("peer_langchain_summarization", "tuned"),
    "peer_langmem_summarization": ("peer_langmem_summarization", "defaults"),
    "peer_langmem_summarization_tuned": ("peer_langmem_summarization", "tuned"),
    "peer_deepagents": ("peer_deepagents", "defaults"),
    "peer_deepagents_tuned": ("peer_deepagents", "tuned"),
}
"""Each peer arm's peer and setting: every table shows a peer at its defaults and tuned."""


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
    """Build any arm of ``ARMS``: the product's through ``keeper_middleware.graphs.build_arm``,
    the benchmark's own here (the same arguments and options for both)."""
    arguments: dict[str, Any] = {
        "window": window,
        "tools": tools,
        "system_prompt": system_prompt,
        "retriever": retriever,
        "archive": archive,
        "keeper_config": keeper_config,
        "checkpointer": checkpointer,
    }
    if name in product.ARMS:
        return product.build_arm(name, model, **arguments, **options)
    request = arm_request(name, model, known=ARM_OPTIONS, options=options, **arguments)
    return _BUILDERS[name](request)


SELF_EDIT_STYLES: dict[str, tuple[Style, bool]] = {
    "self_edit": ("lines", False),
    "self_edit_archive": ("lines", True),
    "self_edit_rules": ("rules", True),
    "free_notes": ("prose", True),
}
"""Each self-editing arm's pinned-state style, and whether it archives what leaves the window."""


def _build_self_edit(request: ArmRequest) -> Arm:
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
        **graph_arguments(request),
    )
    return Arm(
        request.name,
        graph,
        keeper=keeper,
        retriever=keeper.retriever if archived else None,
        description=BENCH_ARMS[request.name].description,
        memory_kind="pinned",
    )


def _build_langchain_peer(request: ArmRequest) -> Arm:
    tuned = request.name.endswith("_tuned")
    graph = peers.langchain_summarization_graph(
        request.model,
        window=request.window,
        summarize_at=request.options.get("summarize_at", ("fraction", 0.75)),
        trim_tokens_to_summarize=None if tuned else "default",
        keep_rules=tuned,
        **graph_arguments(request),
    )
    return Arm(request.name, graph, description=BENCH_ARMS[request.name].description)


def matched_summary_tokens(request: ArmRequest) -> int:
    """The keeper's NOTES budget for this window and reply reserve (see ``notes_budget``)."""
    base = request.keeper_config or KeeperConfig()
    config = replace(base, window=request.window, reply_reserve=request.reply_reserve)
    return keeper_arms.notes_budget(config)


def _build_langmem_peer(request: ArmRequest) -> Arm:
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
        keep_rules=tuned,
    )
    return Arm(request.name, graph, description=BENCH_ARMS[request.name].description)


def _build_deepagents_peer(request: ArmRequest) -> Arm:
    tuned = request.name.endswith("_tuned")
    graph = peers.deepagents_graph(
        request.model,
        window=request.window,
        summarize_at=request.options.get("summarize_at", ("fraction", 0.75)) if tuned else None,
        keep_rules=tuned,
        **graph_arguments(request),
    )
    return Arm(request.name, graph, description=BENCH_ARMS[request.name].description)


_BUILDERS: dict[str, Callable[[ArmRequest], Arm]] = {
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
