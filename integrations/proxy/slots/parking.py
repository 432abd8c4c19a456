"""Slot parking: the proxy manages a llama.cpp server's slots for more sessions than it has.

Each request holds one slot of the server for all its upstream calls (``id_slot`` in the body):
the session's own slot if its cache is still there, else an empty one, else the least recently
used idle one, whose session is first *parked*: its KV cache is saved to the slot folder
(``POST /slots/{id}?action=save``, the server started with ``--slot-save-path`` on that folder)
with a JSON sidecar of what the server reported then (:class:`ServerIdentity`). Before the
session's next request its cache is *restored* (``action=restore``), if the sidecar still matches
the server and the cached tokens share a long enough prefix with the request (the rules and why
they are safe: :mod:`.slot_rules`). Anything else is refused with a warning and the session is
simply re-read: parking can make a switch slower, never an answer different.

Parked files are pruned least recently used first under a disk budget, erased with their session,
and read again from the folder when the proxy restarts. One proxy manages one server's slots.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from keeper_middleware.errors import ConfigurationError, KeeperError
from keeper_middleware.integrations.proxy.slots.files import (
    ParkedEntry,
    cached_tokens,
    model_fingerprint,
    read_folder,
    remove_files,
    sidecar_of,
    write_sidecar,
)
from keeper_middleware.integrations.proxy.slots.rules import (
    REFUSAL_REASONS,
    ParkedFile,
    RefusalReason,
    ServerIdentity,
    parked_name,
    prefix_decision,
    prompt_counts,
    prune_plan,
    refusal_reason,
)

if TYPE_CHECKING:
    from keeper_middleware.integrations.llama_server import LocalLlamaServer

__all__ = ["SlotCounters", "SlotLease", "SlotParking", "SlotParkingConfig", "SlotParkingError"]

_log = logging.getLogger(__name__)


class SlotParkingError(KeeperError, RuntimeError):
    """The server cannot do slot parking as configured; the message says what to change."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotParkingConfig:
    """How the proxy parks sessions' KV caches on one llama.cpp server."""

    slots: int
    """Slots the server runs (``-np``); the proxy pins each active session to one of them."""
    slot_dir: Path
    """The server's ``--slot-save-path``: the proxy reads, sizes and prunes the files there."""
    disk_budget: int = 8 * 1024**3
    """Bytes the parked files may take; the least recently used go first."""
    min_prefix_tokens: int = 256
    """Restore only when the cache shares at least this many leading tokens with the request."""
    server_url: str | None = None
    """llama-server's root URL; ``None``: the upstream URL without its ``/v1``."""
    model_file: Path | None = None
    """The model file, fingerprinted into every sidecar; ``None``: the file ``/props`` names,
    when this machine can read it (else its path is compared)."""
    timeout: float = 300.0
    """Seconds a save or restore may take (a large cache on a slow disk)."""

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ConfigurationError(
                f"slots={self.slots}; pass the server's slot count (-np), >= 1"
            )
        if not Path(self.slot_dir).is_dir():
            raise ConfigurationError(
                f"slot_dir={self.slot_dir} is not a folder; create it and start llama-server "
                "with --slot-save-path on it"
            )
        if self.disk_budget < 1:
            raise ConfigurationError(
                f"disk_budget={self.disk_budget}; pass a positive number of bytes"
            )
        if self.min_prefix_tokens < 1:
            raise ConfigurationError(f"min_prefix_tokens={self.min_prefix_tokens}; pass 1 or more")
        if self.timeout <= 0:
            raise ConfigurationError(f"timeout={self.timeout}; pass a positive number of seconds")
        if self.model_file is not None and not Path(self.model_file).is_file():
            raise ConfigurationError(f"model_file={self.model_file} is not a file; pass the .gguf")

    @classmethod
    def for_server(cls, server: LocalLlamaServer, **options: Any) -> SlotParkingConfig:
        """The settings for a server the local launcher started with ``slot_save_path``."""
        folder = server.config.slot_save_path
        if folder is None:
            raise ConfigurationError(
                "slot parking needs a llama.cpp server started with slot_save_path= "
                "(LlamaServerConfig(slots=N, slot_save_path=folder))"
            )
        return cls(
            slots=server.config.slots,
            slot_dir=Path(folder),
            server_url=server.root_url,
            model_file=server.gguf,
            **options,
        )


@dataclass(slots=True)
class SlotCounters:
    """What parking did since the proxy started (``/metrics`` reads these)."""

    parks: int = 0
    park_failures: int = 0
    restores: int = 0
    partial_restores: int = 0
    """Restores whose cache only partly matched the request (after a cut or an edit)."""
    refusals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSAL_REASONS, 0))
    pruned: int = 0
    erased: int = 0
    park_seconds: float = 0.0
    restore_seconds: float = 0.0
    prompt_tokens_read: int = 0
    prompt_tokens_reused: int = 0
    """Prompt tokens the server did not have to read (its ``cache_n``), on every pinned call."""
    tokens_spared_by_restores: int = 0
    """Of those, the ones on the first call after a restore."""
    parked_bytes: int = 0
    parked_sessions: int = 0


@dataclass(slots=True)
class _Slot:
    number: int
    session: str | None = None
    busy: bool = False
    last_used: float = 0.0


class SlotLease:
    """One request's hold on a slot: every upstream call of the request goes through it."""

    def __init__(self, parking: SlotParking, slot: _Slot, session: str) -> None:
        self.parking, self.slot, self.session = parking, slot, session
        self.restored: int | None = None
        """Tokens of the restored cache the request shares (``None``: nothing was restored)."""
        self._prepared = slot.session == session
        self._after_restore = False

    async def prepare(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The body pinned to this slot; before the first call, the session's cache is
        restored if it is parked and may be."""
        if not self._prepared:
            self._prepared = True
            self.restored = await self.parking._restore(self.slot, self.session, body)
            self._after_restore = self.restored is not None
            self.slot.session = self.session
        return {**body, "id_slot": self.slot.number}

    def observe(self, data: Mapping[str, Any]) -> None:
        """Count the prompt tokens the server read and reused for one reply."""
        counts = prompt_counts(data)
        if counts is None:
            return
        read, reused = counts
        tally = self.parking.counters
        tally.prompt_tokens_read += read
        tally.prompt_tokens_reused += reused
        if self._after_restore:
            tally.tokens_spared_by_restores += reused
            self._after_restore = False


class SlotParking:
    """Pins sessions to a llama.cpp server's slots and parks the caches of evicted ones."""

    def __init__(
        self,
        config: SlotParkingConfig,
        upstream_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        root = config.server_url or upstream_url.rstrip("/").removesuffix("/v1")
        self.root = root.rstrip("/")
        self.folder = Path(config.slot_dir)
        self.client = httpx.AsyncClient(timeout=config.timeout, transport=transport)
        self.counters = SlotCounters()
        self._slots = [_Slot(n) for n in range(config.slots)]
        self._changed = asyncio.Condition()
        self._parked: dict[str, ParkedEntry] = {}
        self._restoring: set[str] = set()
        self._fingerprint: str | None = None
        self._loaded = False
        self._checked = False

    # ---------------------------------------------------------------- holding a slot

    @asynccontextmanager
    async def lease(self, session: str) -> AsyncIterator[SlotLease]:
        """Hold a slot for one request of ``session`` (wait while all slots are busy)."""
        await self._start()
        slot = await self._take(session)
        try:
            if slot.session not in (None, session):
                await self._park(slot)
            yield SlotLease(self, slot, session)
        finally:
            async with self._changed:
                slot.busy = False
                slot.last_used = time.monotonic()
                self._changed.notify_all()

    async def _take(self, session: str) -> _Slot:
        async with self._changed:
            while True:
                own = [s for s in self._slots if s.session == session]
                idle = [s for s in self._slots if not s.busy]
                if own and not own[0].busy:
                    chosen = own[0]
                elif not own and idle:
                    empty = [s for s in idle if s.session is None]
                    chosen = empty[0] if empty else min(idle, key=lambda s: s.last_used)
                else:
                    await self._changed.wait()
                    continue
                chosen.busy = True
                return chosen

    # ---------------------------------------------------------------- parking and restoring

    async def _park(self, slot: _Slot) -> None:
        """Save the slot's cache under its session's name (the slot is then free to reuse)."""
        session, slot.session = slot.session, None
        assert session is not None
        name = parked_name(session)
        began = time.perf_counter()
        try:
            identity = await self.identity()
            await self._slot_action(slot.number, "save", name)
        except (httpx.HTTPError, SlotParkingError, ValueError) as exc:
            self.counters.park_failures += 1
            _log.warning("could not park a session's cache from slot %d: %s", slot.number, exc)
            return
        self.counters.park_seconds += time.perf_counter() - began
        path = self.folder / name
        if not path.is_file():
            self.counters.park_failures += 1
            _log.error(
                "the server saved slot %d but %s does not exist: start llama-server with "
                "--slot-save-path %s",
                slot.number,
                path,
                self.folder,
            )
            return
        entry = ParkedEntry(name, session, path.stat().st_size, time.time(), identity)
        try:
            await asyncio.to_thread(write_sidecar, path, entry)
        except OSError as exc:  # a full disk: a file without its sidecar is never restored
            self.counters.park_failures += 1
            _log.warning("could not keep the parked cache %s: %s", path, exc)
            await self._delete(name)
            return
        self._parked[name] = entry
        self.counters.parks += 1
        await self._prune()

    async def _restore(self, slot: _Slot, session: str, body: Mapping[str, Any]) -> int | None:
        """Restore the session's parked cache into the slot when allowed; the tokens it shares
        with the request, or ``None`` (nothing restored: the server reads the request)."""
        entry = self._parked.get(parked_name(session))
        if entry is None or entry.session != session:
            return None
        self._restoring.add(entry.name)
        try:
            return await self._restore_entry(slot, entry, body)
        finally:
            self._restoring.discard(entry.name)

    async def _restore_entry(
        self, slot: _Slot, entry: ParkedEntry, body: Mapping[str, Any]
    ) -> int | None:
        path = self.folder / entry.name
        try:
            cached = await asyncio.to_thread(cached_tokens, path)
        except (OSError, ValueError) as exc:
            return await self._refused(entry, "missing", str(exc))
        try:
            reason = refusal_reason(entry.identity, await self.identity())
            if reason is not None:
                return await self._refused(entry, reason, "the server differs from when it saved")
            prompt = await self._prompt_tokens(body)
        except (httpx.HTTPError, SlotParkingError, ValueError) as exc:
            return await self._refused(entry, "restore_failed", f"the server could not say: {exc}")
        decision = prefix_decision(cached, prompt, min_tokens=self.config.min_prefix_tokens)
        if not decision.restore:
            detail = f"{decision.kept} of {len(cached)} cached tokens start the request"
            return await self._refused(entry, "prefix", detail)
        began = time.perf_counter()
        try:
            await self._slot_action(slot.number, "restore", entry.name)
        except (httpx.HTTPError, SlotParkingError) as exc:
            await self._erase_slot(slot.number)
            return await self._refused(entry, "restore_failed", str(exc))
        self.counters.restore_seconds += time.perf_counter() - began
        self.counters.restores += 1
        self.counters.partial_restores += not decision.whole
        entry.last_used = time.time()
        await asyncio.to_thread(write_sidecar, path, entry)
        return decision.kept

    async def _refused(self, entry: ParkedEntry, reason: RefusalReason, detail: str) -> int | None:
        """Count and log a refusal, delete the file; ``None`` (nothing restored)."""
        self.counters.refusals[reason] += 1
        _log.warning(
            "not restoring a parked cache (%s: %s); the session is read again", reason, detail
        )
        await self._delete(entry.name)
        return None

    async def forget(self, session: str) -> None:
        """Erase what is kept of a session: its parked file, and its cache in a slot."""
        await self._start()
        await self._delete(parked_name(session))
        async with self._changed:
            held = [s for s in self._slots if s.session == session and not s.busy]
            for slot in held:
                slot.session = None
        for slot in held:
            await self._erase_slot(slot.number)

    # ---------------------------------------------------------------- the server

    async def identity(self) -> ServerIdentity:
        """What the server reports now (asked every time: it may have been restarted)."""
        props = await self._get_json("/props")
        models = await self._get_json("/v1/models")
        if self._fingerprint is None:
            self._fingerprint = await asyncio.to_thread(self._model_fingerprint, props)
        return ServerIdentity.from_server(props, models, self._fingerprint)

    def _model_fingerprint(self, props: Mapping[str, Any]) -> str:
        named = self.config.model_file or Path(str(props.get("model_path", "")))
        try:
            return model_fingerprint(named)
        except OSError:
            return ""

    async def _prompt_tokens(self, body: Mapping[str, Any]) -> list[int]:
        """The tokens the server will read for ``body``: its template, then its tokenizer."""
        shown = {k: body[k] for k in ("messages", "tools", "tool_choice") if k in body}
        rendered = await self._post_json("/apply-template", shown)
        prompt = rendered.get("prompt")
        if not isinstance(prompt, str):
            raise SlotParkingError("/apply-template returned no prompt")
        tokens = await self._post_json(
            "/tokenize", {"content": prompt, "add_special": True, "parse_special": True}
        )
        ids = tokens.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise SlotParkingError("/tokenize returned no token ids")
        return ids

    async def _slot_action(self, number: int, action: str, filename: str | None = None) -> None:
        body = {"filename": filename} if filename else {}
        reply = await self.client.post(
            f"{self.root}/slots/{number}", params={"action": action}, content=orjson.dumps(body)
        )
        if reply.status_code >= 400:
            raise SlotParkingError(
                f"{action} on slot {number} failed ({reply.status_code}): {reply.text[:300]}"
            )

    async def _erase_slot(self, number: int) -> None:
        try:
            await self._slot_action(number, "erase")
            self.counters.erased += 1
        except (httpx.HTTPError, SlotParkingError) as exc:
            _log.warning("could not erase slot %d: %s", number, exc)

    async def _get_json(self, path: str) -> dict[str, Any]:
        reply = await self.client.get(f"{self.root}{path}")
        return _json_object(reply, path)

    async def _post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        reply = await self.client.post(f"{self.root}{path}", content=orjson.dumps(body))
        return _json_object(reply, path)

    async def _start(self) -> None:
        """Once: read the folder's parked files, and check the server has the slots."""
        if not self._loaded:
            self._loaded = True
            for entry in await asyncio.to_thread(read_folder, self.folder):
                self._parked[entry.name] = entry
            self._count_disk()
        if not self._checked:
            try:
                props = await self._get_json("/props")
            except httpx.HTTPError:
                return  # the upstream call reports an unreachable server
            total = int(props.get("total_slots") or 0)
            if total < self.config.slots:
                raise SlotParkingError(
                    f"the server runs {total} slot(s), fewer than --llama-slots "
                    f"{self.config.slots}; start it with -np {self.config.slots}"
                )
            self._checked = True

    # ---------------------------------------------------------------- the disk

    async def _prune(self) -> None:
        files = [
            ParkedFile(name=e.name, size=e.size, last_used=e.last_used)
            for e in self._parked.values()
        ]
        for name in prune_plan(files, self.config.disk_budget, keep=frozenset(self._restoring)):
            await self._delete(name)
            self.counters.pruned += 1
        self._count_disk()

    async def _delete(self, name: str) -> None:
        self._parked.pop(name, None)
        path = self.folder / name
        await asyncio.to_thread(remove_files, path, sidecar_of(path))
        self._count_disk()

    def _count_disk(self) -> None:
        self.counters.parked_bytes = sum(e.size for e in self._parked.values())
        self.counters.parked_sessions = len(self._parked)

    async def aclose(self) -> None:
        await self.client.aclose()


def _json_object(reply: httpx.Response, path: str) -> dict[str, Any]:
    if reply.status_code >= 400:
        raise SlotParkingError(f"{path} failed ({reply.status_code}): {reply.text[:300]}")
    data = orjson.loads(reply.content)
    if not isinstance(data, dict):
        raise SlotParkingError(f"{path} did not return a JSON object")
    return data
