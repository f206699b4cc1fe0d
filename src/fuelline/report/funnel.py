"""The funnel of a run, built only from the stages' stats.json files (and RUN/pipeline.json)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from fuelline.io.stage_layout import PIPELINE_FILE, STATS_FILE


def load_funnel(run_dir: str | os.PathLike) -> dict:
    """Every step's numbers in order, with a check that records in = out + dropped."""
    run_dir = Path(run_dir)
    layout_path = run_dir / PIPELINE_FILE
    if not layout_path.exists():
        raise FileNotFoundError(f"{run_dir}: no {PIPELINE_FILE}; is this the run directory of `fuelline run`?")
    steps = []
    for entry in orjson.loads(layout_path.read_bytes())["stages"]:
        stats_path = run_dir / entry["dir"] / STATS_FILE
        if entry["stage"] == "report" or not stats_path.exists():
            continue
        stats = orjson.loads(stats_path.read_bytes())
        dropped = stats.get("dropped", {})
        step = {
            "name": entry["name"], "stage": entry["stage"], "dir": entry["dir"],
            "records_in": stats["records_in"], "records_out": stats["records_out"],
            "dropped": dict(sorted(dropped.items(), key=lambda kv: -kv[1])),
            "dropped_total": sum(dropped.values()),
            "seconds": stats.get("wall_seconds"),
        }
        step["adds_up"] = step["records_in"] == step["records_out"] + step["dropped_total"]
        for extra in ("dedup", "tokenizer", "splits", "counters", "outputs", "schemas", "forms", "categories", "cache",
                      "decontaminate"):
            if stats.get(extra):
                step[extra] = stats[extra]
        steps.append(step)
    funnel = {"run": os.fspath(run_dir), "steps": steps}
    packed = next((s for s in steps if "splits" in s), None)
    if packed:
        splits = packed["splits"].values()
        tokens = sum(s["tokens"] for s in splits)
        supervised = sum(s["supervised_tokens"] for s in splits)
        funnel["tokens"] = {"total": tokens, "supervised": supervised, "masked": tokens - supervised,
                            "supervised_share": round(supervised / tokens, 4) if tokens else 0.0}
    return funnel


def other_counters(step: dict) -> dict[str, int]:
    """A step's counters but chat-prepare's schema.* and category.*, which both reports show as tables."""
    return {k: v for k, v in step.get("counters", {}).items() if not k.startswith(("schema.", "category."))}


def contamination_lines(report: dict | None) -> list[str]:
    """decontaminate's report in words: per evaluation set, its items found and in how many records."""
    if not report:
        return []
    lines = []
    for name, found in report["sets"].items():
        line = (f"{name}: {found['items_found']:,} of {found['items']:,} items found, in {found['records']:,} "
                f"training records ({report['action']})")
        unchecked = [f"{count:,} {what}" for count, what in ((found.get("items_blank", 0), "blank items"),
                                                              (found["parts_too_short"], "parts too short"))
                     if count]
        if unchecked:
            line += f"; not checked: {', '.join(unchecked)}"
        if found["examples"]:
            first = found["examples"][0]
            line += f"; e.g. item {first['item']} in {first['records']:,}: {first['text'][:60]!r}"
        lines.append(line)
    return lines


def format_funnel(funnel: dict) -> str:
    steps = funnel["steps"]
    first = steps[0]["records_in"] if steps else 0
    lines = [f"{'stage':<14}{'in':>11}{'out':>11}{'dropped':>10}{'kept':>9}{'of input':>10}{'seconds':>9}"]
    for s in steps:
        kept = s["records_out"] / s["records_in"] if s["records_in"] else 0.0
        overall = s["records_out"] / first if first else 0.0
        seconds = f"{s['seconds']:.1f}" if s["seconds"] is not None else "-"
        flag = "" if s["adds_up"] else "   (in != out + dropped!)"
        lines.append(f"{s['name']:<14}{s['records_in']:>11,}{s['records_out']:>11,}{s['dropped_total']:>10,}"
                     f"{kept:>9.2%}{overall:>10.2%}{seconds:>9}{flag}")
        for reason, n in s["dropped"].items():
            lines.append(f"    {reason:<30}{n:>10,}{n / s['records_in']:>9.2%}")
        for key in ("outputs", "schemas", "forms"):
            if s.get(key):
                lines.append(f"    {key}: " + ", ".join(f"{k} {v:,}" for k, v in s[key].items()))
        if s.get("categories"):
            lines.append(f"    {'category':<22}{'in':>9}{'train':>9}{'eval':>9}{'dropped':>9}")
        for name, n in s.get("categories", {}).items():
            lines.append(f"    {name:<22}{n['in']:>9,}{n['train']:>9,}{n['eval']:>9,}{n['dropped']:>9,}")
        if c := s.get("cache"):
            lines.append(f"    cache: {c['tokens']:,} tokens, supervised {c['supervised_share']:.2%}, {c['bytes']:,} "
                         f"bytes in {c['shards']} shard(s), {c['bytes_per_token']:,.1f} bytes/token ({c['format']}, "
                         f"{c['hidden_dtype']}), padding {c['padding_share']:.2%}")
        lines.extend(f"    {line}" for line in contamination_lines(s.get("decontaminate")))
        if counters := other_counters(s):
            lines.append("    (" + ", ".join(f"{k} {v:,}" for k, v in counters.items()) + ")")
    if "tokens" in funnel:
        t = funnel["tokens"]
        lines.append(f"tokens {t['total']:,}: supervised {t['supervised']:,} ({t['supervised_share']:.2%}), "
                     f"masked {t['masked']:,} ({1 - t['supervised_share']:.2%})")
    return "\n".join(lines)
