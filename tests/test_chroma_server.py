"""The embedding backend against a real Chroma server on 127.0.0.1, through chromadb.HttpClient."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keeper_middleware.retrievers.base import Passage
from keeper_middleware.retrievers.embedders import HashingEmbedder
from keeper_middleware.retrievers.embedding import EmbeddingRetriever
from keeper_middleware.retrievers.factory import make_retriever

pytestmark = pytest.mark.chroma_server

CHROMA = Path(sys.executable).with_name("chroma")
HASHING = HashingEmbedder()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_listening(port: int, server: subprocess.Popen, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"chroma exited with {server.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"chroma did not listen on 127.0.0.1:{port} within {seconds} s")


@pytest.fixture(scope="module")
def chroma_url(tmp_path_factory):
    if not CHROMA.exists():
        pytest.fail(f"the chroma CLI is missing at {CHROMA}: install keeper-middleware[embeddings]")
    port = free_port()
    folder = tmp_path_factory.mktemp("chroma-server")
    log = (folder / "server.log").open("wb")
    server = subprocess.Popen(
        [
            str(CHROMA),
            "run",
            "--path",
            str(folder / "data"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
        start_new_session=True,
    )
    try:
        wait_until_listening(port, server)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        log.close()


def test_adds_and_searches_over_http_with_next_text(chroma_url):
    retriever = EmbeddingRetriever(server=chroma_url, embedder=HASHING, collection="server-basic")
    retriever.add([
        Passage(session="s", item=1, position=0, text="The clerk recorded domo86 at nine."),
        Passage(session="s", item=1, position=1, text="Ten were taken from it."),
        Passage(session="s", item=2, position=2, text="The rain kept on."),
    ])  # fmt: skip
    hit = retriever.search("domo86", session="s", k=1)[0]
    assert (hit.passage.text, hit.next_text) == (
        "The clerk recorded domo86 at nine.",
        "Ten were taken from it.",
    )
    assert [h.passage.item for h in retriever.search("rain", session="s", from_item=2)] == [2]
    retriever.delete_session("s")
    assert retriever.count("s") == 0
    retriever.close()


def test_the_server_keeps_the_index_between_clients(chroma_url):
    first = make_retriever(f"embedding+{chroma_url}", embedder=HASHING)
    first.add([Passage(session="kept", item=3, position=0, text="vela44 was sealed.")])
    first.close()
    second = make_retriever(f"embedding+{chroma_url}", embedder=HASHING)
    assert second.search("vela44", session="kept")[0].passage.item == 3
    second.delete_session("kept")
    second.close()


def test_apps_sharing_a_server_under_their_own_namespaces_never_read_each_other(chroma_url):
    spec = f"embedding+{chroma_url}"
    app_a = make_retriever(spec, embedder=HASHING, namespace="app-a")
    app_b = make_retriever(spec, embedder=HASHING, namespace="app-b")
    # the same session name in both apps: the namespace alone keeps them apart
    app_a.add([Passage(session="default", item=1, position=0, text="The vault code is tern71.")])
    app_b.add([Passage(session="default", item=1, position=0, text="The vault code is heron22.")])
    assert [h.passage.text for h in app_a.search("vault code", session="default")] == [
        "The vault code is tern71."
    ]
    assert [h.passage.text for h in app_b.search("vault code", session="default")] == [
        "The vault code is heron22."
    ]
    app_a.close()
    app_b.close()


@pytest.mark.real_model
def test_each_keeper_archive_gets_its_own_collection_on_a_shared_server(chroma_url, tmp_path):
    from keeper_middleware import Keeper
    from keeper_middleware.keeper import archive_namespace

    spec = f"embedding+{chroma_url}"
    first = Keeper(archive=tmp_path / "a" / "agent.sqlite3", retriever=spec)
    second = Keeper(archive=tmp_path / "b" / "agent.sqlite3", retriever=spec)
    assert first.namespace != second.namespace
    first.retriever.add([Passage(session="t", item=1, position=0, text="Ada keeps the red key.")])
    second.retriever.add([Passage(session="t", item=1, position=0, text="Bo keeps the blue key.")])
    assert {h.passage.text for h in first.retriever.search("who keeps a key", session="t")} == {
        "Ada keeps the red key."
    }
    first.close()
    reopened = Keeper(archive=tmp_path / "a" / "agent.sqlite3", retriever=spec)
    assert reopened.namespace == archive_namespace(tmp_path / "a" / "agent.sqlite3")
    assert reopened.retriever.count("t") == 1
    explicit = Keeper(retriever=spec, namespace="tenant-7")
    assert explicit.namespace == "tenant-7" and explicit.retriever.count("t") == 0
    for keeper in (second, reopened, explicit):
        keeper.close()


@pytest.mark.postgres
def test_archives_on_one_database_get_their_own_collection_on_one_chroma_server(
    chroma_url, postgres_url
):
    import uuid

    import psycopg

    from keeper_middleware.archive.postgres import PostgresArchive
    from keeper_middleware.keeper import archive_namespace

    schemas = [f"t_{uuid.uuid4().hex[:10]}" for _ in range(2)]

    def retriever_of(schema: str):
        """What a keeper on this archive builds (any replica: the name depends on the archive)."""
        with PostgresArchive(postgres_url, schema=schema) as archive:
            namespace = archive_namespace(archive)
        return make_retriever(
            f"hybrid+{chroma_url}",
            database=postgres_url,
            schema=schema,
            namespace=namespace,
            embedder=HASHING,
        )

    made = [retriever_of(s) for s in schemas]
    try:
        for retriever, word in zip(made, ("alder", "birch"), strict=True):
            retriever.add([Passage(session="s", item=1, position=0, text=f"The {word} grew.")])
        assert [h.passage.text for h in made[0].search("alder birch", session="s")] == [
            "The alder grew."
        ]
        assert [h.passage.text for h in made[1].search("alder birch", session="s")] == [
            "The birch grew."
        ]
        replica = retriever_of(schemas[0])
        assert [h.passage.text for h in replica.search("alder", session="s")] == ["The alder grew."]
        replica.close()
    finally:
        for retriever in made:
            retriever.close()
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
