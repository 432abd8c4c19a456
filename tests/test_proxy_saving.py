"""What the proxy saves per request: one save with the reply, the same stored form as before,
and a failed request that keeps what it took in without counting it twice."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, message_to_dict

from keeper_middleware.integrations.proxy.sessions.records import (
    MessageMemo,
    SessionRecord,
    StoredRecord,
)
from tests.proxy_upstream import (
    ScriptedUpstream,
    chat,
    client_for,
    convo,
    make_app,
    text_reply,
)

HEADERS = {"X-Keeper-Session": "saved"}


def _window(size: int) -> tuple[BaseMessage, ...]:
    return tuple(
        (HumanMessage if n % 2 == 0 else AIMessage)(content=f"message {n} " * (n % 7), id=f"m{n}")
        for n in range(size)
    )


class _Counting:
    def __init__(self) -> None:
        self.converted: list[str] = []

    def __call__(self, message: BaseMessage) -> dict[str, Any]:
        self.converted.append(str(message.id))
        return message_to_dict(message)


def test_a_message_is_converted_once_while_it_stays_in_the_window() -> None:
    counting = _Counting()
    memo = MessageMemo(counting)
    window = _window(4)
    for _ in range(3):
        assert [memo(m) for m in window] == [message_to_dict(m) for m in window]
    assert counting.converted == ["m0", "m1", "m2", "m3"]
    edited = window[1].model_copy(update={"content": "edited"})
    assert memo(edited)["data"]["content"] == "edited"  # a changed copy is a new message
    memo.keep([window[0], edited])
    counting.converted.clear()
    memo(window[0])
    memo(window[2])
    assert counting.converted == ["m2"]  # dropped with keep(), converted again


@pytest.mark.parametrize("size", [0, 1, 5, 40])
def test_a_record_saved_through_the_memo_is_stored_exactly_as_without_it(size: int) -> None:
    memo = MessageMemo(message_to_dict)
    stored = StoredRecord(SessionRecord())
    plain = StoredRecord(SessionRecord())
    for grown in range(0, size + 1, max(1, size // 3)):
        record = SessionRecord(
            window=_window(grown), taken=tuple((f"d{n}", f"m{n}") for n in range(grown))
        )
        stored, through_memo, _ = stored.saved(record, memo)
        plain, without, _ = plain.saved(record)
        assert through_memo == without


@pytest.mark.anyio
async def test_a_failed_request_keeps_what_it_took_in_and_counts_it_once(tmp_path) -> None:
    upstream = ScriptedUpstream()
    app = make_app(upstream, tmp_path)
    proxy = app.state.proxy
    history = convo("Task: keep the ledger.", "ok", "Item 1: domo1 is 7.")
    async with client_for(app) as client:
        assert (
            await client.post("/v1/chat/completions", json=chat(history), headers=HEADERS)
        ).status_code == 200
        history += [
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "Item 2: domo2 is 9."},
        ]
        upstream.default = lambda body: httpx.ConnectError("refused")
        failed = await client.post("/v1/chat/completions", json=chat(history), headers=HEADERS)
        assert failed.status_code == 502
        after_failure = proxy.stats("default:saved").stored_bytes
        reopened = make_app(upstream, tmp_path)  # what the failed request left on disk
        assert reopened.state.proxy.record("default:saved") == proxy.record("default:saved")
        assert reopened.state.proxy.stats("default:saved").stored_bytes == after_failure
        await reopened.state.proxy.aclose()
        upstream.default = lambda body: text_reply("back")
        answered = await client.post("/v1/chat/completions", json=chat(history), headers=HEADERS)
    assert answered.json()["choices"][0]["message"]["content"] == "back"
    assert proxy.stats("default:saved").stored_bytes == after_failure + len("back")
    texts = [m.content for m in proxy.record("default:saved").window]
    assert texts.count("Item 2: domo2 is 9.") == 1
    await proxy.aclose()
