"""The Responses and Messages front doors' formats, without a server: what a request reads
into (the keeper's neutral messages, with their wire items alongside), how a window message goes
to an upstream of each API, and how a reply comes back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from starlette.datastructures import Headers

from keeper_middleware.integrations.proxy.conversation.chat_request import parse_chat_request
from keeper_middleware.integrations.proxy.conversation.digests import digest_of
from keeper_middleware.integrations.proxy.conversation.form import RequestError
from keeper_middleware.integrations.proxy.conversation.params import translate_params
from keeper_middleware.integrations.proxy.conversation.wire import ToolNames, native_items
from keeper_middleware.integrations.proxy.doors.routes import (
    front_session,
)
from keeper_middleware.integrations.proxy.messages.replies import chat_from_message
from keeper_middleware.integrations.proxy.messages.requests import (
    parse_messages_request,
    render_messages,
)
from keeper_middleware.integrations.proxy.responses.replies import (
    chat_from_response,
    response_output,
)
from keeper_middleware.integrations.proxy.responses.requests import (
    parse_responses_request,
    render_responses,
)
from keeper_middleware.integrations.proxy.sessions.tenants import SessionIdError
from keeper_middleware.integrations.proxy.sessions.turns import shape_turn
from keeper_middleware.integrations.proxy.upstream.apis import ChatApi, upstream_api
from keeper_middleware.step.turns import archived_turn
from tests.client_requests import (
    CLAUDE_SESSION,
    PNG_1PX,
    claude_body,
    claude_step,
    codex_body,
    codex_step,
    user_item,
)

# ----------------------------------------------------------------------------- Responses in


def test_codex_prompt_is_the_system_prompt_and_its_steps_are_calls_and_results():
    body = codex_body(user_item("List the folder."), *codex_step(1, "ls", "a.txt"))
    request = parse_responses_request(body)
    assert request.system_prompt == (
        "You are a coding agent running in the Codex CLI.\n\n<skills_instructions>none"
        "</skills_instructions>"
    )
    kinds = [type(m).__name__ for m in request.messages]
    assert kinds == ["HumanMessage", "HumanMessage", "AIMessage", "ToolMessage"]
    call = request.messages[2]
    assert isinstance(call, AIMessage)
    assert call.tool_calls == [
        {"name": "exec_command", "args": {"cmd": "ls"}, "id": "call_1", "type": "tool_call"}
    ]
    assert call.additional_kwargs["reasoning_content"] == "Step 1."
    # the reasoning item (content: null, which the SDK's param type refuses) rides with the call
    assert native_items(call, "responses") == body["input"][4:6]
    result = request.messages[3]
    assert isinstance(result, ToolMessage) and result.tool_call_id == "call_1"
    assert result.content.endswith("Output:\na.txt")


def test_namespace_and_custom_tools_are_chat_functions_and_map_back():
    body = codex_body(user_item("go"))
    body["tools"] = [
        *body["tools"],
        {"type": "custom", "name": "apply_patch", "description": "Patch."},
    ]
    request = parse_responses_request(body)
    names = [t["function"]["name"] for t in request.tools]
    assert names == ["exec_command", "multi_agent_v1__spawn_agent", "apply_patch"]  # no web_search
    context = request.context
    assert context.names.split("multi_agent_v1__spawn_agent") == ("multi_agent_v1", "spawn_agent")
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "multi_agent_v1__spawn_agent", "arguments": '{"task": "x"}'}},
            {"id": "c2", "type": "function",
             "function": {"name": "apply_patch", "arguments": '{"input": "*** Begin"}'}},
        ],
    }  # fmt: skip
    items = response_output(message, None, context.names)
    assert items[0] | {"id": None} == {
        "id": None, "type": "function_call", "status": "completed", "call_id": "c1",
        "name": "spawn_agent", "namespace": "multi_agent_v1", "arguments": '{"task": "x"}',
    }  # fmt: skip
    assert items[1]["type"] == "custom_tool_call" and items[1]["input"] == "*** Begin"


def test_a_resent_step_has_the_fingerprint_of_the_reply_it_echoes():
    """Codex sends the items it was given back, with ``status`` and ids; the fingerprint is
    the neutral part's, so the proxy recognises its own reply and never archives it twice."""
    reply = {
        "id": "resp_1", "status": "completed", "model": "m",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Step 1."}],
             "encrypted_content": "ENC-1"},
            {"type": "function_call", "id": "fc_1", "name": "exec_command",
             "arguments": '{"cmd": "ls"}', "call_id": "call_1"},
        ],
    }  # fmt: skip
    completion = chat_from_response(reply)
    from keeper_middleware.integrations.proxy.chat_completions.replies import agent_reply
    from keeper_middleware.integrations.proxy.conversation.chat_messages import message_from_openai

    sent, _ = agent_reply(completion, None)
    echoed = parse_responses_request(codex_body(user_item("x"), *codex_step(1, "ls", "a")))
    assert digest_of(message_from_openai(sent)) == echoed.digests[2]


def test_what_the_proxy_cannot_keep_is_refused_clearly_and_unknown_fields_pass():
    for field, value in (("background", True), ("conversation", "conv_1"), ("prompt", {"id": "p"})):
        with pytest.raises(RequestError) as refused:
            parse_responses_request(codex_body(user_item("x")) | {field: value})
        assert refused.value.param == field
    reference = codex_body({"type": "item_reference", "id": "msg_1"})
    with pytest.raises(RequestError, match="keeps no items to refer to"):
        parse_responses_request(reference)
    with pytest.raises(RequestError, match="add the user's message"):
        parse_responses_request({"model": "m", "input": [codex_body()["input"][0]]})
    future = parse_responses_request(codex_body(user_item("x")) | {"brand_new_field": {"a": 1}})
    assert future.params["brand_new_field"] == {"a": 1}


def test_an_image_is_archived_as_a_placeholder_and_sent_on_untouched():
    image = {
        "type": "input_image",
        "image_url": f"data:image/png;base64,{PNG_1PX}",
        "detail": "high",
    }
    item = {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What is this?"}, image]}  # fmt: skip
    message = parse_responses_request(codex_body(item)).messages[-1]
    stored = archived_turn("s", message, None).content
    assert stored == "What is this?\n[image: image/png, 70 bytes]"
    assert PNG_1PX not in stored
    assert render_responses(message) == {"items": [item]}  # same API: as it came
    chat = ChatApi().render(message)  # a chat upstream gets it as an image_url part
    assert chat["content"][1] == {"type": "image_url",
                                  "image_url": {"url": image["image_url"], "detail": "high"}}  # fmt: skip
    blocks = render_messages(message)["content"]  # and a Messages upstream as an image block
    assert blocks[1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                     "data": PNG_1PX}}  # fmt: skip


# ----------------------------------------------------------------------------- Messages in


def test_claude_codes_system_message_joins_the_system_prompt_and_leaves_the_conversation():
    request = parse_messages_request(claude_body(first=True))
    assert request.system_prompt.endswith("# Environment\n - Primary working directory: /w")
    assert request.system_prompt.startswith("x-anthropic-billing-header")
    assert [type(m).__name__ for m in request.messages] == ["HumanMessage"]
    assert request.messages[0].content == (
        "<system-reminder>\nAttribution rules.\n</system-reminder>TASK-1: list the folder."
    )
    names = [t["function"]["name"] for t in request.tools]
    assert names == ["Bash", "Read", "DeferredToolPlaceholder"]


def test_moving_cache_marks_and_block_or_string_spelling_keep_every_fingerprint():
    """Claude Code moves its cache mark to the newest block on every request and sends its
    environment as blocks first, a string later: no resent message looks new."""
    one = parse_messages_request(claude_body(*claude_step(1, "ls", "a.txt"), first=True))
    two = parse_messages_request(
        claude_body(*claude_step(1, "ls", "a.txt"), *claude_step(2, "cat a.txt", "hello"))
    )
    assert two.digests[: len(one.digests)] == one.digests
    assert one.system_prompt == two.system_prompt
    assert "cache_control" not in json.dumps(native_items(one.messages[-1], "messages"))


def test_a_tool_result_and_text_in_one_user_message_are_a_result_then_a_user_message():
    blocks = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt", "is_error": True},
              {"type": "text", "text": "Now count them."}]  # fmt: skip
    request = parse_messages_request(claude_body({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": blocks}))  # fmt: skip
    result, text = request.messages[-2:]
    assert isinstance(result, ToolMessage) and result.content == "a.txt"
    assert isinstance(text, HumanMessage) and text.content == "Now count them."
    rendered = [render_messages(m) for m in request.messages[-3:]]
    from keeper_middleware.integrations.proxy.messages.requests import merged

    assert merged(rendered)[-1] == {"role": "user", "content": blocks}  # merged back, is_error kept


def test_thinking_signatures_go_back_verbatim_and_an_excerpted_reply_keeps_them():
    request = parse_messages_request(claude_body(*claude_step(1, "ls", "a.txt")))
    reply = request.messages[1]
    assert render_messages(reply)["content"][0] == {
        "type": "thinking", "thinking": "Step 1.", "signature": "sig-1"}  # fmt: skip
    shortened = reply.model_copy(update={"content": "[excerpt]"})  # the keeper changed its text
    blocks = render_messages(shortened)["content"]
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[0]["signature"] == "sig-1" and blocks[1]["text"] == "[excerpt]"


def test_fields_claude_code_adds_never_fail_a_request():
    body = claude_body() | {"context_management": {"edits": [{"type": "new_kind"}]},
                            "speed": "fast", "mcp_servers": []}  # fmt: skip
    body["messages"].append({"role": "user", "content": [{"type": "search_result", "source": "x",
                                                          "title": "t", "content": []}]})  # fmt: skip
    request = parse_messages_request(body)
    assert request.params["speed"] == "fast"
    assert translate_params(request.params, "messages", "messages") == request.params
    assert "speed" not in translate_params(request.params, "messages", "chat")


# ----------------------------------------------------------------------------- out to an upstream


def test_the_same_api_gets_every_item_byte_for_byte_and_store_false():
    body = codex_body(user_item("List."), *codex_step(1, "ls", "a.txt"))
    request = parse_responses_request(body)
    api = upstream_api("responses")
    turn = shape_turn("s", request, None, None, reserve=4096, api=api)
    messages = turn.setup.render(list(request.messages))
    sent = api.body(messages, turn.tools, turn.params, {"reasoning_effort": "low"},
                    api.render, request.context)  # fmt: skip
    assert sent["input"] == body["input"]
    assert sent["tools"][:3] == body["tools"] and sent["tools"][3]["name"] == "search_archive"
    assert sent["store"] is False and "reasoning.encrypted_content" in sent["include"]
    assert sent["reasoning"] == {"summary": "auto", "effort": "low"}
    assert "instructions" not in sent and "previous_response_id" not in sent


def test_a_messages_upstream_gets_the_proxys_cache_breakpoints_and_the_clients_fields():
    request = parse_messages_request(claude_body(*claude_step(1, "ls", "a.txt")))
    api = upstream_api("messages", reserve=4096)
    turn = shape_turn("s", request, None, None, reserve=4096, api=api)
    sent = api.body(turn.setup.render(list(request.messages)), turn.tools, turn.params, {},
                    api.render, request.context)  # fmt: skip
    marked = [b for b in sent["system"] if "cache_control" in b]
    assert marked == [sent["system"][-1]] and sent["system"][-1]["text"].startswith("# Environment")
    assert "cache_control" in sent["tools"][-1] and sent["tools"][-1]["name"] == "search_archive"
    assert sent["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sum(json.dumps(m).count("cache_control") for m in sent["messages"]) == 1
    assert sent["max_tokens"] == 4096  # the reserve caps the client's 32000
    assert sent["context_management"] == request.params["context_management"]
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]


def test_translation_to_chat_keeps_one_system_message_and_drops_what_chat_lacks():
    request = parse_messages_request(claude_body(*claude_step(1, "ls", "a.txt")))
    api = upstream_api("chat")
    turn = shape_turn("s", request, None, None, reserve=4096, api=api)
    sent = api.body(turn.setup.render(list(request.messages)), turn.tools, turn.params, {},
                    api.render, request.context)  # fmt: skip
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert sent["max_tokens"] == 4096
    assert "thinking" not in json.dumps(sent["messages"])
    assert set(sent) <= {"model", "max_tokens", "user", "messages", "tools", "stream"}
    assert sent["user"] == request.params["metadata"]["user_id"]


def test_settings_translate_by_meaning():
    assert translate_params({"max_output_tokens": 9, "reasoning": {"effort": "high"},
                             "tool_choice": {"type": "function", "name": "f"}, "store": False},
                            "responses", "chat") == {
        "max_tokens": 9, "reasoning_effort": "high",
        "tool_choice": {"type": "function", "function": {"name": "f"}}}  # fmt: skip
    assert translate_params({"max_tokens": 9, "stop": "END", "user": "u", "tool_choice": "required"},
                            "chat", "messages") == {
        "max_tokens": 9, "stop_sequences": ["END"], "metadata": {"user_id": "u"},
        "tool_choice": {"type": "any"}}  # fmt: skip
    assert translate_params({"stop_sequences": ["x"], "tool_choice": {"type": "tool", "name": "f"}},
                            "messages", "responses") == {
        "tool_choice": {"type": "function", "name": "f"}}  # fmt: skip


# ----------------------------------------------------------------------------- replies back


def test_a_messages_reply_reads_into_a_completion_with_its_blocks_alongside():
    reply = {"id": "msg_1", "model": "m", "stop_reason": "tool_use", "content": [
        {"type": "thinking", "thinking": "Hm.", "signature": "s"},
        {"type": "text", "text": "Listing."},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}],
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 5}}  # fmt: skip
    completion = chat_from_message(reply)
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Listing."
    assert choice["message"]["reasoning_content"] == "Hm."
    assert choice["message"]["keeper_wire"]["items"] == reply["content"]
    assert completion["usage"]["prompt_tokens"] == 100
    assert completion["usage"]["prompt_tokens_details"] == {"cached_tokens": 90}


def test_an_incomplete_response_is_a_reply_that_ran_out_of_tokens():
    reply = {"id": "r", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
             "output": []}  # fmt: skip
    assert chat_from_response(reply)["choices"][0]["finish_reason"] == "length"
    with pytest.raises(ValueError, match="status 'failed'"):
        chat_from_response({"status": "failed", "output": []})


# ----------------------------------------------------------------------------- naming


def test_a_session_is_named_by_the_clients_own_conversation_first():
    codex = parse_responses_request(codex_body(user_item("x")))
    claude = parse_messages_request(claude_body())

    def named(request: Any, require: bool = False, **headers: str) -> str:
        sent = Headers(headers={k.replace("_", "-"): v for k, v in headers.items()})
        return front_session(sent, request, require=require)

    assert named(codex, x_keeper_session="mine", session_id="t1") == "mine"
    assert named(codex, session_id="01a2-ff") == "codex-01a2-ff"
    assert named(codex) == "pck-01a23441-814c-7bc1-b9d0-0f73787eb532"
    assert named(claude, X_Claude_Code_Session_Id=CLAUDE_SESSION) == f"claude-{CLAUDE_SESSION}"
    assert named(claude) == f"claude-{CLAUDE_SESSION}"  # from metadata.user_id
    odd = named(codex, session_id="a b/c")
    assert odd.startswith("codex-") and len(odd) == 6 + 32
    plain = parse_responses_request({"model": "m", "input": "hi", "instructions": "Be brief."})
    assert named(plain).startswith("auto-") and named(plain) == named(plain)
    with pytest.raises(SessionIdError, match="serves several users per key"):
        named(plain, require=True)


def test_the_chat_door_is_unchanged_by_the_internal_model():
    request = parse_chat_request({"model": "m", "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]})  # fmt: skip
    assert request.api == "chat" and request.context is None
    turn = shape_turn("s", request, None, None, reserve=4096, api=ChatApi())
    assert turn.tools[-1] is turn.search_tool
    assert isinstance(turn.setup.render(list(request.messages))[0], SystemMessage)


def test_tool_names_without_namespaces_pass_as_they_are():
    assert ToolNames().split("exec_command") == (None, "exec_command")
    assert ToolNames.flat("ns", "f") == "ns__f"
