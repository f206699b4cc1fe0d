"""Dedup's decision as phases of tasks: spill files, how the work is cut, and resume."""

import random

import numpy as np
import orjson
import pytest

from fuelline.dedup import phases
from fuelline.io.spill import group_ranges, read_spill, spill_counts, write_spill
from fuelline.dedup.stage import AUDIT_FILE, DedupConfig, DedupStage
from fuelline.io import read_records
from fuelline.pipeline.executor import RunOptions, run_stage


def test_spill_rows_come_back_by_partition_in_writer_order(tmp_path):
    rng = np.random.default_rng(3)
    prefixes, written = [], []
    for k, size in enumerate((50, 0, 80)):
        partition = rng.integers(0, 16, size)
        values = rng.integers(0, 1 << 40, size)
        prefix = tmp_path / f"w{k}" / "rows"
        prefix.parent.mkdir()
        write_spill(prefix, partition, 16, {"value": values, "doc": np.arange(size, dtype=np.uint32)})
        prefixes.append(prefix)
        written.append((partition, values))
    base = [0, 50, 50]
    rows = read_spill(prefixes, 4, 9, ("value", "doc"), base)
    expected_values, expected_docs = [], []
    for (partition, values), start in zip(written, base):
        for p in range(4, 9):  # a writer's rows: partition by partition, in their given order within one
            where = np.flatnonzero(partition == p)
            expected_values.extend(values[where].tolist())
            expected_docs.extend((where + start).tolist())
    assert rows["value"].tolist() == expected_values and rows["doc"].tolist() == expected_docs
    assert spill_counts(prefixes).tolist() == np.bincount(
        np.concatenate([p for p, _ in written]), minlength=16).tolist()


def test_partition_ranges_cover_every_row_once_near_the_target():
    rng = np.random.default_rng(4)
    counts = rng.integers(0, 50, 300) * (rng.random(300) < 0.7)
    counts[17] = 500  # one partition above the target: a task of its own
    ranges = group_ranges(counts, 120)
    covered = np.zeros(len(counts), dtype=int)
    for lo, hi in ranges:
        covered[lo:hi] += 1
        assert counts[lo:hi].sum() <= 120 or (counts[lo:hi] > 0).sum() == 1
    assert (covered[counts > 0] == 1).all() and all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """3,000 documents: a third near copies (one character changed), some exact copies."""
    rng = random.Random(11)
    han = [chr(c) for c in range(0x4E00, 0x4E00 + 500)]
    docs = []
    for i in range(3_000):
        roll = rng.random()
        if docs and roll < 0.3:
            copy = list(rng.choice(docs)["text"])
            copy[rng.randrange(len(copy))] = rng.choice(han)
            docs.append({"id": f"d{i}", "text": "".join(copy)})
        elif docs and roll < 0.4:
            docs.append({"id": f"d{i}", "text": rng.choice(docs)["text"]})
        else:
            docs.append({"id": f"d{i}", "text": "".join(rng.choice(han) for _ in range(rng.randint(40, 80)))})
    path = tmp_path_factory.mktemp("phases") / "docs.jsonl"
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    return path


def dedup(source, out, config, workers=1):
    stats = run_stage(DedupStage(config), source, out, RunOptions(workers=workers, shard_size=700, progress=False))
    return stats, {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl.zst"))}


# The default cuts on `workers`, then many small tasks on one (no process starts). MinHash on two
# workers is test_stage.py's test_same_bytes_whatever_the_number_of_workers; SimHash's is here.
@pytest.mark.parametrize("method, workers", [("minhash", 1), ("simhash", 2)])
def test_how_the_phases_are_cut_changes_nothing(corpus, tmp_path, monkeypatch, method, workers):
    config = DedupConfig(method=method, keep="longest")
    stats, reference = dedup(corpus, tmp_path / "default", config, workers=workers)
    summary = stats["dedup"]
    assert summary["exact_duplicates"] > 200 and summary["near_duplicates"] > 300 and AUDIT_FILE in reference
    monkeypatch.setattr(phases, "ROWS_PER_TASK", 300)
    monkeypatch.setattr(phases, "PAIRS_PER_TASK", 50)
    monkeypatch.setattr(phases, "SIMHASH_TASKS", 40)
    monkeypatch.setattr(phases, "AUDIT_ROWS_PER_TASK", 100)
    stats, cut = dedup(corpus, tmp_path / "cut", config)
    tasks, default_tasks = stats["dedup"]["tasks"], summary["tasks"]
    assert tasks["exact"] > default_tasks["exact"] == 1
    assert tasks["candidates"] > default_tasks["candidates"] and tasks["verify"] > default_tasks["verify"]
    # The audit is one zstd frame per task: other bytes, the same rows in the same order.
    audit = [list(read_records(tmp_path / name / AUDIT_FILE)) for name in ("default", "cut")]
    assert len(audit[0]) > 500 and audit[1] == audit[0]
    assert cut.pop(AUDIT_FILE) != reference.pop(AUDIT_FILE) and cut == reference
    assert {k: v for k, v in stats["dedup"].items() if k not in ("tasks", "seconds")} == \
           {k: v for k, v in summary.items() if k not in ("tasks", "seconds")}


def test_an_interrupted_decision_resumes_without_redoing_finished_tasks(corpus, tmp_path, monkeypatch):
    config = DedupConfig()
    _, reference = dedup(corpus, tmp_path / "reference", config)
    verify = phases.verify_pairs
    verified_tasks = []

    def failing(task, **kwargs):
        if task[0] == 2:
            raise KeyboardInterrupt  # as a Ctrl-C in the middle of the verification phase
        verified_tasks.append(task[0])
        return verify(task, **kwargs)

    monkeypatch.setattr(phases, "verify_pairs", failing)
    with pytest.raises(KeyboardInterrupt):
        dedup(corpus, tmp_path / "out", config)
    assert verified_tasks == [0, 1]
    workdir = tmp_path / "out" / "_prepare"
    assert sorted(p.name for p in (workdir / "verify").glob("*.json")) == ["task-00000.json", "task-00001.json"]

    def recomputed(*args, **kwargs):
        raise AssertionError("a finished task was run again")

    monkeypatch.setattr(phases, "verify_pairs", verify)
    monkeypatch.setattr(phases, "write_spill", recomputed)  # candidate tasks spill their pairs: all had finished
    stats, resumed = dedup(corpus, tmp_path / "out", config)
    assert resumed == reference and stats["dedup"]["verified_pairs"] > 0
    assert not (workdir / "verify").exists() and not (workdir / "shards").exists()  # removed once decided


def _components_by_union_find(num_docs: int, pairs) -> list[int]:
    """The reference: a plain union-find, each document labelled by its component's smallest index."""
    parent = list(range(num_docs))

    def root(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = root(int(a)), root(int(b))
        parent[max(ra, rb)] = min(ra, rb)
    return [root(x) for x in range(num_docs)]


@pytest.mark.parametrize("seed", range(20))
def test_connected_components_label_each_document_with_its_components_smallest_index(seed):
    from fuelline.dedup.clusters import connected_components

    rng = np.random.default_rng(seed)
    num_docs = int(rng.integers(1, 400))
    # sparse and dense graphs, long chains in a shuffled order (the most rounds), self-pairs
    kind = seed % 3
    if kind == 0:
        pairs = rng.integers(0, num_docs, size=(int(rng.integers(0, 2 * num_docs)), 2))
    elif kind == 1:
        chain = rng.permutation(num_docs)
        pairs = np.stack([chain[:-1], chain[1:]], axis=1)[rng.permutation(num_docs - 1)]
    else:
        pairs = np.concatenate([rng.integers(0, num_docs, size=(num_docs // 10, 2)),
                                np.repeat(rng.integers(0, num_docs, size=(5, 1)), 2, axis=1)])
    labels = connected_components(num_docs, pairs.astype(np.int64))
    assert labels.tolist() == _components_by_union_find(num_docs, pairs)
