import random
import subprocess
import sys

import numpy as np
import orjson
import pytest

from fuelline.dedup.minhash import MinHasher
from fuelline.dedup.simhash import (
    choose_hamming,
    find_probability,
    hamming_pairs,
    simhashes,
)
from fuelline.dedup.stage import DedupConfig, DedupStage
from fuelline.io import read_records
from fuelline.pipeline.workdir import StepOutputMismatch
from fuelline.pipeline.executor import RunOptions, run_stage

HAN = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]


def random_text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(HAN) for _ in range(length))


def simhash_of(texts: list[str]) -> np.ndarray:
    _, shingles, offsets = MinHasher(num_perm=1, ngram=5, shingle="char").signatures_and_shingles(texts)
    return simhashes(shingles, offsets)


def distance(a, b) -> np.ndarray:
    return np.bitwise_count(np.bitwise_xor(a, b)).astype(np.int64)


def test_simhash_is_a_function_of_the_shingle_set():
    shingles = np.random.default_rng(1).integers(0, 2**64, size=40, dtype=np.uint64)
    shuffled_with_repeats = np.concatenate([shingles[::-1], shingles[:7]])
    values = simhashes(np.concatenate([shingles, shuffled_with_repeats, shingles[:20], shingles[20:]]),
                       np.array([0, 40, 87, 107, 127]))
    assert values[0] == values[1]  # order and repeats do not count
    assert len({int(v) for v in values[1:]}) == 3  # other sets, other hashes
    assert simhashes(np.empty(0, dtype=np.uint64), np.array([0, 0]))[0] == 0
    rng = random.Random(3)
    text = random_text(rng, 300)
    assert simhash_of([text * 2])[0] == simhash_of([text * 3])[0]  # one set of 5-grams, repeated more often


def test_one_changed_shingle_moves_few_bits_and_unrelated_documents_half():
    rng = random.Random(7)
    texts = [random_text(rng, 1_000) for _ in range(200)]
    edited = [t[:-1] + ("一" if t[-1] != "一" else "二") for t in texts]  # only the last 5-gram changes
    values, near = simhash_of(texts), simhash_of(edited)
    moved = distance(values, near)  # 2 of ~1,000 votes change: only bits with a near-tie flip
    assert moved.mean() < 2.5 and moved.max() <= 8
    unrelated = distance(values[:-1], values[1:])
    assert 30 < unrelated.mean() < 34 and unrelated.min() > 16


def test_find_probability_predicts_the_measured_distances():
    rng = random.Random(11)
    found, predicted = [], []
    for _ in range(400):
        base = random_text(rng, 200)
        chars = list(base)
        for position in rng.sample(range(200), rng.randint(3, 8)):
            chars[position] = rng.choice(HAN)
        a, b = (set(MinHasher(num_perm=1).signatures_and_shingles([t])[1].tolist()) for t in (base, "".join(chars)))
        values = simhash_of([base, "".join(chars)])
        found.append(distance(values[0], values[1]) <= 10)
        predicted.append(float(find_probability(len(a & b) / len(a | b), 10)))
    assert abs(np.mean(found) - np.mean(predicted)) < 0.06
    assert choose_hamming(0.85) == 10 and find_probability(0.85, 10) >= 0.8 > find_probability(0.85, 9)


def planted_values(rng: np.random.Generator, n: int, max_flips: int) -> np.ndarray:
    """Random 64-bit values, a quarter of them copies of another with 0..max_flips bits flipped."""
    values = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    for i in rng.choice(np.arange(1, n), size=n // 4, replace=False):
        flipped = rng.choice(64, size=rng.integers(0, max_flips + 1), replace=False)
        values[i] = values[rng.integers(0, i)] ^ np.uint64(sum(1 << int(b) for b in flipped))
    return values


@pytest.mark.parametrize("hamming, blocks", [(0, 0), (3, 4), (3, 6), (6, 7), (6, 0), (10, 12)])
def test_block_tables_find_exactly_the_pairs_brute_force_finds(hamming, blocks):
    rng = np.random.default_rng(hamming * 100 + blocks)
    values = planted_values(rng, 1_500, hamming + 3)
    docs = np.sort(rng.choice(10_000, size=len(values), replace=False))  # any increasing document numbers
    i, j = np.triu_indices(len(values), k=1)
    close = distance(values[i], values[j]) <= hamming
    expected = np.stack([docs[i[close]], docs[j[close]]], axis=1)
    found = hamming_pairs(values, docs, hamming, blocks)
    assert len(expected) > 50  # the planted pairs, and some just beyond the distance
    assert np.array_equal(found, expected)  # same pairs, each once, in the same order


def planted_corpus(path, rng: random.Random) -> dict[str, set[str]]:
    """400 unrelated documents, 60 near copies (one character changed: Jaccard ~0.975) and 20 exact ones."""
    originals = [{"id": f"o{k}", "text": random_text(rng, 400)} for k in range(400)]
    near, exact = [], []
    for k, doc in enumerate(rng.sample(originals, 80)):
        if k < 60:
            chars = list(doc["text"])
            chars[rng.randrange(100, 300)] = "鬱"
            near.append({"id": f"n{k}", "text": "".join(chars)})
        else:
            exact.append({"id": f"e{k}", "text": doc["text"]})
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in originals + near + exact))
    return {"kept": {d["id"] for d in originals}, "near": {d["id"] for d in near}, "exact": {d["id"] for d in exact}}


def test_stage_with_simhash_removes_the_planted_near_duplicates(tmp_path):
    planted = planted_corpus(tmp_path / "docs.jsonl", random.Random(5))
    out = tmp_path / "out"
    config = DedupConfig(method="simhash")
    stats = run_stage(DedupStage(config), tmp_path / "docs.jsonl", out, RunOptions(workers=1, progress=False))
    assert {r["id"] for r in read_records(out)} == planted["kept"]
    rejected = {r["record"]["id"]: r["reason"] for r in read_records(out / "_rejects")}
    assert rejected == {**dict.fromkeys(planted["near"], "near_duplicate"), **dict.fromkeys(planted["exact"], "exact_duplicate")}
    summary = stats["dedup"]
    assert summary["method"] == "simhash" and summary["hamming"] == 10 and "bands" not in summary
    assert summary["verified_pairs"] == 60 and summary["near_duplicates"] == 60
    with pytest.raises(StepOutputMismatch, match="config"):  # the method is part of the stage's identity
        run_stage(DedupStage(DedupConfig(method="minhash")), tmp_path / "docs.jsonl", out,
                  RunOptions(workers=1, progress=False))


def test_cli_dedup_method_simhash(tmp_path):
    planted = planted_corpus(tmp_path / "docs.jsonl", random.Random(6))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "fuelline.cli", "dedup", "-i", str(tmp_path / "docs.jsonl"), "-o", str(out),
               "-w", "1", "-q", "--method", "simhash", "--hamming", "6"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["dedup"]["method"] == "simhash" and stats["dedup"]["hamming"] == 6
    assert stats["dropped"] == {"near_duplicate": len(planted["near"]), "exact_duplicate": len(planted["exact"])}
    wrong = subprocess.run(command[:-4] + ["--method", "lsh"], capture_output=True, text=True, check=False)
    assert wrong.returncode == 2 and "'lsh' is not one of 'minhash', 'simhash'" in wrong.stderr


def test_simhash_options_are_checked():
    with pytest.raises(ValueError, match="method must be"):
        DedupConfig(method="simhash64")
    with pytest.raises(ValueError, match="hamming must be"):
        DedupConfig(method="simhash", hamming=64)
    with pytest.raises(ValueError, match="blocks must be more than hamming"):
        DedupConfig(method="simhash", hamming=6, blocks=6)
