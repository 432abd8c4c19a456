"""The keeper proxy over real sockets: uvicorn on 127.0.0.1, driven by the official ``openai``
client and by ``langchain_openai.ChatOpenAI``, in front of a scripted upstream (and the simulated
reader's server) that also listens on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keeper_bench.reader.server import serve_reader
from keeper_middleware.integrations.proxy import create_proxy_app
from keeper_middleware.integrations.proxy.cli import main, serve_in_thread
from keeper_middleware.startup import SERVER_YOUNG_THRESHOLD
from tests.proxy_upstream import (
    FAST_RETRY,
    SYSTEM,
    ScriptedUpstream,
    story,
    text_reply,
    tool_reply,
)

serve = serve_in_thread


def upstream_app(upstream: ScriptedUpstream) -> Starlette:
    async def chat(request: Request) -> Response:
        answer = upstream.answer(json.loads(await request.body()))
        kind = answer.headers.get("content-type", "application/json")
        return Response(answer.content, status_code=answer.status_code, media_type=kind)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "upstream-model"}]})

    return Starlette(
        routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)]
    )


@contextmanager
def proxy_over(upstream: ScriptedUpstream, folder: Path, **options: Any) -> Iterator[str]:
    options.setdefault("window", 32_768)
    with serve(upstream_app(upstream)) as upstream_url:
        app = create_proxy_app(upstream_url, archive_dir=folder, retry=FAST_RETRY, **options)
        with serve(app) as url:
            yield url


@pytest.fixture
def upstream() -> ScriptedUpstream:
    return ScriptedUpstream()


def test_openai_client_streaming_and_not(upstream, tmp_path):
    upstream.script = [text_reply("Plain answer."), text_reply("Streamed answer.")]
    with proxy_over(upstream, tmp_path) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
        messages: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Hi"},
        ]
        plain = client.chat.completions.create(model="m", messages=messages)
        assert plain.choices[0].message.content == "Plain answer."
        assert plain.usage is not None and plain.usage.prompt_tokens == 100
        messages += [
            {"role": "assistant", "content": "Plain answer."},
            {"role": "user", "content": "Again"},
        ]
        chunks = list(
            client.chat.completions.create(
                model="m", messages=messages, stream=True, stream_options={"include_usage": True}
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Streamed answer."
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 105
        assert [m["content"] for m in upstream.requests[1]["messages"]] == [
            SYSTEM,
            "Hi",
            "Plain answer.",
            "Again",
        ]
        models = client.models.list()
        assert [m.id for m in models.data] == ["upstream-model"]


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return "hi"


@pytest.mark.parametrize("streaming", [False, True])
def test_chat_openai_with_tools_and_usage(upstream, tmp_path, streaming):
    upstream.script = [
        tool_reply(("call_1", "read_file", {"path": "a.txt"})),
        text_reply("It says hi."),
    ]
    with proxy_over(upstream, tmp_path) as url:
        model = ChatOpenAI(
            model="agent-model",
            base_url=url,
            api_key="unused",
            stream_usage=True,
            max_retries=0,
            timeout=30,
        )
        bound = model.bind_tools([read_file])
        history: list[Any] = [SystemMessage(SYSTEM), HumanMessage("Read a.txt")]

        def ask() -> AIMessage:
            if not streaming:
                return bound.invoke(history)
            merged = None
            for chunk in bound.stream(history):
                merged = chunk if merged is None else merged + chunk
            assert merged is not None
            return AIMessage(
                content=merged.content,
                tool_calls=merged.tool_calls,
                usage_metadata=merged.usage_metadata,
            )

        first = ask()
        assert first.tool_calls[0]["name"] == "read_file"
        assert first.tool_calls[0]["args"] == {"path": "a.txt"}
        assert first.usage_metadata is not None and first.usage_metadata["input_tokens"] == 100
        history += [first, ToolMessage("hi", tool_call_id=first.tool_calls[0]["id"])]
        second = ask()
        assert second.content == "It says hi."
    sent = upstream.requests[1]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert [t["function"]["name"] for t in sent["tools"]] == ["read_file", "search_archive"]
    assert len(upstream.requests) == 2


def test_many_concurrent_sessions_do_not_cross_talk(upstream, tmp_path):
    def echo(body: dict[str, Any]) -> dict[str, Any]:
        names = sorted(set(re.findall(r"secret-\d+", json.dumps(body["messages"]))))
        return text_reply("seen: " + " ".join(names))

    upstream.default = echo
    sessions, turns = 32, 6
    filler = " The rain kept on." * 45

    async def one(client: openai.AsyncOpenAI, n: int) -> None:
        messages: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task of secret-{n}."},
        ]
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Item {turn + 1}: secret-{n}.{filler}"})
            reply = await client.chat.completions.create(
                model="m", messages=messages, extra_headers={"X-Keeper-Session": f"s{n}"}
            )
            content = reply.choices[0].message.content
            assert content == f"seen: secret-{n}", content
            messages.append({"role": "assistant", "content": content})

    async def run(url: str) -> None:
        async with openai.AsyncOpenAI(
            base_url=url, api_key="x", max_retries=0, timeout=60
        ) as client:
            await asyncio.gather(*(one(client, n) for n in range(sessions)))

    with serve(upstream_app(upstream)) as upstream_url:
        app = create_proxy_app(upstream_url, window=2048, archive_dir=tmp_path, retry=FAST_RETRY)
        with serve(app, lifespan="off") as url:  # kept open to read the archive below
            asyncio.run(run(url))
    keeper = app.state.proxy.keeper
    assert len(upstream.work_calls) == sessions * turns
    assert sum(keeper.counters(f"default:s{n}").cuts for n in range(sessions)) >= sessions
    for n in range(sessions):
        archived = " ".join(t.content for t in keeper.archive.turns(f"default:s{n}"))
        assert set(re.findall(r"secret-\d+", archived)) == {f"secret-{n}"}
    keeper.close()


def test_a_killed_proxy_restarted_on_the_same_folder_continues(upstream, tmp_path):
    with serve(upstream_app(upstream)) as upstream_url:
        messages: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Task: keep the ledger."},
        ]

        def talk(url: str, items: range) -> None:
            client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
            for i in items:
                messages.append({"role": "user", "content": story(i)})
                reply = client.chat.completions.create(
                    model="m", messages=messages, extra_headers={"X-Keeper-Session": "long"}
                )
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})

        first = create_proxy_app(upstream_url, window=2048, archive_dir=tmp_path, retry=FAST_RETRY)
        with serve(first, lifespan="off") as url:  # no shutdown hook runs: as if killed
            talk(url, range(1, 9))
        cuts = first.state.proxy.keeper.counters("default:long").cuts
        assert cuts >= 1
        second = create_proxy_app(upstream_url, window=2048, archive_dir=tmp_path, retry=FAST_RETRY)
        with serve(second) as url:
            talk(url, range(9, 13))
            report = httpx.get(url.removesuffix("/v1") + "/keeper/sessions/long", timeout=10).json()
    assert report["agent_messages"] == len(messages) - 1
    assert report["counters"]["cuts"] > cuts
    sent = json.dumps(upstream.work_calls[-1]["messages"])
    assert sent.count('"Item 12: ') == 1 and '"Item 1: ' not in sent
    assert "Task: keep the ledger." in sent


def test_through_the_simulated_reader_server(tmp_path):
    with serve_reader() as reader_url:
        app = create_proxy_app(reader_url, window=2048, archive_dir=tmp_path, retry=FAST_RETRY)
        with serve(app) as url:
            model = ChatOpenAI(
                model="simulated-reader",
                base_url=url,
                api_key="x",
                stream_usage=True,
                max_retries=0,
                timeout=30,
            )
            history: list[Any] = [SystemMessage(SYSTEM), HumanMessage("Task: keep the ledger.")]
            for i in range(1, 13):
                history.append(HumanMessage(story(i)))
                reply = model.invoke(history, extra_headers={"X-Keeper-Session": "reader"})
                assert isinstance(reply, AIMessage)
                history.append(reply)
        keeper = app.state.proxy.keeper
        assert keeper.counters("default:reader").cuts >= 1
        assert keeper.counters("default:reader").notes_calls >= 1
        assert keeper.counters("default:reader").cached_tokens > 0


def test_the_command_line_refuses_a_bad_setting_with_a_message(capsys, tmp_path):
    code = main(
        ["--upstream", "http://127.0.0.1:1/v1", "--window", "100", "--archive-dir", str(tmp_path)]
    )
    assert code == 2
    assert "window=100 is too small" in capsys.readouterr().err


def test_an_upstream_without_its_scheme_is_refused_at_start_up(capsys, tmp_path):
    code = main(
        ["--upstream", "localhost:8011", "--window", "32768", "--archive-dir", str(tmp_path)]
    )
    assert code == 2
    assert "add http://" in capsys.readouterr().err


def test_the_server_starts_with_its_start_up_objects_out_of_the_collectors_sight(
    monkeypatch, tmp_path
):
    import gc

    import uvicorn

    seen: dict[str, int] = {}

    def run(app, **_options):  # the server itself is not started: only what precedes it
        seen["frozen"] = gc.get_freeze_count()
        seen["tracked"] = len(gc.get_objects())
        seen["young"] = gc.get_threshold()[0]

    monkeypatch.setattr(uvicorn, "run", run)
    thresholds = gc.get_threshold()
    try:
        code = main(
            [
                "--upstream",
                "http://127.0.0.1:1/v1",
                "--window",
                "32768",
                "--archive-dir",
                str(tmp_path),
            ]
        )
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert code == 0
    assert seen["frozen"] > 10_000  # the imported modules and the app
    assert seen["tracked"] < seen["frozen"]  # a full collection walks only what came after
    assert seen["young"] == SERVER_YOUNG_THRESHOLD  # a request's temporaries die young


def test_the_server_keeps_its_threads_on_the_cpu_it_is_given(monkeypatch, tmp_path):
    import gc
    import os
    import threading

    import uvicorn

    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    seen: dict[str, set[int]] = {}

    def run(app, **_options):  # the server itself is not started: only what precedes it
        seen["main"] = os.sched_getaffinity(0)
        started = threading.Thread(
            target=lambda: seen.setdefault("thread", os.sched_getaffinity(0))
        )
        started.start()
        started.join()

    monkeypatch.setattr(uvicorn, "run", run)
    thresholds = gc.get_threshold()
    try:
        code = main(_started_in(tmp_path, "--cpu", str(cpu)))
    finally:  # this process is pytest's: as it was
        os.sched_setaffinity(0, allowed)
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert code == 0
    assert seen == {"main": {cpu}, "thread": {cpu}}  # a thread started later inherits it


def test_a_cpu_the_process_may_not_run_on_is_refused_at_start_up(capsys, tmp_path):
    code = main(_started_in(tmp_path, "--cpu", "4096"))
    assert code == 2
    assert "--cpu: CPU 4096 is not one this process may run on" in capsys.readouterr().err


def test_a_young_threshold_below_one_is_refused_at_start_up(capsys, tmp_path):
    code = main(_started_in(tmp_path, "--gc-young-threshold", "0"))
    assert code == 2
    assert "--gc-young-threshold must be at least 1" in capsys.readouterr().err


def _started_in(folder, *options: str) -> list[str]:
    """keeper-proxy's arguments for an upstream that is never called, archiving in ``folder``."""
    return [
        "--upstream",
        "http://127.0.0.1:1/v1",
        "--window",
        "32768",
        "--archive-dir",
        str(folder),
        *options,
    ]
