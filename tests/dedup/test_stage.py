import math
import random

import numpy as np
import orjson
import pytest

from fuelline.dedup.clusters import jaccard_pairs
from fuelline.dedup.lsh import band_hashes, bucket_pairs, choose_bands, unique_pairs
from fuelline.dedup.minhash import MinHasher
from fuelline.dedup.normalize import Normalizer
from fuelline.dedup.stage import AUDIT_FILE, DedupConfig, DedupStage
from fuelline.io import read_records
from fuelline.pipeline.executor import RunOptions, run_stage

from ..conftest import shared_file

THRESHOLD = 0.85


def write_jsonl(path, docs):
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    return path


@pytest.fixture(scope="module")
def raw_poems():
    """Every raw poem as {"id": "SOURCE/LINE", "text", "uid": upstream id} (one read, shared)."""
    poems = []
    for line, record in enumerate(read_records(shared_file("chinese-poetry.jsonl.zst")), start=1):
        text = "\n".join(p for p in record["paragraphs"] if isinstance(p, str))
        if text:
            poems.append({"id": f"{record['source']}/{line}", "text": text, "uid": record.get("id")})
    return poems


def shingle_sets(texts):
    """Exact shingle sets (char 5-grams of the normalized text), as Python sets of hashes."""
    normalize = Normalizer()
    _, shingles, offsets = MinHasher(ngram=5, shingle="char").signatures_and_shingles([normalize(t) for t in texts])
    return [set(shingles[offsets[i]:offsets[i + 1]].tolist()) for i in range(len(texts))]


def jaccard(a, b):
    return len(a & b) / len(a | b) if a or b else 1.0  # two empty texts are the same text


def true_pairs(sets, threshold):
    """All pairs with Jaccard >= threshold, exactly, by prefix filtering (no pair is missed:
    two sets this similar must share one of the smallest |S| - ceil(t·|S|) + 1 elements)."""
    owners = {}
    for doc, s in enumerate(sets):
        ordered = sorted(s)
        for token in ordered[: len(ordered) - math.ceil(threshold * len(ordered)) + 1]:
            owners.setdefault(token, []).append(doc)
    found = set()
    for docs in owners.values():
        for i, a in enumerate(docs):
            for b in docs[i + 1:]:
                if (a, b) not in found and jaccard(sets[a], sets[b]) >= threshold:
                    found.add((a, b))
    return found


def representatives(out_dir):
    """Document id → id of the document kept in its place (itself when in no cluster)."""
    cluster = {row["id"]: row["cluster"] for row in read_records(out_dir / AUDIT_FILE)}
    return lambda doc_id: cluster.get(doc_id, doc_id)


@pytest.fixture(scope="module")
def tang_sample(raw_poems, tmp_path_factory):
    """全唐诗 and its flagged-error copies: 64k poems rich in exact and near duplicates."""
    docs = [p for p in raw_poems if p["id"].split("/")[0] in ("quantangshi", "quantangshi_error")]
    base = tmp_path_factory.mktemp("tang")
    source = write_jsonl(base / "tang.jsonl", [{"id": d["id"], "text": d["text"]} for d in docs])
    # one worker (no process starts): the number of workers is the subject of test_same_bytes_whatever_…
    stats = run_stage(DedupStage(), source, base / "out", RunOptions(workers=1, shard_size=20_000, progress=False))
    return docs, base / "out", stats


@pytest.fixture(scope="module")
def tang_shingle_sets(tang_sample):
    """The exact shingle sets of the sample's poems, in its order (built once: seconds of Python)."""
    return shingle_sets([d["text"] for d in tang_sample[0]])


def test_verified_pairs_have_precision_one_and_similarities_are_exact(tang_sample, tang_shingle_sets):
    docs, _, _ = tang_sample
    texts = [d["text"] for d in docs]
    normalize = Normalizer()
    signatures, shingles, offsets = MinHasher().signatures_and_shingles([normalize(t) for t in texts])
    bands, rows = choose_bands(THRESHOLD, 128)
    hashes = band_hashes(signatures, bands, rows)
    everyone = np.arange(len(texts))
    candidates = unique_pairs(np.concatenate([bucket_pairs(hashes[:, b], everyone) for b in range(bands)]), len(texts))
    similarity = jaccard_pairs(shingles, offsets, candidates)
    sets = tang_shingle_sets
    for (a, b), value in zip(candidates.tolist(), similarity.tolist()):
        assert value == pytest.approx(jaccard(sets[a], sets[b]))
    verified = candidates[similarity >= THRESHOLD]
    assert len(verified) > 1_000
    assert all(jaccard(sets[a], sets[b]) >= THRESHOLD for a, b in verified.tolist())


def test_recall_against_brute_force_jaccard(tang_sample, tang_shingle_sets):
    docs, out, stats = tang_sample
    pairs = true_pairs(tang_shingle_sets, THRESHOLD)
    assert len(pairs) > 5_000  # the sample really is full of duplicates
    rep = representatives(out)
    recalled = sum(rep(docs[a]["id"]) == rep(docs[b]["id"]) for a, b in pairs)
    assert recalled / len(pairs) >= 0.95
    assert stats["dedup"]["verified_pairs"] + stats["dedup"]["rejected_pairs"] == stats["dedup"]["candidate_pairs"]


def test_audit_lists_every_removed_document_with_its_similarity(tang_sample):
    docs, out, stats = tang_sample
    rows = list(read_records(out / AUDIT_FILE))
    assert len({r["id"] for r in rows}) == len(rows)  # one row per document
    removed = [r for r in rows if not r["kept"]]
    assert {r["removed"] for r in removed} == {"exact", "near"}
    assert sum(r["removed"] == "exact" for r in removed) == stats["dropped"]["exact_duplicate"]
    assert sum(r["removed"] == "near" for r in removed) == stats["dropped"]["near_duplicate"]
    kept_ids = {d["id"] for d in read_records(out)}
    assert not {r["id"] for r in removed} & kept_ids
    assert all(r["cluster"] in kept_ids for r in rows)
    assert all((r["cluster"] == r["id"]) == r["kept"] for r in rows)
    texts = {d["id"]: d["text"] for d in docs}
    near = [r for r in removed if r["removed"] == "near"][:300]
    sets = shingle_sets([texts[r["id"]] for r in near] + [texts[r["cluster"]] for r in near])
    for k, row in enumerate(near):
        assert row["similarity"] == pytest.approx(jaccard(sets[k], sets[len(near) + k]), abs=1e-4)
    assert all(r["similarity"] == 1.0 for r in removed if r["removed"] == "exact" and r["cluster"] in texts
               and Normalizer()(texts[r["cluster"]]) == Normalizer()(texts[r["id"]]))


@pytest.mark.slow
def test_full_corpus_exact_duplicates_and_error_copies(raw_poems, tmp_path):
    source = write_jsonl(tmp_path / "poems.jsonl", [{"id": p["id"], "text": p["text"]} for p in raw_poems])
    stats = run_stage(DedupStage(), source, tmp_path / "out", RunOptions(workers=2, progress=False))
    assert stats["records_in"] == 398_457
    assert stats["dedup"]["exact_duplicates"] > 20_000  # the corpus README: 22,045 extra copies
    originals = {(p["id"].split("/")[0], p["uid"]): p for p in raw_poems if p["uid"]}
    pairs = [(originals[(src.removesuffix("_error"), p["uid"])], p) for p in raw_poems
             for src in [p["id"].split("/")[0]] if src.endswith("_error") and (src.removesuffix("_error"), p["uid"]) in originals]
    assert len(pairs) > 8_000  # 8,992 error copies share an id with their original
    sets = shingle_sets([a["text"] for a, _ in pairs] + [b["text"] for _, b in pairs])
    similar = [k for k in range(len(pairs)) if jaccard(sets[k], sets[len(pairs) + k]) >= THRESHOLD]
    rep = representatives(tmp_path / "out")
    together = sum(rep(pairs[k][0]["id"]) == rep(pairs[k][1]["id"]) for k in similar)
    assert len(similar) > 5_000 and together / len(similar) >= 0.95


def test_same_bytes_whatever_the_number_of_workers(tmp_path):
    rng = random.Random(5)
    han = [chr(c) for c in range(0x4E00, 0x4E00 + 500)]
    docs = []
    for i in range(3_000):
        if docs and rng.random() < 0.3:
            copy = list(rng.choice(docs)["text"])
            copy[rng.randrange(len(copy))] = rng.choice(han)
            docs.append({"id": f"d{i}", "text": "".join(copy)})
        else:
            docs.append({"id": f"d{i}", "text": "".join(rng.choice(han) for _ in range(60))})
    source = write_jsonl(tmp_path / "docs.jsonl", docs)
    outputs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        run_stage(DedupStage(DedupConfig(keep="longest")), source, out,
                  RunOptions(workers=workers, shard_size=700, progress=False))
        outputs.append({p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl.zst"))})
    assert outputs[0] == outputs[1] and AUDIT_FILE in outputs[0]


def test_options_are_checked():
    with pytest.raises(ValueError, match="exceeds num_perm"):
        DedupConfig(bands=20, rows=10)
    with pytest.raises(ValueError, match="both bands and rows"):
        DedupConfig(bands=20)
