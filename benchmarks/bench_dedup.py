"""Near-duplicate removal on the real poetry corpus, 2 workers: fuelline's dedup stage against datatrove.

Both read the same JSONL input ({"id", "text"}, the poems as in bench_minhash.py, ids `poem-N`
by position), written in two files before timing because datatrove gives each task whole files.

- fuelline: `run_stage(DedupStage(DedupConfig(threshold, ngram=5, num_perm=128)), …)` with
  `RunOptions(workers=2)`: exact duplicates, then MinHash + LSH candidates checked against the
  threshold, union-find clusters, one document kept per cluster.
- datatrove: its four MinHash stages (signatures, buckets, cluster, filter), each a
  LocalPipelineExecutor on 2 workers (signatures and filter: 2 tasks, one per input file;
  buckets: one task per bucket; cluster: 1 task). Its word tokenizer is replaced by one whose
  words are the single letters and digits, so its n-grams are character 5-grams without
  punctuation or spaces, as fuelline's (its built-in Chinese tokenizer needs spaCy and jieba);
  its own text normalization (lower case, punctuation to spaces, digits to 0) stays on. Its
  hashes: 64-bit xxhash, its default. It runs twice: with fuelline's LSH layout (bands x rows
  chosen from the threshold) and with its default 14 buckets x 8 hashes. Every pair that shares
  a bucket is a duplicate: datatrove never checks a candidate's Jaccard, so its threshold is
  only where the LSH curve rises, about (1/buckets)^(1/rows).

The removed sets are compared by id: their intersection and Jaccard, and the same for the sets
of documents each tool put in a cluster (which does not depend on which member each keeps).
For each removed document, the true Jaccard (normalized character 5-grams) with the closest
kept member of its cluster shows how many were removed below the threshold.

    benchmarks/.venv/bin/python benchmarks/bench_dedup.py [--threshold 0.85] [--buckets B --rows R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import orjson

from common import SHARED_DATA, SMOKE_RECORDS, parse_args, peer_available, write_result

from fuelline.io import read_records

CORPUS = SHARED_DATA / "chinese-poetry.jsonl.zst"
NGRAM, NUM_PERM, WORKERS = 5, 128, 2
DATATROVE_DEFAULT_LAYOUT = (14, 8)  # MinhashConfig's num_buckets, hashes_per_bucket


def write_inputs(directory: Path, limit: int | None) -> dict[str, str]:
    """The poems as {"id", "text"} JSONL in two halves; returns them, id to text, in order."""
    docs = []
    for record in read_records(CORPUS):
        paragraphs = record.get("paragraphs")
        text = "\n".join(p for p in paragraphs if isinstance(p, str)) if isinstance(paragraphs, list) else ""
        if text:
            docs.append((f"poem-{len(docs)}", text))
            if limit is not None and len(docs) == limit:
                break
    directory.mkdir(parents=True)
    half = (len(docs) + 1) // 2
    for k, part in enumerate((docs[:half], docs[half:])):
        with open(directory / f"docs-{k}.jsonl", "wb") as f:
            f.writelines(orjson.dumps({"id": doc_id, "text": text}) + b"\n" for doc_id, text in part)
    return dict(docs)


def run_fuelline(inputs: Path, out: Path, threshold: float) -> dict:
    from fuelline.dedup.stage import DedupConfig, DedupStage
    from fuelline.pipeline.executor import RunOptions, run_stage

    config = DedupConfig(threshold=threshold, ngram=NGRAM, num_perm=NUM_PERM)
    start = time.perf_counter()
    stats = run_stage(DedupStage(config), inputs, out, RunOptions(workers=WORKERS, progress=False))
    seconds = time.perf_counter() - start
    kept = {record["id"] for record in read_records(out)}
    # The audit has one row per clustered document; `cluster` is the id of the document kept for it.
    clustered, levels = {}, Counter()
    for row in read_records(out / "clusters.jsonl.zst"):
        clustered[row["id"]] = row["cluster"]
        if not row["kept"]:
            levels[row["removed"]] += 1
    return {"seconds": seconds, "stats": stats, "kept": kept, "clustered": clustered,
            "removed_by_level": dict(levels), "config": repr(config)}


def character_tokenizer():
    """A datatrove WordTokenizer whose words are the letters and digits, one character each.

    Punctuation and spaces are not words, as fuelline's normalizer removes them; datatrove's own
    punctuation list (applied before) misses some symbols, which this catches.
    """
    from datatrove.utils.word_tokenizers import WordTokenizer

    class CharacterTokenizer(WordTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return [c for c in text if c.isalnum()]

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    return CharacterTokenizer()


def run_datatrove(inputs: Path, work: Path, buckets: int, rows: int, workers: int) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    config = MinhashConfig(n_grams=NGRAM, num_buckets=buckets, hashes_per_bucket=rows)
    stages = {
        "signatures": ([JsonlReader(str(inputs)), MinhashDedupSignature(str(work / "signatures"), config=config,
                                                                         language=character_tokenizer())], 2),
        "buckets": ([MinhashDedupBuckets(str(work / "signatures"), str(work / "buckets"), config=config)], buckets),
        "cluster": ([MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=config,
                                         save_cluster_id=True)], 1),
        "filter": ([JsonlReader(str(inputs)),
                    MinhashDedupFilter(str(work / "remove"), exclusion_writer=JsonlWriter(str(work / "removed"))),
                    JsonlWriter(str(work / "kept"))], 2),
    }
    seconds = {}
    for name, (pipeline, tasks) in stages.items():
        executor = LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(workers, tasks),
                                         logging_dir=str(work / "logs" / name))
        start = time.perf_counter()
        executor.run()
        seconds[name] = time.perf_counter() - start
    removed = {r["id"] for r in read_records(sorted((work / "removed").glob("*.jsonl.gz")))}
    return {"seconds": sum(seconds.values()), "stage_seconds": seconds, "removed": removed,
            "clustered": clustered_ids(inputs, work / "remove")}


def clustered_ids(inputs: Path, remove_dir: Path) -> dict[str, int]:
    """The documents datatrove put in a cluster, and the cluster (its .clusters files: doc index, cluster)."""
    import numpy as np

    ids = []
    for k in range(2):
        with open(inputs / f"docs-{k}.jsonl", "rb") as f:
            ids.append([orjson.loads(line)["id"] for line in f])
    found = {}
    for k in range(2):
        path = remove_dir / f"{k:06d}.clusters"
        if path.exists():
            pairs = np.fromfile(path, dtype="<u4").reshape(-1, 2)
            found.update((ids[k][i], int(c)) for i, c in pairs)
    return found


def lsh_shape(threshold: float) -> tuple[int, int]:
    """fuelline's (bands, rows) for this threshold, which datatrove is then given."""
    from fuelline.dedup.stage import DedupConfig

    return DedupConfig(threshold=threshold, ngram=NGRAM, num_perm=NUM_PERM).band_layout()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=0.85)
    parser.add_argument("--buckets", type=int, default=None, help="datatrove buckets (default: fuelline's bands)")
    parser.add_argument("--rows", type=int, default=None, help="datatrove hashes per bucket (default: fuelline's rows)")
    parser.add_argument("--limit", type=int, default=None, help="only the first K documents (a quick run)")
    parser.add_argument("--skip-fuelline", action="store_true", help="only datatrove (fuelline's stage not there yet)")
    args = parse_args(parser)
    if not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus")
    if args.smoke:
        args.limit = args.limit or SMOKE_RECORDS
    layouts = {}
    if args.buckets and args.rows:
        layouts["datatrove"] = (args.buckets, args.rows)
    elif not args.skip_fuelline:
        layouts["datatrove, fuelline's LSH layout"] = lsh_shape(args.threshold)
    if DATATROVE_DEFAULT_LAYOUT not in layouts.values():
        layouts["datatrove, its default layout"] = DATATROVE_DEFAULT_LAYOUT
    if not peer_available("datatrove"):
        layouts = {}
    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as tmp:
        work = Path(tmp)
        docs = write_inputs(work / "input", args.limit)
        print(f"{len(docs):,} documents in 2 JSONL files; {WORKERS} workers", flush=True)
        ours = None if args.skip_fuelline else run_fuelline(work / "input", work / "fuelline", args.threshold)
        if ours is not None:
            print(f"fuelline: {ours['seconds']:.1f} s", flush=True)
        peers = {}
        for k, (name, (buckets, rows)) in enumerate(layouts.items()):
            peers[name] = run_datatrove(work / "input", work / f"datatrove-{k}", buckets, rows, WORKERS)
            peers[name]["layout"] = (buckets, rows)
            print(f"{name}: {peers[name]['seconds']:.1f} s", flush=True)
    report(args, docs, ours, peers)


def overlap(a, b) -> dict:
    a, b = set(a), set(b)
    union = len(a | b)
    return {"fuelline": len(a), "datatrove": len(b), "both": len(a & b), "only_fuelline": len(a - b),
            "only_datatrove": len(b - a), "jaccard": round(len(a & b) / union, 4) if union else 1.0}


def shingle_set(text: str, normalize) -> set[str]:
    text = normalize(text)
    return {text} if len(text) < NGRAM else {text[i:i + NGRAM] for i in range(len(text) - NGRAM + 1)}


def similarity_to_kept(docs: dict[str, str], clusters: dict[str, int], removed: set[str], threshold: float) -> dict:
    """For every removed document, its true Jaccard (normalized character 5-grams, as fuelline
    shingles) with the most similar kept member of its cluster: how many are below the threshold."""
    from fuelline.dedup.normalize import Normalizer

    normalize = Normalizer()
    members: dict[int, list[str]] = {}
    for doc_id, cluster in clusters.items():
        members.setdefault(cluster, []).append(doc_id)
    similarities = []
    for cluster_ids in members.values():
        kept = [shingle_set(docs[d], normalize) for d in cluster_ids if d not in removed]
        for d in cluster_ids:
            if d in removed and kept:
                own = shingle_set(docs[d], normalize)
                similarities.append(max(len(own & k) / len(own | k) for k in kept))
    below = sum(j < threshold for j in similarities)
    quantiles = statistics.quantiles(similarities, n=10) if len(similarities) > 1 else [float("nan")] * 9
    return {"removed_checked": len(similarities), "below_threshold": below,
            "share_below_threshold": round(below / len(similarities), 4) if similarities else 0.0,
            "jaccard_p10": round(quantiles[0], 3), "jaccard_median": round(quantiles[4], 3)}


def report(args, docs: dict[str, str], ours: dict | None, peers: dict) -> None:
    result = {"corpus": CORPUS.name, "documents": len(docs), "limit": args.limit, "workers": WORKERS,
              "threshold": args.threshold, "ngram": NGRAM, "num_perm": NUM_PERM,
              "versions": {n: version(n) for n in ("datatrove", "fuelline") if n == "fuelline" or peers},
              "datatrove": {}}
    removed = None
    if ours is not None:
        removed = set(docs) - ours["kept"]
        dropped = ours["stats"].get("dropped", {})
        quality = similarity_to_kept(docs, ours["clustered"], removed, args.threshold)
        print(f"\nfuelline {ours['config']}")
        for step, step_seconds in ours["stats"].get("dedup", {}).get("seconds", {}).items():
            print(f"  {step:<12} {step_seconds:7.1f} s")
        print(f"  total        {ours['seconds']:7.1f} s, removed {len(removed):,} {dropped}, "
              f"{len(ours['clustered']):,} in clusters; removed below J {args.threshold}: {quality}")
        result["fuelline"] = {"seconds": round(ours["seconds"], 2), "docs_per_s": round(len(docs) / ours["seconds"]),
                              "removed": len(removed), "dropped": dropped, "removed_by_level": ours["removed_by_level"],
                              "clustered": len(ours["clustered"]), "similarity_to_kept": quality,
                              "config": ours["config"], "stats": ours["stats"]}
    for name, peer in peers.items():
        (buckets, rows), seconds = peer["layout"], peer["seconds"]
        quality = similarity_to_kept(docs, peer["clustered"], peer["removed"], args.threshold)
        print(f"\n{name}: {buckets} buckets x {rows} hashes ({buckets * rows} of {NUM_PERM}), LSH threshold "
              f"(1/b)^(1/r) = {(1 / buckets) ** (1 / rows):.3f}")
        for stage, stage_seconds in peer["stage_seconds"].items():
            print(f"  {stage:<12} {stage_seconds:7.1f} s")
        print(f"  total        {seconds:7.1f} s, removed {len(peer['removed']):,}, {len(peer['clustered']):,} "
              f"in clusters; removed below J {args.threshold}: {quality}")
        row = {"buckets": buckets, "hashes_per_bucket": rows, "seconds": round(seconds, 2),
               "docs_per_s": round(len(docs) / seconds),
               "stage_seconds": {k: round(v, 2) for k, v in peer["stage_seconds"].items()},
               "removed": len(peer["removed"]), "clustered": len(peer["clustered"]), "similarity_to_kept": quality}
        if ours is not None:
            row["removed_overlap"] = overlap(removed, peer["removed"])
            row["clustered_overlap"] = overlap(ours["clustered"], peer["clustered"])
            row["fuelline_speedup"] = round(seconds / ours["seconds"], 2)
            print(f"  removed overlap:   {row['removed_overlap']}\n  clustered overlap: {row['clustered_overlap']}"
                  f"\n  fuelline / datatrove speed: {row['fuelline_speedup']:.2f}x")
        result["datatrove"][name] = row
    if args.limit is not None and not args.smoke:
        print("a --limit run: no result file written")
        return
    print(f"wrote {write_result('dedup', result)}")


if __name__ == "__main__":
    main()
