"""The keeper's arms: thin settings over ``create_keeper_agent``.

- ``notes``: in-place notes, the archive search tool, the RULES repeated next to new questions;
- ``notes_retrieval``: the same, plus the best-matching archived sentences shown at each set of
  questions (the retriever holds archived turns only: what is still in view is visible anyway);
- ``notes_rewrite``: the earlier form, where the model rewrites the whole NOTES at each cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

from keeper_middleware.agent import create_keeper_agent
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig, resolve_size
from keeper_middleware.errors import ConfigurationError
from keeper_middleware.graphs.baselines import SUMMARY_BUDGET, default_reply_reserve
from keeper_middleware.keeper import Keeper, Tool
from keeper_middleware.retrievers.base import Retriever
from keeper_middleware.tokens.counting import TokenCounter

KeeperArm = Literal["notes", "notes_retrieval", "notes_rewrite"]
COUNTER_NAMES = r"\b[a-z]{3,7}\d{2}\b"
"""The benchmark's counter names (``domain="counters"``): the names the domain checks track."""
DOMAINS = {"counters": COUNTER_NAMES}


def keeper_arm_config(
    arm: KeeperArm,
    *,
    window: int,
    reply_reserve: int | None,
    base: KeeperConfig | None = None,
    retrieved_per_question: int,
    domain: str | None = None,
    item_tools: Sequence[str] = (),
) -> KeeperConfig:
    """The arm's configuration: ``base`` (or the defaults) with the window and the arm's own
    setting (notes mode, retrieved sentences) applied. ``domain`` fills ``tracked_names`` when the
    base leaves it unset (the benchmark's runner gives none: a user's keeper knows no pattern for
    the names); without one, and without a base, the names the NOTES hold are accounted for
    (``track_noted_names``). A ``reply_reserve`` given here wins over the base's."""
    if domain is not None and domain not in DOMAINS:
        raise ConfigurationError(f"domain={domain!r}; use one of {sorted(DOMAINS)} or None")
    config = base or KeeperConfig()
    changes: dict[str, Any] = {
        "window": window,
        "notes_mode": "rewrite" if arm == "notes_rewrite" else "in_place",
        "show_retrieved": retrieved_per_question if arm == "notes_retrieval" else 0,
    }
    if config.notes_budget is None:
        # Every memory in a comparison gets one size: the NOTES take what a summary is given.
        changes["notes_budget"] = ("tokens", resolve_size(NOTES_SHARE, window, name="notes_budget"))
    if reply_reserve is not None:
        changes["reply_reserve"] = reply_reserve
    elif base is None:
        changes["reply_reserve"] = default_reply_reserve(window)
    if domain is not None and config.tracked_names is None:
        changes["tracked_names"] = DOMAINS[domain]
    elif base is None:
        # no pattern from outside: the names the NOTES hold are the ones accounted for
        changes["track_noted_names"] = True
    if item_tools:
        changes["item_tools"] = tuple(item_tools)
    return replace(config, **changes)


NOTES_SHARE = SUMMARY_BUDGET
"""Without a NOTES budget of its own in the config, a keeper arm's NOTES are given what a summary
is given: an eighth of the window (4K tokens at a 32K window). The library's own default is
smaller (10% of window - reserve: 2,867 tokens at 32K); a comparison at unequal sizes would
measure the setting, not the method."""


def notes_budget(config: KeeperConfig) -> int:
    """The tokens the keeper's NOTES may take: the config's own ``notes_budget`` when it has one
    (a size in tokens or a fraction of the budget), else an eighth of the window. A summariser
    compared with the keeper gets this many tokens, so neither memory is larger by setting."""
    own = getattr(config, "notes_budget", None)
    if own is not None:
        return resolve_size(own, config.budget, name="notes_budget")
    return resolve_size(NOTES_SHARE, config.window, name="notes_budget")


def keeper_arm_graph(
    arm: KeeperArm,
    model: BaseChatModel,
    *,
    config: KeeperConfig,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    archive: ArchiveStore | str | Path | None = None,
    retriever: Retriever | str | None = "keyword",
    token_counter: TokenCounter | str | None = None,
    checkpointer: Checkpointer = None,
) -> tuple[CompiledStateGraph[Any, Any, Any, Any], Keeper]:
    """The compiled keeper agent and its engine (whose archive holds every NOTES version)."""
    # notes_retrieval: the retriever chosen for the arm serves the passages shown next to the
    # questions; the archive search stays keyword, so swapping backends changes only the passages
    shows_passages = arm == "notes_retrieval"
    keeper = Keeper(
        config,
        archive=archive if archive is not None else ":memory:",
        retriever="keyword" if shows_passages else retriever,
        passages_retriever=retriever if shows_passages else None,
        token_counter=token_counter,
    )
    graph = create_keeper_agent(
        model,
        tools,
        system_prompt=system_prompt,
        keeper=keeper,
        checkpointer=checkpointer,
        name=arm,
    )
    return graph, keeper
