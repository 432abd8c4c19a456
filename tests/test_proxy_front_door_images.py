"""Images at the Responses and Messages front doors, through the whole proxy: the upstream gets
the picture's bytes as the client sent them (an ``image_url`` data URL for a Chat Completions
upstream), and once the turn leaves the window the archive holds a placeholder naming its type
and size, never the bytes; the turn is archived once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.client_requests import PNG_1PX
from tests.proxy_upstream import ScriptedUpstream, client_for, make_app, story, text_reply

pytestmark = pytest.mark.anyio
DATA_URL = f"data:image/png;base64,{PNG_1PX}"
PLACEHOLDER = "[image: image/png, 70 bytes]"


def responses_history(turns: int) -> list[dict[str, Any]]:
    first = {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                         {"type": "input_image", "image_url": DATA_URL}]}  # fmt: skip
    history: list[dict[str, Any]] = [first]
    for i in range(1, turns + 1):
        history += [{"role": "assistant", "content": f"Seen {i}."},
                    {"role": "user", "content": story(i)}]  # fmt: skip
    return history


def messages_history(turns: int) -> list[dict[str, Any]]:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG_1PX}}  # fmt: skip
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
    ]
    for i in range(1, turns + 1):
        history += [{"role": "assistant", "content": f"Seen {i}."},
                    {"role": "user", "content": story(i)}]  # fmt: skip
    return history


@pytest.mark.parametrize("door", ["responses", "messages"])
async def test_an_image_reaches_the_upstream_whole_and_is_archived_as_a_placeholder(tmp_path, door):
    upstream = ScriptedUpstream(default=lambda body: text_reply("Seen."))
    app = make_app(upstream, tmp_path, window=2048)
    proxy = app.state.proxy
    headers = {"x-keeper-session": "pictures"}
    async with client_for(app) as client:
        for turns in range(14):
            if door == "responses":
                body = {"model": "m", "instructions": "Look closely.",
                        "input": responses_history(turns)}  # fmt: skip
            else:
                body = {"model": "m", "max_tokens": 256, "system": "Look closely.",
                        "messages": messages_history(turns)}  # fmt: skip
            got = await client.post(f"/v1/{door}", json=body, headers=headers)
            assert got.status_code == 200, got.text
    first = upstream.work_calls[0]["messages"][1]["content"]
    images = [part["image_url"]["url"] for part in first if part["type"] == "image_url"]
    assert images == [DATA_URL]  # the bytes, as the client sent them
    assert proxy.keeper.counters("default:pictures").cuts >= 1
    turns = list(proxy.keeper.archive.turns("default:pictures"))
    pictured = [t for t in turns if "What is this?" in t.content]
    assert [t.content for t in pictured] == [f"What is this?\n{PLACEHOLDER}"]
    assert not any(PNG_1PX in t.content for t in turns)
    await proxy.aclose()
