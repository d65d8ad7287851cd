"""The tables' part of a sharded run's training checkpoints, for every placement.

Beside each `ckpt-<N>` of the TrainingCheckpoint (dense model, dense
optimizer, epoch), every table's shards are saved as
`<directory>/shards-<N>/<table>/shard-<i>-of-<S>` (distributed/checkpoint.py),
each process saving the shards it holds (core/table_protocol.Table.local_shards):
a MultiWorkerMirroredStrategy worker its own, the ParameterServerStrategy
coordinator every ps task's. Restoring re-shards the keys by owner, so a run
resumes onto another number of shards, and one process restores the bundles
with distributed/checkpoint.restore_table.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterable, Mapping, Sequence

import tensorflow as tf

from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.util import model_files


def shards_path(directory: str, number: int) -> str:
  """`<directory>/shards-<number>`: the table shards of checkpoint ckpt-<number>."""
  return os.path.join(directory, f"shards-{number}")


def prune_shard_dirs(directory: str, kept: Iterable[int]) -> None:
  """Removes the `shards-<N>` directories of `directory` whose N is not in `kept`."""
  keep = {shards_path(directory, n) for n in kept}
  for path in tf.io.gfile.glob(os.path.join(directory, "shards-*")):
    if path.rstrip("/") not in keep:
      with contextlib.suppress(tf.errors.OpError):  # Best effort: the next prune retries.
        model_files.remove(path)


class TableCheckpoints:
  """Saves, restores and prunes the shards of a run's tables, as checkpoint numbers.

  Args:
    strategy: The run's strategy: when other processes hold shards too (a
      table's local shards are fewer than its shards), `save` returns only
      once every process saved, a collective barrier of the strategy, so the
      chief's `ckpt-<N>`, written after it, never lacks a shard.
    directory: The checkpoint directory, on storage every process writes
      (non-chief workers' own model_dir is a temporary one, jobs.worker_config).
    tables: Table name -> a table of the protocol (ShardedTable, PSShardedTable).
    optimizers: The tables' hash optimizers (their slots and step counts are
      saved with the rows).
  """

  def __init__(self, strategy: tf.distribute.Strategy, directory: str, tables: Mapping[str, object],
               optimizers: Sequence = ()):
    self._strategy = strategy
    self.directory = directory
    self._tables = dict(tables)
    self._optimizers = list(optimizers)
    # Whether other processes hold shards (they save them at the same time).
    self._shared = any(len(t.local_shards()) < t.num_shards for t in self._tables.values())
    # The process holding shard 0 prunes: the chief, or the PS coordinator.
    self._prunes = all(
        any(s.shard_id == 0 for s in t.local_shards()) for t in self._tables.values())

  def path(self, number: int) -> str:
    """`<directory>/shards-<number>`: the shards of checkpoint ckpt-<number>."""
    return shards_path(self.directory, number)

  def save(self, number: int) -> None:
    """Saves the shards this process holds as checkpoint `number`."""
    for table in self._tables.values():
      checkpoint_lib.save_table(self.path(number), table, self._optimizers)
    if self._shared:
      barrier(self._strategy)

  def prune(self, kept: Iterable[int]) -> None:
    """Removes the shards of checkpoints other than `kept` (the process holding shard 0)."""
    if self._prunes:
      prune_shard_dirs(self.directory, kept)

  def restore(self, number: int, tables: Iterable[str] | None = None,
              keep_rows: bool = False) -> None:
    """Restores the shards this process holds (the keys they own now) from checkpoint `number`.

    `tables`: the names to restore (default every table); `keep_rows`: as
    checkpoint.restore_shard's (keys on their saved rows).

    Raises:
      FileNotFoundError, ValueError: as checkpoint.restore_shard (missing
        shards, a shard too small for its keys, another dim or optimizer),
        naming the table and file.
    """
    for name, table in self._tables.items():
      if tables is None or name in tables:
        checkpoint_lib.restore_table(self.path(number), table, self._optimizers, keep_rows)


def summed_over_workers(strategy: tf.distribute.Strategy, values: list[int]) -> list[int]:
  """`values` summed element-wise over every worker (an all-reduce; every worker calls it)."""
  summed = strategy.reduce(tf.distribute.ReduceOp.SUM,
                           strategy.run(lambda: tf.constant(values, tf.int64)), axis=None)
  return [int(v) for v in summed.numpy()]


def barrier(strategy: tf.distribute.Strategy) -> None:
  """Returns once every worker reached it: an all-reduce of one number."""
  summed_over_workers(strategy, [1])
