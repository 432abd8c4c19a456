"""What the keeper did, counted: the figures a run is judged by besides its score."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from langchain_core.messages import BaseMessage


@dataclass(slots=True)
class Counters:
    """Per-session totals. Plain integers so they persist as JSON beside the archive."""

    model_calls: int = 0
    """Calls for the agent's own work."""
    notes_calls: int = 0
    """Calls made to take notes (first asks and re-asks)."""
    cuts: int = 0
    note_requests: int = 0
    reasks: int = 0
    empty_note_replies: int = 0
    garbage_note_lines: int = 0
    dropped_note_lines: int = 0
    thinking_retries: int = 0
    """Replies that thought to their limit and were asked again without thinking."""
    empty_retries: int = 0
    """Empty replies (no text, no tool call) asked again."""
    searches: int = 0
    search_refusals: int = 0
    search_stops: int = 0
    rules_injected: int = 0
    archive_turns: int = 0
    notes_tokens: int = 0
    """Tokens of the NOTES block as last written."""
    notes_entries_moved: int = 0
    """Entries moved from the NOTES to the archive to keep the NOTES within their budget."""
    peak_window: int = 0
    """Largest request, in tokens, the keeper let through."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    management_prompt_tokens: int = 0
    management_completion_tokens: int = 0

    def add_usage(self, reply: BaseMessage, *, management: bool) -> None:
        """Add a reply's usage data (as LangChain reports it) to the totals."""
        usage: Any = getattr(reply, "usage_metadata", None) or {}
        prompt = int(usage.get("input_tokens") or 0)
        completion = int(usage.get("output_tokens") or 0)
        details = usage.get("input_token_details") or {}
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cached_tokens += int(details.get("cache_read") or 0)
        if management:
            self.management_prompt_tokens += prompt
            self.management_completion_tokens += completion

    def to_json(self) -> dict[str, int]:
        # every field is an int: no deep copy needed (``asdict`` makes one, at every save)
        return {name: getattr(self, name) for name in _COUNTER_FIELDS}

    @classmethod
    def from_json(cls, data: object) -> Counters:
        if not isinstance(data, dict):
            return cls()
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})

    @property
    def cached_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


_COUNTER_FIELDS = tuple(f.name for f in fields(Counters))
