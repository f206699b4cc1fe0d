"""MinHash signatures of the real poetry corpus on one core: fuelline against datasketch and rensa.

Every tool gets the same texts (a poem's `paragraphs` joined by newlines, not normalized) and
the same shingles: the set of character 5-grams (a text shorter than 5 characters is one
shingle), 128 permutations. Each timed call goes from a list of texts to a (n, 128) uint32
array, so the peers' times include building the shingle sets in Python, which is what a user of
them pays; the cost of that step alone is reported too. The process is pinned to one core and
every thread pool (numba, OpenMP, BLAS, rayon inside rensa) is set to one thread.

Peers: datasketch's `MinHash.generator` (its bulk path: one MinHash copied per document, then
`update_batch`) with its default sha1 and with `xxhash.xxh32_intdigest` passed as the hashfunc
(directly, not wrapped in a lambda, which would only add a call); rensa's `RMinHash` per
document, its batch `digest_matrix_from_token_sets` (timed with and without `to_rows`, the only
way to get the values out of its matrix), and its `CMinHash` batch (circulant permutations).

fuelline's numba kernel is compiled (or loaded from numba's on-disk cache) on its first call;
that call is made on 100 texts before timing and reported separately: cold (empty cache
directory) and, in a fresh process, with the cache this run wrote.

Accuracy: pairs of synthetic Chinese documents whose 5-gram sets have a known Jaccard J spread
over 0.1 to 0.95 (one random text, the other the same text with random characters replaced);
each tool estimates J as the share of equal signature entries. MinHash with k permutations has a
standard error of sqrt(J(1-J)/k), so every tool should land near the same RMSE.

    bash benchmarks/setup_peers.sh
    benchmarks/.venv/bin/python benchmarks/bench_minhash.py [--repeats 3] [--limit K] [--pairs 2000]
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Before numpy, numba or rensa are imported: one thread everywhere; a numba cache of our own so
# the first call measures a real compile.
for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ[_var] = "1"
NUMBA_CACHE = tempfile.mkdtemp(prefix="bench-minhash-numba-")
atexit.register(shutil.rmtree, NUMBA_CACHE, ignore_errors=True)  # also when imported (bench_exact.py)
os.environ["NUMBA_CACHE_DIR"] = NUMBA_CACHE

import argparse  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from importlib.metadata import version  # noqa: E402

import numpy as np  # noqa: E402
import xxhash  # noqa: E402

from common import SHARED_DATA, SMOKE_RECORDS, best_of, parse_args, peer_available, write_result  # noqa: E402

from fuelline.io import read_records  # noqa: E402

CORPUS = SHARED_DATA / "chinese-poetry.jsonl.zst"
NUM_PERM, NGRAM, SEED = 128, 5, 1
PEER_PACKAGES = ("datasketch", "rensa")  # the first word of each peer's name below
FUELLINE_SOURCE = "fuelline.dedup.minhash"


def poem_texts(limit: int | None = None) -> list[str]:
    """The corpus's poems as texts, lines joined by newlines; empty ones are left out."""
    texts = []
    for record in read_records(CORPUS):
        paragraphs = record.get("paragraphs")
        text = "\n".join(p for p in paragraphs if isinstance(p, str)) if isinstance(paragraphs, list) else ""
        if text:
            texts.append(text)
            if limit is not None and len(texts) == limit:
                break
    return texts


def shingles(text: str) -> set[str]:
    if len(text) < NGRAM:
        return {text}
    return {text[i:i + NGRAM] for i in range(len(text) - NGRAM + 1)}


# Each tool: texts -> uint32 array (n, NUM_PERM).

def datasketch_sha1(texts: list[str]) -> np.ndarray:
    from datasketch import MinHash

    out = np.empty((len(texts), NUM_PERM), dtype=np.uint32)
    batches = ([s.encode() for s in shingles(t)] for t in texts)
    for i, m in enumerate(MinHash.generator(batches, num_perm=NUM_PERM, seed=SEED)):
        out[i] = m.hashvalues
    return out


def datasketch_xxh32(texts: list[str]) -> np.ndarray:
    from datasketch import MinHash

    out = np.empty((len(texts), NUM_PERM), dtype=np.uint32)
    batches = ([s.encode() for s in shingles(t)] for t in texts)
    for i, m in enumerate(MinHash.generator(batches, num_perm=NUM_PERM, seed=SEED, hashfunc=xxhash.xxh32_intdigest)):
        out[i] = m.hashvalues
    return out


def rensa_per_document(texts: list[str]) -> np.ndarray:
    from rensa import RMinHash

    out = np.empty((len(texts), NUM_PERM), dtype=np.uint32)
    for i, text in enumerate(texts):
        m = RMinHash(num_perm=NUM_PERM, seed=SEED)
        m.update(list(shingles(text)))
        out[i] = m.digest()
    return out


def rensa_batch_matrix(texts: list[str]):
    """The batch call alone: the signatures stay inside rensa's matrix object."""
    from rensa import RMinHash

    return RMinHash.digest_matrix_from_token_sets((list(shingles(t)) for t in texts), NUM_PERM, SEED)


def rensa_batch(texts: list[str]) -> np.ndarray:
    """The batch call, and the signatures out as an array (`to_rows` is the only way out)."""
    return np.array(rensa_batch_matrix(texts).to_rows(), dtype=np.uint32)


def rensa_cminhash_batch(texts: list[str]) -> np.ndarray:
    """C-MinHash (circulant permutations of one hash): another sketch, same estimator."""
    from rensa import CMinHash

    return np.array(CMinHash.digests_from_token_sets((list(shingles(t)) for t in texts), NUM_PERM, SEED),
                    dtype=np.uint32)


def fuelline_hasher():
    try:
        from fuelline.dedup.minhash import MinHasher
    except ImportError:
        return None
    return MinHasher(num_perm=NUM_PERM, ngram=NGRAM, shingle="char")


PEERS = {
    "datasketch MinHash.generator, sha1 (default)": datasketch_sha1,
    "datasketch MinHash.generator, xxh32": datasketch_xxh32,
    "rensa RMinHash per document": rensa_per_document,
    "rensa RMinHash.digest_matrix_from_token_sets + to_rows": rensa_batch,
    "rensa CMinHash.digests_from_token_sets": rensa_cminhash_batch,
}
# Timed, not checked for accuracy: its output is not an array.
TIMING_ONLY = {"rensa RMinHash.digest_matrix_from_token_sets (no to_rows)": rensa_batch_matrix}


def compile_times(hasher, texts: list[str]) -> dict:
    """First call in this process (cold numba cache), and in a fresh one that finds the cache."""
    start = time.perf_counter()
    hasher.signatures(texts[:100])
    cold = time.perf_counter() - start
    steady, _ = best_of(lambda: hasher.signatures(texts[:100]), 3)
    probe = ("import time, sys; from fuelline.dedup.minhash import MinHasher; "
             f"h = MinHasher(num_perm={NUM_PERM}, ngram={NGRAM}, shingle='char'); "
             "texts = sys.stdin.read().split('\\0'); "
             "t = time.perf_counter(); h.signatures(texts); print(time.perf_counter() - t)")
    env = {**os.environ, "NUMBA_CACHE_DIR": NUMBA_CACHE}
    warm = float(subprocess.run([sys.executable, "-c", probe], input="\0".join(texts[:100]), text=True,
                                capture_output=True, check=True, env=env).stdout)
    return {"first_call_cold_cache_s": round(cold, 3), "first_call_with_disk_cache_s": round(warm, 3),
            "same_call_compiled_s": round(steady, 5)}


def throughput(texts: list[str], repeats: int, hasher) -> dict:
    rows = {}
    # The shingling alone, each set dropped once built, as the tools do (keeping 400,000 sets
    # alive would time the garbage collector instead).
    prepare = {
        "(shingle sets of str only)": lambda ts: sum(len(shingles(t)) for t in ts),
        "(shingle lists of UTF-8 bytes only, datasketch's input)": lambda ts: sum(
            len([s.encode() for s in shingles(t)]) for t in ts),
    }
    tools = {**prepare, **PEERS, **TIMING_ONLY}
    if hasher is not None:
        tools["fuelline MinHasher.signatures"] = hasher.signatures
    for name, fn in tools.items():
        seconds, _ = best_of(lambda: fn(texts), repeats)
        rows[name] = {"seconds": round(seconds, 3), "docs_per_s": round(len(texts) / seconds)}
        print(f"{name:<62} {seconds:8.2f} s {len(texts) / seconds:>12,.0f} docs/s", flush=True)
    return rows


def mutated_pair(rng: random.Random, target: float) -> tuple[str, str, float]:
    """A random text and a copy with characters replaced until its 5-gram Jaccard is near `target`."""
    # One replaced character removes up to 5 of n shingles: J = (n-5)/(n+5), so a high target
    # needs a long enough text.
    length = rng.randrange(max(40, math.ceil(NGRAM * (1 + target) / (1 - target)) + NGRAM + 10), 600)
    first = [chr(0x4E00 + rng.randrange(0x5000)) for _ in range(length)]
    positions = rng.sample(range(length), length)
    replacement = [chr(0x4E00 + rng.randrange(0x5000)) for _ in range(length)]

    def pair(k: int) -> tuple[str, float]:
        second = list(first)
        for p in positions[:k]:
            second[p] = replacement[p] if replacement[p] != first[p] else chr(0x4E00 + 0x5000)
        a, b = shingles("".join(first)), shingles("".join(second))
        return "".join(second), len(a & b) / len(a | b)

    low, high = 0, length  # Jaccard falls as more characters are replaced
    while low < high:
        mid = (low + high) // 2
        if pair(mid)[1] > target:
            low = mid + 1
        else:
            high = mid
    candidates = [k for k in (low - 1, low) if k >= 1]
    k = min(candidates, key=lambda k: abs(pair(k)[1] - target))
    second, jaccard = pair(k)
    return "".join(first), second, jaccard


def accuracy(num_pairs: int, hasher) -> dict:
    rng = random.Random(20261130)
    pairs = [mutated_pair(rng, rng.uniform(0.1, 0.95)) for _ in range(num_pairs)]
    truth = np.array([j for _, _, j in pairs])
    texts = [t for a, b, _ in pairs for t in (a, b)]
    tools = dict(PEERS)
    if hasher is not None:
        tools["fuelline MinHasher.signatures"] = hasher.signatures
    theory = float(np.sqrt(np.mean(truth * (1 - truth) / NUM_PERM)))
    result = {"pairs": num_pairs, "true_jaccard_min": round(float(truth.min()), 3),
              "true_jaccard_max": round(float(truth.max()), 3), "theoretical_rmse": round(theory, 4), "tools": {}}
    print(f"\naccuracy on {num_pairs:,} pairs, true J {truth.min():.2f}..{truth.max():.2f}; "
          f"theoretical RMSE sqrt(mean J(1-J)/{NUM_PERM}) = {theory:.4f}")
    for name, fn in tools.items():
        signatures = fn(texts)
        estimate = (signatures[0::2] == signatures[1::2]).mean(axis=1)
        error = estimate - truth
        rmse = float(np.sqrt(np.mean(error ** 2)))
        result["tools"][name] = {"rmse": round(rmse, 4), "bias": round(float(error.mean()), 4),
                                 "rmse_over_theory": round(rmse / theory, 3)}
        print(f"{name:<62} RMSE {rmse:.4f} ({rmse / theory:.2f}x theory)  bias {error.mean():+.4f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="only the first K documents (a quick run)")
    parser.add_argument("--pairs", type=int, default=2000, help="synthetic pairs of the accuracy check")
    args = parse_args(parser)
    if not CORPUS.exists():
        sys.exit(f"{CORPUS} not found: the benchmark needs the shared poetry corpus")
    if args.smoke:
        args.limit, args.pairs, args.repeats = args.limit or SMOKE_RECORDS, 50, 1
    missing = {package for package in PEER_PACKAGES if not peer_available(package)}
    for tools in (PEERS, TIMING_ONLY):
        for name in [name for name in tools if name.split()[0] in missing]:
            del tools[name]
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    texts = poem_texts(args.limit)
    print(f"{len(texts):,} texts, {sum(map(len, texts)):,} characters; one core, best of {args.repeats}")
    hasher = fuelline_hasher()
    compile_info = None
    if hasher is None:
        print(f"{FUELLINE_SOURCE} is not importable yet: timing the peers only")
    else:
        compile_info = compile_times(hasher, texts)
        print(f"fuelline numba compile: {compile_info}")
    rows = throughput(texts, args.repeats, hasher)
    ratios = {}
    if hasher is not None:
        ours = rows["fuelline MinHasher.signatures"]["docs_per_s"]
        ratios = {name: round(ours / row["docs_per_s"], 2) for name, row in rows.items()
                  if name in PEERS or name in TIMING_ONLY}
        for name, ratio in ratios.items():
            print(f"fuelline / {name}: {ratio:.2f}x")
    acc = accuracy(args.pairs, hasher)
    if args.limit is not None and not args.smoke:
        print("a --limit run: no result file written")
        return
    versions = {name: version(name) for name in ("datasketch", "rensa", "xxhash", "numba", "numpy")
                if name not in missing}
    path = write_result("minhash", {
        "corpus": CORPUS.name, "documents": len(texts), "limit": args.limit, "num_perm": NUM_PERM,
        "shingles": f"character {NGRAM}-grams of the raw text, as a set", "cores_used": 1,
        "repeats": args.repeats, "versions": versions, "fuelline_compile": compile_info, "results": rows,
        "fuelline_speedup": ratios, "accuracy": acc})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
