"""The pure parts under the proxy, without an app: history is aligned by content, not position;
a message's digest ignores how a client reserialises it (ChatOpenAI's round trip included);
withdrawing and taking in messages keep the NOTES' count of kept messages and a late edit right;
a session record survives JSON; the fallback session name depends on the opening only; a tool call
without a name is refused; and the agent's system prompt is rendered first."""

from __future__ import annotations

import json

import pytest

from keeper_middleware.integrations.proxy.chat_completions.replies import agent_reply
from keeper_middleware.integrations.proxy.conversation.chat_messages import message_from_openai
from keeper_middleware.integrations.proxy.conversation.chat_request import parse_chat_request
from keeper_middleware.integrations.proxy.conversation.digests import digest_of
from keeper_middleware.integrations.proxy.conversation.form import ChatRequest, RequestError
from keeper_middleware.integrations.proxy.sessions.history import align, take_in, withdraw
from keeper_middleware.integrations.proxy.sessions.records import SessionRecord
from keeper_middleware.integrations.proxy.sessions.tenants import fallback_session
from keeper_middleware.keeper import ModelSetup
from keeper_middleware.messages.facts import keeper_message
from keeper_middleware.notes.block import Notes, parse_notes, render_notes
from tests.proxy_upstream import SYSTEM, chat, convo, tool_reply

pytestmark = pytest.mark.anyio


# ----------------------------------------------------------------------------- pure parts


def NOTHING_ARCHIVED(ids: set[str]) -> set[str]:  # noqa: N802
    return set()


def test_alignment_is_by_content_not_position():
    assert align(["a", "b"], ["a", "b", "c"]) == [(0, 0), (1, 1)]  # continuing
    assert align(["a", "b", "c"], ["b", "c", "d"]) == [(1, 0), (2, 1)]  # front trimmed
    assert align(["a", "b", "c"], ["a", "x", "c"]) == [(0, 0), (2, 2)]  # edited in place
    assert align(["a", "b"], ["a"]) == [(0, 0)]  # regenerated
    assert align([], ["a"]) == [] and align(["a"], ["z"]) == []  # new, or foreign


def test_digest_ignores_how_clients_reserialise_a_reply():
    ours = message_from_openai(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'},
                }
            ],
        }
    )
    theirs = message_from_openai(
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "hm",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a":2,"b":1}'},
                }
            ],
        }
    )
    assert digest_of(ours) == digest_of(theirs)
    other = message_from_openai({"role": "user", "content": ""})
    assert digest_of(ours) != digest_of(other)


def test_a_reply_sent_back_by_chat_openai_is_recognised():
    from langchain_openai.chat_models.base import _convert_dict_to_message, _convert_message_to_dict

    data = tool_reply(("call_9", "read_file", {"path": "a.txt", "n": 2}), text=None)
    ours, _ = agent_reply(data, "search_archive")
    resent = _convert_message_to_dict(_convert_dict_to_message(ours))
    assert digest_of(message_from_openai(resent)) == digest_of(message_from_openai(ours))


def test_withdrawing_inside_the_kept_messages_lowers_the_notes_count():
    counter = iter(range(100))

    def new_id() -> str:
        return f"m{next(counter)}"

    notes = keeper_message(render_notes(Notes(), kept=2), "notes", msg_id="notes-1")
    task = message_from_openai({"role": "user", "content": "Task"}).model_copy(update={"id": "t"})
    kept = [
        message_from_openai({"role": "user", "content": f"k{i}"}).model_copy(update={"id": f"k{i}"})
        for i in range(2)
    ]
    window = (task, notes, *kept)
    trimmed = withdraw(window, {"k1"})
    assert [m.id for m in trimmed] == ["t", "notes-1", "k0"]
    assert parse_notes(trimmed[1].content)[1] == 1
    assert withdraw(window, {"t"}) == window  # the pinned head stays once NOTES exist
    record = SessionRecord(window=window, taken=(("d-task", "t"), ("d-k0", "k0"), ("d-k1", "k1")))
    fresh = message_from_openai({"role": "user", "content": "k1 edited"})
    intake = take_in(
        record,
        [task, kept[0], fresh],
        ["d-task", "d-k0", digest_of(fresh)],
        new_id,
        NOTHING_ARCHIVED,
    )
    assert intake.withdrawn == 1 and intake.new == 1
    assert [m.content for m in intake.record.window][-2:] == ["k0", "k1 edited"]


def test_withdrawing_a_message_that_precedes_a_late_edit_keeps_the_edit_once():
    ids = iter(f"n{i}" for i in range(100))
    msgs = [
        message_from_openai({"role": "user", "content": f"m{i}"}).model_copy(update={"id": f"m{i}"})
        for i in range(4)
    ]
    notes = keeper_message(render_notes(Notes()), "notes", msg_id="notes-1")
    # m0 archived (its edit e0 sits at the end of the window); m1..m3 in view
    edit = msgs[0].model_copy(update={"id": "e0", "content": "m0 edited"})
    window = (notes, msgs[1], msgs[2], msgs[3], edit)
    record = SessionRecord(
        window=window, taken=(("d-e0", "e0"), ("d1", "m1"), ("d2", "m2"), ("d3", "m3"))
    )
    again = [edit, msgs[1]]  # the agent drops m2 and m3
    intake = take_in(record, again, ["d-e0", "d1"], lambda: next(ids), NOTHING_ARCHIVED)
    contents = [m.content for m in intake.record.window]
    assert contents.count("m0 edited") == 1 and "m2" not in contents
    assert [d for d, _ in intake.record.taken] == ["d-e0", "d1"]


def test_session_record_survives_json():
    request: ChatRequest = parse_chat_request(chat(convo("Hi", "Hello", "More?")))
    record = take_in(
        SessionRecord(), request.messages, request.digests, lambda: "x", NOTHING_ARCHIVED
    ).record
    record = SessionRecord(
        window=record.window,
        keeper_state={"seen": []},
        taken=tuple((d, f"id{i}") for i, (d, _) in enumerate(record.taken)),
    )
    again = SessionRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again == record


def test_fallback_session_depends_on_system_and_first_user_message():
    a = parse_chat_request(chat(convo("Task", "ok", "more")))
    b = parse_chat_request(chat(convo("Task")))
    c = parse_chat_request(
        chat([{"role": "system", "content": "other"}, {"role": "user", "content": "Task"}])
    )
    assert fallback_session(a.system_prompt, a.messages) == fallback_session(
        b.system_prompt, b.messages
    )
    assert fallback_session(a.system_prompt, a.messages) != fallback_session(
        c.system_prompt, c.messages
    )


def test_parse_rejects_a_tool_call_without_a_name():
    with pytest.raises(RequestError, match=r"function\.name"):
        parse_chat_request(
            chat(
                [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"id": "c"}]},
                ]
            )
        )


def test_model_setup_renders_the_agent_system_prompt():
    request = parse_chat_request(chat(convo("Hi")))
    setup = ModelSetup(system_prompt=request.system_prompt)
    assert setup.render(list(request.messages))[0].content == SYSTEM
