"""A note reply too long to send back beside its re-ask: the re-ask goes without it.

The dialogue used to give up when the re-ask did not fit after a huge reply: a reply with no
change line (an essay) then left the NOTES unchanged, and the rule the turns stated was lost
at the cut. Now the re-ask is sent without that reply, and a rule named in any reply is kept.
"""

from __future__ import annotations

from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.notes.dialogue import REPLY_LEFT_OUT
from tests.fake_model import ScriptedChatModel

THREAD = {"configurable": {"thread_id": "t1"}}
RULE = "Always report figures in euros."
ESSAY = "\n".join(f"Paragraph {i}: the turns describe the ledger at length." for i in range(400))


def run(first_reply: str, second_reply: str) -> tuple[Keeper, list[list[BaseMessage]]]:
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512, notes_every_items=2))
    replies = [first_reply, second_reply]
    reasks: list[list[BaseMessage]] = []

    def reply(messages: list[BaseMessage]) -> str:
        kind = keeper_kind(messages[-1])
        if kind == "notes_reask":
            reasks.append(messages)
        if kind in ("notes_request", "notes_reask"):
            return replies.pop(0) if replies else "NO CHANGES"
        return "ok"

    model = ScriptedChatModel(default=reply)
    agent = create_keeper_agent(model, keeper=keeper, checkpointer=InMemorySaver())
    agent.invoke({"messages": [HumanMessage(f"Task: keep the ledger. {RULE}")]}, THREAD)
    agent.invoke({"messages": [HumanMessage("Item 1. k1 is 2 and k2 is 2.")]}, THREAD)
    agent.invoke({"messages": [HumanMessage("Item 2. Nothing else.")]}, THREAD)
    for received in model.received:
        size = keeper.tokens.count_messages(received.messages)
        assert size <= keeper.config.budget, f"a request of {size} tokens went out"
    return keeper, reasks


def test_an_essay_too_long_to_send_back_is_left_out_of_the_reask_and_the_rule_is_kept():
    keeper, reasks = run(ESSAY, f"RULE: {RULE}")
    assert len(reasks) == 1
    assert REPLY_LEFT_OUT in text_of(reasks[0][-1])
    assert all(ESSAY[:200] not in text_of(m) for m in reasks[0])
    assert RULE in keeper.notes("t1").rules


def test_a_rule_in_a_huge_first_reply_is_kept_when_the_reask_leaves_it_out():
    huge = "\n".join([f"RULE: {RULE}", "SET k1 = 5 (= 2 + 2)", *ESSAY.split("\n")])
    keeper, reasks = run(huge, "SET k1 = 2")
    assert reasks and REPLY_LEFT_OUT in text_of(reasks[0][-1])
    notes = keeper.notes("t1")
    assert RULE in notes.rules
    assert dict(notes.state).get("k1") == "2"
