"""Means over seeds with their 95% intervals (pure).

One seed's score says little: a stream's draw of names and questions moves an arm by a few
questions. Tables that compare arms over several seeds give each arm's mean with a Student t
interval, so a reader sees where two arms' intervals overlap (a tie) and where they do not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

T_95: dict[int, float] = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
}
"""Two-sided 95% Student t quantiles by degrees of freedom (1.96 beyond 10 is close enough
within 0.03 for more seeds: 2.228 at 10, 2.086 at 20)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean over ``count`` seeds and the half-width of its 95% interval (0 for one seed:
    no interval can be given, and the table says so with the count)."""

    mean: float
    half_width: float
    count: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def overlaps(self, other: Interval) -> bool:
        """Whether the two intervals share a value (the arms cannot be told apart)."""
        return self.low <= other.high and other.low <= self.high

    def cell(self) -> str:
        """``mean ± half`` (one decimal), or the value alone for one seed."""
        if self.count < 2:
            return f"{self.mean:g} (1 seed)"
        return f"{self.mean:.1f} ± {self.half_width:.1f}"


def t_interval(values: Sequence[float]) -> Interval:
    """The mean of ``values`` and its two-sided 95% Student t interval.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("an interval needs at least one value")
    count = len(values)
    mean = sum(values) / count
    if count < 2:
        return Interval(mean, 0.0, count)
    variance = sum((v - mean) ** 2 for v in values) / (count - 1)
    quantile = T_95.get(count - 1, 1.96 if count > 30 else 2.086)
    return Interval(mean, quantile * math.sqrt(variance / count), count)
