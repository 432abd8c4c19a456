"""A LangGraph agent whose checkpoints (``PostgresSaver``) and keeper archive share one database.

Any worker that opens the same URL can continue any thread: the graph state comes from the
checkpoints, the archived turns, NOTES and search index from the keeper's tables (schema
``keeper``, beside LangGraph's tables in ``public``). Here a second worker, with nothing in
memory, answers a question about the first item after the first worker has cut it out of view.

    KEEPER_DATABASE_URL=postgresql://user:password@host:5432/dbname python examples/postgres_agent.py

Without ``KEEPER_DATABASE_URL`` it starts a throwaway PostgreSQL server in a temporary folder
(PostgreSQL must be installed) and removes it afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.postgres import PostgresSaver
from middleware_agent import SYSTEM, conversation, default_model, lookup

from keeper_middleware import Keeper, KeeperConfig, create_keeper_agent
from keeper_middleware.messages.facts import text_of

CONFIG = KeeperConfig(window=4096, reply_reserve=512)
THREAD = {"configurable": {"thread_id": "ledger-7"}}


@contextmanager
def database() -> Iterator[str]:
    if os.environ.get("KEEPER_DATABASE_URL"):
        yield os.environ["KEEPER_DATABASE_URL"]
        return
    from keeper_middleware.integrations.postgres_server import LocalPostgres

    with LocalPostgres() as server:
        yield server.url


def worker(url: str, saver: PostgresSaver) -> tuple[Keeper, object]:
    """What each worker process builds: a keeper and an agent, both on the shared database."""
    keeper = Keeper(CONFIG, archive=url)  # one argument: archive, NOTES and keyword index
    agent = create_keeper_agent(
        default_model(), [lookup], system_prompt=SYSTEM, keeper=keeper, checkpointer=saver
    )
    return keeper, agent


def main(items: int = 30) -> None:
    with database() as url, PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        first, agent = worker(url, saver)
        for text in conversation(items):
            agent.invoke({"messages": [HumanMessage(text)]}, THREAD)  # type: ignore[attr-defined]
        print(f"worker 1: cuts: {first.counters('ledger-7').cuts}")
        first.close()

        second, agent = worker(url, saver)  # another process, nothing in memory
        question = "Questions:\n1. What was r1 recorded at?"
        reply = agent.invoke({"messages": [HumanMessage(question)]}, THREAD)  # type: ignore[attr-defined]
        print(f"worker 2: {question.splitlines()[1]} -> {text_of(reply['messages'][-1])}")
        versions = sum(1 for _ in second.archive.notes_versions("ledger-7"))
        print(
            f"archived turns: {second.archive.turn_count('ledger-7')}, notes versions: {versions}"
        )
        checkpoints = saver.conn.execute("SELECT COUNT(*) AS n FROM checkpoints").fetchone()
        print(f"checkpoints in the same database: {checkpoints['n'] if checkpoints else 0}")
        # the example cleans up after itself; a real deployment keeps both for as long as needed
        second.archive.delete_session("ledger-7")
        second.retriever.delete_session("ledger-7")
        saver.delete_thread("ledger-7")
        second.close()


if __name__ == "__main__":
    main()
