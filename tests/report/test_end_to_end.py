import shutil
import subprocess
from itertools import islice

import numpy as np
import orjson
import pytest

from fuelline.formats.tokens import verify_token_dataset
from fuelline.io import read_records
from fuelline.loader import TokenDataset, check_alignment, make_loader
from fuelline.pipeline.config import load_pipeline, run_pipeline
from fuelline.report.funnel import load_funnel

from ..conftest import ROOT, shared_file

RAW_POEMS = 4_000


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """configs/poetry.toml over the first few thousand raw poems of the real corpus."""
    base = tmp_path_factory.mktemp("e2e")
    source = base / "poems.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in
                                islice(read_records(shared_file("chinese-poetry.jsonl.zst")), RAW_POEMS)))
    run_pipeline(load_pipeline(ROOT / "configs" / "poetry.toml"), base / "run", input=[str(source)], workers=2,
                 progress=False)
    return base / "run"


def test_the_pipeline_ends_in_a_verified_loadable_token_dataset(run_dir):
    pack_dir = next(p for p in run_dir.iterdir() if p.name.endswith("-pack"))
    for split in ("train", "val"):
        verify_token_dataset(pack_dir / split)
    batch = next(iter(make_loader(TokenDataset(pack_dir / "train", 128), 4)))
    check_alignment(batch)
    assert (batch["labels"] == -100).any() and (batch["labels"] != -100).any()


def test_the_report_adds_up_at_every_stage(run_dir):
    funnel = load_funnel(run_dir)
    steps = funnel["steps"]
    assert [s["stage"] for s in steps] == ["clean", "boilerplate", "dedup", "tokenizer", "pack"]
    assert steps[0]["records_in"] == RAW_POEMS
    for step in steps:
        assert step["records_in"] == step["records_out"] + sum(step["dropped"].values()), step["name"]
    for before, after in zip(steps, steps[1:]):
        assert after["records_in"] == before["records_out"]
    splits = steps[-1]["splits"]
    assert splits["train"]["documents"] + splits["val"]["documents"] == steps[-1]["records_out"]
    t = funnel["tokens"]
    assert t["total"] == splits["train"]["tokens"] + splits["val"]["tokens"] == t["supervised"] + t["masked"]


def test_the_html_report_renders_its_charts_in_headless_chromium(run_dir, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("needs Debian's chromium (.ci/run installs it)")
    page = run_dir / "report" / "report.html"  # where the report step and `fuelline report RUN` write
    assert page.read_text().count("data:image/png;base64,") == 3
    shot = ROOT / "tests" / "report" / "screenshots"
    shot.mkdir(exist_ok=True)
    png = shot / "report.png"
    png.unlink(missing_ok=True)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,2400", "--enable-logging=stderr"]
    result = subprocess.run([browser, *flags, f"--screenshot={png}", page.as_uri()], capture_output=True,
                            text=True, timeout=120)
    assert png.exists(), result.stderr[-2000:]
    assert "Uncaught" not in result.stderr and "Failed to load resource" not in result.stderr
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.stdout.count("<img") == 3
    import matplotlib.image

    pixels = matplotlib.image.imread(png)[..., :3]
    bar_blue = np.array([0x4A, 0x7B, 0xB7]) / 255  # the funnel chart's bars were drawn
    assert (np.abs(pixels - bar_blue).sum(axis=-1) < 0.05).sum() > 1_000
