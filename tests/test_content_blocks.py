"""Content blocks reach the archive whole: text word for word, tool calls and results and JSON
as text, an image or a file as a placeholder naming what it was; all of it searchable.

List content used to keep only its text parts: a JSON tool result, an Anthropic-style
``tool_use`` or ``tool_result`` block and an image were missing from the archive and from search.
"""

from __future__ import annotations

import base64

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.blocks import block_as_text, content_as_text
from keeper_middleware.messages.facts import keeper_kind, text_of
from tests.fake_model import ScriptedChatModel

THREAD = {"configurable": {"thread_id": "t1"}}
PNG = base64.b64encode(b"\x89PNG" + bytes(range(256)) * 40).decode()
PDF = "data:application/pdf;base64," + base64.b64encode(b"%PDF-1.7 " * 500).decode()


def test_text_blocks_stay_word_for_word_and_join_as_they_did():
    assert content_as_text(["a", {"type": "text", "text": "b"}, "c"]) == "abc"
    assert content_as_text("plain") == "plain"
    assert content_as_text([{"type": "reasoning", "reasoning": "hidden"}, "shown"]) == "shown"


def test_every_other_block_is_text_of_its_own():
    rendered = content_as_text(
        [
            "Here is the result:",
            {"type": "json", "json": {"ticket": "ABC-123", "status": "failed"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}},
            {"type": "image", "url": "https://example.org/dog.png", "alt": "a dog asleep"},
            {"type": "file", "file": {"filename": "report.pdf", "file_data": PDF}},
            {
                "type": "document",
                "title": "Runbook",
                "source": {"type": "text", "media_type": "text/plain", "data": "Restart X."},
            },
            "Done.",
        ]
    )
    lines = rendered.split("\n")
    assert lines[0] == "Here is the result:"
    assert lines[1] == '{"ticket": "ABC-123", "status": "failed"}'
    assert lines[2] == f"[image: image/png, {len(base64.b64decode(PNG)):,} bytes]"
    assert lines[3] == "[image: https://example.org/cat.png]"
    assert lines[4] == '[image: alt "a dog asleep", https://example.org/dog.png]'
    assert lines[5] == '[file: application/pdf, 4,500 bytes, filename "report.pdf"]'
    assert lines[6:] == ['[document "Runbook"]', "Restart X.", "Done."]
    assert PNG[:40] not in rendered  # the bytes themselves are not kept


def test_anthropic_tool_use_and_tool_result_blocks_read_as_what_they_were():
    use = {"type": "tool_use", "id": "toolu_7", "name": "lookup", "input": {"key": "ABC-123"}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_7",
        "content": [{"type": "text", "text": "ABC-123 is closed."}],
        "is_error": False,
    }
    assert block_as_text(use) == '[tool_use lookup id=toolu_7] {"key": "ABC-123"}'
    assert block_as_text(result) == "[tool_result for=toolu_7]\nABC-123 is closed."
    failed = {**result, "is_error": True, "content": "timeout"}
    assert block_as_text(failed) == "[tool_result for=toolu_7, error]\ntimeout"


@tool
def lookup(key: str) -> list[dict]:
    """Look a ticket up."""
    return [
        {"type": "text", "text": f"Ticket {key}:"},
        {"type": "json", "json": {"ticket": key, "owner": "Wren Okafor", "state": "blocked"}},
    ]


def test_every_block_is_archived_and_searchable_through_an_agent():
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512, notes_every_items=2))

    def reply(messages: list[BaseMessage]):
        if keeper_kind(messages[-1]) in ("notes_request", "notes_reask"):
            return "NO CHANGES"
        last = messages[-1]
        if isinstance(last, HumanMessage) and "ticket" in text_of(last):
            return AIMessage(
                [
                    {"type": "text", "text": "Looking it up."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "lookup",
                        "input": {"key": "QX-9"},
                    },
                ],
                tool_calls=[{"name": "lookup", "args": {"key": "QX-9"}, "id": "toolu_1"}],
            )
        return "ok"

    model = ScriptedChatModel(default=reply)
    agent = create_keeper_agent(model, [lookup], keeper=keeper, checkpointer=InMemorySaver())
    agent.invoke({"messages": [HumanMessage("Task: track tickets.")]}, THREAD)
    agent.invoke({"messages": [HumanMessage("Item 1. Check the ticket QX-9.")]}, THREAD)
    photo = HumanMessage(
        [
            {"type": "text", "text": "Item 2. The whiteboard:"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/jpeg", "data": PNG},
                "alt": "whiteboard with the release plan",
            },
        ]
    )
    agent.invoke({"messages": [photo]}, THREAD)
    pasted = HumanMessage(
        [
            {"type": "text", "text": "Item 3. From the other tool:"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_0",
                "content": [{"type": "text", "text": "Zephyr cache hit rate 93 percent"}],
            },
        ]
    )
    agent.invoke({"messages": [pasted]}, THREAD)
    for n in range(4, 9):
        agent.invoke({"messages": [HumanMessage(f"Item {n}. More work.")]}, THREAD)
    assert keeper.counters("t1").cuts >= 2
    archived = {t.msg_id: t for t in keeper.archive.turns("t1")}
    texts = "\n".join(t.content for t in archived.values())
    assert '[tool_use lookup id=toolu_1] {"key": "QX-9"}' in texts
    assert '"owner": "Wren Okafor"' in texts
    assert '[image: image/jpeg, 10,244 bytes, alt "whiteboard with the release plan"]' in texts
    assert "[tool_result for=toolu_0]\nZephyr cache hit rate 93 percent" in texts
    for query in ("Wren Okafor", "whiteboard release plan", "Zephyr cache"):
        hits = keeper.retriever.search(query, session="t1", k=3)
        assert hits, f"{query!r} is not searchable"
    result = next(t for t in archived.values() if t.role == "tool")
    assert result.content.startswith("Ticket QX-9:\n{")


def test_a_tool_result_of_json_blocks_too_big_for_view_is_excerpted_not_kept_whole():
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512))
    rows = [{"type": "json", "json": {"row": i, "value": f"v{i:05d}"}} for i in range(3000)]
    call = AIMessage("", tool_calls=[{"name": "dump", "args": {}, "id": "d1"}], id="a1")
    messages = [
        HumanMessage("Task.", id="h0"),
        call,
        ToolMessage(rows, tool_call_id="d1", name="dump", id="t1"),
    ]
    from keeper_middleware import ModelSetup

    result = keeper.step("s", messages, None, ModelSetup(), lambda m, k: AIMessage("NO CHANGES"))
    shown = next(m for m in result.messages if isinstance(m, ToolMessage))
    assert keeper.tokens.count_messages([shown]) <= keeper.config.message_tokens
    (whole,) = [t for t in keeper.archive.turns("s") if t.msg_id == "t1"]
    assert whole.content == content_as_text(rows)
