"""How a model is called: the system prompt and tools every call carries, rendered alike."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

import keeper_middleware.model.setup as model_setup
from keeper_middleware.model.setup import ModelSetup


@tool
def lookup(city: str, day: int) -> str:
    """The weather in a city on a day."""
    return f"{city} {day}"


def test_the_tool_schemas_are_what_langchain_makes_of_each_tool() -> None:
    raw = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}
    setup = ModelSetup(system_prompt="s", tools=(lookup, raw))
    assert setup.tool_schemas == [convert_to_openai_tool(lookup), convert_to_openai_tool(raw)]


def test_each_tool_is_converted_once_however_often_a_step_counts_the_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    converted: list[object] = []

    def counting(tool_: object) -> dict[str, object]:
        converted.append(tool_)
        return convert_to_openai_tool(tool_)  # type: ignore[arg-type]

    monkeypatch.setattr(model_setup, "convert_to_openai_tool", counting)
    setup = ModelSetup(tools=(lookup,))
    for _ in range(5):
        assert setup.tool_schemas[0]["function"]["name"] == "lookup"
    assert converted == [lookup]


def test_a_caller_changing_the_list_it_was_given_leaves_the_setup_as_it_was() -> None:
    setup = ModelSetup(tools=(lookup,))
    given = setup.tool_schemas
    given.clear()
    assert setup.tool_schemas == [convert_to_openai_tool(lookup)]


def test_setups_with_the_same_prompt_and_tools_are_equal() -> None:
    assert ModelSetup("s", (lookup,)) == ModelSetup("s", (lookup,))
    assert ModelSetup("s", (lookup,)) != ModelSetup("t", (lookup,))


def test_render_puts_the_system_prompt_first_unless_the_messages_bring_their_own() -> None:
    setup = ModelSetup(system_prompt="rules")
    question = HumanMessage(content="hi")
    assert [m.content for m in setup.render([question])] == ["rules", "hi"]
    own = SystemMessage(content="mine")
    assert setup.render([own, question]) == [own, question]
