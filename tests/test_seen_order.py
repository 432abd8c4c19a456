"""The keeper state lists the ids it took in in the order it took them in, so a store can save
what was appended to it instead of the whole list (its order used to move with a set's)."""

from __future__ import annotations

import itertools
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_middleware import Keeper, KeeperConfig, ModelSetup
from keeper_middleware.step.arrivals import ordered_seen

SETUP = ModelSetup(system_prompt="Keep a tally.")


def _note_call(messages: list[BaseMessage], kwargs: Any) -> AIMessage:
    return AIMessage(content="NO CHANGES")


def test_each_step_appends_the_ids_it_took_in_after_those_it_held() -> None:
    keeper = Keeper(KeeperConfig(window=32_768))
    messages: list[BaseMessage] = [HumanMessage("Tally every counter.", id="task")]
    state: dict[str, Any] | None = None
    lists = []
    for number in range(1, 40):
        messages += [HumanMessage(f"Item {number}: alpha.", id=f"z{number}-in")]
        messages += [AIMessage(f"Noted {number}.", id=f"a{number}-out")]
        result = keeper.step("s", messages, state, SETUP, _note_call)
        messages, state = list(result.messages), result.state
        lists.append((result.cut, list(state["seen"])))
    assert lists[-1][1] == [str(m.id) for m in messages]
    pairs = [(a, b) for (_, a), (cut, b) in itertools.pairwise(lists) if not cut]
    assert len(pairs) > 30
    for shorter, longer in pairs:
        assert longer[: len(shorter)] == shorter
    keeper.close()


def test_ids_no_longer_in_view_leave_and_the_order_stays() -> None:
    before = ["a", "b", "c"]
    assert ordered_seen(
        before, {"a", "b", "c", "e", "d"}, ["a", "b", "c", "d", "e"], set("abcde")
    ) == [*"abcde"]
    assert ordered_seen(before, {"a", "b", "c", "d"}, ["a", "c", "d"], {"a", "c", "d"}) == [
        "a",
        "c",
        "d",
    ]
