"""The funnel as a self-contained HTML page with PNG charts (matplotlib, embedded as base64)."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

from fuelline.io.atomic import write_bytes_atomic
from fuelline.report.funnel import other_counters

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}
td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}
.reason td:first-child{padding-left:2em;color:#666}.bad{color:#b00}img{max-width:100%;margin:1em 0}
td.examples{text-align:left;font-size:.85em;max-width:40em}"""


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def charts(funnel: dict) -> dict[str, bytes]:
    """PNG bytes of the funnel, the drop reasons, the categories (chat-prepare) and the document lengths."""
    steps = funnel["steps"]
    pictures = {"funnel.png": _png(funnel_figure(funnel)), "drop_reasons.png": _png(drop_reasons_figure(funnel))}
    categorized = next((s for s in steps if s.get("categories")), None)
    if categorized:
        pictures["categories.png"] = _png(categories_figure(categorized["categories"]))
    lengths = lengths_figure(funnel)
    if lengths is not None:
        pictures["tokens_per_document.png"] = _png(lengths)
    return pictures


def _figure(width: float, height: float):
    """A matplotlib Figure outside pyplot: no global state, no backend to pick, nothing to close."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    return figure, figure.subplots()


def _share(n: int, total: int) -> str:
    """n / total as a percentage with enough digits that a small drop does not print as 0.0%."""
    if not total:
        return "n/a"
    percent = 100 * n / total
    if percent == 0 or percent >= 1:
        return f"{percent:.1f}%"
    digits = min(6, 1 - math.floor(math.log10(percent)))  # two significant figures: 0.042%, 0.0031%
    return f"{percent:.{digits}f}%"


def count_label(n: int, records_in: int) -> str:
    """A count and its share of the stage's input, e.g. "22,291 (5.6%)"."""
    return f"{n:,} ({_share(n, records_in)})"


def funnel_figure(funnel: dict):
    """Records after each stage, each bar topped by what the stage dropped (red) and labelled with it.

    On a linear axis a 6% drop is a sliver, so every stage's bar also carries its drop as text: the count and
    its share of the stage's input, above the kept count (texts with gid "drop" and "kept").
    """
    steps = funnel["steps"]
    figure, axes = _figure(8, 3.5)
    labels = ["input"] + [s["name"] for s in steps]
    kept = [steps[0]["records_in"] if steps else 0] + [s["records_out"] for s in steps]
    dropped = [0] + [max(s["records_in"] - s["records_out"], 0) for s in steps]
    axes.bar(labels, kept, color="#4a7bb7", label="kept")
    axes.bar(labels, dropped, bottom=kept, color="#c0504d", label="dropped by the stage")
    for x, (n, lost) in enumerate(zip(kept, dropped)):
        top = n + lost
        axes.annotate(f"{n:,}", (x, top), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                      fontsize=8, gid="kept")
        if x:
            label = "\u2212" + count_label(lost, steps[x - 1]["records_in"])  # a minus sign: −22,291 (5.6%)
            axes.annotate(label, (x, top), xytext=(0, 13), textcoords="offset points", ha="center", va="bottom",
                          fontsize=8, color="#c0504d", gid="drop")
    axes.set_ylim(0, max(kept[0], 1) * 1.25)
    axes.yaxis.set_major_formatter("{x:,.0f}")
    axes.set_ylabel("records")
    axes.set_title("records after each stage, and what each stage dropped")
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return figure


def drop_reasons_figure(funnel: dict):
    """One bar per (stage, reason) on a log axis, labelled with its count and share of the stage's input.

    Reasons span several orders of magnitude (a dozen records beside a hundred thousand); on a linear axis the
    small ones are empty bars, so the axis is logarithmic and every bar carries its number as text.
    """
    reasons = sorted(((f"{s['name']}: {r}", n, s["records_in"]) for s in funnel["steps"]
                      for r, n in s["dropped"].items()), key=lambda x: x[1])
    figure, axes = _figure(8, max(2.0, 0.3 * len(reasons) + 1))
    axes.set_xscale("log")
    largest = max((n for _, n, _ in reasons), default=1)
    if reasons:
        axes.barh([r for r, _, _ in reasons], [n for _, n, _ in reasons], color="#c0504d")
        for y, (_, n, records_in) in enumerate(reasons):
            axes.annotate(count_label(n, records_in), (max(n, 0.5), y), xytext=(3, 0),
                          textcoords="offset points", ha="left", va="center", fontsize=8, gid="reason")
    decades = math.log10(max(largest, 1) / 0.5)
    axes.set_xlim(0.5, max(largest, 1) * 10 ** (0.35 * decades + 0.6))  # room on the right for the labels
    axes.set_xlabel("records dropped (log scale; label: count and share of the stage's input)")
    axes.set_title("drop reasons")
    return figure


def _bin_position(value: float, bins: list[str], largest: float) -> float | None:
    """Where `value` falls on a bar chart of bins labelled "lo-hi" (hi inclusive) or "lo-" (open), one unit
    per bar, interpolated linearly inside its bar; None when the labels are not of that form."""
    for index, label in enumerate(bins):
        low, _, high = label.partition("-")
        try:
            low_value = float(low)
            end = float(high) + 1 if high else max(largest + 1, 2 * low_value, low_value + 1)
        except ValueError:
            return None
        if value < end or index == len(bins) - 1:
            return index - 0.5 + min(max((value - low_value) / (end - low_value), 0.0), 1.0)
    return None


def lengths_figure(funnel: dict):
    """Histogram of the train split's tokens per document, log y, with p50/p90/p99 as dashed lines.

    A few long documents decide the sequence length and the cost of padding, so the y axis is logarithmic
    (a bin of 3 documents beside one of 30,000 stays visible) and the percentiles are drawn where they fall.
    None when the run has no pack step.
    """
    packed = next((s for s in funnel["steps"] if "splits" in s), None)
    if packed is None:
        return None
    lengths = packed["splits"]["train"]["tokens_per_document"]
    histogram = lengths["histogram"]
    bins, counts = list(histogram), list(histogram.values())
    figure, axes = _figure(8, 3.5)
    axes.bar(bins, counts, color="#9bbb59")
    for x, n in enumerate(counts):
        if n:
            axes.annotate(f"{n:,}", (x, n), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                          fontsize=7)
    axes.set_yscale("log")
    axes.set_ylim(0.7, max(counts + [1]) * 4)
    for name, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
        x = _bin_position(lengths[name], bins, lengths.get("max", 0))
        if x is not None:
            value = f"{lengths[name]:,.1f}".removesuffix(".0")  # np.percentile interpolates: 70.5
            axes.axvline(x, color="#333", linestyle=style, linewidth=1.2, label=f"{name} {value}",
                         gid=name)
    if axes.get_lines():
        axes.legend(loc="upper right", fontsize=8, title="tokens per document")
    axes.set_xlabel("tokens per document")
    axes.tick_params(axis="x", labelrotation=30)
    axes.set_ylabel("documents (train, log scale)")
    axes.set_title(f"document lengths: min {lengths['min']:,}, mean {lengths['mean']:,.1f}, "
                   f"max {lengths['max']:,}")
    return figure


def categories_figure(categories: dict[str, dict[str, int]]):
    """Stacked bars per category: train, eval and dropped conversations."""
    names = list(categories)
    figure, axes = _figure(8, max(2.0, 0.4 * len(names) + 1))
    left = [0] * len(names)
    for outcome, color in (("train", "#4a7bb7"), ("eval", "#9bbb59"), ("dropped", "#c0504d")):
        values = [categories[n][outcome] for n in names]
        axes.barh(names, values, left=left, color=color, label=outcome)
        left = [a + b for a, b in zip(left, values)]
    axes.set_xlabel("conversations")
    axes.set_title("conversations per category")
    axes.legend(loc="lower right")
    return figure


def render_html(funnel: dict, pictures: dict[str, bytes]) -> str:
    rows = []
    for s in funnel["steps"]:
        css = "" if s["adds_up"] else " class='bad'"
        kept = s["records_out"] / s["records_in"] if s["records_in"] else 0.0
        rows.append(f"<tr{css}><td>{html.escape(s['name'])}</td><td>{s['records_in']:,}</td><td>{s['records_out']:,}</td>"
                    f"<td>{s['dropped_total']:,}</td><td>{kept:.2%}</td><td>{s['seconds'] or 0:.1f}</td></tr>")
        for reason, n in s["dropped"].items():
            rows.append(f"<tr class='reason'><td>{html.escape(reason)}</td><td></td><td></td><td>{n:,}</td>"
                        f"<td>{n / s['records_in']:.2%}</td><td></td></tr>")
        for name, n in s.get("categories", {}).items():
            rows.append(f"<tr class='reason'><td>category {html.escape(name)}</td><td>{n['in']:,}</td>"
                        f"<td>{n['train'] + n['eval']:,}</td><td>{n['dropped']:,}</td>"
                        f"<td>train {n['train']:,} · eval {n['eval']:,}</td><td></td></tr>")
        if counters := other_counters(s):
            text = ", ".join(f"{html.escape(k)} {v:,}" for k, v in counters.items())
            rows.append(f"<tr class='reason'><td colspan='6'>{text}</td></tr>")
    tables = "".join(contamination_table(s["name"], s["decontaminate"]) for s in funnel["steps"] if s.get("decontaminate"))
    tokens = ""
    if "tokens" in funnel:
        t = funnel["tokens"]
        tokens = (f"<p>{t['total']:,} tokens: {t['supervised']:,} supervised ({t['supervised_share']:.2%}), "
                  f"{t['masked']:,} masked ({1 - t['supervised_share']:.2%}).</p>")
    images = "".join(f"<img alt='{name}' src='data:image/png;base64,{base64.b64encode(data).decode()}'>"
                     for name, data in pictures.items())
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>fuelline funnel</title><style>{STYLE}</style>"
            f"</head><body><h1>Funnel of {html.escape(funnel['run'])}</h1><table><tr><th>stage</th><th>in</th>"
            f"<th>out</th><th>dropped</th><th>kept</th><th>seconds</th></tr>{''.join(rows)}</table>{tables}{tokens}{images}"
            f"</body></html>")


def contamination_table(step: str, report: dict) -> str:
    """decontaminate's report: one row per evaluation set, its items found, the training records that
    hold them, and the items found in the most records."""
    rows = []
    for name, found in report["sets"].items():
        examples = "<br>".join(f"item {e['item']}{' (' + html.escape(str(e['id'])) + ')' if e['id'] is not None else ''}"
                               f" in {e['records']:,}: {html.escape(e['text'])}" for e in found["examples"])
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{found['items']:,}</td><td>{found['items_found']:,}</td>"
                    f"<td>{found['records']:,}</td><td>{found.get('items_blank', 0):,}</td>"
                    f"<td class='examples'>{examples}</td></tr>")
    rule = report["rule"]
    return (f"<h2>Evaluation items found by {html.escape(step)} ({html.escape(report['action'])})</h2><p>word "
            f"{rule['ngram']}-grams (CJK: characters), an item found when a record holds {rule['threshold']:.0%} of its "
            f"n-grams</p><table class='contamination'><tr><th>evaluation set</th><th>items</th><th>found</th>"
            f"<th>training records</th><th>blank (not checked)</th><th>examples</th></tr>{''.join(rows)}</table>")


def write_report(funnel: dict, directory: Path) -> Path:
    """report.html and the PNG charts (also embedded in the page, which stands alone)."""
    pictures = charts(funnel)
    for name, data in pictures.items():
        write_bytes_atomic(directory / name, data)
    path = directory / "report.html"
    write_bytes_atomic(path, render_html(funnel, pictures).encode())
    return path
