"""What the keeper did, counted: the figures a run is judged by besides its score."""

from __future__ import annotations

import operator
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
    """Cuts made: turns archived and a NOTES version written for them."""
    note_requests: int = 0
    """Note requests sent (first asks)."""
    reasks: int = 0
    """Note requests asked again because a reply failed its checks."""
    empty_note_replies: int = 0
    """Note replies with nothing in them."""
    garbage_note_lines: int = 0
    """Lines of note replies that were not change lines."""
    dropped_note_lines: int = 0
    """Change lines the checks left out of the NOTES."""
    thinking_retries: int = 0
    """Replies that thought to their limit and were asked again without thinking."""
    empty_retries: int = 0
    """Empty replies (no text, no tool call) asked again."""
    searches: int = 0
    """Archive searches answered."""
    search_refusals: int = 0
    """Archive searches refused (repeated, or asked again with nothing new archived)."""
    search_stops: int = 0
    """Times the model was told to stop searching and answer."""
    rules_injected: int = 0
    """Times the RULES were repeated next to a new question."""
    archive_turns: int = 0
    """Turns archived."""
    notes_tokens: int = 0
    """Tokens of the NOTES block as last written."""
    notes_entries_moved: int = 0
    """Entries moved from the NOTES to the archive to keep the NOTES within their budget."""
    peak_window: int = 0
    """Largest request, in tokens, the keeper let through."""
    prompt_tokens: int = 0
    """Prompt tokens the model reported, over every call."""
    completion_tokens: int = 0
    """Completion tokens the model reported, over every call."""
    cached_tokens: int = 0
    """Prompt tokens the server reported as read from its prefix cache."""
    management_prompt_tokens: int = 0
    """Of ``prompt_tokens``, those of the keeper's own calls (notes)."""
    management_completion_tokens: int = 0
    """Of ``completion_tokens``, those of the keeper's own calls."""

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
        # every field is an int: no deep copy needed (``asdict`` makes one, at every save);
        # read in one C call, as a request asks for them several times
        return dict(zip(_COUNTER_FIELDS, _read_counters(self), strict=True))

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
_read_counters = operator.attrgetter(*_COUNTER_FIELDS)
