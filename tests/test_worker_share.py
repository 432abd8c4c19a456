"""What a proxy request's worker jobs keep instead of working out again stays exactly right."""

from __future__ import annotations

import json
from dataclasses import replace

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, message_to_dict

from keeper_middleware import KeeperConfig
from keeper_middleware.archive.json_text import dict_text, list_text, value_text
from keeper_middleware.config import resolve_size
from keeper_middleware.integrations.proxy.sessions.records import MessageMemo
from keeper_middleware.messages.memo import SameMessageMemo


def test_config_sizes_follow_a_replaced_window() -> None:
    config = KeeperConfig(window=32_768)
    wider = replace(config, window=65_536)
    for made in (config, wider):
        assert made.budget == made.window - made.reserve
        assert made.notes_threshold == resolve_size(made.notes_at, made.budget, name="notes_at")
        assert made.message_tokens == resolve_size(made.message_limit, made.budget, name="m")
    assert wider.budget > config.budget
    assert wider.notes_tokens >= config.notes_tokens


def test_a_memo_of_same_objects_answers_by_the_object_alone() -> None:
    memo: SameMessageMemo[int] = SameMessageMemo(same_objects=True)
    message = HumanMessage("what is due?", id="m1")
    memo.put(message, 7)
    assert memo.get(message) == 7
    assert memo.get(HumanMessage("what is due?", id="m1")) is None  # another object


def test_a_memo_by_default_sees_a_message_changed_in_place() -> None:
    memo: SameMessageMemo[int] = SameMessageMemo()
    message = AIMessage("", tool_calls=[{"name": "read", "args": {"path": "a"}, "id": "c1"}])
    memo.put(message, 3)
    assert memo.get(message) == 3
    message.tool_calls[0]["args"]["path"] = "b"
    assert memo.get(message) is None


def test_texts_of_many_messages_are_their_texts_one_by_one() -> None:
    memo = MessageMemo(message_to_dict)
    window = [
        HumanMessage("héllo", id="u1"),
        AIMessage("", tool_calls=[{"name": "ls", "args": {"dir": "ü"}, "id": "c1"}], id="a1"),
        ToolMessage("done", tool_call_id="c1", id="t1"),
    ]
    first = memo.text(window[1])  # one made before, the others not yet
    texts = memo.texts(window)
    assert texts == [value_text(message_to_dict(m)) for m in window]
    assert texts[1] is first
    assert memo.texts(window) == texts  # all made now: read as they are
    assert json.loads(list_text(texts)) == [message_to_dict(m) for m in window]


def test_a_mapping_written_from_its_values_texts_is_what_the_store_writes() -> None:
    values = {"taken": [["d", "i"]], 'we"ird\nkéy': {"a": 1}, "": None}
    texts = {key: value_text(value) for key, value in values.items()}
    assert dict_text(texts) == value_text(values)
    assert json.loads(dict_text(texts)) == values
