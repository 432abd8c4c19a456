"""The parked files on disk: a slot file's tokens, its JSON sidecar, the model's fingerprint.

Every parked cache is two files in the slot folder: llama-server's own slot file (named by
:func:`.slot_rules.parked_name`) and ``<name>.json`` beside it, written atomically after the
save, holding the session it belongs to, its size, when it was last used and the identity of the
server that wrote it. A slot file without a readable sidecar is never restored.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from keeper_middleware.integrations.proxy.slots.rules import (
    ServerIdentity,
    parked_name,
    read_cached_tokens,
)

__all__ = [
    "ParkedEntry",
    "cached_tokens",
    "model_fingerprint",
    "read_folder",
    "remove_files",
    "sidecar_of",
    "write_sidecar",
]

_log = logging.getLogger(__name__)
_SIDECAR = ".json"
_FINGERPRINT_BYTES = 1 << 20


@dataclass(slots=True)
class ParkedEntry:
    """One parked cache: its file name, whose it is, its size, when last used, and the
    identity of the server that wrote it."""

    name: str
    session: str
    size: int
    last_used: float
    identity: ServerIdentity


def sidecar_of(path: Path) -> Path:
    return path.with_name(path.name + _SIDECAR)


def model_fingerprint(path: Path) -> str:
    """The model file's size and the hashes of its first and last MiB: two quantisations or
    two fine-tunes differ there, and it costs two small reads, not a pass over gigabytes."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(_FINGERPRINT_BYTES))
        handle.seek(max(0, size - _FINGERPRINT_BYTES))
        digest.update(handle.read(_FINGERPRINT_BYTES))
    return f"{size}:{digest.hexdigest()[:32]}"


def cached_tokens(path: Path) -> list[int]:
    with path.open("rb") as handle:
        head = handle.read(12)
        count = int.from_bytes(head[8:12], "little") if len(head) == 12 else 0
        return read_cached_tokens(head + handle.read(4 * count))


def write_sidecar(path: Path, entry: ParkedEntry) -> None:
    data = {
        "session": entry.session,
        "size": entry.size,
        "last_used": entry.last_used,
        "identity": entry.identity.to_json(),
    }
    sidecar = sidecar_of(path)
    temporary = sidecar.with_name(sidecar.name + ".tmp")
    temporary.write_bytes(orjson.dumps(data))
    os.replace(temporary, sidecar)


def read_folder(folder: Path) -> list[ParkedEntry]:
    """The parked files a previous run left; a file without a readable sidecar is not ours to
    trust (it is left alone, and never restored)."""
    found = []
    for sidecar in sorted(folder.glob(f"kv-*.bin{_SIDECAR}")):
        path = sidecar.with_name(sidecar.name.removesuffix(_SIDECAR))
        try:
            data = orjson.loads(sidecar.read_bytes())
            session = str(data["session"])
            if parked_name(session) != path.name or not path.is_file():
                continue
            identity = ServerIdentity.from_json(data["identity"])
            entry = ParkedEntry(
                path.name, session, path.stat().st_size, float(data["last_used"]), identity
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log.warning("ignoring the parked file %s: its sidecar is unreadable (%s)", path, exc)
            continue
        found.append(entry)
    return found


def remove_files(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
