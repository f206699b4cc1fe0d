"""Reliability family (p): outputs that overlap inputs or each other, empty inputs, repeated inputs.

- overlapping outputs: every command that reads inputs and writes outputs (clean, boilerplate,
  dedup, decontaminate, tokenizer train, pack, chat prepare, chat regenerate, cache vocab-map, the
  steps of `fuelline run`) with its output the input, inside it, holding it, spelled absolute,
  through a symlink and through `..`, each with and without --restart; chat prepare's two outputs
  on one path. The tree of inputs and finished outputs is compared byte for byte before and after:
  a refusal (exit 2, one line naming the output) with the tree unchanged is clear_error, a changed
  tree silent_wrong, a traceback a crash.
- empty and repeated inputs: an empty file, a compressed file of blank lines, a directory of empty
  files; a file named twice, with its directory, through a symlink, by two globs: clear_error with
  the tree unchanged.
- apart: outputs beside their inputs (a sibling, a prefix of the input's name) run: ok.
- --restart with a user's file: each command run into its own output, notes.txt added, run again
  with --restart (fuelline run also with --restart-from): clear_error when refused naming notes.txt
  with the tree unchanged, and the same --restart then running once notes.txt is gone.
- read beside the inputs: an evaluation set, a servers file, a --config file and a pipeline file
  inside the output, with and without --restart: clear_error with the tree unchanged.

Runs in this process through click's runner, each trial forked (`trials.isolated`). Called by
benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import orjson
import zstandard

from common import SHARED_DATA
from trials import Tally, isolated

CHAT = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i}?"},
                                          {"from": "gpt", "value": f"answer {i}."}]} for i in range(12)]


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    import fuelline.cli  # noqa: F401 - imported once here, so that every forked trial starts warm

    root = work / "paths"
    tree, pristine = root / "tree", root / "pristine"
    _build_tree(tree)
    shutil.copytree(tree, pristine, symlinks=True)
    return [_overlaps(tree, pristine, full), _empty_and_repeated(tree, pristine), _apart(root, tree),
            _reads_inside_outputs(tree, pristine), _restart_keeps_user_files(tree, pristine)]


def _invoke(args: list, cwd: Path) -> tuple[int, str]:
    from click.testing import CliRunner

    from fuelline.cli import main

    os.chdir(cwd)  # in the forked trial only
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stderr + (repr(result.exception) if result.exit_code not in (0, 2) else "")


def _build_tree(tree: Path) -> None:
    """Raw poems (corpus.jsonl, d/), clean's output cl/, a tokenizer tok/, a pack pk/, chat records
    (chat/), a pipeline file and a symlink to each directory (ln-NAME)."""
    from fuelline.io import read_records

    raw = list(itertools.islice(read_records(SHARED_DATA / "chinese-poetry.jsonl.zst"), 40))
    (tree / "d").mkdir(parents=True)
    (tree / "chat").mkdir()
    for path in (tree / "corpus.jsonl", tree / "d" / "corpus.jsonl"):
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in raw))
    (tree / "chat" / "chat.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in CHAT))
    (tree / "clean.toml").write_text('[[step]]\nuse = "clean"\n')
    for args in (["clean", "-i", "corpus.jsonl", "-o", "cl"], ["tokenizer", "train", "-i", "cl", "-o", "tok",
                                                               "--vocab-size", "400"],
                 ["pack", "-i", "cl", "-o", "pk", "--tokenizer", "tok"]):
        done, note = isolated(lambda: "{} {}".format(*_invoke([*args, "-q"], tree)))
        assert done.startswith("0 "), f"{args}: {done} {note}"
    for name in ("d", "cl", "chat", "pk"):
        (tree / f"ln-{name}").symlink_to(name)


def _snapshot(root: Path) -> dict[str, object]:
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            found[path.relative_to(root).as_posix()] = (f"-> {os.readlink(path)}" if path.is_symlink() else "dir"
                                                        if path.is_dir() else path.read_bytes())
    return found


def _refused(tree: Path, pristine: Path, args: list, names: str) -> tuple[str, str]:
    """Run a command that must be refused: clear_error when it exits 2 naming `names`, the tree as
    it was; the tree is put back when it was changed."""
    before = _snapshot(tree)

    def trial() -> str:
        code, stderr = _invoke([*args, "-q"], tree)
        if code not in (0, 2) or "Traceback" in stderr:
            return f"crash {stderr.strip()[-300:]}"
        return f"{code} {stderr.strip()}"

    outcome, note = isolated(trial)
    result = outcome.split(" ", 1)
    changed = _snapshot(tree) != before
    if changed:
        shutil.rmtree(tree)
        shutil.copytree(pristine, tree, symlinks=True)
        return "silent_wrong", f"changed the tree: {result}"
    if result[0] in ("crash", "hang"):
        return result[0], note or result[-1]
    if result[0] == "0":
        return "silent_wrong", "exit 0"
    message = result[1] if len(result) > 1 else ""
    one_line = message.count("\n") == 0 or message.startswith("Usage:")  # click's refusal of an option's value
    return ("clear_error" if names in message and one_line else "crash"), message[:200]


def _commands() -> dict[str, tuple[str, callable]]:
    """name → (the input directory it reads, args(input, output))."""
    return {
        "clean": ("d", lambda i, o: ["clean", "-i", i, "-o", o]),
        "boilerplate": ("cl", lambda i, o: ["boilerplate", "-i", i, "-o", o]),
        "dedup": ("cl", lambda i, o: ["dedup", "-i", i, "-o", o]),
        "decontaminate": ("cl", lambda i, o: ["decontaminate", "-i", i, "-o", o, "--against", "corpus.jsonl:title"]),
        "tokenizer train": ("cl", lambda i, o: ["tokenizer", "train", "-i", i, "-o", o]),
        "pack": ("cl", lambda i, o: ["pack", "-i", i, "-o", o, "--tokenizer", "tok"]),
        "chat prepare": ("chat", lambda i, o: ["chat", "prepare", "-i", i, "--train-output", o, "--eval-output",
                                               "elsewhere-eval"]),
        "chat regenerate": ("chat", lambda i, o: ["chat", "regenerate", "-i", i, "-o", o, "--server",
                                                  "http://127.0.0.1:9", "--model", "m"]),
        "cache vocab-map": ("pk", lambda i, o: ["cache", "vocab-map", i, "--draft-vocab", "8", "-o", o]),
        "run": ("d", lambda i, o: ["run", "clean.toml", "-i", i, "-o", o]),
    }


def _forms(tree: Path, directory: str, full: bool) -> dict[str, tuple[str, str]]:
    """form → (input, output) spellings of one overlap with the input directory."""
    from fuelline.io.paths import is_data_file

    inner = next(p for p in sorted((tree / directory).iterdir()) if p.is_file() and is_data_file(p))
    forms = {"equal": (directory, directory), "inside": (directory, f"{directory}/out.jsonl"),
             "holding": (f"{directory}/{inner.name}", directory)}
    if full:
        forms |= {"absolute": (directory, str(tree / directory)), "symlink": (directory, f"ln-{directory}"),
                  "symlinked input": (f"ln-{directory}", f"{directory}/out.jsonl"),
                  "dot-dot": (directory, f"d/../{directory}")}
    return forms


def _overlaps(tree: Path, pristine: Path, full: bool) -> Tally:
    tally = Tally("outputs overlapping inputs, every command")
    for name, (directory, args) in _commands().items():
        for form, (read, output) in _forms(tree, directory, full).items():
            for restart in ([], ["--restart"]):
                outcome, note = _refused(tree, pristine, [*args(read, output), *restart], "output")
                tally.add(outcome, f"{name}, {form}{' --restart' if restart else ''}: {note}")
    for restart in ([], ["--restart"]):
        outcome, note = _refused(tree, pristine, ["chat", "prepare", "-i", "chat", "--train-output", "same.jsonl",
                                                  "--eval-output", "same.jsonl", *restart], "same.jsonl")
        tally.add(outcome, f"chat prepare, both outputs on one path: {note}")
    return tally


def _empty_and_repeated(tree: Path, pristine: Path) -> Tally:
    tally = Tally("empty and repeated inputs")
    empty = tree.parent / "empty"
    empty.mkdir(exist_ok=True)
    (empty / "none.jsonl").write_bytes(b"")
    (empty / "blank.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b"\n \n"))
    cases = [(["-i", empty / "none.jsonl"], "none.jsonl"), (["-i", empty / "blank.jsonl.zst"], "blank.jsonl.zst"),
             (["-i", empty], "empty"), (["-i", "corpus.jsonl", "-i", "corpus.jsonl"], "twice"),
             (["-i", "d", "-i", "d/corpus.jsonl"], "twice"), (["-i", "d", "-i", "ln-d/corpus.jsonl"], "twice"),
             (["-i", "d/*.jsonl", "-i", "d/corpus*"], "twice")]
    for inputs, names in cases:
        for command in (["clean", "-o", "fresh"], ["tokenizer", "train", "-o", "fresh"]):
            outcome, note = _refused(tree, pristine, [*command, *inputs], names)
            tally.add(outcome, f"{command[0]} {inputs}: {note}")
    return tally


def _apart(root: Path, tree: Path) -> Tally:
    """Outputs that only look close to their inputs must run."""
    tally = Tally("outputs apart from their inputs run")
    for k, args in enumerate([["clean", "-i", "d/corpus.jsonl", "-o", "{out}"], ["dedup", "-i", "cl", "-o", "{out}"],
                              ["chat", "prepare", "-i", "chat", "--train-output", "{out}/t.jsonl", "--eval-output",
                               "{out}/e.jsonl", "--test-size", "0.25"]]):
        out = root / f"cl-apart-{k}"  # beside the tree, its name starting like an input's
        inputs_before = _snapshot(tree)

        def trial() -> str:
            code, stderr = _invoke([*(a.format(out=out) for a in args), "-q"], tree)
            return "ok" if code == 0 else f"crash {stderr.strip()[-200:]}"

        outcome, note = isolated(trial)
        if outcome == "ok" and _snapshot(tree) != inputs_before:
            outcome, note = "silent_wrong", "the inputs changed"
        tally.add(outcome.split(" ")[0], f"{args[0]}: {note or outcome}")
    return tally


def _reads_inside_outputs(tree: Path, pristine: Path) -> Tally:
    """What a step reads beside its inputs, inside its output: refused as an input is."""
    tally = Tally("evaluation sets, servers, --config and pipeline files inside outputs")
    extra = {"d/c.toml": 'profile = "poetry"\n', "d/p.toml": '[[step]]\nuse = "clean"\n',
             "chat/servers.json": '{"format": "fuelline.servers", "version": 1, "model": "m", '
                                  '"servers": [{"url": "http://127.0.0.1:9"}]}'}
    for name, text in extra.items():
        for place in (tree, pristine):
            (place / name).write_text(text)
    cases = [(["decontaminate", "-i", "cl", "-o", "d", "--against", "d/corpus.jsonl:title"], "d/corpus.jsonl"),
             (["chat", "regenerate", "-i", "corpus.jsonl", "-o", "chat", "--servers-file", "chat/servers.json"],
              "chat/servers.json"),
             (["clean", "-i", "corpus.jsonl", "-o", "d", "--config", "d/c.toml"], "d/c.toml"),
             (["run", "d/p.toml", "-i", "corpus.jsonl", "-o", "d"], "d/p.toml")]
    for args, read in cases:
        for restart in ([], ["--restart"]):
            outcome, note = _refused(tree, pristine, [*args, *restart], f"contains the input {read}")
            tally.add(outcome, f"{args[0]} {read}{' --restart' if restart else ''}: {note}")
    return tally


def _restart_keeps_user_files(tree: Path, pristine: Path) -> Tally:
    """Each command's finished output holding notes.txt: --restart refused, the tree unchanged; the
    outputs made here are removed at the end, so the tree is left as it was."""
    tally = Tally("--restart with a user's file in the output, every command")
    commands = {
        "clean": lambda o: ["clean", "-i", "corpus.jsonl", "-o", o], "boilerplate": lambda o: ["boilerplate", "-i", "cl", "-o", o],
        "dedup": lambda o: ["dedup", "-i", "cl", "-o", o],
        "decontaminate": lambda o: ["decontaminate", "-i", "cl", "-o", o, "--against", "corpus.jsonl:title"],
        "tokenizer train": lambda o: ["tokenizer", "train", "-i", "cl", "-o", o, "--vocab-size", "400"],
        "pack": lambda o: ["pack", "-i", "cl", "-o", o, "--tokenizer", "tok"],
        "chat prepare": lambda o: ["chat", "prepare", "-i", "chat", "--train-output", o, "--eval-output", f"{o}-eval"],
        "run": lambda o: ["run", "clean.toml", "-i", "corpus.jsonl", "-o", o],
        "run --restart-from": lambda o: ["run", "clean.toml", "-i", "corpus.jsonl", "-o", o, "--restart-from", "clean"],
    }
    made = []
    for k, (name, args) in enumerate(commands.items()):
        out = f"restart-{k}"
        made += [out, f"{out}-eval"]
        done, note = isolated(lambda: "{} {}".format(*_invoke([*args(out), "-q"], tree)))
        if not done.startswith("0 "):
            tally.add("crash", f"{name}: the first run: {done} {note}")
            continue
        holder = tree / out / ("01-clean" if name.startswith("run") else "")
        (holder / "notes.txt").write_text("mine\n")
        flags = [] if "--restart-from" in args(out) else ["--restart"]
        backup = tree.parent / "restart-pristine"  # the tree with this output, put back if the trial changed it
        shutil.rmtree(backup, ignore_errors=True)
        shutil.copytree(tree, backup, symlinks=True)
        outcome, note = _refused(tree, backup, [*args(out), *flags], "holds notes.txt that fuelline did not write")
        if outcome == "clear_error":
            (holder / "notes.txt").unlink()
            again, why = isolated(lambda: "{} {}".format(*_invoke([*args(out), *flags, "-q"], tree)))
            if not again.startswith("0 "):
                outcome, note = "crash", f"--restart without the user's file: {again} {why}"
        tally.add(outcome, f"{name}: {note}")
    for out in [*made, "../restart-pristine"]:
        shutil.rmtree(tree / out, ignore_errors=True)
        for lock in tree.glob(f".{out}*.lock"):
            lock.unlink()
    return tally
