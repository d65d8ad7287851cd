"""The tables' part of a sharded run's training checkpoints, for every placement.

Beside each `ckpt-<N>` of the TrainingCheckpoint (dense model, dense
optimizer, epoch), every table's shards are saved as
`<directory>/shards-<N>/<table>/shard-<i>-of-<S>` (distributed/checkpoint.py),
each process saving the shards it holds (core/table_protocol.Table.local_shards):
a MultiWorkerMirroredStrategy worker its own, the ParameterServerStrategy
coordinator every ps task's. Restoring re-shards the keys by owner, so a run
resumes onto another number of shards, and one process restores the bundles
with distributed/checkpoint.restore_table. With `pipeline.checkpoint.
full_every_epochs` > 1, the saves between full ones are deltas
(distributed/delta.py), `shards-<N>/chain.json` naming the checkpoints whose
shards they build on.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Iterable, Mapping, Sequence

import tensorflow as tf

from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.distributed import delta
from mxrec_pipeline.util import model_files


def shards_path(directory: str, number: int) -> str:
  """`<directory>/shards-<number>`: the table shards of checkpoint ckpt-<number>."""
  return os.path.join(directory, f"shards-{number}")


CHAIN_FILE = "chain.json"


def chain(directory: str, number: int) -> list[int]:
  """The checkpoints whose shards make checkpoint `number`'s tables, oldest first.

  [number] for a full save; for a delta (`pipeline.checkpoint`), the full
  save it builds on, then every delta up to `number`, as its
  `shards-<number>/chain.json` records.
  """
  return [int(n) for n in _chain_file(directory, number).get("chain", [number])]


def chain_record(directory: str, number: int) -> dict:
  """What checkpoint `number` records of its chain's full save: {"full_step", "full_time"}
  (keras/save_schedule.py; {} for a checkpoint of a version before schedules)."""
  return {k: v for k, v in _chain_file(directory, number).items() if k != "chain"}


def _chain_file(directory: str, number: int) -> dict:
  path = os.path.join(shards_path(directory, number), CHAIN_FILE)
  if not tf.io.gfile.exists(path):
    return {}
  with tf.io.gfile.GFile(path) as f:
    return json.loads(f.read())


def full_shards_in(directory: str, number: int, tables: Iterable[str], scratch: str,
                   optimizers=()) -> str:
  """A directory of checkpoint `number`'s tables as full bundles: `shards-<number>` itself,
  or, for a delta, its chain merged into `scratch` (distributed/delta.materialize_chain)."""
  numbers = chain(directory, number)
  if len(numbers) == 1:
    return shards_path(directory, number)
  for name in tables:
    delta.materialize_chain(shards_path(directory, numbers[0]),
                            [shards_path(directory, n) for n in numbers[1:]], name, scratch,
                            optimizers)
  return scratch


@contextlib.contextmanager
def full_shards(directory: str, number: int, tables: Iterable[str], optimizers=()):
  """`full_shards_in` a temporary scratch directory, removed on exit."""
  with tempfile.TemporaryDirectory() as scratch:
    yield full_shards_in(directory, number, tables, scratch, optimizers)


def prune_shard_dirs(directory: str, kept: Iterable[int]) -> None:
  """Removes the `shards-<N>` directories of `directory` whose N is not in `kept`, nor in the
  chain of a kept one (a delta's full save and earlier deltas)."""
  keep = {shards_path(directory, m) for n in kept for m in chain(directory, n)}
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

  def save(self, number: int, after: int | None = None, record: dict | None = None) -> None:
    """Saves the shards this process holds as checkpoint `number`.

    Args:
      number: The checkpoint's number.
      after: None: a full save, which starts a chain. Else a delta
        (distributed/delta.py) after checkpoint `after`, the previous save of
        this run's chain: what changed since it (or since the restore of it).
      record: JSON-able facts about the chain kept in its `chain.json`
        (keras/save_schedule.SaveSchedule.chain_record); None: none.
    """
    stale = os.path.join(self.path(number), CHAIN_FILE)  # Of an earlier save of this number.
    if self._prunes and tf.io.gfile.exists(stale):
      tf.io.gfile.remove(stale)
    for table in self._tables.values():
      if after is None:
        checkpoint_lib.save_table(self.path(number), table, self._optimizers, start_chain=True)
      else:
        delta.save_delta(self.path(number), table, self._optimizers)
    if (after is not None or record) and self._prunes:
      numbers = [number] if after is None else chain(self.directory, after) + [number]
      with tf.io.gfile.GFile(os.path.join(self.path(number), CHAIN_FILE), "w") as f:
        f.write(json.dumps({"chain": numbers, **(record or {})}))
    if self._shared:
      barrier(self._strategy)

  def same_shards(self, number: int) -> bool:
    """Whether checkpoint `number` was saved by as many shards as each table has now (a delta
    after restoring it can build on its chain)."""
    return all(
        len(checkpoint_lib.saved_shards(self.path(number), name)) == table.num_shards
        for name, table in self._tables.items())

  def chain(self, number: int) -> list[int]:
    """`chain` of checkpoint `number` in this directory."""
    return chain(self.directory, number)

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
    numbers = chain(self.directory, number)
    for name, table in self._tables.items():
      if tables is not None and name not in tables:
        continue
      if len(numbers) == 1:
        checkpoint_lib.restore_table(self.path(number), table, self._optimizers, keep_rows)
      else:
        delta.restore_chain(self.path(numbers[0]), [self.path(n) for n in numbers[1:]], table,
                            self._optimizers, keep_rows)
      for shard in table.local_shards():  # Deltas after this restore hold what changes next.
        with contextlib.nullcontext() if shard.device is None else tf.device(shard.device):
          shard.key_index.export_changes(clear=True)


def summed_over_workers(strategy: tf.distribute.Strategy, values: list[int]) -> list[int]:
  """`values` summed element-wise over every worker (an all-reduce; every worker calls it)."""
  summed = strategy.reduce(tf.distribute.ReduceOp.SUM,
                           strategy.run(lambda: tf.constant(values, tf.int64)), axis=None)
  return [int(v) for v in summed.numpy()]


def barrier(strategy: tf.distribute.Strategy) -> None:
  """Returns once every worker reached it: an all-reduce of one number."""
  summed_over_workers(strategy, [1])
