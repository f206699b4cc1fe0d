"""Exact-duplicate keys of the real poetry corpus on one core: fuelline against sha256.

Baseline: sha256 of each text's UTF-8 bytes, no normalization (what a hand-written exact dedup
does), against fuelline's `exact_keys` on the same raw texts. fuelline's dedup stage normalizes
first (its `Normalizer`: NFKC, lower case, punctuation and whitespace removed), so that is timed
too, against sha256 after the same normalizer: equal work on both sides. Texts are the same as
in bench_minhash.py; the number of distinct keys shows how many documents each key would keep.

    benchmarks/.venv/bin/python benchmarks/bench_exact.py [--repeats 3] [--limit K]
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import sys

from bench_minhash import CORPUS, poem_texts
from common import SMOKE_RECORDS, best_of, parse_args, write_result


def sha256_keys(texts: list[str]) -> list[bytes]:
    return [hashlib.sha256(t.encode()).digest() for t in texts]


def normalized_sha256_keys(normalizer):
    def keys(texts: list[str]) -> list[bytes]:
        return [hashlib.sha256(normalizer(t).encode()).digest() for t in texts]
    return keys


def fuelline_tools() -> dict:
    """fuelline's key function on raw and on normalized text, and sha256 after the same normalizer.

    `exact_keys` takes texts that are already normalized (the dedup stage normalizes once for
    both the exact key and the shingles); if it ever takes the normalizer, it is passed.
    """
    try:
        from fuelline.dedup.exact import exact_keys
        from fuelline.dedup.normalize import Normalizer
    except ImportError:
        return {}
    normalizer = Normalizer()
    takes_normalizer = len(inspect.signature(exact_keys).parameters) >= 2
    print(f"fuelline.dedup.exact.exact_keys{inspect.signature(exact_keys)}")
    if takes_normalizer:
        return {"Normalizer() + sha256": normalized_sha256_keys(normalizer),
                "fuelline exact_keys(texts, Normalizer())": lambda texts: exact_keys(texts, normalizer)}
    return {"fuelline exact_keys (raw text, no normalization)": exact_keys,
            "Normalizer() + sha256": normalized_sha256_keys(normalizer),
            "fuelline Normalizer() + exact_keys (as its dedup stage)":
                lambda texts: exact_keys([normalizer(t) for t in texts])}


def distinct(keys) -> int:
    try:
        return len(set(keys))
    except TypeError:  # an array of keys
        import numpy as np
        keys = np.asarray(keys)
        return len(np.unique(keys.reshape(len(keys), -1), axis=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="only the first K documents (a quick run)")
    args = parse_args(parser)
    if not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus")
    if args.smoke:
        args.limit, args.repeats = args.limit or SMOKE_RECORDS, 1
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    texts = poem_texts(args.limit)
    print(f"{len(texts):,} texts; one core, best of {args.repeats}")
    tools = {"sha256 of the UTF-8 text (baseline)": sha256_keys, **fuelline_tools()}
    rows = {}
    for name, fn in tools.items():
        seconds, keys = best_of(lambda: fn(texts), args.repeats)
        rows[name] = {"seconds": round(seconds, 3), "docs_per_s": round(len(texts) / seconds),
                      "distinct_keys": distinct(keys)}
        print(f"{name:<56} {seconds:7.3f} s {len(texts) / seconds:>12,.0f} docs/s "
              f"{rows[name]['distinct_keys']:>9,} distinct")
    # Each fuelline row against the baseline doing the same normalization (or none).
    ratios = {}
    for name in rows:
        if name.startswith("fuelline"):
            base = next(n for n in rows if not n.startswith("fuelline")
                        and ("Normalizer" in n) == ("Normalizer" in name))
            ratios[f"{name} / {base}"] = round(rows[name]["docs_per_s"] / rows[base]["docs_per_s"], 2)
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x")
    if args.limit is not None and not args.smoke:
        print("a --limit run: no result file written")
        return
    path = write_result("exact", {"corpus": CORPUS.name, "documents": len(texts), "cores_used": 1,
                                  "repeats": args.repeats, "results": rows,
                                  "fuelline_speedup": ratios})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
