"""The report's charts show what the funnel table says: small drops, rare reasons and the long tail of lengths.

The funnel is built by hand: a clean stage dropping 6% of 400,000 records under 15 reasons from 3 to 10,873
records, a dedup stage dropping 12, and a pack step whose train split has a long-tailed length histogram.
"""

import pytest

from fuelline.report.html import (
    charts,
    drop_reasons_figure,
    funnel_figure,
    lengths_figure,
    render_html,
)

REASON_SIZES = [3, 7, 12, 25, 40, 90, 150, 300, 500, 800, 1_200, 2_000, 3_000, 5_000, 10_873]  # sum 24,000
HISTOGRAM = {"0-15": 12_000, "16-31": 30_000, "32-63": 9_000, "64-127": 2_500, "128-255": 400, "256-511": 60,
             "512-1023": 9, "1024-2047": 2, "2048-4095": 1, "4096-": 0}


def _step(name, records_in, dropped, **extra):
    records_out = records_in - sum(dropped.values())
    return {"name": name, "stage": name, "dir": name, "records_in": records_in, "records_out": records_out,
            "dropped": dict(sorted(dropped.items(), key=lambda kv: -kv[1])), "dropped_total": sum(dropped.values()),
            "seconds": 1.0, "adds_up": True, **extra}


def _funnel(pack=True, categories=None):
    clean = _step("clean", 400_000, {f"reason_{i:02d}": n for i, n in enumerate(REASON_SIZES)})
    dedup = _step("dedup", 376_000, {"exact_duplicate": 12})
    steps = [clean, dedup]
    if categories:
        steps.append(_step("chat", 375_988, {}, categories=categories))
    if pack:
        lengths = {"min": 3, "mean": 41.3, "p50": 24.0, "p90": 70.5, "p99": 300.2, "max": 2_100,
                   "histogram": HISTOGRAM}
        split = {"documents": 53_972, "tokens": 2_229_043, "supervised_tokens": 2_000_000,
                 "tokens_per_document": lengths}
        steps.append(_step("pack", steps[-1]["records_out"], {},
                           splits={"train": split, "val": {**split, "documents": 0}}))
    return {"run": "/runs/test", "steps": steps}


def _texts(figure, gid):
    return [t.get_text() for t in figure.axes[0].texts if t.get_gid() == gid]


def test_funnel_labels_every_stage_with_its_drop_count_and_share_of_its_input():
    figure = funnel_figure(_funnel())
    assert _texts(figure, "drop") == ["\u221224,000 (6.0%)", "\u221212 (0.0032%)", "\u22120 (0.0%)"]
    assert _texts(figure, "kept") == ["400,000", "376,000", "375,988", "375,988"]


def test_drop_reasons_are_on_a_log_axis_with_one_labelled_bar_per_reason():
    figure = drop_reasons_figure(_funnel())
    axes = figure.axes[0]
    figure.draw_without_rendering()
    assert axes.get_xscale() == "log"
    names = [t.get_text() for t in axes.get_yticklabels()]
    assert sorted(names) == sorted([f"clean: reason_{i:02d}" for i in range(15)] + ["dedup: exact_duplicate"])
    labels = _texts(figure, "reason")
    assert len(labels) == 16
    assert "3 (0.00075%)" in labels and "10,873 (2.7%)" in labels and "12 (0.0032%)" in labels
    assert "1,200 (0.30%)" in labels
    # the smallest reason's bar is still a visible share of the largest one's (3 / 10,873 on a linear axis)
    left, _ = axes.get_xlim()
    visible = {round(p.get_width()): axes.transData.transform((p.get_width(), 0))[0]
               - axes.transData.transform((left, 0))[0] for p in axes.patches}
    assert visible[3] > 0.15 * visible[10_873]


def test_document_lengths_are_on_a_log_axis_with_the_percentiles_where_they_fall():
    figure = lengths_figure(_funnel())
    axes = figure.axes[0]
    assert axes.get_yscale() == "log"
    lines = {line.get_gid(): line for line in axes.get_lines()}
    assert sorted(lines) == ["p50", "p90", "p99"]
    bins = list(HISTOGRAM)
    for name, bin_label in (("p50", "16-31"), ("p90", "64-127"), ("p99", "256-511")):
        x = lines[name].get_xdata()[0]
        assert bins.index(bin_label) - 0.5 <= x <= bins.index(bin_label) + 0.5, name
    legend = [t.get_text() for t in axes.get_legend().get_texts()]
    assert legend == ["p50 24", "p90 70.5", "p99 300.2"]
    # the bin of a single 2,048+ token document is a visible bar: log axis, lower limit under 1
    assert axes.get_ylim()[0] < 1


def test_a_percentile_in_the_open_last_bin_is_marked_inside_it():
    funnel = _funnel()
    lengths = funnel["steps"][-1]["splits"]["train"]["tokens_per_document"]
    lengths.update(p99=6_000.0, max=9_000)
    x = {line.get_gid(): line.get_xdata()[0] for line in lengths_figure(funnel).axes[0].get_lines()}
    assert len(HISTOGRAM) - 1.5 <= x["p99"] <= len(HISTOGRAM) - 0.5


def test_charts_keeps_its_names_and_returns_png_bytes():
    pictures = charts(_funnel())
    assert list(pictures) == ["funnel.png", "drop_reasons.png", "tokens_per_document.png"]
    assert all(data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5_000 for data in pictures.values())
    assert render_html(_funnel(), pictures).count("data:image/png;base64,") == 3


def test_charts_without_a_pack_step_or_with_categories():
    categories = {"math": {"in": 10, "train": 7, "eval": 1, "dropped": 2}}
    assert list(charts(_funnel(pack=False, categories=categories))) == ["funnel.png", "drop_reasons.png",
                                                                          "categories.png"]
    assert lengths_figure(_funnel(pack=False)) is None


@pytest.mark.parametrize("funnel", [{"run": "empty", "steps": []},
                                    {"run": "zero", "steps": [_step("clean", 0, {})]}])
def test_charts_of_an_empty_run_do_not_fail(funnel):
    assert set(charts(funnel)) == {"funnel.png", "drop_reasons.png"}
