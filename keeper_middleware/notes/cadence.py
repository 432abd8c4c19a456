"""When the item cadence calls for notes: the NOTES count toward it as the items they are worth.

Taking notes every N new items keeps each call's size in a band: the fixed part (system prompt,
task, NOTES, the exchange kept in view) plus zero to N items. Along a long conversation the NOTES
grow from nothing to their budget, and with a fixed N every call carries that growth: measured on
the benchmark's ``harder`` stream at 1M tokens, the NOTES grew from 94 to 1,094 tokens a call and
the prompt tokens per 100K stream tokens rose 17% from the first tenth to the last, all of it the
NOTES (the work calls and cuts per tenth stayed the same).

So the NOTES take the place of turns: they count toward the cadence as the items their size is
worth, and the conversation is noted a little more often as they fill. How much they count is a
trade between two costs that cannot both stay flat. The average call carries the NOTES and half a
cycle of new turns; every cut sends the new NOTES and the turns kept in view again, which a
server's prefix cache cannot serve. Counted twice (the NOTES are in view at both ends of a
cycle), they keep the average call the size it was with empty NOTES, but the cycle shortens by
all of their growth: on the ``harder`` stream at 10M tokens, 1,339 cuts instead of 920, and the
uncached prompt tokens per 100K stream tokens grew 20% from the first tenth to the last while the
prompt stayed flat (−2%). Not counted, the prompt grows with the NOTES (+21% at 10M). Counted once,
the growth is shared: the average call grows by half the NOTES' growth and the cycle shortens by
the other half; measured at 10M, prompt +10%, uncached +12% (and at 1M +13%, +9%), scores within
noise (simulated reader), 6.7% fewer uncached tokens over the run and 18% more prompt tokens
(``bench/results/notes_cost.md``, "Cadence and the stream's edges"). Counting the NOTES' budget
from the start instead of their size keeps the cadence constant, and the prompt grows with the
NOTES (+22% to +27% at 10M). The cadence never drops below ``floor`` items, so a chat of short
messages beside big NOTES is not noted after every message.

Pure: the caller counts the tokens.
"""

from __future__ import annotations

import math

from keeper_middleware.errors import ConfigurationError

NOTES_WEIGHT = 1
"""How many items' worth each item-sized piece of the NOTES counts for: once, so the NOTES'
growth is shared between the calls' size and how often the NOTES are sent again."""


def items_due(*, every: int, notes_tokens: int, new_tokens: int, new_items: int) -> int:
    """How many new items call for notes, given the NOTES' size and what the new items weigh.

    ``new_tokens`` are the tokens of the turns since the NOTES (not those kept in view as already
    noted), ``new_items`` how many items they hold. The answer is ``every`` with no NOTES or no
    measure of an item yet, and never under half of ``every`` (at least 1).
    """
    if every < 1:
        raise ConfigurationError(f"every must be >= 1 item, got {every}")
    if notes_tokens < 0 or new_tokens < 0 or new_items < 0:
        raise ConfigurationError(
            "notes_tokens, new_tokens and new_items are sizes and counts, never negative; got "
            f"{notes_tokens}, {new_tokens}, {new_items}"
        )
    floor = max(1, math.ceil(every / 2))
    if notes_tokens == 0 or new_items == 0 or new_tokens == 0:
        return every
    per_item = new_tokens / new_items
    worth = NOTES_WEIGHT * notes_tokens / per_item
    return max(floor, math.ceil(every - worth))
