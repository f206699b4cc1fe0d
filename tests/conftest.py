import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("FUELLINE_SHARED_DATA", ROOT.parent / "shared" / "data"))


def shared_file(relative: str) -> Path:
    """A file of ../shared/data; the test is skipped, saying why, when the data is not there."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"needs the shared corpus file {path} (CI always has it)")
    return path


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FUELLINE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
