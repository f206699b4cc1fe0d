"""The names in a directory a stage writes: one place for the writer and the readers to agree on.

    _plan.json        what the directory is the output of (stage options, inputs, shards): the plan
                      marker every step writes (`fuelline.pipeline.workdir`)
    part-00000.*      output shard k, the only records in the directory
    _rejects/part-*   dropped and unreadable records of shard k, with their reasons
    _prepare/         what a corpus-level stage learned before the shards
    _done/part-*.json completion marker of shard k: its counts, seconds and output sizes
    stats.json        the stage's totals, written last
    NAME/part-*       a further named output of a stage that writes several (`Stage.outputs`),
                      unless the run puts it elsewhere; the first output stays at the top

`fuelline.pipeline.executor` writes this layout; `fuelline.io.paths` reads a directory that
holds `_done/` as its part files only, so bookkeeping and a further output's parts never pass for
records (every step's output has a `_plan.json`, a record stage's alone has `_done/`).
"""

PLAN_FILE = "_plan.json"
STAGE_PART_PREFIX = "part-"
DONE_DIR, REJECTS_DIR, PREPARE_DIR, STATS_FILE = "_done", "_rejects", "_prepare", "stats.json"
# What a stage writes into its directory beside the markers (`fuelline.io.step_files`): all --restart deletes,
# with a further output's parts (NAME/part-*) and what a stage writes beside them (`Stage.writes`).
STAGE_WRITES = (f"{STAGE_PART_PREFIX}*", f"{REJECTS_DIR}/{STAGE_PART_PREFIX}*", f"{DONE_DIR}/{STAGE_PART_PREFIX}*",
                PREPARE_DIR)
# What every step writes beside its data, in a stage directory or not; never records, so a
# directory read skips them.
PIPELINE_FILE = "pipeline.json"  # RUN/pipeline.json: the steps of a `fuelline run` and their directories, in order
BOOKKEEPING_FILES = {STATS_FILE, PIPELINE_FILE, "funnel.json"}
