"""The `fuelline` command: one subcommand per stage, plus `run` (a pipeline file) and `demo`.

Stage subcommands are built from each stage's Config dataclass, so an option exists once, with
one help text, for the CLI and for pipeline files alike. Heavy imports happen inside commands.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import click

from fuelline import __version__
from fuelline.io.remote import filesystem, is_url, refuse_url
from fuelline.pipeline.registry import STAGES, step_class
from fuelline.pipeline.stats import dominant_drop, dropped_text, require_kept
from fuelline.report.funnel import contamination_lines
from fuelline.pipeline.workers import RunOptions
from fuelline.cache.cli import cache as cache_group, cache_numbers
from fuelline.chat.regenerate_config import RegenerateConfig
from fuelline.cli_options import (at_least, config_params, given, quiet_option, restart_option, run_options,
                                   run_params, workers_option)
from fuelline.serve.cli import serve_command

# Exceptions that mean a mistake in what the user gave (a path, an option, a file's content) and
# whose message says so: the one place that decides what is a message and what is a traceback.
# RecordError and TokenFormatError are ValueErrors, OutputBusy and a failed server start RuntimeErrors.
# An OSError that says the place cannot be written (full, read-only, not permitted) is one too
# (`fuelline.io.atomic.write_refusal`).
USER_ERRORS = (ValueError, RuntimeError, FileNotFoundError, IsADirectoryError, NotADirectoryError)
RESUME_HINT = "run the same command again to resume"
SUMMARY_KEYS = ("dedup", "tokenizer", "outputs", "schemas", "forms", "encoder", "export")
CHAT_PREFIX = "chat-"
PACK_RUN_OPTIONS = ("workers", "shard_size", "executor", "ray_address")  # pack's on_error is its own


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, carrying what a command wants to say instead of the general hint to rerun."""


class FuellineGroup(click.Group):
    """`fuelline`: an expected mistake (USER_ERRORS, a full disk, a read-only output) is one line and exit 2, Ctrl-C says how to
    resume and exits 130 (the shell's code for SIGINT); a bug, or any error under `--debug`, keeps its traceback."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands: dict[str, Callable[[], click.Command]] = {}

    def add_lazy_command(self, name: str, build: Callable[[], click.Command]) -> None:
        """A subcommand built when first named: a stage's options need its module (dedup's imports
        numba), which the other commands should not pay for on every start."""
        self.lazy_commands[name] = build

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in self.lazy_commands:
            self.add_command(self.lazy_commands[name](), name)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context):
        debug = ctx.params.get("debug", False)
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):  # RuntimeErrors, but click's own control flow
            raise
        except USER_ERRORS as e:
            if debug:
                raise
            click.echo(f"error: {e}", err=True)
            for note in getattr(e, "__notes__", ()):  # e.g. the shard a Ray task failed on
                click.echo(f"  {note}", err=True)
            ctx.exit(2)
        except OSError as e:  # a full disk, a read-only place: no bug; say which file
            from fuelline.io.atomic import write_refusal

            if debug or (message := write_refusal(e)) is None:
                raise
            click.echo(f"error: {message}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt as e:
            if debug:
                import traceback

                traceback.print_exc()
            click.echo(f"interrupted: {e if isinstance(e, Interrupted) else RESUME_HINT}", err=True)
            ctx.exit(130)


@click.group(cls=FuellineGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="fuelline")
@click.option("--debug", is_flag=True, help="show the traceback of an error instead of a one-line message")
def main(debug: bool) -> None:
    """Turn raw text and chat corpora into training-ready data for LLMs."""
    _spawn_without_the_script()


# What the console script pip (or setuptools) writes defines besides its dunders: `from fuelline.cli
# import main`, sys, and in older templates re.
CONSOLE_SCRIPT_NAMES = {"main", "sys", "re"}


def _spawn_without_the_script() -> None:
    """Spare the processes multiprocessing spawns (a stage's workers) from running the console script.

    A spawned process first runs its parent's main script again (`multiprocessing.spawn`), unless
    the main module is a package's `__main__`, as under `python -m fuelline`. For the `fuelline`
    script that is `from fuelline.cli import main`: every command's imports (click, the cache,
    chat, serve and pack modules), ~0.15 s in each worker before its first task, for nothing a
    worker uses. So when the main module is that script and nothing else, it takes the spec of
    `fuelline.__main__`, the module it stands for; a script of the user's own is left alone."""
    script = sys.modules["__main__"]
    names = {name for name in vars(script) if not name.startswith("__")}
    if getattr(script, "__spec__", None) is None and getattr(script, "main", None) is main \
            and names <= CONSOLE_SCRIPT_NAMES:
        script.__spec__ = importlib.util.find_spec("fuelline.__main__")


def _print_stats(all_stats: list[dict], outputs: list[Path | str | None] | None = None) -> None:
    """One summary line per stage; `outputs` (the stage directories, in order) lets it point at rejects."""
    for stats, output in zip(all_stats, outputs or [None] * len(all_stats)):
        if "report" in stats:
            click.echo(f"report     {stats['report']}")
            continue
        dropped = dropped_text(stats["dropped"])
        resumed = f", {stats['resumed_shards']} shard(s) resumed" if stats.get("resumed_shards") else ""
        if stats.get("resumed"):  # a finished step found again
            resumed = f", resumed: done in an earlier run in {stats['original_wall_seconds']:.1f}s"
        click.echo(
            f"{stats['stage']:<10} in {stats['records_in']:>10,}  out {stats['records_out']:>10,}  "
            f"dropped: {dropped}  ({stats['wall_seconds']:.1f}s{resumed})" + _rejects_note(stats, output)
        )
        if "cache" in stats:  # a target cache's numbers, as `fuelline cache build` prints them
            click.echo(f"  cache: {cache_numbers(stats)}")
        for key in SUMMARY_KEYS:  # corpus-level numbers a stage or task adds
            if key in stats:
                click.echo(f"  {key}: " + ", ".join(f"{k} {v}" for k, v in stats[key].items()))
        for line in contamination_lines(stats.get("decontaminate")):
            click.echo(f"  {line}")
        for category, numbers in stats.get("categories", {}).items():
            click.echo(f"  category {category}: " + ", ".join(f"{k} {v:,}" for k, v in numbers.items()))
        for split, numbers in stats.get("splits", {}).items():
            template = stats.get("identity", {}).get("config", {}).get("template")
            click.echo(f"  {split}: {_split_summary(numbers, template)}")
        _warn(stats, "  ")


def _warn(stats: dict, indent: str = "") -> None:
    """A step's warnings on stderr, and the reason most of its records were dropped."""
    for warning in stats.get("warnings", []) + stats.get("tokenizer", {}).get("warnings", []):
        click.echo(f"{indent}warning: {warning}", err=True)
    if stats.get("records_out") and (dominant := dominant_drop(stats)):  # nothing kept: require_kept says it
        click.echo(f"{indent}warning: {dominant}", err=True)


def _rejects_note(stats: dict, output: Path | str | None) -> str:
    from fuelline.io.stage_layout import REJECTS_DIR

    if output is None or not stats.get("dropped"):
        return ""
    rejects = f"{str(output).rstrip('/')}/{REJECTS_DIR}"
    if is_url(output):
        fs, path = filesystem(rejects)
        found = fs.isdir(path)
    else:
        found = Path(rejects).is_dir()
    return f"  (rejected records in {rejects}/)" if found else ""


def _local_only(ctx: click.Context, param: click.Parameter, value):
    """An option naming a local file or directory: a URL is refused (a `Path` would quietly turn
    s3://b/x into the local directory s3:/b/x)."""
    if value is not None:
        names, level = [], ctx
        while level.parent is not None:  # the command's words, whatever the program is called
            names.append(level.info_name)
            level = level.parent
        refuse_url(value, f"fuelline {' '.join(reversed(names))} {param.opts[0]}")
    return value


def _step_dirs(run_dir: str, count: int) -> list[Path | None]:
    """The step directories of a run, in order, from RUN/pipeline.json, which the run has just
    written (None for a step it does not list)."""
    import orjson

    from fuelline.io.stage_layout import PIPELINE_FILE

    path = Path(run_dir) / PIPELINE_FILE
    try:
        layout = orjson.loads(path.read_bytes())["stages"]
        dirs = [Path(run_dir) / entry["dir"] for entry in layout]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise click.ClickException(f"{path}: the run finished, but its list of steps cannot be read "
                                   f"({type(e).__name__}: {e}); every step's stats.json is in its directory") from None
    return (dirs + [None] * count)[:count]


@main.command(params=run_params("workers", "executor", "ray_address"))
@click.argument("pipeline_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--run-dir", "-o", required=True, type=click.Path(file_okay=False), callback=_local_only,
              help="where the steps' outputs go")
@click.option("--input", "-i", "inputs", multiple=True, help="input of the first step (files, dirs, globs)")
@click.option("--restart-from", metavar="STEP", default=None,
              help="redo the step of this name and those after it; the steps before it resume (--restart: every step)")
def run(pipeline_file, run_dir, inputs, workers, restart, quiet, executor, ray_address, restart_from):
    """Run a pipeline file (TOML); running it again resumes."""
    from fuelline.pipeline.config import load_pipeline, run_pipeline

    steps = load_pipeline(pipeline_file)
    all_stats = run_pipeline(steps, run_dir, input=list(inputs), workers=workers, executor=executor,
                             ray_address=ray_address, restart=restart, restart_from=restart_from, progress=not quiet,
                             reads=[pipeline_file])
    _print_stats(all_stats, _step_dirs(run_dir, len(all_stats)))


def _stage_options(cls) -> list[click.Option]:
    """Input, run options, `--config` and the stage's own options (its Config's fields)."""
    params = [
        click.Option(["--input", "-i", "inputs"], multiple=True, required=True, help="files, directories or globs"),
        *run_params(),
        click.Option(["--config", "config_file"], type=click.Path(exists=True, dir_okay=False),
                     help="TOML file of this step's options; options given here override it"),
        *config_params(cls.Config),
    ]
    if hasattr(cls, "explain_report"):  # stages that can show why they would remove what they remove
        params.append(click.Option(["--explain"], type=int, is_flag=False, flag_value=30, default=None,
                                   help="list the top N scored items with their features instead of running"))
    return params


def _build_step(name: str, values: dict, where: str, config_file: str | None = None):
    """Step (or stage) `name` with the options of a --config TOML file, then those given in `values`."""
    from fuelline.pipeline.config import build_dataclass, read_toml

    cls = step_class(name)
    from_file = read_toml(config_file) if config_file else {}
    return cls(build_dataclass(cls.Config, {**from_file, **given(values)}, config_file or where))


def _run_from_cli(name: str, inputs, output, *, config_file, where=None, explain=None, output_locations=None,
                  copies=(), **values) -> dict | None:
    """Build the stage (TOML file, then options given) and run it, printing its stats; None after --explain."""
    from fuelline.pipeline.executor import run_stage

    options = run_options(values)
    stage = _build_step(name, values, where or f"fuelline {name}", config_file)
    if explain:
        click.echo(stage.explain_report(list(inputs), stage.config, explain))
        return None
    stats = run_stage(stage, list(inputs), output, options, output_locations, copies,
                      reads=[config_file] if config_file else [])
    _print_stats([stats], [output])
    require_kept(stats)
    return stats


def _stage_command(name: str, command_name: str | None = None) -> click.Command:
    """A subcommand for stage `name`, with its Config's fields as options."""
    cls = step_class(name)

    def callback(inputs, output, **values):
        _run_from_cli(name, inputs, output, **values)

    output = click.Option(["--output", "-o"], required=True, type=click.Path(file_okay=False),
                          help="output directory: a path, or a URL (s3://…, gs://…; docs/io.md)")
    return click.Command(command_name or name, callback=callback, params=[output, *_stage_options(cls)],
                         help=cls.description, short_help=cls.description)


for _name in STAGES:
    if not _name.startswith(CHAT_PREFIX):  # chat stages live under `fuelline chat`
        main.add_lazy_command(_name, functools.partial(_stage_command, _name))


@main.group()
def chat() -> None:
    """Chat and distillation data: prepare chat data, make instruction data from poetry."""


def _chat_prepare_command() -> click.Command:
    """`chat prepare`: like any stage, but with a train and an eval output (each a directory or a .jsonl)."""
    cls = step_class("chat-prepare")

    def callback(inputs, train_output, eval_output, work_dir, **values):
        from fuelline.io.writers import write_jsonl_file

        if is_url(train_output) or is_url(eval_output):  # a Path would mangle the URL: the stage directory is it
            for output in (train_output, eval_output, work_dir):
                if output is not None and output.endswith(".jsonl"):
                    raise ValueError(f"{output}: a single .jsonl output is written locally; with URLs, give "
                                     "directories (--train-output URL --eval-output URL/eval)")
            if work_dir:
                raise ValueError("--work-dir is for a .jsonl --train-output; with URLs the step's directory is "
                                 "--train-output itself")
            stage_dir, single = train_output, {}
        else:
            train, evals = train_output, eval_output = Path(train_output), Path(eval_output)
            single = {name: path for name, path in (("train", train), ("eval", evals)) if path.suffix == ".jsonl"}
            if "train" not in single and work_dir:  # the train directory is the stage directory
                raise ValueError(f"--work-dir is for a .jsonl --train-output; {train} is the step's directory itself")
            stage_dir = train if "train" not in single else Path(work_dir or train.with_name(train.name + ".parts"))
        locations = {} if "eval" in single else {"eval": eval_output}
        stats = _run_from_cli("chat-prepare", inputs, stage_dir, where="fuelline chat prepare",
                              output_locations=locations, copies=list(single.values()), **values)
        if stats is None:
            return
        for name, path in single.items():
            write_jsonl_file(stage_dir if name == "train" else stage_dir / name, path)
        click.echo(f"train  {stats['outputs']['train']:,} conversations → {train_output}\n"
                   f"eval   {stats['outputs']['eval']:,} prompts → {eval_output}")

    outputs = [
        click.Option(["--train-output"], required=True, type=click.Path(),
                     help="train chat records: a step's directory, or one plain file when it ends in .jsonl"),
        click.Option(["--eval-output"], required=True, type=click.Path(),
                     help="eval records {id, turns}: a directory, or one plain file when it ends in .jsonl"),
        click.Option(["--work-dir"], type=click.Path(file_okay=False), default=None,
                     help="the step's directory (resume state, stats.json, rejects) when --train-output is a .jsonl "
                          "(default: TRAIN_OUTPUT.parts)"),
    ]
    return click.Command("prepare", callback=callback, params=[*outputs, *_stage_options(cls)],
                         help=cls.description, short_help=cls.description)


chat.add_command(_chat_prepare_command())


@chat.command("regenerate", help=step_class("regenerate").description, params=[
    click.Option(["--input", "-i", "inputs"], multiple=True, required=True, help="chat records (files, dirs, globs)"),
    click.Option(["--output", "-o"], required=True, type=click.Path(), callback=_local_only,
                 help="OUT.jsonl (errors in OUT.jsonl.errors, stats in OUT.stats.json), or a directory for all three"),
    *config_params(RegenerateConfig),
    click.Option(["--resume"], is_flag=True, help="accepted for older scripts, does nothing: a run resumes OUT by "
                                                  "default (skips the ids it holds, retries what failed)"),
    restart_option("delete OUT (its errors and stats too) and start over"), quiet_option()])
def regenerate_command(inputs, output, resume, restart, quiet, **values):
    from dataclasses import replace

    from fuelline.chat.regenerate_config import resolve_servers

    step = _build_step("regenerate", values, "fuelline chat regenerate")
    model, _ = resolve_servers(step.config.model, step.config.servers, step.config.servers_file)
    step.config = replace(step.config, model=model)  # the model the servers serve is part of what a resume checks
    step.warn = lambda message: click.echo(message, err=True)
    try:
        stats = step.run(list(inputs), Path(output), RunOptions(restart=restart, progress=not quiet), {})
    except KeyboardInterrupt:
        raise Interrupted(f"what was written to {output} is kept: run the same command again to continue") from None
    if stats.get("resumed"):
        click.echo(f"regenerate in {stats['records_in']:,}  out {stats['records_out']:,}: finished in an earlier "
                   f"run, nothing left to do ({output}; --restart to regenerate again)")
        require_kept(stats)
        return
    c = stats["counters"]
    dropped = dropped_text(stats["dropped"])
    click.echo(f"regenerate in {stats['records_in']:,}  out {stats['records_out']:,} ({c['resumed']:,} resumed)  "
               f"dropped: {dropped}  requests {c['requests']:,} (retried {c['retried']:,}), "
               f"{c['tokens_generated']:,} tokens in {stats['wall_seconds']:.1f}s"
               + (f" ({c['tokens_unknown']:,} answers without a token count)" if c["tokens_unknown"] else ""))
    if stats["failures"]:
        click.echo("  failed for good (in the errors file; running the same command again retries them): "
                   + ", ".join(f"{k} {v:,}" for k, v in stats["failures"].items()))
    for url, numbers in stats["servers"].items():
        left_out = f", left out {', '.join(numbers['left_out'])}" if numbers["left_out"] else ""
        click.echo(f"  {url}: {numbers['requests']:,} requests, {numbers['failed']:,} failed, "
                   f"{numbers['tokens']:,} tokens{left_out}")
    require_kept(stats)


chat.add_command(_stage_command("chat-from-poetry", "from-poetry"))


@main.command(help=step_class("pack").description, params=[
    click.Option(["--input", "-i", "inputs"], multiple=True, required=True, help="document records (files, dirs, globs)"),
    click.Option(["--output", "-o"], required=True, type=click.Path(file_okay=False),
                 help="output directory: train/, val/ and a copy of the tokenizer"),
    *config_params(step_class("pack").Config), *run_params(*PACK_RUN_OPTIONS)])
def pack(inputs, output, **values):
    options = run_options(values, *PACK_RUN_OPTIONS)
    step = _build_step("pack", values, "fuelline pack")
    stats = step.run(list(inputs), output, options, {})  # a URL stays one, for pack to refuse
    for split, numbers in stats["splits"].items():
        click.echo(f"{split:<6} {_split_summary(numbers, step.config.template, 9)}")
    if stats["dropped"] or any(stats["counters"].values()):
        click.echo("dropped: " + dropped_text(stats["dropped"]) +
                   "".join(f"; {k} {v:,}" for k, v in stats["counters"].items()) + _rejects_note(stats, output))
    click.echo(f"{stats['dtype']}, vocabulary {stats['vocab_size']:,}; wrote {output}")
    _warn(stats)
    require_kept(stats)


def _split_summary(numbers: dict, template: str | None, width: int = 0) -> str:
    """A pack split in words: conversations for chat records, the metadata dropped only for poetry."""
    unit = "conversations" if template == "chat" else "documents"
    line = (f"{numbers['documents']:>{width},} {unit} {numbers['tokens']:>{width + 3 if width else 0},} tokens, "
            f"supervised {numbers['supervised_share']:.2%}")
    if template in (None, "poetry"):
        line += f", metadata dropped {numbers['metadata_dropout_share']:.2%}"
    return line


def _token_datasets(directory: str) -> dict[str | None, Path]:
    """{None: DIR} for a token dataset, {"train": DIR/train, "val": DIR/val} for a pack output."""
    from fuelline.formats.tokens import MANIFEST

    root = Path(directory)
    if (root / MANIFEST).exists():
        return {None: root}
    splits = {s: root / s for s in ("train", "val") if (root / s).is_dir()}
    if not splits:
        raise ValueError(f"{root}: neither a token dataset (no {MANIFEST}) nor a pack output (no train/ or val/)")
    return splits


@main.command(params=[quiet_option(shows_progress=False)])
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def verify(directory):
    """Check a token dataset (or a pack output's train/ and val/): manifest, sizes, checksums, ids."""
    from fuelline.formats.tokens import verify_token_dataset

    for target in _token_datasets(directory).values():
        manifest = verify_token_dataset(target)
        click.echo(f"ok  {target}: {manifest['num_documents']:,} documents, {manifest['num_tokens']:,} tokens, "
                   f"{manifest['dtype']}, checksums match")


@main.command(params=[quiet_option(shows_progress=False)])
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--doc", "doc", type=int, default=None, callback=at_least(0), help="decode document K, showing masked and trained parts")
@click.option("--window", type=int, default=None, callback=at_least(0), help="show the inputs and labels of training window I")
@click.option("--seq-len", type=int, default=64, show_default=True, callback=at_least(2), help="window length for --window")
@click.option("--split", default="train", show_default=True, help="split of a pack output to read")
def inspect(directory, doc, window, seq_len, split):
    """Look inside a token dataset: one document, or the position table of a training window."""
    from fuelline.pack.inspect import open_for_inspection, show_document, show_window

    if (doc is None) == (window is None):
        raise ValueError("give exactly one of --doc K or --window I")
    files, tokenizer = open_for_inspection(directory, split)
    try:
        click.echo(show_document(files, tokenizer, doc) if doc is not None else show_window(files, tokenizer, window, seq_len))
    except IndexError as e:  # K or I beyond the dataset: the message says by how much
        raise ValueError(str(e)) from e


@main.command(params=[quiet_option(shows_progress=False)])
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the funnel as JSON instead of a table")
def report(run_dir, as_json):
    """The funnel of a run: text table, and RUN/report/ (funnel.json, report.html, PNG charts)."""
    import orjson

    from fuelline.report.funnel import format_funnel
    from fuelline.report.step import report_run

    stats = report_run(Path(run_dir))
    funnel = orjson.loads((Path(stats["report"]).parent / "funnel.json").read_bytes())
    click.echo(orjson.dumps(funnel, option=orjson.OPT_INDENT_2).decode() if as_json else format_funnel(funnel))
    if not as_json:
        click.echo(f"\nHTML report: {Path(run_dir) / 'report' / 'report.html'}")


@main.group()
def tokenizer() -> None:
    """Train a BPE tokenizer, or convert a tiktoken vocabulary."""


@tokenizer.command("train", help=step_class("tokenizer").description, params=[
    click.Option(["--input", "-i", "inputs"], multiple=True, required=True, help="document records (files, dirs, globs)"),
    click.Option(["--output", "-o"], required=True, type=click.Path(file_okay=False), callback=_local_only,
                 help="tokenizer directory to write"),
    *config_params(step_class("tokenizer").Config), restart_option("delete what OUTPUT holds and train again"),
    quiet_option(shows_progress=False)])
def train(inputs, output, restart, **values):
    stats = _build_step("tokenizer", values, "fuelline tokenizer train").run(
        list(inputs), Path(output), RunOptions(restart=restart), {})
    report = stats["tokenizer"]
    done = f"trained in an earlier run ({output}; --restart to train again)" if stats.get("resumed") else \
        f"trained on {stats['records_in']:,} documents in {report['train_seconds']} s"
    click.echo(f"{done}: {report['vocab_size']:,} tokens, {report['tokens_per_char']} tokens per character, "
               f"{report['isolated_share']:.1%} of punctuation marks are tokens of their own; wrote {output}")
    _warn(stats)


@tokenizer.command("from-tiktoken", params=[quiet_option(shows_progress=False)])
@click.argument("ranks_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--output", "-o", required=True, type=click.Path(file_okay=False), callback=_local_only,
              help="tokenizer directory to write")
@click.option("--preset", type=click.Choice(["qwen", "none"]), default="qwen", show_default=True,
              help="pre-tokenization pattern and special tokens of a known model family")
def from_tiktoken(ranks_file, output, preset):
    """Convert a tiktoken ranks file into a tokenizer.json that gives the same ids."""
    from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

    path = convert_tiktoken(ranks_file, output, preset=preset)
    click.echo(f"wrote {path}")


@main.group()
def export() -> None:
    """Write a token dataset in another framework's format."""


@export.command("megatron", params=[quiet_option(shows_progress=False)])
@click.argument("token_dir", metavar="TOKEN_DATASET", type=click.Path(exists=True, file_okay=False))
@click.option("--output", "-o", "prefix", required=True, callback=_local_only,
              help="output prefix: PREFIX.bin and PREFIX.idx, or PREFIX_train.* and PREFIX_val.* for a pack output")
def export_megatron_command(token_dir, prefix):
    """Export a token dataset directory TOKEN_DATASET (or a pack output, with its train/ and val/) to
    Megatron-LM's indexed dataset (.bin/.idx); the loss mask is dropped."""
    from fuelline.formats.megatron import export_megatron
    from fuelline.formats.tokens import read_manifest

    masked = False
    for split, directory in _token_datasets(token_dir).items():
        manifest = read_manifest(directory)
        if split is not None and manifest["num_documents"] == 0:
            click.echo(f"note: {directory} holds no documents; {prefix}_{split}.bin/.idx not written")
            continue
        bin_path, idx_path = export_megatron(directory, prefix if split is None else f"{prefix}_{split}")
        click.echo(f"wrote {bin_path} and {idx_path}: {manifest['num_documents']:,} documents, "
                   f"{manifest['num_tokens']:,} tokens")
        masked = masked or manifest["mask"] is not None
    if masked:
        click.echo("note: the loss mask was not exported (Megatron's format has none); every token is a target")


main.add_command(serve_command)
main.add_command(cache_group)


@main.command(params=[workers_option(), quiet_option()])
@click.argument("kind", type=click.Choice(["poetry", "chat"]), default="poetry")
@click.option("--dir", "-o", "directory", type=click.Path(file_okay=False), default=None,
              help="where to write the corpus and the run (default: a new temporary directory)")
def demo(kind, directory, workers, quiet):
    """Run a pipeline on a small built-in sample: poetry (pretraining data) or chat (distillation data,
    with a tiny local model served on this machine; extras torch and serve)."""
    if kind == "chat":
        from fuelline.chat.demo import run_chat_demo
        from fuelline.report.funnel import format_funnel, load_funnel

        run_dir, _ = run_chat_demo(directory, progress=not quiet)
        click.echo(format_funnel(load_funnel(run_dir)))
        cache = next(run_dir.glob("*-cache"))
        click.echo(f"\nreport: {run_dir / 'report' / 'report.html'}")
        click.echo(f"the cache: from fuelline.cache import CacheDataset; CacheDataset({str(cache)!r})[0]")
        return
    from fuelline.demo import run_demo

    run_demo(directory, workers=workers, progress=not quiet,
             report=lambda stats, run_dir: _print_stats(stats, _step_dirs(run_dir, len(stats))))


if __name__ == "__main__":
    main()
