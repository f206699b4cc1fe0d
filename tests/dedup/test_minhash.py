import random

import numpy as np
import pytest

from fuelline.dedup.lsh import bucket_pairs, candidate_probability, choose_bands, unique_pairs
from fuelline.dedup.minhash import MinHasher, permutations, reference_shingles, splitmix64

HAN = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]


def random_text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(HAN) for _ in range(length))


@pytest.mark.parametrize("shingle, ngram", [("char", 5), ("char", 1), ("word", 3), ("auto", 5)])
def test_fast_kernel_matches_the_reference_bit_for_bit(shingle, ngram):
    rng = random.Random(7)
    texts = ["", "a", "短", "四個字", "abcde", "the quick brown fox jumps over the lazy dog"]
    texts += [random_text(rng, rng.randint(1, 80)) for _ in range(150)]
    texts += [" ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(rng.randint(1, 30)))
              for _ in range(50)]
    hasher = MinHasher(num_perm=64, ngram=ngram, shingle=shingle, seed=3)
    fast = hasher.signatures(texts)
    for text, signature in zip(texts, fast):
        assert np.array_equal(signature, hasher.reference(text)), text


def test_auto_shingles_by_characters_exactly_when_half_the_visible_characters_are_cjk():
    # Spaces and newlines are not counted; kana, hangul and extension-B Han are CJK. One batch
    # decides for all its documents at once (empty ones among them), as each would be decided alone.
    cases = {"江南 ab": True, "江 abc": False, "ア한\nxy": True, "\U00020001 x\ny z": False, "abc": False,
             "江南好，风景旧曾谙": True}
    hasher = MinHasher(num_perm=8, ngram=2, shingle="auto")
    texts = ["", *cases, "", "   ", ""]
    symbols, offsets = hasher.symbols(texts)
    for k, text in enumerate(texts):
        own = symbols[offsets[k]:offsets[k + 1]]
        assert np.array_equal(own, hasher.symbols([text])[0]), text
        if text in cases:
            assert (own.tolist() == [ord(c) for c in text]) == cases[text], text


def test_hash_family_is_fixed_in_code_not_drawn_from_a_library():
    # splitmix64 test vectors from its reference implementation (seed 0): the permutation
    # coefficients derive from it, so signatures cannot change with numpy or Python versions.
    state, outputs = 0, []
    for _ in range(3):
        state, value = splitmix64(state)
        outputs.append(value)
    assert outputs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    a, b = permutations(2, seed=0)
    assert (int(a[0]), int(b[0])) == (outputs[0] | 1, outputs[1])


def test_estimated_jaccard_error_matches_theory():
    rng = random.Random(11)
    hasher = MinHasher(num_perm=128, ngram=5, shingle="char")
    z_scores = []
    for _ in range(600):
        base = random_text(rng, 120)
        chars = list(base)
        for _ in range(rng.randint(1, 12)):  # edits spread the true similarity over (0, 1)
            chars[rng.randrange(len(chars))] = rng.choice(HAN)
        other = "".join(chars)
        a, b = (reference_shingles([ord(c) for c in t], 5) for t in (base, other))
        truth = len(a & b) / len(a | b)
        if not 0.05 < truth < 0.95:
            continue
        sig = hasher.signatures([base, other])
        estimate = float(np.mean(sig[0] == sig[1]))
        z_scores.append((estimate - truth) / np.sqrt(truth * (1 - truth) / 128))
    z = np.array(z_scores)
    assert len(z) > 300
    assert abs(z.mean()) < 0.15  # unbiased
    assert 0.8 < z.std() < 1.2  # the binomial standard error sqrt(J(1-J)/k)


def test_band_choice_and_candidate_probability():
    bands, rows = choose_bands(0.85, 128)
    assert bands * rows <= 128
    assert candidate_probability(0.95, bands, rows) > 0.99
    assert candidate_probability(0.5, bands, rows) < 0.01
    assert candidate_probability(0.85, bands, rows) > 0.8  # misses cost more than verified extras
    assert choose_bands(0.85, 128, fn_weight=0.5) != (bands, rows)


def test_bucket_pairs_connect_every_run_and_nothing_else():
    hashes = np.array([5, 9, 5, 7, 5, 9, 1], dtype=np.uint64)
    docs = np.array([0, 2, 3, 4, 8, 9, 11])
    pairs = unique_pairs(bucket_pairs(hashes, docs), 12)
    assert {tuple(p) for p in pairs.tolist()} == {(0, 3), (3, 8), (0, 8), (2, 9)}
