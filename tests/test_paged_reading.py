"""Reading an archived message back page by page gives every character exactly once.

Pages used to be cut at a length guessed from the whole text's density and clipped when a
dense stretch (CJK, digits, emoji) made one too big: the clipped tail was on no page (5.4K of
48K characters). Now a page that would be too big ends where it fits and the next begins there.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import keeper_kind, text_of
from keeper_middleware.step.excerpts import EXCERPT_TAG, page_count, read_page
from keeper_middleware.tokens.counting import ApproximateTokenCounter
from tests.fake_model import ScriptedChatModel

COUNT = ApproximateTokenCounter().count_text
POINTER = re.compile(r'search_archive\(read="([^"]+)", page=1\) \(pages 1 to (\d+)\)')

LIGHT = "The service warmed its cache slowly after each deploy, and nobody minded. "
DENSE = (
    "解析器缓存路由认证计费导出搜索测试失败成功文件函数变量错误修复",
    "3.14159265358979323846264338327950288419716939937510",
    "🔥✅❌🚀🐛👍🏽👨‍💻",
    "ファイルをよみこみますテストがしっぱいしました",
    "0x7f3a9c2e1b4d8f60a5c3e9b7d1f2a4c6e8b0d2f4a6c8e0b2d4f6a8c0e2b4d6f8",
)


def stretch(kind: int, repeat: int) -> str:
    return (LIGHT if kind == 0 else DENSE[(kind - 1) % len(DENSE)]) * repeat


texts = st.lists(
    st.tuples(st.integers(0, len(DENSE)), st.integers(1, 120)), min_size=1, max_size=14
).map(lambda parts: "".join(stretch(k, r) for k, r in parts))


@settings(max_examples=120, deadline=None)
@given(text=texts, page_tokens=st.integers(48, 1500))
def test_every_character_is_on_exactly_one_page_and_each_page_fits(text, page_tokens):
    pages = page_count(text, page_tokens, COUNT)
    read = [read_page(text, n, page_tokens, COUNT) for n in range(1, pages + 1)]
    assert "".join(chunk for chunk, _ in read) == text
    assert all(total == pages for _, total in read)
    assert all(COUNT(chunk) <= page_tokens or len(chunk) == 1 for chunk, _ in read)
    assert read_page(text, pages + 1, page_tokens, COUNT) == ("", pages)


def test_a_dense_48k_message_read_back_through_the_tool_is_whole():
    keeper = Keeper(KeeperConfig(window=4096, reply_reserve=512))

    def reply(messages: list[BaseMessage]) -> str:
        return "NO CHANGES" if keeper_kind(messages[-1]) == "notes_request" else "ok"

    agent = create_keeper_agent(
        ScriptedChatModel(default=reply), keeper=keeper, checkpointer=InMemorySaver()
    )
    thread = {"configurable": {"thread_id": "t1"}}
    agent.invoke({"messages": [HumanMessage("Task.")]}, thread)
    pasted = "".join(stretch(i % 6, 40 + 17 * (i % 5)) for i in range(60))[:48_000]
    out = agent.invoke({"messages": [HumanMessage(pasted)]}, thread)
    shown = next(m for m in out["messages"] if EXCERPT_TAG in text_of(m))
    ref, pages = POINTER.search(text_of(shown)).groups()
    body = ""
    for page in range(1, int(pages) + 1):
        reply_text = keeper.search("t1", read=ref, page=page)
        assert reply_text.startswith(f'[READ "{ref}"] page {page} of {pages}')
        body += reply_text.split("\n", 1)[1].rsplit("\n", 1)[0]
        assert keeper.tokens.count_text(reply_text) <= keeper.config.message_tokens
    assert body == pasted
