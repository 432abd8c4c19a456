"""Every entry point takes ``keeper=Keeper(...)`` or ``keeper=KeeperConfig(...)``, with one clash
check: a keeper and the arguments that would make another are refused together."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from keeper_middleware import ConfigurationError, Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.integrations.langchain import KeeperMiddleware, keeper_pre_model_hook
from keeper_middleware.node import KeeperNode, keeper_node
from keeper_middleware.testing import ScriptedChatModel


def model() -> ScriptedChatModel:
    return ScriptedChatModel(default="ok")


def engine_of(built: Any) -> Keeper:
    return built.keeper if hasattr(built, "keeper") else built.node.keeper


ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "create_keeper_agent": lambda **kw: create_keeper_agent(model(), **kw),
    "KeeperMiddleware": lambda **kw: KeeperMiddleware(model(), **kw),
    "keeper_pre_model_hook": lambda **kw: keeper_pre_model_hook(model(), **kw),
    "KeeperNode": lambda **kw: KeeperNode(kw.pop("keeper"), model=model(), **kw),
    "keeper_node": lambda **kw: keeper_node(kw.pop("keeper"), model=model(), **kw),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_takes_a_keeper_or_a_config(entry):
    config = KeeperConfig(window=8_192)
    from_config = engine_of(ENTRY_POINTS[entry](keeper=config))
    assert isinstance(from_config, Keeper) and from_config.config is config
    shared = Keeper(KeeperConfig(window=16_384))
    assert engine_of(ENTRY_POINTS[entry](keeper=shared)) is shared


@pytest.mark.parametrize(
    "entry", ["create_keeper_agent", "KeeperMiddleware", "keeper_pre_model_hook"]
)
def test_a_keeper_with_the_arguments_of_another_is_refused_in_one_way(entry):
    with pytest.raises(ConfigurationError, match="keeper= was given together with config="):
        ENTRY_POINTS[entry](keeper=Keeper(), config=KeeperConfig())
    with pytest.raises(ConfigurationError, match="keeper= is a KeeperConfig and config="):
        ENTRY_POINTS[entry](keeper=KeeperConfig(), config=KeeperConfig())


@pytest.mark.parametrize("entry", ["KeeperNode", "keeper_node"])
def test_the_node_refuses_anything_else_naming_both_forms(entry):
    with pytest.raises(ConfigurationError, match=r"Keeper\(\.\.\.\) or a KeeperConfig"):
        ENTRY_POINTS[entry](keeper="keeper.sqlite")
