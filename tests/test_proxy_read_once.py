"""The proxy reads each upstream completion once and each reply it returns once: what it keeps
from that one reading is exactly what reading again would give (the same LangChain message,
the same fingerprint), and a reply the agent sends back as it came is confirmed with the rest of
its resent history instead of being read again. A session's model setup and system message are
made once while its prompt and tools stay the same, and render as the setup's own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from keeper_middleware.integrations.proxy.chat_completions.replies import (
    agent_reply,
    as_received,
    read_completion,
)
from keeper_middleware.integrations.proxy.conversation.chat_messages import (
    message_from_openai,
    message_to_openai,
)
from keeper_middleware.integrations.proxy.conversation.chat_request import parse_chat_request
from keeper_middleware.integrations.proxy.conversation.digests import digest_of
from keeper_middleware.integrations.proxy.sessions.setups import SessionSetups
from keeper_middleware.integrations.proxy.sessions.window_forms import WindowForms
from keeper_middleware.keeper import ModelSetup
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from tests.proxy_upstream import (
    AGENT_TOOL,
    SYSTEM,
    ScriptedUpstream,
    client_for,
    completion,
    make_app,
    text_reply,
    tool_reply,
)

call = st.builds(
    lambda n, name, arguments: {
        "id": f"call_{n}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    },
    st.integers(0, 9),
    st.sampled_from(["read_file", SEARCH_TOOL_NAME]),
    st.sampled_from(['{"path": "a"}', '{"query": "x"}', "", "not json", "[1]", '{"n": 1.5}']),
)
message = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.one_of(st.none(), st.text(max_size=12))},
    optional={
        "tool_calls": st.one_of(st.none(), st.lists(call, max_size=3)),
        "name": st.sampled_from(["helper", None]),
        "reasoning_content": st.text(max_size=5),
        "refusal": st.none(),
    },
)


@settings(max_examples=150, deadline=None)
@given(message, st.sampled_from([None, SEARCH_TOOL_NAME]), st.booleans())
def test_a_completion_read_once_gives_what_reading_it_again_gives(raw, hidden, usage):
    data = completion(raw)
    if not usage:
        data.pop("usage", None)
    done = read_completion(data)
    assert done.data is data
    assert done.said == message_from_openai({**raw, "role": "assistant"})
    reply = done.reply  # the keeper's form: the same message, with what the keeper reads
    assert reply.model_copy(
        update={"additional_kwargs": {}, "response_metadata": {}, "usage_metadata": None}
    ) == message_from_openai({**raw, "role": "assistant"})
    assert reply.response_metadata == {"finish_reason": "stop", "model_name": "upstream-model"}
    assert (reply.usage_metadata is not None) == usage
    sent, _ = agent_reply(data, hidden)
    received = as_received(done, sent)
    assert received == message_from_openai(sent)
    assert digest_of(received) == digest_of(message_from_openai(sent))


async def _two_requests(folder: Path, reply: dict[str, Any]) -> tuple[Any, list[Any]]:
    upstream = ScriptedUpstream(script=[reply, text_reply("done")])
    app = make_app(upstream, folder)
    proxy = app.state.proxy
    history: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "read the file"},
    ]
    kept = []
    async with client_for(app) as client:
        for _ in range(2):
            got = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": history, "tools": [AGENT_TOOL]},
                headers={"X-Keeper-Session": "s"},
            )
            assert got.status_code == 200, got.text
            history.append(got.json()["choices"][0]["message"])
            kept.append(proxy.resent("default:s"))
            if history[-1].get("tool_calls"):
                call_id = history[-1]["tool_calls"][0]["id"]
                history.append({"role": "tool", "tool_call_id": call_id, "content": "text"})
    await proxy.aclose()
    return history, kept


def test_a_reply_sent_back_as_it_came_is_confirmed_with_the_rest(tmp_path):
    reply = tool_reply(("call_1", "read_file", {"path": "a"}), text="looking")
    history, kept = asyncio.run(_two_requests(tmp_path, reply))
    first = kept[0]
    assert first.raw[-1] == history[2]  # the reply joined the request it answered
    whole = parse_chat_request({"messages": history[:3]}).digests_reusing(())
    assert first.pairs == whole  # the fingerprints reading it again gives
    again = parse_chat_request({"messages": history[:4]}, first)
    assert again.resent_pairs == whole  # only the tool result is read
    assert again.digests_reusing(()) == parse_chat_request(
        {"messages": history[:4]}
    ).digests_reusing(())


def test_a_reply_sent_back_changed_is_read_again(tmp_path):
    reply = tool_reply(("call_1", "read_file", {"path": "a"}), text="looking")
    history, kept = asyncio.run(_two_requests(tmp_path, reply))
    changed = [*history[:2], {**history[2], "content": "looking!"}, history[3]]
    assert parse_chat_request({"messages": changed}, kept[0]).resent_pairs == ()


def test_a_sessions_setup_and_system_message_are_made_once_and_render_as_the_setups_own():
    setups = SessionSetups()
    tools = ({"type": "function", "function": {"name": "read_file", "parameters": {}}},)
    first = setups.setup("s", "be brief", tools)
    again = setups.setup("s", "be brief", tuple(dict(t) for t in tools))
    assert again is first  # the same prompt and tools: the same setup
    window = [HumanMessage("hi", id="m1"), AIMessage("hello", id="m2")]
    rendered = setups.render("s", first, window)
    assert rendered == first.render(window)
    assert setups.render("s", first, window)[0] is rendered[0]  # one system message object
    led = [SystemMessage("own"), *window]
    assert setups.render("s", first, led) == first.render(led)
    changed = setups.setup("s", "be thorough", tools)
    assert changed is not first and setups.render("s", changed, window) == changed.render(window)
    assert setups.setup("t", None, ()).render(window) == setups.render("t", ModelSetup(), window)


def test_a_windows_forms_listed_at_once_are_the_forms_one_by_one():
    forms = WindowForms(message_to_openai)
    window = [HumanMessage(f"m{i}", id=f"m{i}") for i in range(4)]
    first = forms.many(window)
    assert first == [message_to_openai(m) for m in window]
    grown = [*window, AIMessage("reply", id="r")]
    listed = forms.many(grown)
    assert listed == [message_to_openai(m) for m in grown]
    assert all(a is b for a, b in zip(listed, first, strict=False))  # converted once
    listed.append({"role": "user", "content": "a caller's own change"})
    more = [*grown, HumanMessage("next", id="n")]
    assert forms.many(more) == [message_to_openai(m) for m in more]  # the kept list unchanged
    cut = [window[0], HumanMessage("edited", id="e"), *grown[2:]]  # not the same objects
    assert forms.many(cut) == [message_to_openai(m) for m in cut]
    assert forms.many(grown[:2]) == [message_to_openai(m) for m in grown[:2]]
