"""Tiers of one parameter-server shard: its device cache, host and SSD rows, all on its ps task.

`TieredShard`: a tiered PSShardedTable (distributed/ps_table.py) gives each
shard the three tiers of core/tiers.py on the shard's ps task: the shard
variable [device_vocabulary_size, dim] and its optimizer slots are the device
cache, the host tier is the native TierStore in the ps process's memory, the
SSD tier its files under `<ssd_data_path>/shard_<i>`. The shard's key index
hands out global rows of the shard, as a single-process tiered table's does.

Asynchronous workers run several steps on one shard at once, so each step
inserts its keys, then plans its rows and applies the plan's moves in the
shard's tf.CriticalSection (no other step's moves, and no evaluation read,
interleave), gathers and updates the rows outside it, and finishes its plan
token after the optimizer's update. The planner pins every slot of an
unfinished plan (TierConfig.pin_until_finish, native/core/device_cache.h), so
no step evicts a row another step still reads or updates. Mirrors mxRec's
HybridMgmt swap (plan, then swap out / swap in before the lookup) placed on
TF's parameter servers. See docs/tiers.md#on-parameter-servers.
"""

from __future__ import annotations

import os

import tensorflow as tf

from mxrec_pipeline.core import initializers
from mxrec_pipeline.core import lookup as lookup_lib
from mxrec_pipeline.core import tiers as tiers_lib


def shard_config(config: tiers_lib.TierConfig, shard: int) -> tiers_lib.TierConfig:
  """Shard `shard`'s TierConfig: SSD directories `<path>/shard_<shard>`, concurrent-steps pinning.

  Creates the directories (on this machine; a ps task on another host needs
  them there: its TierStore names a missing one when it first spills).
  """
  paths = tuple(os.path.join(p, f"shard_{shard}") for p in config.ssd_data_path)
  for path in paths:
    os.makedirs(path, exist_ok=True)
  return tiers_lib.TierConfig(config.device_vocabulary_size, config.host_vocabulary_size,
                              config.ssd_vocabulary_size, paths, config.cache_policy,
                              config.wait_seconds, pin_until_finish=True)


class TieredShard:
  """The tiers of one shard and the critical section of its data movement.

  Create it eagerly under `tf.device(<the shard's ps device>)`; call
  `lookup` in the step under the same device, `finish` after the shard's
  optimizer update.

  Args:
    table_name: The table (the native resources' shared name on the ps).
    dim: Embedding dimension.
    config: The shard's TierConfig (`shard_config`).
    row_initializer: Initial rows by global row (core/initializers.py).
    container: The ps tables' resource container.
    variable: The shard's [device_vocabulary_size, dim] rows (the cache).
    slot_variables: (slot variable, initial value) of the shard's optimizer
      slots, which move with the rows.

  Attributes:
    storage: The shard's core/tiers.TieredStorage (cache and store).
    critical_section: The tf.CriticalSection of plan + moves (and reads).
  """

  def __init__(self, table_name: str, dim: int, config: tiers_lib.TierConfig,
               row_initializer: initializers.RowInitializer, container: str, variable: tf.Variable,
               slot_variables):
    self.table_name = table_name
    self.container = container
    self.variable = variable
    self.storage = tiers_lib.TieredStorage(table_name, dim, config, row_initializer, container,
                                           slot_variables=slot_variables)
    self.storage.make_create_ops(len(slot_variables))
    self.critical_section = tf.CriticalSection(name=f"{table_name}_tiers")
    # Tokens of the training lookups of each traced step (FuncGraph, or None
    # eagerly) that `finish` has not finished yet.
    self._tokens: dict = {}

  def lookup(self, global_rows: tf.Tensor, training: bool, default_value,
             admitting: bool) -> tf.Tensor:
    """[num_unique, dim] rows of the shard's distinct global rows (-1: no row).

    Training: plans and applies the moves in the critical section, then
    gathers the rows at their slots (differentiable: IndexedSlices of the
    shard variable at the slots); the plan's token waits for `finish`.
    Evaluation: reads the rows wherever they live, in the section, moving
    nothing (absent ones and -1 read `default_value`).

    Raises:
      tf.errors.ResourceExhaustedError (at run time): no room in the cache
        for the step's rows while other steps pin it (naming the table).
    """
    if not training:
      return self.critical_section.execute(
          lambda: self.storage.read(self.variable, global_rows, default_value),
          exclusive_resource_access=False)

    def plan_and_move():
      slots, token = tiers_lib.plan(self.container, self.table_name, global_rows, wait=True)
      moved = self.storage.apply_moves(self.variable, token)
      with tf.control_dependencies([] if moved is None else [moved]):
        return tf.identity(slots), tf.identity(token)

    slots, token = self.critical_section.execute(plan_and_move, exclusive_resource_access=False)
    rows = lookup_lib.gather_rows(self.variable, slots, training=True, default_value=default_value,
                                  admitting=admitting)
    # The token is finished after the read too (a shard without gradient).
    self._tokens.setdefault(_graph_key(), []).append((token, rows))
    return rows

  def finish(self, after) -> list:
    """Finishes the tokens of this step's training lookups once `after` ran.

    Args:
      after: The shard's optimizer update ops (control dependencies).

    Returns:
      The finish ops (eagerly: [] once done).

    Raises:
      tf.errors.FailedPreconditionError (at run time): a plan of this step
        had been taken as lost (unfinished for 2 x wait_seconds): its rows
        may have gone to other keys meanwhile (native DeviceCache::Finish).
    """
    tokens = self._tokens.pop(_graph_key(), [])
    reads = [rows for _, rows in tokens]
    with tf.control_dependencies([a for a in after if a is not None] + reads):
      done = [self.storage.finish_token(token) for token, _ in tokens]
    return [] if tf.executing_eagerly() else done

  # What distributed/checkpoint.py and core/admission.evict read of a table's
  # tiers (core/tiers.TieredStorage's signatures), here on the shard.

  @property
  def config(self) -> tiers_lib.TierConfig:
    return self.storage.config

  def read_rows(self, variable: tf.Variable, global_rows: tf.Tensor) -> tf.Tensor:
    """[n, width] whole rows (embedding, then each slot) of global rows, wherever they live.

    Read in the critical section: no row is caught half-moved.
    """
    return self.critical_section.execute(lambda: self.storage.read_rows(variable, global_rows),
                                         exclusive_resource_access=False)

  def import_rows(self, variable: tf.Variable, global_rows: tf.Tensor, rows: tf.Tensor):
    """Replaces every tier's content with `rows` ([n, width]) of `global_rows` (restores)."""
    return self.storage.import_rows(variable, global_rows, rows)

  def fresh_rows(self, global_rows: tf.Tensor) -> tf.Tensor:
    """[n, width] initial rows of global rows (RowInitializer and the slots' initial values)."""
    return self.storage.fresh_rows(global_rows)

  def slot_block(self, slot_variable) -> int:
    """Block of a slot variable in `read_rows`' layout."""
    return self.storage.slot_block(slot_variable)

  def release(self, global_rows: tf.Tensor):
    """Drops evicted keys' global rows from every tier, in the critical section."""
    return self.critical_section.execute(lambda: _op_output(self.storage.release(global_rows)),
                                         exclusive_resource_access=False)


def _op_output(op) -> tf.Tensor:
  """A tensor after `op` (CriticalSection.execute returns tensors)."""
  with tf.control_dependencies([] if op is None else [op]):
    return tf.constant(True)


def _graph_key():
  """The step being traced (its FuncGraph), or None eagerly."""
  return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
