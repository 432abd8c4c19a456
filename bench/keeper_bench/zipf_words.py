"""Words drawn as natural text draws them: a large vocabulary, each word's frequency falling with
its rank (Zipf's law), for archives whose search cost should not hinge on a tiny word list.

The chat lines of ``keeper-bench index-cost`` are built from 8 names and 45 words, so every word
a question names stands in about one passage in eight, and a keyword search at 1M messages ranks
by three or four words of 125,000 passages each. Natural text is not like that: most of its
words are rare. With ``--vocabulary zipf`` the archive and the questions draw their words from
50,000 made-up words (syllables, so no stemmer folds two together) at Zipf frequencies
(exponent 1.07, as measured for English), the questions as the messages do.
"""

from __future__ import annotations

import itertools
import random
from functools import cache

SYLLABLES = tuple(
    consonant + vowel for consonant in "bdfgklmnprstvz" for vowel in ("a", "e", "i", "o", "u")
)
SIZE = 50_000
EXPONENT = 1.07


@cache
def vocabulary() -> tuple[str, ...]:
    """The made-up words, rank 1 first: every word of two and then three syllables."""
    words = (
        "".join(parts) for length in (2, 3) for parts in itertools.product(SYLLABLES, repeat=length)
    )
    return tuple(itertools.islice(words, SIZE))


@cache
def _cumulative() -> list[float]:
    return list(itertools.accumulate(1.0 / rank**EXPONENT for rank in range(1, SIZE + 1)))


def zipf_words(rng: random.Random, count: int) -> list[str]:
    """``count`` words drawn independently at their Zipf frequencies."""
    return rng.choices(vocabulary(), cum_weights=_cumulative(), k=count)
