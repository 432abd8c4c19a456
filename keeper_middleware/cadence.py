"""When the item cadence calls for notes: the NOTES count toward it as the items they are worth.

Taking notes every N new items keeps each call's size in a band: the fixed part (system prompt,
task, NOTES, the exchange kept in view) plus zero to N items. Along a long conversation the NOTES
grow from nothing to their budget, and with a fixed N every call carries that growth: measured on
the benchmark's ``harder`` stream at 1M tokens, the NOTES grew from 94 to 1,094 tokens a call and
the prompt tokens per 100K stream tokens rose 17% from the first tenth to the last, all of it the
NOTES (the work calls and cuts per tenth stayed the same).

So the NOTES take the place of turns: they count toward the cadence as the items their size is
worth, twice, because they are in view at both ends of a cycle (right after a cut and at the next
one). The average call then stays the size it was with empty NOTES, and the conversation is noted
a little more often as the NOTES fill. The cadence never drops below ``floor`` items, so a chat of
short messages beside big NOTES is not noted after every message.

Pure: the caller counts the tokens.
"""

from __future__ import annotations

import math

NOTES_WEIGHT = 2
"""How many items' worth each item-sized piece of the NOTES counts for (both ends of a cycle)."""


def items_due(*, every: int, notes_tokens: int, new_tokens: int, new_items: int) -> int:
    """How many new items call for notes, given the NOTES' size and what the new items weigh.

    ``new_tokens`` are the tokens of the turns since the NOTES (not those kept in view as already
    noted), ``new_items`` how many items they hold. The answer is ``every`` with no NOTES or no
    measure of an item yet, and never under half of ``every`` (at least 1).
    """
    if every < 1:
        raise ValueError(f"every must be >= 1 item, got {every}")
    if notes_tokens < 0 or new_tokens < 0 or new_items < 0:
        raise ValueError(
            "notes_tokens, new_tokens and new_items are sizes and counts, never negative; got "
            f"{notes_tokens}, {new_tokens}, {new_items}"
        )
    floor = max(1, math.ceil(every / 2))
    if notes_tokens == 0 or new_items == 0 or new_tokens == 0:
        return every
    per_item = new_tokens / new_items
    worth = NOTES_WEIGHT * notes_tokens / per_item
    return max(floor, math.ceil(every - worth))
