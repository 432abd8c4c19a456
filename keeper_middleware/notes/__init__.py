"""The NOTES block and how the keeper takes notes: change lines, the note dialogue, the
checks a change passes, the budget, recall of entries that left, and the RULES.
"""

from keeper_middleware.notes.block import Notes, parse_notes, render_notes

__all__ = ["Notes", "parse_notes", "render_notes"]
