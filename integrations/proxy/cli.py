"""``keeper-proxy``: run the keeper proxy in front of an OpenAI-compatible model server.

    keeper-proxy --upstream http://127.0.0.1:8000/v1 --window 32768 --port 8100

Then point the agent's base URL at ``http://127.0.0.1:8100/v1`` (Chat Completions and Responses
clients) or ``http://127.0.0.1:8100`` (Anthropic Messages clients; ``--upstream-api`` names what
the upstream speaks). Send ``X-Keeper-Session: <id>``
to name a conversation; without it, a conversation is named by the request's ``user``, system
prompt and first user message. Keys map to tenants (``--keys-file``, ``KEEPER_PROXY_KEYS``);
``GET``/``DELETE /keeper/sessions/<id>`` show or forget one of the caller's sessions, ``/metrics``
serves the counters to Prometheus.

    python -m keeper_middleware.integrations.proxy --help
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keeper_middleware.errors import ConfigurationError, KeeperError
from keeper_middleware.integrations.proxy.serving import (
    DEFAULT_HEADER_TIMEOUT,
    http_protocol,
    pin_to_cpu,
    serve_in_thread,
)
from keeper_middleware.startup import (
    SERVER_YOUNG_THRESHOLD,
    collect_young_less_often,
    freeze_startup_objects,
)

__all__ = ["build_parser", "main", "serve_in_thread"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keeper-proxy",
        description="An OpenAI-compatible proxy that keeps an agent working past its window: "
        "old turns go to an archive, checked NOTES stay in view, the model can search the archive.",
    )
    parser.add_argument(
        "--upstream", required=True, help="the model server's base URL, e.g. http://host:8000/v1"
    )
    parser.add_argument(
        "--upstream-api",
        choices=("chat", "responses", "messages"),
        default="chat",
        help="the API the upstream speaks: chat (Chat Completions, the default: llama.cpp, vLLM), "
        "responses (OpenAI Responses) or messages (Anthropic Messages). Clients of that API are "
        "passed through; clients of the others (every front door is open: /v1/chat/completions, "
        "/v1/responses, /v1/messages) are translated",
    )
    parser.add_argument(
        "--window", type=int, required=True, help="the live window in tokens, e.g. 32768"
    )
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    parser.add_argument(
        "--archive-dir",
        default="keeper-proxy-data",
        help="folder for the archive, notes and sessions (default ./keeper-proxy-data)",
    )
    parser.add_argument(
        "--archive-url",
        default=os.environ.get("KEEPER_ARCHIVE_URL"),
        help="keep everything in PostgreSQL instead (postgresql://user:password@host/db, env "
        "KEEPER_ARCHIVE_URL): any number of replicas on one database serve any session",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("KEEPER_PROXY_API_KEY"),
        help="one key, for tenant 'default' (env KEEPER_PROXY_API_KEY)",
    )
    parser.add_argument(
        "--keys-file",
        default=os.environ.get("KEEPER_PROXY_KEYS_FILE"),
        help="a file of 'tenant key' lines, several keys per tenant allowed (env "
        "KEEPER_PROXY_KEYS_FILE); KEEPER_PROXY_KEYS='t1:key1,t1:key2,t2:key3' adds more",
    )
    parser.add_argument(
        "--admin-key",
        default=os.environ.get("KEEPER_PROXY_ADMIN_KEY"),
        help="a key that sees every tenant's sessions as <tenant>:<id> (env KEEPER_PROXY_ADMIN_KEY)",
    )
    parser.add_argument(
        "--metrics-key",
        default=os.environ.get("KEEPER_PROXY_METRICS_KEY"),
        help="when set, /metrics needs this key or the admin key (env KEEPER_PROXY_METRICS_KEY)",
    )
    parser.add_argument(
        "--metrics-per-session",
        action="store_true",
        help="label /metrics by session id too (they can carry what users typed)",
    )
    parser.add_argument(
        "--require-session",
        action="store_true",
        help="refuse requests naming neither X-Keeper-Session nor 'user': use when several end "
        "users share one key, so that no two of them share a session",
    )
    parser.add_argument(
        "--tenant-quota-mb",
        type=float,
        default=None,
        help="messages each tenant may store, in MB; a request past it gets a 413",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=32.0,
        help="largest request body accepted, in MB (default 32)",
    )
    parser.add_argument(
        "--upstream-timeout",
        type=float,
        default=600.0,
        help="seconds one upstream try may take (default 600)",
    )
    parser.add_argument(
        "--upstream-retries",
        type=int,
        default=3,
        help="tries repeated after an upstream error, 429 or timeout (default 3)",
    )
    parser.add_argument(
        "--upstream-budget",
        type=float,
        default=120.0,
        help="seconds after which no new upstream try starts (default 120)",
    )
    parser.add_argument(
        "--max-retry-after",
        type=float,
        default=10.0,
        help="the longest Retry-After the proxy waits for inside a request (default 10 s); a "
        "longer one goes to the agent at once, with the upstream's status",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT,
        help=f"seconds a client has to send a request's headers before its connection is "
        f"closed (default {DEFAULT_HEADER_TIMEOUT:g})",
    )
    parser.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="keep the proxy's threads on this CPU (as taskset -c does): its event loop and "
        "worker threads take turns at the interpreter's lock, which costs 30-40%% more CPU a "
        "request when they run on different cores (default: wherever the OS puts them)",
    )
    parser.add_argument(
        "--gc-young-threshold",
        type=int,
        default=SERVER_YOUNG_THRESHOLD,
        help=f"allocations between the garbage collector's young collections (default "
        f"{SERVER_YOUNG_THRESHOLD:,}; Python's own is 700): a request's parsed history dies "
        "before a collection walks it",
    )
    parser.add_argument(
        "--upstream-api-key",
        default=os.environ.get("KEEPER_UPSTREAM_API_KEY"),
        help="key sent to the upstream (env KEEPER_UPSTREAM_API_KEY); without it and without "
        "--api-key the agent's own Authorization header is passed on",
    )
    parser.add_argument(
        "--reasoning-effort",
        default=None,
        help="forwarded as reasoning_effort on every upstream call, e.g. medium",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="token counter: 'approximate' (default), 'hf:/path/to/model' (its tokenizer.json) "
        "or 'server:http://host:port' (llama.cpp's tokenize endpoint)",
    )
    parser.add_argument(
        "--max-upstream-calls", type=int, default=12, help="upstream calls per request at most"
    )
    parking = parser.add_argument_group(
        "slot parking (a llama.cpp llama-server upstream with more sessions than slots)"
    )
    parking.add_argument(
        "--llama-slots",
        type=int,
        default=None,
        help="manage the server's N slots (its -np): pin each active session to one and park "
        "the KV caches of evicted sessions on disk; needs --slot-dir",
    )
    parking.add_argument(
        "--slot-dir",
        default=None,
        help="the folder llama-server was started with as --slot-save-path",
    )
    parking.add_argument(
        "--slot-disk-budget",
        type=byte_size,
        default="8G",
        help="bytes the parked caches may take, e.g. 8G or 500M (default 8G); the least "
        "recently used go first",
    )
    parking.add_argument(
        "--slot-min-prefix",
        type=int,
        default=256,
        help="restore a parked cache only when it shares this many leading tokens with the "
        "request (default 256)",
    )
    parking.add_argument(
        "--slot-model-file",
        default=None,
        help="the model .gguf, fingerprinted to refuse caches of another model (default: the "
        "file the server names, when readable here)",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="log a line per request (off by default: at many requests a second the log line "
        "costs more than routing the request)",
    )
    return parser


def byte_size(text: str) -> int:
    """``8G``, ``500M``, ``64K`` or a plain number of bytes."""
    units = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    factor = units.get(cleaned[-1:], 1)
    number = cleaned[:-1] if cleaned[-1:] in units else cleaned
    try:
        value = int(float(number) * factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 8G or 500M") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive size")
    return value


def slot_parking_config(args: argparse.Namespace) -> Any:
    """The slot parking settings the arguments ask for, or ``None``."""
    if args.llama_slots is None and args.slot_dir is None:
        return None
    if args.llama_slots is None or args.slot_dir is None:
        raise ConfigurationError("slot parking needs both --llama-slots N and --slot-dir PATH")
    from keeper_middleware.integrations.proxy.slots.parking import SlotParkingConfig

    return SlotParkingConfig(
        slots=args.llama_slots,
        slot_dir=Path(args.slot_dir),
        disk_budget=args.slot_disk_budget,
        min_prefix_tokens=args.slot_min_prefix,
        model_file=Path(args.slot_model_file) if args.slot_model_file else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["demo"]:  # the proxy offline, in front of a scripted upstream
        from keeper_middleware.integrations.proxy.demo import main as demo

        return demo(given[1:])
    args = build_parser().parse_args(given)
    if args.cpu is not None:  # before any thread starts: every thread inherits it
        try:
            pin_to_cpu(args.cpu)
        except ConfigurationError as exc:
            print(f"keeper-proxy: --cpu: {exc}", file=sys.stderr)
            return 2
    try:
        import uvicorn

        from keeper_middleware.integrations.proxy.app import create_proxy_app
        from keeper_middleware.integrations.proxy.sessions.tenants import Tenants
        from keeper_middleware.integrations.proxy.upstream.client import RetryPolicy
    except ImportError as exc:  # the web server is an extra
        print(
            f"keeper-proxy needs the proxy extra ({exc.name} is missing): "
            "pip install 'keeper-middleware[proxy]'",
            file=sys.stderr,
        )
        return 2
    try:
        tenants = Tenants.from_sources(
            api_key=args.api_key,
            keys_file=args.keys_file,
            admin_key=args.admin_key,
            metrics_key=args.metrics_key,
        )
        quota = args.tenant_quota_mb
        app = create_proxy_app(
            args.upstream,
            window=args.window,
            archive_dir=None if args.archive_url else Path(args.archive_dir),
            archive_url=args.archive_url,
            tenants=tenants,
            require_session=args.require_session,
            metrics_per_session=args.metrics_per_session,
            tenant_quota_bytes=None if quota is None else int(quota * 1024 * 1024),
            max_body_bytes=int(args.max_body_mb * 1024 * 1024),
            retry=RetryPolicy(
                attempts=args.upstream_retries + 1,
                timeout=args.upstream_timeout,
                budget=args.upstream_budget,
                max_retry_after=args.max_retry_after,
            ),
            upstream_api_key=args.upstream_api_key,
            reasoning_effort=args.reasoning_effort,
            max_upstream_calls=args.max_upstream_calls,
            token_counter=args.tokenizer,
            slot_parking=slot_parking_config(args),
            upstream_api=args.upstream_api,
        )
    except (KeeperError, ValueError) as exc:
        print(f"keeper-proxy: {exc}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1") and tenants.open:
        print(
            f"keeper-proxy: listening on {args.host} without keys; anyone who can reach "
            "it can read every session.",
            file=sys.stderr,
        )
    if args.header_timeout <= 0:
        print(
            "keeper-proxy: --header-timeout must be a positive number of seconds", file=sys.stderr
        )
        return 2
    if args.gc_young_threshold < 1:
        print("keeper-proxy: --gc-young-threshold must be at least 1", file=sys.stderr)
        return 2
    freeze_startup_objects()
    collect_young_less_often(args.gc_young_threshold)
    # uvicorn picks uvloop and httptools when installed (the proxy extra installs them)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        http=http_protocol(args.header_timeout),
        log_level=args.log_level,
        access_log=args.access_log,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
