"""A worker process on a shared PostgreSQL archive, for the tests of many writers on one session.

python -m tests.session_worker hold URL SCHEMA SESSION ROUNDS
    holds the session ROUNDS times for a moment each, printing "start end" times;
python -m tests.session_worker step URL SCHEMA SESSION START_AT
    waits until the wall clock reaches START_AT, then runs one keeper step over a fixed
    history that is due for a cut, with a slow note call, and prints what it did;
python -m tests.session_worker sleep URL SCHEMA SESSION
    takes the session, prints "held" and sleeps until killed.
"""

from __future__ import annotations

import sys
import time

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from keeper_middleware import Keeper, KeeperConfig, ModelSetup
from keeper_middleware.archive.postgres import PostgresArchive
from tests.fake_model import ScriptedChatModel
from tests.story_model import StoryModel, batch

CONFIG = KeeperConfig(window=2048, reply_reserve=256, notes_every_items=5)


def history() -> list[BaseMessage]:
    """The same messages, with the same ids, in every worker: one agent's state."""
    messages: list[BaseMessage] = [HumanMessage("Task: read. Rule: keep it exact.", id="m0")]
    for i in range(1, 7):
        messages.append(HumanMessage(batch(i, f"Today we set c{i} to {i * 3}."), id=f"h{i}"))
        messages.append(AIMessage(f"Noted item {i}.", id=f"a{i}"))
    return messages


def main(mode: str, url: str, schema: str, session: str, *rest: str) -> None:
    keeper = Keeper(CONFIG, archive=PostgresArchive(url, schema=schema))
    if mode == "hold":
        for _ in range(int(rest[0])):
            with keeper.session(session):
                start = time.time()
                time.sleep(0.02)
                print(f"{start} {time.time()}", flush=True)
    elif mode == "step":
        model = ScriptedChatModel(default=StoryModel())
        calls = []

        def slow_call(messages: list[BaseMessage], kwargs: object) -> AIMessage:
            calls.append(1)
            time.sleep(0.5)  # long enough that an unserialised second worker would overlap
            reply = model.invoke(messages)
            assert isinstance(reply, AIMessage)
            return reply

        print("ready", flush=True)
        sys.stdin.readline()
        result = keeper.step(session, history(), None, ModelSetup(), slow_call)
        print(f"cut={result.cut} window={[m.id for m in result.messages]}", flush=True)
        print(f"note calls {len(calls)}", flush=True)
    elif mode == "sleep":
        with keeper.session(session):
            print("held", flush=True)
            time.sleep(600)
    keeper.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
