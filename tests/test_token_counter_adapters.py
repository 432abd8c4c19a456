"""``token_counter=`` takes what LangChain's ``trim_messages`` takes: a function from messages to a
count (``count_tokens_approximately``) or a chat model (its ``get_num_tokens_from_messages``),
and the keeper then sizes its window with it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.messages.utils import count_tokens_approximately
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import ArgumentTypeError, Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.tokens.adapters import ChatModelTokenCounter, MessagesTokenCounter
from keeper_middleware.tokens.counting import ApproximateTokenCounter, resolve_token_counter
from tests.test_integrations_parity import SYSTEM, TOOLS, ClerkModel, clerk, scenario, thread

MESSAGES: list[BaseMessage] = [
    SystemMessage("You are a clerk."),
    HumanMessage("Item 1. Mira recorded domo01 at 1."),
    AIMessage("Noted: domo01 is 1."),
]
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "Look a register up.", "parameters": {}},
}


class WordCountingModel(ClerkModel):
    """A chat model whose own tokenizer counts two tokens a word."""

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Any = None) -> int:
        words = sum(len(str(m.content).split()) for m in messages)
        return 2 * words + (10 * len(tools) if tools else 0)


def test_a_function_from_messages_to_a_count_is_used_as_is():
    counter = Keeper(token_counter=count_tokens_approximately).tokens
    assert isinstance(counter, MessagesTokenCounter)
    assert counter.count_messages(MESSAGES) == count_tokens_approximately(MESSAGES)
    assert counter.count_messages(MESSAGES, [TOOL]) == count_tokens_approximately(
        MESSAGES, tools=[TOOL]
    )
    # a text alone counts as the message holding it, less an empty message's overhead
    assert counter.count_text("x" * 400) == 100


def test_a_function_without_tools_counts_the_schemas_as_text():
    counter = resolve_token_counter(lambda messages: 7 * len(messages))
    assert counter.count_messages(MESSAGES) == 21
    # the schemas count as the function counts a message's text: this one ignores text
    assert counter.count_messages(MESSAGES, [TOOL]) == 21


def test_a_chat_model_counts_with_its_own_tokenizer():
    model = WordCountingModel(default="ok")
    counter = Keeper(token_counter=model).tokens
    assert isinstance(counter, ChatModelTokenCounter)
    assert counter.count_messages(MESSAGES) == model.get_num_tokens_from_messages(MESSAGES)
    assert counter.count_messages(MESSAGES, [TOOL]) == model.get_num_tokens_from_messages(
        MESSAGES, tools=[TOOL]
    )
    assert counter.count_text("one two three") == 6


def test_a_token_counter_object_and_the_names_still_work():
    mine = ApproximateTokenCounter(chars_per_token=3.0)
    assert resolve_token_counter(mine) is mine
    assert isinstance(resolve_token_counter("approximate"), ApproximateTokenCounter)


def test_anything_else_is_refused_with_the_argument_named():
    with pytest.raises(ArgumentTypeError, match=re.escape("token_counter=3.5 is a float")):
        resolve_token_counter(3.5)


def _cuts(token_counter: Any) -> int:
    agent = create_keeper_agent(
        ClerkModel(default=clerk),
        TOOLS,
        system_prompt=SYSTEM,
        config=KeeperConfig(window=4096, reply_reserve=512),
        token_counter=token_counter,
        checkpointer=InMemorySaver(),
    )
    for text in scenario(24):
        agent.invoke({"messages": [HumanMessage(text)]}, thread())
    return agent.keeper.counters("t1").cuts


def test_the_keeper_sizes_its_window_with_the_counter_it_was_given():
    """A counter that counts three times as much fills the same window sooner: more cuts."""

    def heavy(messages: list[BaseMessage], **kwargs: Any) -> int:
        return 3 * count_tokens_approximately(messages, **kwargs)

    plain = _cuts(count_tokens_approximately)
    assert plain >= 1
    assert _cuts(heavy) > plain
