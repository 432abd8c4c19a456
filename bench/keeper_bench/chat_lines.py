"""The chat lines and questions of ``keeper-bench index-cost``'s large archive: lines like
LoCoMo's (``Speaker (date): text``) made from 8 speakers and 45 words, or from words at natural
frequencies (``keeper_bench.zipf_words``)."""

from __future__ import annotations

import random

from keeper_bench.zipf_words import zipf_words

WORDS = [
    "garden",
    "painting",
    "concert",
    "hiking",
    "recipe",
    "guitar",
    "puppy",
    "camping",
    "novel",
    "museum",
    "beach",
    "pottery",
    "marathon",
    "bakery",
    "violin",
    "festival",
    "library",
    "workshop",
    "canoe",
    "sunset",
    "pottery",
    "yoga",
    "chess",
    "tennis",
    "photography",
    "adoption",
    "counseling",
    "volunteer",
    "parade",
    "picnic",
    "mountain",
    "lake",
    "family",
    "school",
    "career",
    "friendship",
    "support",
    "group",
    "charity",
    "shelter",
    "sculpture",
    "poem",
    "journal",
    "mural",
    "bicycle",
]
NAMES = ("Caroline", "Melanie", "Jon", "Gina", "Joanna", "Nate", "Tim", "John")
QUESTIONS = (
    "When did {a} go to the {w}?",
    "What did {a} say about the {w} and the {v}?",
    "Why did {a} start the {w}?",
    "How does {a} feel about {b}'s {w}?",
)


def content_words(rng: random.Random, count: int, vocabulary: str = "chat") -> list[str]:
    """``count`` words of a chat line or a question: the 45 ``WORDS`` (``chat``), or words at
    natural frequencies (``zipf``, ``keeper_bench.zipf_words``)."""
    return rng.sample(WORDS, count) if vocabulary == "chat" else zipf_words(rng, count)


def chat_message(rng: random.Random, n: int, sentences: int = 1, vocabulary: str = "chat") -> str:
    """A chat line like LoCoMo's: ``Speaker (date): text`` of ``sentences`` sentences."""
    who = NAMES[n % len(NAMES)]
    day = 1 + n // 40 % 28
    parts = []
    for _ in range(sentences):
        chosen = content_words(rng, 6, vocabulary)
        parts.append(
            f"I went to the {chosen[0]} with my {chosen[1]} friends and we talked about "
            f"{chosen[2]} and {chosen[3]} for a while near the {chosen[4]} {chosen[5]}."
        )
    return f"{who} ({day} May, 2023): " + " ".join(parts)
