"""The Ray executor: a stage's shards and its `prepare` map run as Ray tasks, on a cluster or here.

It runs the same functions on the same items as the local `WorkerPool` (`map` is their shared
`fuelline.pipeline.workers.Executor.map`) and returns results in the order of the items, so the
output bytes are the same. A shard task writes its part files and, last, its completion marker
into the output directory exactly as a local worker does, so resume works the same and a
directory begun by one executor is finished by the other. That directory is a path every node
sees (NFS, Lustre), or a URL (object storage) the task uploads its files to; see docs/ray.md.

Failures. A task whose worker process dies (killed, out of memory, node lost) is retried by Ray
up to SYSTEM_RETRIES times: the shard is redone from its start and its atomic writes give the
same bytes, as on resume. An exception the task raises itself (bad input, a bug) is not retried,
since it would only fail again: it is re-raised here at once, noting its shard, and the tasks
still queued or running are cancelled (`ray.cancel`), as the local executor cancels its queue.

Ray is imported only when this executor is opened. Its workers import fuelline like any module:
installed in the same environment on every node (docs/ray.md), no `runtime_env` needed.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence

from tqdm import tqdm

from fuelline.pipeline.shards import InputShard
from fuelline.pipeline.workers import Executor

SYSTEM_RETRIES = 3  # tries after a worker died; an exception raised by the task is not retried
CANCEL_WAIT_S = 30.0  # how long cancelled tasks get to stop before the output's lock is let go
WAIT_S = 1.0  # longest wait between two looks at the tasks (and at Ctrl-C)


def _call(fn: Callable, item):
    return fn(item)


def _name(items: Sequence, i: int, desc: str) -> str:
    """An item for a message: a shard by its part, file and lines; anything else by its position."""
    item = items[i]
    if not isinstance(item, InputShard):
        return f"item {i} of {desc}"
    span = f"lines {item.start + 1}-{item.stop}" if item.stop is not None else "the whole file"
    return f"shard {item.part_name} ({item.source}, {span})"


class RayExecutor(Executor):
    """Ray tasks on the cluster at `address` ("auto", HOST:PORT), or on one started here for the
    run with `workers` CPUs when `address` is None.

    A cluster we did not start is left running: leaving only disconnects from it. A connection
    the caller opened (`ray.init` before this) is used and left open.
    """

    def __init__(self, address: str | None, workers: int):
        self.address, self.workers = address, workers
        self._ray = None
        self._task = None
        self._connected = False  # by us: leaving disconnects (and stops a cluster started here)

    def __enter__(self):
        try:
            import ray
        except ImportError:
            raise RuntimeError('the ray executor needs Ray: pip install -e ".[ray]"') from None
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a cluster started here reports nothing
            where = {"address": self.address} if self.address else {"address": "local", "num_cpus": self.workers}
            with warnings.catch_warnings():  # a tip about GPU visibility, which CPU tasks do not use
                warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
                try:
                    ray.init(**where, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
                except ConnectionError as e:
                    why = str(e).rstrip(".")
                    raise RuntimeError(f"found no Ray cluster at {self.address}{f': {why}' if why else ''}; start "
                                       "one with `ray start --head`, or check --ray-address (docs/ray.md)") from e
            self._connected = True
        self._ray = ray
        self._task = ray.remote(num_cpus=1, max_retries=SYSTEM_RETRIES, retry_exceptions=False)(_call)
        return self

    def __exit__(self, *exc):
        if self._connected:
            self._ray.shutdown()

    def run_shards(self, run: Callable[..., dict], shards: list[InputShard], bar: tqdm) -> None:
        """`run(shard)` for every shard, one Ray task each; `bar` counts a shard's records when it finishes."""
        self._gather(run, shards, "shards", lambda i, marker: bar.update(marker["records_in"]))

    def _gather(self, fn: Callable, items: Sequence, desc: str, on_result: Callable[[int, object], None]) -> None:
        """Run `fn` on every item; hand each result over as its task ends; the first failure cancels the rest."""
        ray = self._ray
        function = ray.put(fn)  # sent once, not once per task (a stage may carry what `prepare` learned)
        refs = [self._task.remote(function, item) for item in items]
        position = {ref: i for i, ref in enumerate(refs)}
        waiting = refs
        try:
            while waiting:
                done, waiting = ray.wait(waiting, num_returns=1, timeout=WAIT_S)
                for ref in done:
                    i = position[ref]
                    on_result(i, self._result(ref, _name(items, i, desc)))
        except BaseException:
            self._cancel(waiting)
            raise

    def _result(self, ref, name: str):
        exceptions = self._ray.exceptions
        try:
            return self._ray.get(ref)
        except exceptions.RayTaskError as e:  # the task raised: the same error the local executor shows
            cause = e.cause if isinstance(e.cause, BaseException) else e
            cause.add_note(f"in the Ray task of {name}; not retried: an error the task raises would recur")
            raise cause from e  # `from`: the task's own traceback, for a bug
        except exceptions.RayError as e:  # its worker died each time it was tried, or the cluster failed
            raise RuntimeError(f"{name} did not finish on Ray after {SYSTEM_RETRIES} retries: {str(e).rstrip('.')}; "
                               "finished shards are kept, run the same command again to resume") from e

    def _cancel(self, refs: list) -> None:
        """Cancel the tasks of `refs` and wait for them, so none still writes once the run gives up."""
        for ref in refs:
            self._ray.cancel(ref)  # queued: never started; running: interrupted, its writes aborted
        if refs:
            self._ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)
