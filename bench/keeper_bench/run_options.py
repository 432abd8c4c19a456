"""What one benchmark run is: its options, its model and its stream (``keeper-bench run``).

Everything a run folder's results depend on is in :class:`RunOptions`; ``run.json`` records it,
and a folder holding a different run is refused.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from pydantic import SecretStr

from keeper_bench.grader import SIMULATED_READER
from keeper_bench.reader.faults import FAULT_PRESETS, NO_FAULTS, ReaderFaults
from keeper_bench.reader.rot import NO_ROT, REALISTIC_ROT, ContextRot
from keeper_bench.streams import SIZES, StreamSpec, generate_stream, preset_spec
from keeper_middleware.config import resolve_size
from keeper_middleware.graphs.baselines import SUMMARY_BUDGET

DELIVERIES = ("messages", "tool")
_OPENAI = re.compile(r"^openai:(https?://[^/:\s]+(?::\d+)?(?:/[^:\s]*)?)(?::(\S+))?$")


# -- what a run is ------------------------------------------------------------------------------
def parse_faults(text: str) -> ReaderFaults:
    """``misread=0.05,empty_reply=0.02,seed=3`` → ``ReaderFaults``; "" or ``none`` → no faults;
    ``realistic`` (optionally ``realistic,seed=3``) → the stated realistic mix."""
    values: dict[str, Any] = {}
    parts = [p.strip() for p in text.split(",")]
    preset = parts[0] if parts and parts[0] in FAULT_PRESETS else None
    if preset is not None:
        parts = parts[1:]
        values = {f.name: getattr(FAULT_PRESETS[preset], f.name) for f in fields(ReaderFaults)}
    for part in parts:
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"--faults takes NAME=RATE pairs separated by commas, got {part!r}")
        values[name.strip()] = int(value) if name.strip() == "seed" else float(value)
    try:
        return ReaderFaults(**values)
    except TypeError as error:
        known = ", ".join(f.name for f in fields(ReaderFaults))
        raise ValueError(f"unknown fault in --faults {text!r}; known: {known}") from error


def parse_model(spec: str) -> tuple[str, str | None]:
    """("sim", None) or (base URL, model name or None) from ``sim`` / ``openai:URL[:MODEL]``."""
    if spec == "sim":
        return "sim", None
    match = _OPENAI.match(spec)
    if match is None:
        raise ValueError(
            f"--model {spec!r}: use sim (the simulated reader) or openai:URL[:MODEL], "
            "e.g. openai:http://127.0.0.1:8080/v1:qwen3-4b"
        )
    return match.group(1), match.group(2)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """One arm on one stream with one model: everything a run folder's results depend on."""

    arm: str
    stream: Path
    model: str = "sim"
    window: int = 32_768
    delivery: str = "messages"
    retriever: str = "keyword"
    embedder: str | None = None
    faults: ReaderFaults = NO_FAULTS
    rot: float = 0.0
    """Context rot of the simulated reader (``ContextRot.rate``; 0 off, see ``reader.rot``)."""
    timeout: float = 600.0
    max_tokens: int | None = None
    """A reply limit for a real model (some servers otherwise write to the end of their context)."""
    label: str | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(
                f"max_tokens must be a positive number of tokens, got {self.max_tokens}"
            )
        if self.delivery not in DELIVERIES:
            raise ValueError(f"delivery must be one of {DELIVERIES}, got {self.delivery!r}")
        if self.window < 1024:
            raise ValueError(f"window must be at least 1024 tokens, got {self.window}")
        kind, _ = parse_model(self.model)
        if kind != "sim" and (self.faults != NO_FAULTS or self.rot):
            raise ValueError("--faults and --rot only apply to the simulated reader (--model sim)")
        if isinstance(self.rot, bool) or not 0 <= self.rot <= 1:
            raise ValueError(
                f"rot must be a rate between 0 and 1 (e.g. {REALISTIC_ROT.rate}), got {self.rot!r}"
            )
        if self.embedder not in (None, "hashing", "minilm"):
            raise ValueError(f"embedder must be hashing or minilm, got {self.embedder!r}")
        if not (Path(self.stream) / "stream.jsonl").exists():
            raise FileNotFoundError(f"no stream.jsonl in {self.stream}: generate a stream first")

    @classmethod
    def create(cls, *, faults: str | ReaderFaults = NO_FAULTS, **given: Any) -> RunOptions:
        parsed = parse_faults(faults) if isinstance(faults, str) else faults
        return cls(faults=parsed, **{**given, "stream": Path(given["stream"]).resolve()})

    @property
    def reader(self) -> str:
        if self.model == "sim":
            return SIMULATED_READER
        url, name = parse_model(self.model)
        return f"{name or 'default'} at {url}"

    @staticmethod
    def identity_keys() -> frozenset[str]:
        return frozenset(
            {
                "arm",
                "model",
                "window",
                "delivery",
                "retriever",
                "embedder",
                "faults",
                "rot",
                "stream",
            }
        )

    def run_json(self, run_dir: Path) -> dict[str, Any]:
        return {
            "stream": os.path.relpath(Path(self.stream).resolve(), run_dir.resolve()),
            "reader": self.reader,
            "label": self.label or self.arm,
            "arm": self.arm,
            "model": self.model,
            "window": self.window,
            "delivery": self.delivery,
            "retriever": self.retriever,
            "embedder": self.embedder,
            "faults": {f.name: getattr(self.faults, f.name) for f in fields(self.faults)},
            "rot": self.rot,
        }


def make_model(options: RunOptions) -> BaseChatModel:
    return chat_model(
        options.model,
        faults=options.faults,
        rot=options.rot,
        window=options.window,
        timeout=options.timeout,
        max_tokens=options.max_tokens,
    )


def chat_model(
    spec: str,
    *,
    faults: ReaderFaults = NO_FAULTS,
    rot: float = 0.0,
    window: int = 32_768,
    timeout: float = 600.0,
    max_tokens: int | None = None,
) -> BaseChatModel:
    """The simulated reader (``sim``, with its faults, context rot and a summary budget of an
    eighth of ``window``) or a client of an OpenAI-compatible server (``openai:URL[:MODEL]``), at
    temperature 0."""
    if spec == "sim":
        from keeper_bench.reader import SimulatedReader

        return SimulatedReader(
            faults=faults,
            rot=ContextRot(rate=rot, seed=faults.seed) if rot else NO_ROT,
            summary_tokens=resolve_size(SUMMARY_BUDGET, window, name="summary_tokens"),
        )
    from langchain_openai import ChatOpenAI

    url, name = parse_model(spec)
    return ChatOpenAI(
        base_url=url,
        api_key=SecretStr(os.environ.get("OPENAI_API_KEY") or "none"),
        model=name or "default",
        stream_usage=True,
        timeout=timeout,
        max_retries=2,
        temperature=0,
        max_tokens=max_tokens,  # type: ignore[call-arg]
    )


def resolve_stream(spec: str, folder: Path, *, seed: int = 0) -> Path:
    """A stream folder as given, or a preset ``SIZE[:FAMILY+FAMILY...]`` generated into ``folder``
    (reused when it already holds that stream)."""
    given = Path(spec)
    if (given / "stream.jsonl").exists():
        return given
    size, _, families = spec.partition(":")
    if size not in SIZES:
        raise ValueError(
            f"--stream {spec!r} is neither a stream folder nor a preset; presets are "
            f"{', '.join(SIZES)}, optionally with families, e.g. small:rules+overdrawn"
        )
    chosen = frozenset({"base", *(f for f in re.split(r"[+,]", families) if f)})
    wanted = preset_spec(size, seed=seed, families=chosen)
    spec_file = folder / "spec.json"
    if (
        spec_file.exists()
        and (folder / "stream.jsonl").exists()
        and StreamSpec.from_json(json.loads(spec_file.read_text())["spec"]) == wanted
    ):
        return folder
    generate_stream(wanted, folder)
    return folder
