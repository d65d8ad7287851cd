"""Feature admission and eviction on the device tables (mxRec's FeatureSpec settings).

mxRec ("Rec SDK TensorFlow", feature admission and eviction) configures them
per table through `FeatureSpec(access_threshold=..., eviction_threshold=...,
faae_coefficient=...)`, a `FeatureSpec(..., is_timestamp=True)` giving each
batch's timestamps, and `EvictHook`. Here:

- Admission: the native key index counts every sighting of a key that has no
  row yet (each occurrence adds its feature's `faae_coefficient`); the key gets
  a row once its count reaches `access_threshold`. Until then its unique row in
  the batch is -1: lookups read `serving_default_value` (zeros) and it gets no
  gradient (see embedding.lookup_rows).
- Eviction: every training insertion records the batch's timestamp (its largest
  `is_timestamp` value, in seconds) as the last-seen time of its keys; `evict`
  removes keys last seen more than `eviction_threshold` seconds before the latest
  timestamp and resets their rows to the table's initial values and their
  optimizer slots to the slots' initial values.

See docs/admission-eviction.md.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from mxrec_pipeline import ops
from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.util import initialize


@dataclasses.dataclass(frozen=True)
class AdmitEvictConfig:
  """Admission and eviction settings of one table.

  Attributes:
    access_threshold: Sightings (times faae_coefficient) a key needs before it
      gets a row; None (or 0, 1) admits every key at its first sighting.
    eviction_threshold_s: Seconds, on the data's timestamps, a key may stay
      unseen before `evict` removes it; None never evicts.
  """

  access_threshold: int | None = None
  eviction_threshold_s: int | None = None

  def __post_init__(self):
    for name in ("access_threshold", "eviction_threshold_s"):
      value = getattr(self, name)
      if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"`{name}` must be None or an int >= 0, got {value!r}")

  @property
  def admits(self) -> bool:
    """Whether keys need more than one sighting."""
    return (self.access_threshold or 0) > 1


def configure(table_name: str, config: AdmitEvictConfig, where: str) -> None:
  """Registers `config` for `table_name` in the current run.

  Raises:
    ValueError: the table already has a different config (naming both).
  """
  run = initialize.get_config_initializer()
  existing = run.admit_evict.setdefault(table_name, config)
  if existing != config:
    raise ValueError(f"{where}: table '{table_name}' already has {existing}, not {config}; "
                     "give every FeatureSpec of a table the same thresholds")


def config_of(table_name: str) -> AdmitEvictConfig | None:
  """The table's config in the current run, or None."""
  return initialize.get_config_initializer().admit_evict.get(table_name)


def insert(container: str, table_name: str, keys: tf.Tensor, training: bool,
           counts: tf.Tensor | None = None, timestamp: tf.Tensor | None = None):
  """Native insertion of one table's keys, with admission when configured.

  Args:
    container: The run's resource container.
    table_name: The table.
    keys: [n] int64.
    training: False only looks up (unseen keys read -1).
    counts: [n] int64 sighting weights (faae_coefficient); ones when None.
    timestamp: int64 scalar, the batch's time in seconds; None: no timestamp.

  Returns:
    (unique_rows [num_unique] int64, -1 for keys without a row;
     restore [n] int32).
  """
  handle = key_index_lib.handle(container, table_name)
  config = config_of(table_name)
  if not training or config is None:
    unique_rows, restore, _ = key_index_lib.insert(handle, keys, training)
    return unique_rows, restore
  if counts is None:
    counts = tf.ones_like(keys)
  if timestamp is None:
    timestamp = tf.constant(-1, tf.int64)
  unique_rows, restore, _ = key_index_lib.insert_admit(handle, keys, counts, timestamp,
                                                       config.access_threshold or 0)
  return unique_rows, restore


def batch_timestamp(values: tf.Tensor) -> tf.Tensor:
  """The batch's time: the largest of its timestamps (int64 seconds), -1 if empty."""
  values = tf.cast(tf.reshape(values, [-1]), tf.int64)
  return tf.reduce_max(tf.concat([values, tf.constant([-1], tf.int64)], axis=0))


def table_stats(table) -> dict[str, tf.Tensor]:
  """Occupancy and admission counters of a table's key index.

  Returns:
    Dict of int64 scalars: size (keys with a row), capacity, admissions (keys
    given a row), evictions (keys removed by evict), pending (keys counted but
    not admitted yet).
  """
  with tf.device(key_index_lib.HOST_DEVICE):
    stats = ops.load().mx_key_index_stats(table.key_index.resource_handle)
  return dict(zip(("size", "capacity", "admissions", "evictions", "pending"), tf.unstack(stats, 5)))


def evict(table, idle_s: int, optimizers=()) -> tf.Tensor:
  """Removes keys idle longer than `idle_s` and resets their rows and slots.

  Tiered tables (core/tiers.py) drop the freed global rows from the device
  cache and the host/SSD store instead. Flat tables' freed rows get the
  table's initial values for those rows again (its
  emb_initializer is evaluated for the whole table and gathered, so this costs
  one initialization of the table per call), and each optimizer's slots of the
  table their initial values (`HashOptimizer.slot_initial_values`).

  Args:
    table: A shard of the table protocol (core/table_protocol.TableShard):
      a SparseEmbedding, a worker's shard or a ps shard (call it under the
      shard's device).
    idle_s: Seconds, >= 0.
    optimizers: HashOptimizers whose slots of `table` to reset (one without
      slots of it is skipped).

  Returns:
    freed rows: [num_evicted] int64, ascending. In a graph, running it evicts
    and resets.
  """
  with tf.device(key_index_lib.HOST_DEVICE):
    freed = ops.load().mx_key_index_evict(table.key_index.resource_handle,
                                          tf.constant(idle_s, tf.int64))
  if table.is_tiered:
    # Freed global rows leave every tier with the next plan; a key given one of
    # them later starts from its initial row (core/tiers.py).
    release = table.tiers.release(freed)
    with tf.control_dependencies([] if release is None else [release]):
      return tf.identity(freed)
  variable = table.variable
  initial = tf.gather(table.initial_rows(), freed)
  updates = [variable.scatter_update(tf.IndexedSlices(initial, freed))]
  for optimizer in optimizers:
    try:
      slots = table.slot_variables(optimizer)
    except KeyError:  # The optimizer has not trained this table.
      continue
    for name, initial_value in optimizer.slot_initial_values.items():
      slot = slots[name]
      value = tf.cast(initial_value, slot.dtype)
      fill = tf.fill([tf.size(freed), table.dim], value)
      updates.append(slot.scatter_update(tf.IndexedSlices(fill, freed)))
  with tf.control_dependencies(updates):
    return tf.identity(freed)


def evict_all(optimizers=None) -> dict[str, tf.Tensor]:
  """`evict` on every table of the run with an eviction threshold.

  Args:
    optimizers: HashOptimizers whose slots to reset; None: every hash
      optimizer that created slots in this run.

  Returns:
    Table name -> freed rows.
  """
  run = initialize.get_config_initializer()
  if optimizers is None:
    optimizers = run.hash_optimizers
  return {
      name: evict(run.tables[name], config.eviction_threshold_s, optimizers)
      for name, config in run.admit_evict.items()
      if config.eviction_threshold_s is not None and name in run.tables
  }
