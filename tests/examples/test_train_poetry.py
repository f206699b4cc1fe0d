"""examples/train_poetry.py end to end on real poems: it learns more than token frequencies,
reports its speed and data wait, and refuses double-shifted labels before training."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_poetry.py"
# The example's defaults, pinned: the threshold below was measured with them.
SMALL = ["--device", "cpu", "--layers", "2", "--dim", "64", "--heads", "4", "--seq-len", "128", "--batch-size", "16",
         "--lr", "5e-3"]


def train(packed, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--data", str(packed), *SMALL, *args],
                          capture_output=True, text=True, timeout=1500)  # ~40 s here; 10x that on a loaded machine


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_learns_well_below_unigram_entropy(packed_poems, tmp_path):
    out = tmp_path / "metrics.json"
    result = train(packed_poems, "--steps", "600", "--eval-every", "300", "--json-out", str(out))
    assert result.returncode == 0, result.stderr
    metrics = json.loads(out.read_text())
    # The unigram entropy (5.98 nats on these poems) is the loss of a model that knows only how
    # often each token occurs, so a model that uses no context scores ~1.0x. A bigram table counted
    # on the train split scores 4.65 on val (0.78x). These 600 steps (~2 epochs of the 575k train
    # tokens, ~25 s) reach 4.55-4.60 (0.76-0.77x over seeds 0-2), and the curve is still falling;
    # 0.85x (5.08) leaves ~0.5 nats for other CPUs and torch builds.
    assert metrics["val_loss"] < 0.85 * metrics["unigram_entropy"], metrics
    assert metrics["steps"] == 600 and metrics["tokens_per_s"] > 0 and 0 <= metrics["data_wait_share"] < 1
    logged = [line for line in result.stdout.splitlines() if line.startswith("step")]
    assert len(logged) == 2
    assert all("tokens/s" in line and "data wait" in line and "val loss" in line for line in logged)


def test_double_shifted_labels_refused_before_the_first_step(packed_poems):
    result = train(packed_poems, "--steps", "50", "--shift-labels-in-data")
    assert result.returncode != 0
    assert "check_alignment refused the first batch" in result.stderr
    assert "double shift" in result.stderr
    assert "train loss" not in result.stdout
