"""`fuelline cache build`: run the target once over the conversations and store its hidden states.

One process per GPU (`torchrun --nproc-per-node N -m fuelline cache build …`; one process
without torchrun); the caller says which rank this is (`ranks.py`). The build has three steps:
rank 0 makes the plan (`plan.py`: encoding, shards, batches) and deals out the unfinished
shards; every rank loads the model and writes its shards (`forward.py`, `writer.py`); rank 0
then merges them into the cache (`merge.py`), `manifest.json` last.

Interrupted at any point, the same command resumes: finished shards are kept, a partial one
continues after its last committed batch, with any number of ranks.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


from fuelline.cache.capture import check_layer_ids
from fuelline.cache.forward import load_target, write_shards
from fuelline.cache.merge import merge
from fuelline.cache.plan import BUILD_DIR, CacheConfig, Plan, assign, layout_for, make_plan, model_config, \
    model_fingerprint
from fuelline.cache.ranks import Ranks
from fuelline.cache.writer import shard_done
from fuelline.fingerprints import tokenizer_fingerprint
from fuelline.model_source import resolve_model
from fuelline.formats.target_cache import INDEX, MANIFEST, SHARD_FILES, Layout
from fuelline.io.paths import expand_inputs
from fuelline.io.stage_layout import REJECTS_DIR
from fuelline.pipeline.options import identity_history, identity_values, read_paths
from fuelline.pipeline.shards import describe_inputs
from fuelline.pipeline.workdir import WorkDir, not_a_step_output

# What a cache build writes into its output (`fuelline.io.step_files`): the cache, its rejects, and .build/,
# where the plan and the finished batches wait for the merge (an earlier fuelline's plan there too).
CACHE_WRITES = (MANIFEST, INDEX, SHARD_FILES, REJECTS_DIR, BUILD_DIR)


def build_identity(model: str | os.PathLike, inputs: list[str], config: CacheConfig, name: str | None = None) -> dict:
    """What the cache's bytes depend on: options, model and tokenizer contents, the input files.
    `name`: the model as the user named it (a Hub id), when `model` is its resolved directory."""
    return {"config": identity_values(config), "model": name or os.fspath(Path(model).resolve()),
            "model_fingerprint": model_fingerprint(model), "tokenizer_fingerprint": tokenizer_fingerprint(model),
            "inputs": describe_inputs(expand_inputs(inputs))}


def build_cache(model: str | os.PathLike, inputs: list[str], output: str | os.PathLike, config: CacheConfig,
                progress: bool = True, ranks: Ranks | None = None, restart: bool = False) -> dict:
    """Build (or resume, or find finished) the cache at `output`; returns its stats (on every rank).

    `model`: a model directory or a Hub id (`resolve_model`); `ranks`: this process's place among
    the ranks building it, one rank by default; `restart`: discard what `output` holds first."""
    name, model = resolve_model(model)
    ranks = ranks or Ranks()
    ranks.connect()
    output = Path(output)
    try:
        if ranks.rank == 0:
            step_dir = WorkDir(output, build_identity(model, inputs, config, name), **identity_history(CacheConfig),
                               reads=[*inputs, model, *read_paths(config)], writes=CACHE_WRITES)
            with step_dir.lock():
                if restart:
                    step_dir.restart()
                return _run(ranks, (name, model), inputs, output, config, progress, step_dir)
        return _run(ranks, (name, model), inputs, output, config, progress)
    finally:
        ranks.close()


def on_rank_zero(ranks: Ranks, work):
    """`work()` run by rank 0 and its result on every rank; its error raised on every rank (as text
    beyond rank 0: an exception may not pickle)."""
    result, error = None, None
    if ranks.rank == 0:
        try:
            result = work()
        except Exception as e:
            error = e
    if ranks.world_size > 1:
        shared = ranks.share(("error", f"{type(error).__name__}: {error}") if error else ("ok", result))
        if error is None:
            if shared[0] == "error":
                raise RuntimeError(f"rank 0 stopped the build: {shared[1]}")
            result = shared[1]
    if error is not None:
        raise error
    return result


def _run(ranks: Ranks, target: tuple[str, Path], inputs, output: Path, config: CacheConfig, progress: bool,
         step_dir: WorkDir | None = None) -> dict:
    """The build on every rank; `step_dir`: rank 0's, its lock held."""
    state = on_rank_zero(ranks, lambda: _prepare(ranks, step_dir, target[1], inputs, config, progress))
    if state.get("finished"):
        return state["finished"]
    plan = Plan.load(output)
    mine = state["assignment"][ranks.rank]
    write_everywhere(ranks, lambda: mine and write_shards(ranks, load_target(ranks, target[1], config, progress), plan,
                                                          config, mine, progress),
                     f"the plan and the finished batches are kept in {output / BUILD_DIR}: the same command resumes "
                     "there")
    return on_rank_zero(ranks, lambda: merge(output, plan, config, step_dir.finish))


def write_everywhere(ranks: Ranks, write, resumable: str) -> None:
    """`write()` on every rank; any rank's error raised on every rank (each naming the ranks that failed),
    with `resumable`, what the user can do, as its note."""
    error = None
    try:
        write()
    except Exception as e:
        error = e
    errors = ranks.gather(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        error.add_note(resumable)
        raise error
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise RuntimeError("; ".join(f"rank {r} failed: {e}" for r, e in failed) + f"; {resumable}")


def _prepare(ranks: Ranks, step_dir: WorkDir, model: Path, inputs, config: CacheConfig, progress: bool) -> dict:
    """Rank 0: the finished cache's stats, or the plan made or found and each rank's shards."""
    output = step_dir.path
    created = not output.exists()
    _, text = model_config(model)
    check_layer_ids(config.layers, text.num_hidden_layers)
    layout = layout_for(config, text.hidden_size)
    if (output / MANIFEST).exists():
        if (finished := step_dir.finished()) is None:
            raise not_a_step_output(output)  # a cache, but not one built here (no stats.json)
        if (output / BUILD_DIR).exists():
            shutil.rmtree(output / BUILD_DIR)  # left by a merge stopped after the manifest
        return {"finished": finished}
    step_dir.begin(lambda: (plan := Plan.load(output)) is not None
                   and any(shard_done(plan.build_dir, s.shard_id) for s in plan.shards))
    plan = Plan.load(output) if step_dir.resumed else None
    if plan is None:
        if (output / BUILD_DIR).exists():
            shutil.rmtree(output / BUILD_DIR)  # a plan never finished: nothing of it resumes
        plan = make_plan_or_leave_nothing(step_dir, created, inputs, model, config, text, progress)
    _check_disk(output, plan, layout, config.force)
    remaining = [s for s in plan.shards if not shard_done(plan.build_dir, s.shard_id)]
    return {"assignment": assign(remaining, ranks.world_size)}


def make_plan_or_leave_nothing(step_dir: WorkDir, created: bool, inputs, model, config: CacheConfig,
                                text, progress: bool) -> Plan:
    """make_plan; when it fails (a bad record, an interrupt), nothing it began stays: without its plan a
    `.build/` resumes nothing, and an output directory the build created goes too."""
    output = step_dir.path
    try:
        return make_plan(output, inputs, model, config, step_dir.identity, text, progress)
    except BaseException:
        shutil.rmtree(output / BUILD_DIR, ignore_errors=True)
        step_dir.plan_path.unlink(missing_ok=True)
        if created and output.is_dir() and not any(output.iterdir()):
            output.rmdir()
        raise


def _check_disk(output: Path, plan: Plan, layout: Layout, force: bool) -> None:
    written = sum(p.stat().st_size for p in (output / BUILD_DIR).glob("shard-*.bin*"))
    needed = plan.total_bytes - written + len(plan.record_ids) * layout.index_dtype().itemsize
    free = shutil.disk_usage(output).free
    if needed > free and not force:
        raise ValueError(f"the cache needs {needed / 2**30:,.2f} GiB more and {output} has {free / 2**30:,.2f} GiB "
                         "free; free some space or pass --force to start anyway")
