"""The draft vocabulary mapping: counts against a plain loop over CacheDataset / TokenFiles, the
mapping against SpecForge's rule written out here with a Counter filled sample by sample (and
against speculators' rule, which breaks ties by id), the files against a direct torch.save or
np.save, on caches of both formats and on token datasets."""

import shutil
from collections import Counter

import numpy as np
import orjson
import pytest
import torch

from fuelline.cache import vocab_map
from fuelline.cache.dataset import CacheDataset
from fuelline.cache.vocab_map import (build_vocab_mapping, companion_paths, count_supervised, format_summary,
                                      save_vocab_mapping, vocab_mapping)
from fuelline.formats.errors import FormatError
from fuelline.formats.target_cache import BF16, DEEPSPEC_V2, FP8, FUELLINE, shard_name
from fuelline.formats.tokens import TokenDatasetWriter, TokenFiles

from . import synthetic
from .synthetic import write_cache

KINDS = [(FUELLINE, BF16), (FUELLINE, FP8), (DEEPSPEC_V2, BF16)]
TARGET = 150_000  # synthetic.random_sample draws ids below this


def specforge(samples, draft_vocab_size, target_vocab_size):
    """SpecForge's rule (generate_vocab_mapping_file + process_token_dict_to_mappings), literally:
    a Counter updated per sample with torch.unique's ids and counts, padded, most_common."""
    token_dict = Counter()
    for input_ids, loss_mask in samples:
        masked_ids = input_ids[loss_mask == 1]
        unique_ids, counts = masked_ids.unique(return_counts=True)
        token_dict.update(dict(zip(unique_ids.tolist(), counts.tolist())))
    if len(token_dict) < draft_vocab_size:
        missing = set(range(draft_vocab_size)) - set(token_dict.keys())
        for token in sorted(missing):  # SpecForge iterates the set itself: ascending in practice
            token_dict[token] = 0
            if len(token_dict) >= draft_vocab_size:
                break
    used = sorted(key for key, _ in token_dict.most_common(draft_vocab_size))
    members = set(used)  # SpecForge tests `i in used` on the list: same answer
    return (torch.tensor([used[i] - i for i in range(len(used))]),
            torch.tensor([i in members for i in range(target_vocab_size)]))


def speculators(samples, draft_vocab_size, target_vocab_size):
    """speculators' rule (save_token_frequency_distribution + build_vocab_mappings_from_distribution),
    literally: a Counter of supervised ids, sorted by (-count, id), padded with the lowest unseen ids."""
    freq = Counter()
    for input_ids, loss_mask in samples:
        ids, counts = input_ids[loss_mask.to(torch.bool)].unique(return_counts=True)
        freq.update(dict(zip(ids.tolist(), counts.tolist())))
    chosen = sorted(freq, key=lambda token: (-freq[token], token))[:draft_vocab_size]
    for token in range(draft_vocab_size):
        if len(chosen) >= draft_vocab_size:
            break
        if token not in chosen:
            chosen.append(token)
    chosen.sort()
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    return torch.tensor(chosen, dtype=torch.long) - torch.arange(draft_vocab_size), t2d


def cache_samples(path):
    dataset = CacheDataset(path)
    return [(dataset[i]["input_ids"].long(), dataset[i]["loss_mask"].long()) for i in range(len(dataset))]


def token_samples(path):
    files = TokenFiles(path)
    return [(torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64)))
            for ids, mask in (files.document(k) for k in range(files.num_documents))]


def loop_counts(samples):
    """Counts and first supervised sample per id, by a plain loop."""
    counts, first = Counter(), {}
    for k, (ids, mask) in enumerate(samples):
        for token in ids[mask == 1].tolist():
            counts[token] += 1
            first.setdefault(token, k)
    return counts, first


def assert_counts(counted, samples):
    counts, first = loop_counts(samples)
    seen = np.flatnonzero(counted.counts)
    assert seen.tolist() == sorted(counts)
    assert counted.counts[seen].tolist() == [counts[j] for j in seen.tolist()]
    assert counted.first_sample[seen].tolist() == [first[j] for j in seen.tolist()]
    assert (counted.first_sample[counted.counts == 0] == vocab_map.NEVER).all()
    assert counted.counts.dtype == np.int64 and counted.supervised == sum(counts.values())
    assert counted.samples == len(samples) and counted.tokens == sum(len(ids) for ids, _ in samples)


def write_tokens(directory, docs, vocab_size, with_mask=True):
    """A token dataset of `docs` ([(ids, mask)]), as pack --template chat writes one."""
    writer = TokenDatasetWriter(directory, dtype="uint16", vocab_size=vocab_size, bos_id=None, eos_id=None,
                                tokenizer={}, with_mask=with_mask)
    writer.add_documents(np.concatenate([ids for ids, _ in docs]), np.array([len(ids) for ids, _ in docs]),
                         np.concatenate([mask for _, mask in docs]) if with_mask else None)
    writer.close()
    return directory


def skewed_docs(seed=0, n=60, vocab=40):
    """Documents over a small vocabulary with skewed frequencies: many equal counts (ties), an
    empty document and one with no supervised token."""
    rng = np.random.default_rng(seed)
    docs = []
    for k in range(n):
        length = 0 if k == 3 else int(rng.integers(1, 30))
        ids = (rng.zipf(1.5, length) % vocab).astype(np.int64) + 5
        mask = (rng.random(length) < 0.5) if k != 4 else np.zeros(length, bool)
        docs.append((ids, mask))
    return docs


@pytest.fixture(scope="module", params=KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def cache(request, tmp_path_factory):
    fmt, dtype = request.param
    path = tmp_path_factory.mktemp(f"{fmt}-{dtype}")
    write_cache(path, fmt=fmt, hidden_dtype=dtype, num_samples=30, num_shards=4, max_len=25)
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_cache_counts_equal_a_per_sample_loop(cache, workers):
    assert_counts(count_supervised(cache, workers=workers), cache_samples(cache))


def test_passes_of_a_few_tokens_count_the_same(cache, tmp_path, monkeypatch):
    """Many passes per shard (and per token dataset) merge to the same counts and first samples."""
    whole = count_supervised(cache)
    tokens = write_tokens(tmp_path / "tokens", skewed_docs(), 64)
    whole_tokens = count_supervised(tokens)
    monkeypatch.setattr(vocab_map, "CHUNK_TOKENS", 7)
    for before, path in ((whole, cache), (whole_tokens, tokens)):
        chunked = count_supervised(path, workers=2)
        assert np.array_equal(chunked.counts, before.counts)
        assert np.array_equal(chunked.first_sample, before.first_sample)


@pytest.mark.parametrize("draft", [1, 17, 200, 500])  # 166 distinct ids, each once: ties, then padding
def test_cache_mapping_is_specforges(cache, draft):
    counted = count_supervised(cache)
    d2t, t2d = vocab_mapping(counted.counts, counted.first_sample, draft, TARGET)
    expected_d2t, expected_t2d = specforge(cache_samples(cache), draft, TARGET)
    assert d2t.dtype == expected_d2t.dtype == torch.int64 and t2d.dtype == expected_t2d.dtype == torch.bool
    assert torch.equal(d2t, expected_d2t) and torch.equal(t2d, expected_t2d)


@pytest.mark.parametrize("draft", [1, 3, 10, 25, 39, 60])  # 40 ids 5..44: ties, then padding with ids < 5
def test_token_mapping_is_specforges_with_ties_and_padding(tmp_path, draft):
    path = write_tokens(tmp_path / "tokens", skewed_docs(), 64)
    counted = count_supervised(path)
    assert_counts(counted, token_samples(path))
    tied = Counter(counted.counts[counted.counts > 0].tolist())
    assert max(tied.values()) > 1  # equal counts, so the tie order decides
    d2t, t2d = vocab_mapping(counted.counts, counted.first_sample, draft, 64)
    expected_d2t, expected_t2d = specforge(token_samples(path), draft, 64)
    assert torch.equal(d2t, expected_d2t) and torch.equal(t2d, expected_t2d)
    assert int(t2d.sum()) == draft and len(d2t) == draft
    targets = d2t + torch.arange(draft)  # the target id of each draft id: strictly increasing, in t2d
    assert bool((targets[1:] > targets[:-1]).all()) and bool(t2d[targets].all())


@pytest.mark.parametrize("draft", [1, 3, 10, 25, 39, 60])
def test_speculators_mapping_is_its_rule_and_differs_from_specforges_only_on_ties(tmp_path, draft):
    path = write_tokens(tmp_path / "tokens", skewed_docs(), 64)
    counted, samples = count_supervised(path), token_samples(path)
    d2t, t2d = vocab_mapping(counted.counts, counted.first_sample, draft, 64, "speculators")
    expected_d2t, expected_t2d = speculators(samples, draft, 64)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert torch.equal(d2t, expected_d2t) and torch.equal(t2d, expected_t2d)
    _, specforge_t2d = specforge(samples, draft, 64)
    kept = set(torch.nonzero(t2d).flatten().tolist())
    kept_by_specforge = set(torch.nonzero(specforge_t2d).flatten().tolist())
    counts = np.pad(counted.counts, (0, 64 - len(counted.counts)))  # padding ids: count 0
    cut = min(counts[sorted(kept | kept_by_specforge)])  # the lowest count either keeps
    assert all(counts[token] == cut for token in kept ^ kept_by_specforge)  # they differ only on tied tokens


def test_speculators_and_specforge_agree_without_ties_at_the_cut_and_differ_with_them(tmp_path):
    """Token 1 three times, 9, 3 and 7 once each, 9 in the first sample: a draft of 3 takes 1, 9 and 3
    for SpecForge (first appearance, then id), 1, 3 and 7 for speculators (id); a draft of 1 takes 1
    for both."""
    docs = [(np.array([9, 1, 1]), np.ones(3, bool)), (np.array([3, 7, 1]), np.ones(3, bool))]
    counted = count_supervised(write_tokens(tmp_path / "t", docs, 16))
    first = [torch.nonzero(vocab_mapping(counted.counts, counted.first_sample, 3, 16, trainer)[1]).flatten().tolist()
             for trainer in ("specforge", "speculators")]
    assert first == [[1, 3, 9], [1, 3, 7]]
    both = [vocab_mapping(counted.counts, counted.first_sample, 1, 16, trainer) for trainer in ("specforge", "speculators")]
    assert torch.equal(both[0][0], both[1][0]) and torch.equal(both[0][1], both[1][1])  # token 1: twice


def test_build_for_speculators_writes_its_d2t_and_t2d_npy(cache, tmp_path):
    output = tmp_path / "export" / "d2t.npy"
    stats = build_vocab_mapping(cache, output, draft_vocab_size=64, target_vocab_size=TARGET, trainer="speculators")
    expected_d2t, expected_t2d = speculators(cache_samples(cache), 64, TARGET)
    d2t, t2d = np.load(output), np.load(tmp_path / "export" / "t2d.npy")  # as its train.py loads them
    assert d2t.dtype == np.int64 and t2d.dtype == np.bool_
    assert np.array_equal(d2t, expected_d2t.numpy()) and np.array_equal(t2d, expected_t2d.numpy())
    assert sorted(p.name for p in output.parent.iterdir()) == [
        ".d2t.npy.plan.json", "d2t.counts.npy", "d2t.npy", "d2t.stats.json", "t2d.npy"]
    assert stats["trainer"] == "speculators" and "t2d.npy" in format_summary(stats)
    again = build_vocab_mapping(cache, output, draft_vocab_size=64, target_vocab_size=TARGET, trainer="speculators")
    assert again["resumed"] and again["draft_vocab_size"] == 64  # finished: recognized, not redone
    with pytest.raises(Exception, match="different config.trainer"):
        build_vocab_mapping(cache, output, draft_vocab_size=64, target_vocab_size=TARGET)
    with pytest.raises(ValueError, match="for speculators -o names its d2t file"):
        build_vocab_mapping(cache, tmp_path / "mapping.npy", draft_vocab_size=8, target_vocab_size=TARGET,
                            trainer="speculators")
    with pytest.raises(ValueError, match="trainer must be one of specforge, speculators, not 'eagle'"):
        build_vocab_mapping(cache, tmp_path / "m.pt", draft_vocab_size=8, trainer="eagle")


def test_tie_order_is_first_sample_then_id(tmp_path):
    """Each id once: the first sample decides, and within a sample the lower id (torch.unique's order)."""
    docs = [(np.array([9, 3, 7]), np.ones(3, bool)), (np.array([1, 2]), np.ones(2, bool)),
            (np.array([8, 1]), np.array([True, False]))]
    counted = count_supervised(write_tokens(tmp_path / "t", docs, 16))
    d2t, t2d = vocab_mapping(counted.counts, counted.first_sample, 4, 16)
    assert torch.nonzero(t2d).flatten().tolist() == [1, 3, 7, 9]  # sample 0's three, then sample 1's lower id
    assert d2t.tolist() == [1, 2, 5, 6]


def test_build_writes_torch_saves_bytes_counts_and_stats(cache, tmp_path):
    output = tmp_path / "out" / "vocab_mapping.pt"
    stats = build_vocab_mapping(cache, output, draft_vocab_size=64, target_vocab_size=TARGET, workers=2)
    expected = dict(zip(("d2t", "t2d"), specforge(cache_samples(cache), 64, TARGET)))
    direct = tmp_path / "direct" / "vocab_mapping.pt"
    direct.parent.mkdir()
    torch.save(expected, direct)
    first = direct.read_bytes()
    torch.save(expected, direct)
    assert direct.read_bytes() == first  # torch.save is deterministic
    assert output.read_bytes() == first
    loaded = torch.load(output)
    assert set(loaded) == {"d2t", "t2d"} and torch.equal(loaded["d2t"], expected["d2t"])
    assert sorted(p.name for p in output.parent.iterdir()) == [  # no temp left; the hidden plan marker
        ".vocab_mapping.pt.plan.json", "vocab_mapping.counts.npy", "vocab_mapping.pt", "vocab_mapping.stats.json"]
    samples = cache_samples(cache)
    counts = np.load(companion_paths(output)["counts"])
    direct_counts = np.zeros(TARGET, np.int64)
    for ids, mask in samples:
        np.add.at(direct_counts, ids[mask == 1].numpy(), 1)
    assert counts.dtype == np.int64 and np.array_equal(counts, direct_counts)
    kept = expected["t2d"].numpy()
    supervised = sum(int((mask == 1).sum()) for _, mask in samples)
    in_draft = sum(int(kept[ids[mask == 1].numpy()].sum()) for ids, mask in samples)
    written = orjson.loads(companion_paths(output)["stats"].read_bytes())
    assert written == stats
    assert stats["coverage"] == pytest.approx(in_draft / supervised) and 0 < stats["coverage"] < 1
    assert stats["supervised_tokens"] == supervised and stats["samples"] == len(samples)
    assert stats["distinct_tokens"] == int(np.count_nonzero(direct_counts))
    assert stats["draft_vocab_size"] == 64 and stats["target_vocab_size"] == TARGET
    assert stats["source"]["kind"] == "target cache" and stats["target_vocab_size_from"] == "given"
    text = format_summary(stats)
    assert f"{supervised:,} supervised tokens" in text and f"{stats['coverage']:.2%}" in text


def test_save_replaces_atomically_with_the_direct_bytes(tmp_path):
    d2t, t2d = torch.tensor([0, 0, 3]), torch.tensor([True, True, False, False, False, True])
    path = tmp_path / "mapping.pt"
    path.write_bytes(b"old")
    save_vocab_mapping(path, d2t, t2d)
    (tmp_path / "direct").mkdir()
    torch.save({"d2t": d2t, "t2d": t2d}, tmp_path / "direct" / "mapping.pt")
    assert path.read_bytes() == (tmp_path / "direct" / "mapping.pt").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["direct", "mapping.pt"]


def test_pack_output_counts_train_only(tmp_path):
    out = tmp_path / "packed"
    train, val = skewed_docs(1), skewed_docs(2, n=10)
    write_tokens(out / "train", train, 64)
    write_tokens(out / "val", val, 64)
    stats = build_vocab_mapping(out, tmp_path / "m.pt", draft_vocab_size=20)
    counted = count_supervised(out)
    assert_counts(counted, token_samples(out / "train"))
    assert stats["source"] == {"path": str(out), "kind": "pack output", "split": "train"}
    assert stats["target_vocab_size"] == 64 and "manifest.json" in stats["target_vocab_size_from"]
    assert "its train/ split only" in format_summary(stats)
    loaded = torch.load(tmp_path / "m.pt")
    expected_d2t, expected_t2d = specforge(token_samples(out / "train"), 20, 64)
    assert torch.equal(loaded["d2t"], expected_d2t) and torch.equal(loaded["t2d"], expected_t2d)


def test_target_vocab_from_the_cache_target_models_config(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(orjson.dumps({"text_config": {"vocab_size": 151_936}}))
    monkeypatch.setattr(synthetic, "TARGET_MODEL", str(model))
    write_cache(tmp_path / "cache", num_samples=5)
    stats = build_vocab_mapping(tmp_path / "cache", tmp_path / "m.pt", draft_vocab_size=32)
    assert stats["target_vocab_size"] == 151_936 and stats["target_vocab_size_from"] == str(model / "config.json")
    assert torch.load(tmp_path / "m.pt")["t2d"].shape == (151_936,)


def test_errors_say_what_is_wrong(tmp_path, cache):
    with pytest.raises(ValueError, match="pass --target-vocab"):  # the cache's target is "org/target-model"
        build_vocab_mapping(cache, tmp_path / "m.pt", draft_vocab_size=8)
    with pytest.raises(ValueError, match=r"token id [\d,]+ \(supervised first in sample \d+\) is not below "
                                         "target_vocab_size 1,000"):
        build_vocab_mapping(cache, tmp_path / "m.pt", draft_vocab_size=8, target_vocab_size=1000)
    counts, first = np.array([0, 2, 1]), np.array([vocab_map.NEVER, 0, 1])
    with pytest.raises(ValueError, match="draft_vocab_size 9 is larger than target_vocab_size 8"):
        vocab_mapping(counts, first, 9, 8)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="draft_vocab_size must be a positive integer"):
            vocab_mapping(counts, first, bad, 8)
    with pytest.raises(IsADirectoryError, match="-o names the mapping file"):
        build_vocab_mapping(cache, tmp_path, draft_vocab_size=8, target_vocab_size=TARGET)
    unmasked = write_tokens(tmp_path / "plain", skewed_docs(), 64, with_mask=False)
    with pytest.raises(FormatError, match=r"no loss mask \(mask.bin\).*--template chat"):
        count_supervised(unmasked)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither a target cache nor a token dataset"):
        count_supervised(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        count_supervised(tmp_path / "absent")
    with pytest.raises(ValueError, match="workers must be at least 1"):
        count_supervised(cache, workers=0)
    assert not (tmp_path / "m.pt").exists()


def test_a_damaged_cache_is_refused_as_the_reader_refuses_it(tmp_path):
    write_cache(tmp_path / "cache", num_samples=6, num_shards=2)
    shard = tmp_path / "cache" / shard_name(1)
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(FormatError, match=shard_name(1)):
        CacheDataset(tmp_path / "cache")
    with pytest.raises(FormatError, match=shard_name(1)):
        count_supervised(tmp_path / "cache")


def test_fewer_distinct_tokens_than_the_draft_vocabulary_pads_with_the_lowest_unseen(tmp_path):
    docs = [(np.array([2, 70, 70, 5]), np.array([True, True, True, False]))]
    stats = build_vocab_mapping(write_tokens(tmp_path / "t", docs, 100), tmp_path / "m.pt", draft_vocab_size=4)
    t2d = torch.load(tmp_path / "m.pt")["t2d"]
    assert torch.nonzero(t2d).flatten().tolist() == [0, 1, 2, 70]  # the seen 2 and 70, then 0 and 1
    assert stats["coverage"] == 1.0 and stats["distinct_tokens"] == 2
    assert "only 2 distinct supervised tokens" in format_summary(stats)


@pytest.mark.slow  # ~15 s: the Qwen vocabulary's conversion and a real pack
def test_a_real_chat_pack_output(qwen_dir, tmp_path):
    from fuelline.pack.packer import PackConfig, pack

    records = [{"id": f"c{k}", "conversations": [{"role": "user", "content": f"What is {k} plus {k}?"},
                                                 {"role": "assistant", "content": f"{k} plus {k} is {2 * k}."}]}
               for k in range(40)]
    (tmp_path / "chats.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    pack([tmp_path / "chats.jsonl"], qwen_dir, tmp_path / "out", PackConfig(template="chat", chat_template="chatml"),
         workers=1, progress=False)
    stats = build_vocab_mapping(tmp_path / "out", tmp_path / "m.pt", draft_vocab_size=32, target_vocab_size=151_936)
    samples = token_samples(tmp_path / "out" / "train")
    expected_d2t, expected_t2d = specforge(samples, 32, 151_936)
    loaded = torch.load(tmp_path / "m.pt")
    assert torch.equal(loaded["d2t"], expected_d2t) and torch.equal(loaded["t2d"], expected_t2d)
    assert stats["samples"] == len(samples) < 40 and stats["source"]["split"] == "train"


def test_the_command_writes_specforges_mapping_and_says_its_coverage(tmp_path):
    from click.testing import CliRunner

    from fuelline.cli import main

    write_cache(tmp_path / "cache", num_samples=20, max_len=30)
    out = tmp_path / "maps" / "vocab_mapping.pt"
    runner = CliRunner()
    for args, says in ((["-o", str(out)], "error: --draft-vocab (draft_vocab_size in a pipeline step) is required"),
                       (["--draft-vocab", "0", "-o", str(out)], "error: --draft-vocab must be at least 1, found 0")):
        refused = runner.invoke(main, ["cache", "vocab-map", str(tmp_path / "cache"), *args])
        assert refused.exit_code == 2 and says in refused.output and "Traceback" not in refused.output
    missing = runner.invoke(main, ["cache", "vocab-map", str(tmp_path / "cache"), "--draft-vocab", "50", "-o", str(out)])
    assert missing.exit_code == 2 and "pass --target-vocab" in missing.output and "Traceback" not in missing.output
    assert not out.exists()
    result = runner.invoke(main, ["cache", "vocab-map", str(tmp_path / "cache"), "--draft-vocab", "50", "-o", str(out),
                                  "--target-vocab", str(TARGET), "--workers", "2"])
    assert result.exit_code == 0, result.output
    d2t, t2d = specforge(cache_samples(tmp_path / "cache"), 50, TARGET)
    saved = torch.load(out)
    assert torch.equal(saved["d2t"], d2t) and torch.equal(saved["t2d"], t2d)
    stats = orjson.loads(companion_paths(out)["stats"].read_bytes())
    assert f"coverage {stats['coverage']:.2%} of supervised tokens" in result.output
    again = runner.invoke(main, ["cache", "vocab-map", str(tmp_path / "cache"), "--draft-vocab", "50", "-o", str(out),
                                 "--target-vocab", str(TARGET), "--no-verify"])  # verify decides nothing written
    assert again.exit_code == 0 and torch.equal(torch.load(out)["d2t"], d2t), again.output


def test_a_damaged_record_is_refused_and_no_verify_counts_only_what_opening_checks(cache, tmp_path):
    """Issue 36 class 4: the ids of one sample overwritten, or a mask byte flipped, with the index left
    as it was: `cache verify` names the checksum, and so does vocab-map, never a mapping from the damage."""
    from .test_specforge import poke

    before = count_supervised(cache)
    length = int(CacheDataset(cache).lengths[3])
    for field, data, changed in (
            ("input_ids", np.full(length, 7, "<i4").tobytes(), lambda c: c.counts[7] > before.counts[7:8].sum()),
            ("loss_mask", b"\x01", lambda c: c.supervised == before.supervised + 1)):  # position 0: a prompt token
        damaged = tmp_path / field
        shutil.copytree(cache, damaged)
        poke(damaged, 3, field, 0, data, reseal=False)
        assert changed(count_supervised(damaged, verify=False))  # what vocab-map counted before issue 36
        if cache.name.startswith(DEEPSPEC_V2):  # no checksums in this format: only its structure is checked
            continue
        with pytest.raises(FormatError, match=r"shard-\d+\.bin: sample 3: checksum mismatch"):
            build_vocab_mapping(damaged, tmp_path / "m.pt", draft_vocab_size=8, target_vocab_size=TARGET)
        assert not (tmp_path / "m.pt").exists()


def test_a_flipped_mask_bit_in_a_token_dataset_or_a_pack_output_is_refused(tmp_path):
    for directory, damaged in ((tmp_path / "tokens", tmp_path / "tokens"),
                               (tmp_path / "packed", tmp_path / "packed" / "train")):
        write_tokens(damaged, skewed_docs(), 64)
        flipped = bytearray((damaged / "mask.bin").read_bytes())
        flipped[3] ^= 0x10
        (damaged / "mask.bin").write_bytes(bytes(flipped))
        with pytest.raises(FormatError, match=r"mask\.bin: checksum mismatch"):
            build_vocab_mapping(directory, tmp_path / "m.pt", draft_vocab_size=8)
        assert count_supervised(directory, verify=False).supervised  # counted from the damage, when asked to
    assert not (tmp_path / "m.pt").exists()


def test_no_supervised_token_exits_2_with_the_reason_and_writes_nothing(tmp_path):
    """Issue 36 class 10."""
    from click.testing import CliRunner

    from fuelline.cli import main

    docs = [(np.array([3, 4, 5]), np.zeros(3, bool)), (np.array([6]), np.zeros(1, bool))]
    write_tokens(tmp_path / "t", docs, 16)
    result = CliRunner().invoke(main, ["cache", "vocab-map", str(tmp_path / "t"), "--draft-vocab", "4", "-o",
                                       str(tmp_path / "m.pt"), "--quiet"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "no supervised token in its 2 samples (4 tokens, every loss mask 0)" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
