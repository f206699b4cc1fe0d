"""SimHash beside MinHash: fuelline's dedup stage on the real poetry corpus, against an exact truth.

The poems as in bench_dedup.py (its `write_inputs`: {"id": "poem-N", "text"} in two JSONL files),
the stage run with `method = "minhash"` and with `method = "simhash"` at several Hamming
distances, 2 workers, threshold 0.85, character 5-grams of the normalized text. Each run is a
child process of its own, so its peak memory (`common.MemoryPeaks`: the process that runs the
stage and, separately, its largest worker) is its own; seconds include starting the workers.

Ground truth: every pair of documents whose normalized character 5-gram sets have Jaccard
similarity ≥ 0.85, found exactly by an all-pairs similarity join with prefix filtering (Bayardo,
Ma & Srikant 2007), not by brute force over the 8·10^10 pairs. Order the distinct shingles by
global frequency, rarest first (ties by hash); J(x, y) ≥ t implies |x ∩ y| ≥ t·max(|x|, |y|), so
the first |x| - ⌈t·|x|⌉ + 1 shingles of x and the first |y| - ⌈t·|y|⌉ + 1 of y share one. Every
pair sharing a prefix shingle is a candidate, and every candidate is verified by exact Jaccard
(`jaccard_pairs`, the stage's own). Nothing is sampled or estimated. Documents whose normalized
text is empty (no shingles) are left out of the evaluation.

Measured per run: recall = the share of ground-truth pairs whose two documents end in the same
cluster (through exact copies or near-duplicates), over all pairs and over the pairs that are not
exact copies after normalization (the part a near-duplicate method has to find); precision = the
share of documents the stage put in a cluster that have a ground-truth partner in that cluster.
Also: the Hamming distance of the ground-truth near pairs' SimHashes (what bounds SimHash's
recall) and, for the default distance, the time of the candidate search by number of blocks.

    .venv/bin/python benchmarks/bench_simhash.py [--hamming 6 8 9 10 12] [--limit K]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from bench_dedup import CORPUS, write_inputs
from common import SMOKE_RECORDS, MemoryPeaks, parse_args, write_result
from numba import njit

from fuelline.dedup.clusters import jaccard_pairs
from fuelline.dedup.lsh import unique_pairs
from fuelline.dedup.minhash import MinHasher
from fuelline.dedup.simhash import (
    choose_blocks,
    find_probability,
    hamming_pairs,
    simhashes,
)
from fuelline.dedup.stage import DedupConfig, DedupStage
from fuelline.io import read_records
from fuelline.pipeline.executor import RunOptions, run_stage

THRESHOLD, NGRAM, WORKERS = 0.85, 5, 2


def config(method: str, hamming: int | None) -> DedupConfig:
    return DedupConfig(threshold=THRESHOLD, method=method, hamming=hamming, shingle="char", ngram=NGRAM)


def run_child(inputs: Path, out: Path, method: str, hamming: int | None) -> dict:
    """The stage in this process (the child), timed and watched."""
    with MemoryPeaks() as peaks:
        started = time.perf_counter()
        stats = run_stage(DedupStage(config(method, hamming)), inputs, out, RunOptions(workers=WORKERS, progress=False))
        seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "stats": stats, **peaks.result()}


def run_method(inputs: Path, out: Path, method: str, hamming: int | None) -> dict:
    args = [sys.executable, __file__, "--child", method, str(inputs), str(out), str(hamming)]
    child = subprocess.run(args, check=True, capture_output=True, text=True)
    return orjson.loads(child.stdout.splitlines()[-1])


def shingle_sets(texts: list[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(shingle hashes, per-document offsets, normalized texts), exactly as the stage shingles."""
    normalize = config("minhash", None).normalizer()
    normalized = [normalize(t) for t in texts]
    _, shingles, offsets = MinHasher(num_perm=1, ngram=NGRAM, shingle="char").signatures_and_shingles(normalized)
    return shingles, offsets, normalized


@njit(cache=True)
def _pairs_within_groups(docs, starts):
    total = 0
    for g in range(starts.shape[0] - 1):
        size = starts[g + 1] - starts[g]
        total += size * (size - 1) // 2
    out = np.empty((total, 2), dtype=np.int64)
    k = 0
    for g in range(starts.shape[0] - 1):
        for x in range(starts[g], starts[g + 1]):
            for y in range(x + 1, starts[g + 1]):
                out[k, 0], out[k, 1] = min(docs[x], docs[y]), max(docs[x], docs[y])
                k += 1
    return out


def prefix_candidates(shingles: np.ndarray, offsets: np.ndarray, threshold: float) -> np.ndarray:
    """Every pair that shares a shingle among both documents' prefixes (module docstring)."""
    n = len(offsets) - 1
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
    distinct, token = np.unique(shingles, return_inverse=True)
    pairs = np.unique(owner * len(distinct) + token)  # distinct (document, token), by document
    owner, token = pairs // len(distinct), pairs % len(distinct)
    frequency = np.bincount(token, minlength=len(distinct))
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[np.lexsort((distinct, frequency))] = np.arange(len(distinct))  # rarest first, ties by hash
    by_rank = np.sort(owner * len(distinct) + rank[token])
    owner, rank_of = by_rank // len(distinct), by_rank % len(distinct)
    sizes = np.bincount(owner, minlength=n)
    position = np.arange(len(owner)) - np.concatenate(([0], np.cumsum(sizes)))[owner]
    prefix = sizes - np.ceil(threshold * sizes - 1e-9).astype(np.int64) + 1  # never shorter than exact
    keep = position < prefix[owner]
    order = np.lexsort((owner[keep], rank_of[keep]))
    grouped_rank, grouped_docs = rank_of[keep][order], owner[keep][order]
    starts = np.flatnonzero(np.concatenate(([True], grouped_rank[1:] != grouped_rank[:-1], [True])))
    return unique_pairs(_pairs_within_groups(grouped_docs, starts), n)


def ground_truth(shingles: np.ndarray, offsets: np.ndarray, normalized: list[str]) -> dict:
    started = time.perf_counter()
    candidates = prefix_candidates(shingles, offsets, THRESHOLD)
    similar = candidates[jaccard_pairs(shingles, offsets, candidates) >= THRESHOLD]
    exact = np.array([normalized[a] == normalized[b] for a, b in similar.tolist()], dtype=bool)
    return {"pairs": similar, "exact": exact, "candidates": len(candidates),
            "seconds": round(time.perf_counter() - started, 1)}


def representatives(out: Path, ids: list[str]) -> np.ndarray:
    """For each document (by position), the position of the document its cluster kept."""
    where = {doc_id: k for k, doc_id in enumerate(ids)}
    rep = np.arange(len(ids))
    for row in read_records(out / "clusters.jsonl.zst"):
        rep[where[row["id"]]] = where[row["cluster"]]
    return rep


def quality(out: Path, ids: list[str], truth: dict, evaluated: np.ndarray) -> dict:
    rep = representatives(out, ids)
    pairs, exact = truth["pairs"], truth["exact"]
    together = rep[pairs[:, 0]] == rep[pairs[:, 1]]
    clustered = np.flatnonzero((np.bincount(rep, minlength=len(rep))[rep] > 1) & evaluated)
    confirmed = np.zeros(len(rep), dtype=bool)
    confirmed[pairs[together].ravel()] = True
    return {"recall_pairs": round(float(together.mean()), 4),
            "recall_near_pairs": round(float(together[~exact].mean()), 4),
            "near_pairs_missed": int((~together[~exact]).sum()),
            "clustered_documents": len(clustered),
            "precision": round(float(confirmed[clustered].mean()), 4) if len(clustered) else 1.0}


def simhash_study(shingles: np.ndarray, offsets: np.ndarray, normalized: list[str], truth: dict,
                  hamming: int) -> dict:
    """Hamming distances of the ground-truth near pairs, and the candidate search's time by blocks."""
    values = simhashes(shingles, offsets)
    near = truth["pairs"][~truth["exact"]]
    distance = np.bitwise_count(values[near[:, 0]] ^ values[near[:, 1]])
    within = {k: round(float((distance <= k).mean()), 4) for k in range(17)}
    first = {}
    for k, text in enumerate(normalized):
        first.setdefault(text, k)
    eligible = np.array(sorted(first.values()), dtype=np.int64)  # one document per normalized text
    chosen = choose_blocks(hamming, len(eligible))
    hamming_pairs(values[:100], eligible[:100], hamming, chosen)  # compile or load numba's cache first
    by_blocks = {}
    for blocks in range(hamming + 1, chosen + 2):
        started = time.perf_counter()
        found = hamming_pairs(values[eligible], eligible, hamming, blocks)
        by_blocks[blocks] = {"tables": math.comb(blocks, hamming), "seconds": round(time.perf_counter() - started, 2),
                             "pairs": len(found)}
    return {"near_pairs_within_distance": within, "distance_median": float(np.median(distance)),
            "blocks_chosen": chosen, "candidate_search_by_blocks": by_blocks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hamming", type=int, nargs="+", default=[6, 8, 9, 10, 12],
                        help="SimHash distances to run (the default, 10 at 0.85, is always run)")
    parser.add_argument("--limit", type=int, default=None, help="only the first K documents (a quick run)")
    parser.add_argument("--child", nargs=4, metavar=("METHOD", "INPUTS", "OUT", "HAMMING"), help=argparse.SUPPRESS)
    args = parse_args(parser)
    if args.smoke:  # MinHash and SimHash at the default distance alone
        args.limit, args.hamming = args.limit or SMOKE_RECORDS, []
    if args.child:
        method, inputs, out, hamming = args.child
        result = run_child(Path(inputs), Path(out), method, None if hamming == "None" else int(hamming))
        print(orjson.dumps(result).decode())
        return
    if not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus")
    default = config("simhash", None).max_hamming()
    with tempfile.TemporaryDirectory(prefix="bench-simhash-") as tmp:
        work = Path(tmp)
        docs = write_inputs(work / "input", args.limit)
        ids, texts = list(docs), list(docs.values())
        print(f"{len(ids):,} documents; {WORKERS} workers; threshold {THRESHOLD}", flush=True)
        shingles, offsets, normalized = shingle_sets(texts)
        truth = ground_truth(shingles, offsets, normalized)
        print(f"ground truth: {len(truth['pairs']):,} pairs ≥ {THRESHOLD} ({int((~truth['exact']).sum()):,} not "
              f"exact copies) from {truth['candidates']:,} prefix-filter candidates in {truth['seconds']} s", flush=True)
        evaluated = np.diff(offsets) > 0
        runs = {"minhash": ("minhash", None), **{f"simhash hamming={k}": ("simhash", k)
                                                 for k in sorted({*args.hamming, default})}}
        results = {}
        for name, (method, hamming) in runs.items():
            run = run_method(work / "input", work / name.replace(" ", "-"), method, hamming)
            results[name] = summarize(run, quality(work / name.replace(" ", "-"), ids, truth, evaluated))
            print(f"{name:<20} {results[name]}", flush=True)
        study = simhash_study(shingles, offsets, normalized, truth, default)
    report(args, len(ids), int(evaluated.sum()), truth, results, study, default)


def summarize(run: dict, measured: dict) -> dict:
    dedup = run["stats"]["dedup"]
    layout = {k: dedup[k] for k in ("bands", "rows", "hamming", "blocks", "tables") if k in dedup}
    return {"seconds": run["seconds"], **layout, "peak_parent_anon_mib": run["peak_parent_anon_mib"],
            "peak_parent_rss_mib": run["peak_parent_rss_mib"], "peak_worker_anon_mib": run["peak_worker_anon_mib"],
            "removed": sum(run["stats"]["dropped"].values()), "dropped": run["stats"]["dropped"],
            "candidate_pairs": dedup["candidate_pairs"], "verified_pairs": dedup["verified_pairs"],
            "step_seconds": dedup["seconds"], "candidate_probability": dedup["candidate_probability"], **measured}


def report(args, documents: int, evaluated: int, truth: dict, results: dict, study: dict, default: int) -> None:
    theory = {k: round(float(find_probability(THRESHOLD, k)), 4) for k in sorted({*args.hamming, default})}
    print(f"\nSimHash distance of the ground-truth near pairs: median {study['distance_median']}, share within k: "
          f"{study['near_pairs_within_distance']}\nfound at J = {THRESHOLD} exactly, binomial model: {theory}\n"
          f"candidate search at hamming={default} by blocks: {study['candidate_search_by_blocks']}")
    if args.limit is not None and not args.smoke:
        print("a --limit run: no result file written")
        return
    path = write_result("simhash", {
        "corpus": CORPUS.name, "documents": documents, "evaluated_documents": evaluated, "workers": WORKERS,
        "threshold": THRESHOLD, "shingles": f"character {NGRAM}-grams of the normalized text",
        "ground_truth": {"method": "all-pairs similarity join, prefix filtering, every candidate verified: exact",
                         "pairs": len(truth["pairs"]), "near_pairs": int((~truth["exact"]).sum()),
                         "candidates": truth["candidates"], "seconds": truth["seconds"]},
        "default_hamming": default, "runs": results, "simhash_find_probability_at_threshold": theory,
        "simhash_study": study})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
