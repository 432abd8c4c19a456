"""Plots a reader can read: every series visible, the legend off the data, the reader named.

Several arms often score the same (the keeper's three arms sit on one line), so each series is
drawn with its own marker and line style and shifted a little sideways ("dodged") within its
distance bucket: identical series show side by side instead of hiding each other. The legend
sits outside the axes. Questions the history cannot answer ("none") are not a distance, so they
get a panel of their own and are never joined to the distance curve. Runs of one arm over
several seeds are drawn as the mean with a bar from the lowest to the highest seed.

matplotlib's Agg backend is used (no display).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keeper_bench.costs import CostSummary
from keeper_bench.grader import GradeResult
from keeper_bench.questions import BUCKET_LABELS
from keeper_bench.report import reader_label

NO_DISTANCE = "none"
"""The bucket of questions the history cannot answer."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "d", "p")
COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#b8860b",
)  # fmt: skip
LINE_STYLES = ("-", "--", "-.", ":")
DODGE_WIDTH = 0.6
"""The share of a bucket's width the series of one bucket spread over."""


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or an error that says how to install it."""
    try:
        import matplotlib
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError("plots need matplotlib: pip install keeper-bench") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def series_style(index: int) -> dict[str, Any]:
    """Colour, marker and line style of the ``index``-th series: no two of the first 12 share a
    marker, and the line style cycles too, so series stay apart in grey print."""
    return {
        "color": COLOURS[index % len(COLOURS)],
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": LINE_STYLES[(index // 2) % len(LINE_STYLES)],
    }


def dodge(index: int, count: int) -> float:
    """The sideways shift of series ``index`` of ``count`` within a bucket (0 for one series)."""
    if count <= 1:
        return 0.0
    step = DODGE_WIDTH / (count - 1)
    return -DODGE_WIDTH / 2 + index * step


def grouped(results: Sequence[GradeResult]) -> dict[str, list[GradeResult]]:
    """Results by label, in first-seen order: one series per arm, one result per seed."""
    groups: dict[str, list[GradeResult]] = {}
    for index, result in enumerate(results):
        groups.setdefault(result.label or f"run {index + 1}", []).append(result)
    return groups


def bucket_shares(results: Sequence[GradeResult], bucket: str) -> list[float]:
    """The share right in ``bucket`` for each result that asked about it."""
    return [
        r.by_bucket[bucket][0] / r.by_bucket[bucket][1]
        for r in results
        if bucket in r.by_bucket and r.by_bucket[bucket][1]
    ]


def _spread(shares: Sequence[float]) -> tuple[float, float, float]:
    """Mean and the distances down to the lowest and up to the highest share: never negative,
    though the float mean of equal shares can land a hair above or below them."""
    mean = sum(shares) / len(shares)
    return mean, max(0.0, mean - min(shares)), max(0.0, max(shares) - mean)


def save(figure: Any, path: Path | str) -> Path:
    """Write the figure (with everything outside its axes, the legend included) and close it."""
    out = Path(path)
    figure.savefig(out, dpi=100, bbox_inches="tight")
    pyplot().close(figure)
    return out


def plot_score_by_distance(results: Sequence[GradeResult], path: Path | str) -> Path:
    """Share right per distance bucket, one dodged series per arm (mean and seed range), with
    the unanswerable questions in a panel of their own."""
    return save(score_by_distance_figure(results), path)


def score_by_distance_figure(results: Sequence[GradeResult]) -> Any:
    """The figure of :func:`plot_score_by_distance`: axes 0 the distances, axes 1 "none"."""
    plt = pyplot()
    groups = grouped(results)
    asked = [b for b in BUCKET_LABELS if any(b in r.by_bucket for r in results)]
    distances = [b for b in asked if b != NO_DISTANCE]
    seeds = max((len(g) for g in groups.values()), default=1)
    figure, (axes, none_axes) = plt.subplots(
        1,
        2,
        figsize=(9.5, 4.6),
        sharey=True,
        gridspec_kw={"width_ratios": [max(1, len(distances)), 1.2], "wspace": 0.08},
    )
    handles = []
    for index, (label, group) in enumerate(groups.items()):
        style = series_style(index)
        shift = dodge(index, len(groups))
        xs, ys, low, high = [], [], [], []
        for position, bucket in enumerate(distances):
            shares = bucket_shares(group, bucket)
            if shares:
                mean, below, above = _spread(shares)
                xs.append(position + shift)
                ys.append(mean)
                low.append(below)
                high.append(above)
        line = axes.errorbar(
            xs, ys, yerr=[low, high], capsize=2, markersize=6, linewidth=1.3, label=label, **style
        )
        handles.append(line)
        none_shares = bucket_shares(group, NO_DISTANCE)
        if none_shares:
            mean, below, above = _spread(none_shares)
            none_axes.errorbar(
                [shift],
                [mean],
                yerr=[[below], [above]],
                capsize=2,
                markersize=6,
                color=style["color"],
                marker=style["marker"],
                linestyle="none",
            )
    axes.set_xticks(range(len(distances)), distances)
    axes.set_xlim(-0.6, len(distances) - 0.4)
    axes.set_ylim(-0.05, 1.05)
    axes.set_xlabel("distance back (batches)")
    axes.set_ylabel("share right" + (" (mean; bar: lowest–highest seed)" if seeds > 1 else ""))
    axes.grid(axis="y", alpha=0.3)
    none_axes.set_xticks([0], ["history never says"])
    none_axes.set_xlim(-0.6, 0.6)
    none_axes.set_xlabel('answer "unknown"')
    none_axes.grid(axis="y", alpha=0.3)
    runs = f", {seeds} seeds" if seeds > 1 else ""
    figure.suptitle(f"Score by distance ({reader_label(results)}{runs})")
    if handles:
        figure.legend(
            handles,
            list(groups),
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=3,
            frameon=False,
            fontsize="small",
        )
    return figure


def _thousands() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(
        lambda value, _: f"{value / 1e6:g}M" if value >= 1e6 else f"{value / 1e3:g}K"
    )


def plot_cost_by_segment(
    rows: Sequence[tuple[str, CostSummary]],
    path: Path | str,
    *,
    reader: str,
    metric: str = "minutes",
) -> Path:
    """Minutes (or tokens) per 100K tokens of history, segment by segment: flat means it scales.
    Rows with the same label (seeds) are averaged segment by segment."""
    return save(cost_by_segment_figure(rows, reader=reader, metric=metric), path)


def cost_by_segment_figure(
    rows: Sequence[tuple[str, CostSummary]], *, reader: str, metric: str = "minutes"
) -> Any:
    """The figure of :func:`plot_cost_by_segment`."""
    if metric not in ("minutes", "tokens"):
        raise ValueError(f"metric must be 'minutes' or 'tokens', got {metric!r}")
    plt = pyplot()
    groups: dict[str, list[CostSummary]] = {}
    for label, summary in rows:
        groups.setdefault(label, []).append(summary)
    figure, axes = plt.subplots(figsize=(9.5, 4.6))
    for index, (label, summaries) in enumerate(groups.items()):
        count = min(len(s.segments) for s in summaries)
        if not count:
            continue
        first = summaries[0].segments[0]
        shift = dodge(index, len(groups)) * (first.end_tokens - first.start_tokens) / 2
        xs = [(summaries[0].segments[i].end_tokens + shift) / 1000 for i in range(count)]
        ys = [
            sum(
                s.segments[i].minutes_per_100k
                if metric == "minutes"
                else s.segments[i].tokens_per_100k
                for s in summaries
            )
            / len(summaries)
            for i in range(count)
        ]
        axes.plot(xs, ys, label=label, markersize=5, linewidth=1.3, **series_style(index))
    axes.set_xlabel("history so far (thousand tokens; series shifted sideways to stay apart)")
    axes.set_ylabel(f"{metric} per 100K tokens of history")
    if metric == "tokens":
        axes.yaxis.set_major_formatter(_thousands())
    axes.set_title(f"{metric.capitalize()} per 100K tokens of history ({reader})")
    axes.grid(alpha=0.3)
    if groups:
        axes.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize="small")
    return figure
