"""History is matched by content: whatever an agent does to the history it resends (continue,
trim the front, edit, regenerate, resend, a foreign request on its session), no turn is archived
twice and none of the agent's current messages is lost. Checked over random edit sequences
through the real proxy (real SQLite archive, keeper cuts on a small window)."""

from __future__ import annotations

import asyncio
import re
import tempfile
from itertools import count
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keeper_middleware.messages.facts import keeper_kind, text_of
from tests.proxy_upstream import SYSTEM, ScriptedUpstream, client_for, make_app, text_reply

TAG = re.compile(r"^(M|R|F)\d+:")
PAD = " ".join(f"ledger line {i} holds figure {i * 7}." for i in range(12))

operation = st.one_of(
    st.just(("new",)),
    st.tuples(st.just("trim"), st.integers(1, 6)),
    st.tuples(st.just("edit"), st.integers(0, 40)),
    st.tuples(st.just("edit_keep"), st.integers(0, 40)),
    st.just(("regenerate",)),
    st.just(("resend",)),
    st.just(("foreign",)),
)


def tagged(text: str) -> str | None:
    match = TAG.match(text)
    return match.group(0) if match else None


async def replay(ops: list[tuple[Any, ...]], folder: Path) -> None:
    numbers = count()
    replies = count()
    upstream = ScriptedUpstream(default=lambda body: text_reply(f"R{next(replies)}: noted."))
    app = make_app(upstream, folder, window=2048)
    proxy = app.state.proxy
    session = "default:owner"
    history: list[dict[str, Any]] = []

    def user(prefix: str = "M") -> dict[str, Any]:
        return {"role": "user", "content": f"{prefix}{next(numbers)}: {PAD}"}

    async def send(client: Any, messages: list[dict[str, Any]], name: str) -> dict[str, Any]:
        body = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, *messages]}
        response = await client.post(
            "/v1/chat/completions", json=body, headers={"X-Keeper-Session": name}
        )
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]

    async with client_for(app) as client:
        for op in [("new",), *ops]:
            kind = op[0]
            if kind == "new" or not history:
                history.append(user())
            elif kind == "trim":
                history = history[min(op[1], len(history) - 1) :]
            elif kind == "edit":
                at = op[1] % len(history)
                history = [*history[:at], user()]
            elif kind == "edit_keep":
                at = op[1] % len(history)
                history[at] = {**history[at], "content": f"M{next(numbers)}: edited {PAD}"}
            elif kind == "regenerate" and history[-1]["role"] == "assistant":
                history.pop()
            elif kind == "foreign":
                await send(client, [history[0], user("F")], "owner")
                history.append(user())
            history.append(await send(client, history, "owner"))
            check(proxy, session, history)
    await proxy.aclose()


def check(proxy: Any, session: str, history: list[dict[str, Any]]) -> None:
    archived = [tagged(t.content) for t in proxy.keeper.archive.turns(session)]
    archived = [t for t in archived if t]
    assert len(archived) == len(set(archived)), "a turn was archived twice"
    window = [tagged(text_of(m)) for m in proxy.record(session).window if keeper_kind(m) is None]
    window = [t for t in window if t]
    assert len(window) == len(set(window)), "a message is twice in view"
    for message in history:
        tag = tagged(message["content"] or "")
        assert tag is None or tag in set(window) | set(archived), f"{tag} was lost"


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(operation, min_size=1, max_size=24))
def test_no_edit_sequence_archives_a_turn_twice_or_loses_one(ops):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(replay(ops, Path(folder)))


def test_a_long_front_trimming_agent_archives_every_turn_once(tmp_path):
    ops = [("new",), ("trim", 2)] * 20
    asyncio.run(replay(ops, tmp_path))
