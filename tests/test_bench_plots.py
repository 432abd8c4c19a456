"""Plots a reader can read: every series visible, the legend off the data, "none" apart."""

from __future__ import annotations

import pytest

from keeper_bench.costs import CallRecord, summarize_costs
from keeper_bench.grader import SIMULATED_READER, GradeResult
from keeper_bench.plots import (
    NO_DISTANCE,
    cost_by_segment_figure,
    dodge,
    plot_score_by_distance,
    pyplot,
    score_by_distance_figure,
    series_style,
)

PNG = b"\x89PNG"
BUCKETS = {"1–4": (4, 4), "5–24": (3, 4), "25–99": (2, 4), NO_DISTANCE: (2, 2)}


def result(label: str, right_by_bucket: dict[str, tuple[int, int]]) -> GradeResult:
    return GradeResult(
        reader=SIMULATED_READER, label=label, scored=(), by_bucket=dict(right_by_bucket)
    )


def identical_arms(count: int, seeds: int = 1) -> list[GradeResult]:
    return [result(f"arm{i}", BUCKETS) for i in range(count) for _ in range(seeds)]


def series_lines(axes) -> dict[str, object]:
    """Each error-bar series' data line, by its label."""
    return {c.get_label(): c.lines[0] for c in axes.containers}


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("count", [2, 3, 11])
def test_series_that_score_the_same_are_drawn_apart(count):
    figure = score_by_distance_figure(identical_arms(count))
    lines = series_lines(figure.axes[0])
    series = [tuple(map(tuple, line.get_xydata())) for line in lines.values()]
    assert len(series) == count and len(set(series)) == count  # no series hides another
    styles = [series_style(i) for i in range(count)]
    assert len({s["marker"] for s in styles}) == count
    pyplot().close(figure)


def test_the_legend_sits_off_the_data():
    figure = score_by_distance_figure(identical_arms(11))
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    [legend] = figure.legends
    box = legend.get_window_extent(renderer)
    assert not any(_boxes_overlap(box, axes.get_window_extent(renderer)) for axes in figure.axes)
    pyplot().close(figure)


def test_none_is_a_panel_of_its_own_never_joined_to_the_distances():
    figure = score_by_distance_figure(identical_arms(3))
    distances, none = figure.axes[:2]
    assert NO_DISTANCE not in [t.get_text() for t in distances.get_xticklabels()]
    points = [c.lines[0] for c in none.containers]
    assert len(points) == 3
    assert all(len(line.get_xydata()) == 1 and line.get_linestyle() == "None" for line in points)
    pyplot().close(figure)


def test_seeds_of_one_arm_are_one_series_with_their_range():
    runs = [
        result("notes", {"1–4": (4, 4), "5–24": (4, 4)}),
        result("notes", {"1–4": (2, 4), "5–24": (4, 4)}),
        result("notes", {"1–4": (3, 4), "5–24": (4, 4)}),
    ]
    figure = score_by_distance_figure(runs)
    lines = series_lines(figure.axes[0])
    assert list(lines) == ["notes"]
    assert list(lines["notes"].get_ydata()) == [pytest.approx(0.75), 1.0]
    [container] = figure.axes[0].containers
    first_bar = container.lines[2][0].get_segments()[0]  # [[x, lowest], [x, highest]]
    assert (first_bar[0][1], first_bar[1][1]) == (pytest.approx(0.5), pytest.approx(1.0))
    assert "3 seeds" in figure.get_suptitle()
    pyplot().close(figure)


def test_dodge_spreads_series_symmetrically_within_a_bucket():
    assert dodge(0, 1) == 0.0
    shifts = [dodge(i, 5) for i in range(5)]
    assert shifts == sorted(shifts) and shifts[2] == pytest.approx(0.0)
    assert shifts[0] == pytest.approx(-shifts[-1]) and shifts[-1] - shifts[0] < 1.0


def _call(item: int, tokens: int) -> CallRecord:
    return CallRecord(
        index=item,
        kind="work",
        prompt_tokens=tokens,
        completion_tokens=1,
        cached_tokens=None,
        request_fingerprint=("t",),
        wall_seconds=1,
        model_seconds=1,
        item=item,
    )


def test_a_small_run_has_a_curve_not_one_point_and_equal_runs_stay_apart():
    history = {item: item * 1_000 for item in range(1, 31)}  # 30K tokens of history
    summary = summarize_costs([_call(i, 500 * i) for i in range(1, 31)], history)
    figure = cost_by_segment_figure(
        [("notes", summary), ("notes_rewrite", summary)], reader=SIMULATED_READER, metric="tokens"
    )
    first, second = (line.get_xydata() for line in figure.axes[0].get_lines()[:2])
    assert len(first) >= 8
    assert all(a[0] != b[0] and a[1] == b[1] for a, b in zip(first, second, strict=True))
    pyplot().close(figure)


def test_the_score_plot_is_written_as_a_png(tmp_path):
    path = plot_score_by_distance(identical_arms(4, seeds=3), tmp_path / "s.png")
    assert path.read_bytes().startswith(PNG)


def test_seeds_that_score_the_same_share_draw_even_when_the_float_mean_drifts(tmp_path):
    # three seeds at 1/10 each: their float mean is a hair above 0.1, and the range must not
    # come out negative (matplotlib refuses a negative error bar)
    tenth = {"1–4": (1, 10), "5–24": (7, 10), NO_DISTANCE: (1, 10)}
    runs = [result("arm", tenth) for _ in range(3)]
    figure = score_by_distance_figure(runs)
    lines = series_lines(figure.axes[0])
    assert list(lines) == ["arm"]
    pyplot().close(figure)
