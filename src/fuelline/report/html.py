"""The funnel as a self-contained HTML page with PNG charts (matplotlib, embedded as base64)."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from fuelline.io.atomic import write_bytes_atomic
from fuelline.report.funnel import COUNTERS_SHOWN_ELSEWHERE

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}
td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}
.reason td:first-child{padding-left:2em;color:#666}.bad{color:#b00}img{max-width:100%;margin:1em 0}"""


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def charts(funnel: dict) -> dict[str, bytes]:
    """PNG bytes of the funnel, the drop reasons and the tokens-per-document histogram."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    steps = funnel["steps"]
    pictures = {}
    figure, axes = plt.subplots(figsize=(8, 3.5))
    labels = ["input"] + [s["name"] for s in steps]
    counts = [steps[0]["records_in"]] + [s["records_out"] for s in steps] if steps else [0]
    axes.bar(labels, counts, color="#4a7bb7")
    for x, n in enumerate(counts):
        axes.text(x, n, f"{n:,}", ha="center", va="bottom", fontsize=8)
    axes.set_ylabel("records")
    axes.set_title("records after each stage")
    pictures["funnel.png"] = _png(figure)
    plt.close(figure)

    reasons = sorted(((f"{s['name']}: {r}", n) for s in steps for r, n in s["dropped"].items()), key=lambda x: x[1])
    figure, axes = plt.subplots(figsize=(8, max(2.0, 0.3 * len(reasons) + 1)))
    if reasons:
        axes.barh([r for r, _ in reasons], [n for _, n in reasons], color="#c0504d")
    axes.set_xlabel("records dropped")
    axes.set_title("drop reasons")
    pictures["drop_reasons.png"] = _png(figure)
    plt.close(figure)

    categorized = next((s for s in steps if s.get("categories")), None)
    if categorized:
        pictures["categories.png"] = _category_chart(plt, categorized["categories"])

    packed = next((s for s in steps if "splits" in s), None)
    if packed:
        histogram = packed["splits"]["train"]["tokens_per_document"]["histogram"]
        figure, axes = plt.subplots(figsize=(8, 3.5))
        axes.bar(list(histogram), list(histogram.values()), color="#9bbb59")
        axes.set_xlabel("tokens per document")
        axes.tick_params(axis="x", labelrotation=30)
        axes.set_ylabel("documents (train)")
        axes.set_title("document lengths")
        pictures["tokens_per_document.png"] = _png(figure)
        plt.close(figure)
    return pictures


def _category_chart(plt, categories: dict[str, dict[str, int]]) -> bytes:
    """Stacked bars per category: train, eval and dropped conversations."""
    names = list(categories)
    figure, axes = plt.subplots(figsize=(8, max(2.0, 0.4 * len(names) + 1)))
    left = [0] * len(names)
    for outcome, color in (("train", "#4a7bb7"), ("eval", "#9bbb59"), ("dropped", "#c0504d")):
        values = [categories[n][outcome] for n in names]
        axes.barh(names, values, left=left, color=color, label=outcome)
        left = [a + b for a, b in zip(left, values)]
    axes.set_xlabel("conversations")
    axes.set_title("conversations per category")
    axes.legend(loc="lower right")
    data = _png(figure)
    plt.close(figure)
    return data


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
        counters = {k: v for k, v in s.get("counters", {}).items() if not k.startswith(COUNTERS_SHOWN_ELSEWHERE)}
        if counters:
            text = ", ".join(f"{html.escape(k)} {v:,}" for k, v in counters.items())
            rows.append(f"<tr class='reason'><td colspan='6'>{text}</td></tr>")
    tokens = ""
    if "tokens" in funnel:
        t = funnel["tokens"]
        tokens = (f"<p>{t['total']:,} tokens: {t['supervised']:,} supervised ({t['supervised_share']:.2%}), "
                  f"{t['masked']:,} masked ({1 - t['supervised_share']:.2%}).</p>")
    images = "".join(f"<img alt='{name}' src='data:image/png;base64,{base64.b64encode(data).decode()}'>"
                     for name, data in pictures.items())
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>fuelline funnel</title><style>{STYLE}</style>"
            f"</head><body><h1>Funnel of {html.escape(funnel['run'])}</h1><table><tr><th>stage</th><th>in</th>"
            f"<th>out</th><th>dropped</th><th>kept</th><th>seconds</th></tr>{''.join(rows)}</table>{tokens}{images}"
            f"</body></html>")


def write_report(funnel: dict, directory: Path) -> Path:
    """report.html and the PNG charts (also embedded in the page, which stands alone)."""
    pictures = charts(funnel)
    for name, data in pictures.items():
        write_bytes_atomic(directory / name, data)
    path = directory / "report.html"
    write_bytes_atomic(path, render_html(funnel, pictures).encode())
    return path
