"""A table sharded by key over the parameter servers of a ParameterServerStrategy.

`PSShardedTable`: shard i of a table lives on "/job:ps/task:i" (its native key
index, its [rows_per_shard, dim] rows and the hash optimizer's slots of those
rows); key k belongs to shard `sharding.owner(k, num_ps)`. In a step the
ClusterCoordinator scheduled, a worker splits the batch's keys by owner,
inserts and gathers each part on its owner ps (ops under tf.device: TF's
remote execution, so only the touched rows travel), stitches the rows back in
batch order and, after the backward pass, applies the hash optimizer's row
update on each owner ps. Admission and eviction (core/admission.py) run on the
owners too; tiered shards (`tiers=`, mxRec's DDR/SSD modes) keep core/tiers.py's
three tiers on their ps (distributed/ps_tiers.py). Updates from several
workers are asynchronous (Hogwild-style), as ParameterServerStrategy's dense
variables are.

Mirrors TF's variable placement under ParameterServerStrategy and TFRA's /
mxRec's PS-sharded hash tables (TorchRec's row-wise sharding splits the same
way). See docs/distributed.md#parameter-servers-parameterserverstrategy for
an example and launching.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import initializers
from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.core import lookup as lookup_lib
from mxrec_pipeline.core import tiers as tiers_lib
from mxrec_pipeline.distributed import ps_tiers
from mxrec_pipeline.distributed import sharding
from mxrec_pipeline.optimizers.base import HashOptimizer

# Resource container of the PS tables' key indexes (one per PS process).
CONTAINER = "mxrec_ps"
LOCAL_DEVICE = "/CPU:0"


def ps_devices(strategy: tf.distribute.Strategy | None) -> list[str]:
  """The devices of the shards: "/job:ps/task:i/device:CPU:0" per ps task, or the local CPU.

  Args:
    strategy: A ParameterServerStrategy (its cluster's "ps" job), or None for
      one shard in this process (single-process training of the same table).

  Raises:
    ValueError: a strategy that is not a ParameterServerStrategy, or a
      cluster with no "ps" task.
  """
  if strategy is None:
    return [LOCAL_DEVICE]
  if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    raise ValueError(f"PSShardedTable needs a ParameterServerStrategy, got "
                     f"{type(strategy).__name__} (MultiWorkerMirroredStrategy: use ShardedTable)")
  # The strategy connected this process to the cluster: the ps tasks' CPUs are logical devices.
  tasks = {
      tf.DeviceSpec.from_string(d.name).task for d in tf.config.list_logical_devices("CPU")
      if tf.DeviceSpec.from_string(d.name).job == "ps"
  }
  num_ps = len(tasks)
  if num_ps < 1 or tasks != set(range(num_ps)):
    raise ValueError(f"PSShardedTable: the cluster's \"ps\" tasks are {sorted(tasks)}; "
                     "expected ps 0 to N-1 (is each one up?)")
  return [f"/job:ps/task:{i}/device:CPU:0" for i in range(num_ps)]


class PSShardedTable(tf.Module):
  """Key index, rows and optimizer slots of a table, shard i on ps task i.

  Create it on the coordinator (the chief) OUTSIDE `strategy.scope()` (its
  variables are placed with tf.device on their shard's ps task); call
  `lookup` and `apply_gradients` inside a tf.function that
  `ClusterCoordinator.schedule` runs on the workers.

  Args:
    strategy: The ParameterServerStrategy (one shard per ps task), or None:
      one shard on this process's CPU (the single-process reference).
    name: Table name (the key index's shared name on each PS).
    dim: Embedding dimension, >= 1.
    rows_per_shard: Rows of each shard: the most distinct keys a PS owns; a
      full shard fails naming the table (MxKeyIndexInsert's error).
    optimizer: A row-wise hash optimizer (mxrec_pipeline.optimizers: lazy
      Adam, Adagrad, SGD, FTRL); its slots are created beside each shard.
    emb_initializer: Initializer of each shard's rows, called with
      (shape=[rows_per_shard, dim], dtype); rows are drawn per shard, so a
      random one gives other initial rows than one process would.
    key_dtype: dtype of the raw ids: tf.int64, tf.int32 or tf.string
      (fingerprinted by core/key_index.to_keys); the export's signature
      takes ids of this dtype.
    value_dtype: Floating dtype of the rows.
    access_threshold: Feature admission (mxRec's access_threshold,
      core/admission.py): sightings a key needs, counted by its owner PS over
      every worker's training lookups, before it gets a row; None (or 0, 1)
      admits every key at once.
    eviction_threshold_s: Feature eviction (mxRec's eviction_threshold):
      `evict` removes keys unseen for more than this many seconds of the
      batches' timestamps (`lookup(..., timestamp=)`); None never evicts.
    tiers: Host/SSD tiers of each shard (core/tiers.TierConfig, per-shard
      sizes; its device_vocabulary_size must equal rows_per_shard, and
      ssd_data_path directories get a `shard_<i>` directory per shard), or
      None: all rows in the shard variable. Tiered rows are float32 and start
      from the RowInitializer of `emb_initializer` (by global row of the
      shard, core/initializers.row_initializer).

  Attributes:
    devices: The shards' devices, shard i first.
    num_shards: len(devices).
    shard_variables: [num_shards] [rows_per_shard, dim] rows variables.
    slots: [num_shards] dicts slot name -> [rows_per_shard, dim] variable.
    step: int64 scalar variable on shard 0: apply_gradients calls so far.
    admit_evict: The table's admission.AdmitEvictConfig.
    tiered_shards: [num_shards] ps_tiers.TieredShard, or None (not tiered).

  Raises:
    ValueError: created inside a strategy scope, bad dim/rows_per_shard/
      key_dtype/access_threshold/eviction_threshold_s, an optimizer that is
      not a HashOptimizer, a strategy that ps_devices refuses, tiers whose
      device_vocabulary_size is not rows_per_shard, a non-float32 tiered
      table or an initializer without a per-row form (all naming the table).
  """

  def __init__(self, strategy: tf.distribute.Strategy | None, *, name: str, dim: int,
               rows_per_shard: int, optimizer: HashOptimizer,
               emb_initializer: Callable = tf.keras.initializers.Zeros(),
               key_dtype: tf.DType = tf.int64, value_dtype: tf.DType = tf.float32,
               access_threshold: int | None = None, eviction_threshold_s: int | None = None,
               tiers: tiers_lib.TierConfig | None = None):
    super().__init__(name=None)
    if tf.distribute.has_strategy():
      raise ValueError(f"PSShardedTable('{name}'): create it outside strategy.scope(): "
                       "ParameterServerStrategy places variables created in its scope round-robin "
                       "over the ps tasks, a shard's rows and slots must sit beside its key index")
    for arg, value in (("dim", dim), ("rows_per_shard", rows_per_shard)):
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"PSShardedTable('{name}'): `{arg}` must be a positive int, got {value!r}")
    if not isinstance(optimizer, HashOptimizer):
      raise ValueError(f"PSShardedTable('{name}'): `optimizer` must be a row-wise hash optimizer "
                       f"of mxrec_pipeline.optimizers, got {type(optimizer).__name__}")
    self.table_name = name
    self.dim = int(dim)
    self.rows_per_shard = int(rows_per_shard)
    self.optimizer = optimizer
    self.key_dtype = tf.as_dtype(key_dtype)
    if self.key_dtype not in (tf.int64, tf.int32, tf.string):
      raise ValueError(f"PSShardedTable('{name}'): `key_dtype` must be int64, int32 or string, "
                       f"got {self.key_dtype.name}")
    try:
      self.admit_evict = admission.AdmitEvictConfig(access_threshold, eviction_threshold_s)
    except ValueError as e:
      raise ValueError(f"PSShardedTable('{name}'): {e}") from None
    if tiers is not None:
      if tiers.device_vocabulary_size != self.rows_per_shard:
        raise ValueError(f"PSShardedTable('{name}'): tiers.device_vocabulary_size="
                         f"{tiers.device_vocabulary_size} must equal rows_per_shard="
                         f"{self.rows_per_shard} (the shard variable is the device cache)")
      if tf.as_dtype(value_dtype) != tf.float32:
        raise ValueError(f"PSShardedTable('{name}'): a tiered table's value_dtype must be "
                         f"float32, got {tf.as_dtype(value_dtype).name}")
      emb_initializer = initializers.row_initializer(emb_initializer, name)
    self.tiers = tiers
    self._emb_initializer = emb_initializer
    self._value_dtype = value_dtype
    self.devices = ps_devices(strategy)
    self.num_shards = len(self.devices)
    self._key_indexes = []
    self.shard_variables = []
    self.slots = []
    self.tiered_shards = None if tiers is None else []
    capacity = self.rows_per_shard if tiers is None else tiers.total_rows
    for i, device in enumerate(self.devices):
      with tf.device(device):
        index = key_index_lib.KeyIndex(CONTAINER, name, capacity)
      self._key_indexes.append(index)
      with tf.device(device):
        self.shard_variables.append(
            tf.Variable(emb_initializer(shape=[self.rows_per_shard, self.dim], dtype=value_dtype),
                        name=f"{name}/shard_{i}"))
        self.slots.append({
            slot: tf.Variable(
                tf.fill([self.rows_per_shard, self.dim], tf.constant(initial, value_dtype)),
                trainable=False, name=f"{name}/shard_{i}/{optimizer.optimizer_name}/"
                f"{slot}") for slot, initial in optimizer.slot_initial_values.items()
        })
        if i == 0:
          self.step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name=f"{name}/step")
        if tiers is not None:
          self.tiered_shards.append(
              ps_tiers.TieredShard(name, self.dim, ps_tiers.shard_config(tiers, i), emb_initializer,
                                   CONTAINER, self.shard_variables[i],
                                   [(self.slots[i][slot], initial)
                                    for slot, initial in optimizer.slot_initial_values.items()]))

  @property
  def key_indexes(self) -> list[key_index_lib.KeyIndex]:
    """[num_shards] the shards' key indexes (each on its shard's device)."""
    return list(self._key_indexes)

  def initial_rows(self) -> tf.Tensor:
    """[rows_per_shard, dim] initial rows of a shard (emb_initializer's values)."""
    return tf.convert_to_tensor(
        self._emb_initializer(shape=[self.rows_per_shard, self.dim], dtype=self._value_dtype),
        self._value_dtype)

  def _split(self, keys: tf.Tensor):
    """(keys per shard, their positions in `keys`): [num_shards] lists of [n_i] tensors."""
    owners = sharding.owner(keys, self.num_shards)
    positions = tf.range(tf.size(keys, out_type=tf.int32))
    return (tf.dynamic_partition(keys, owners, self.num_shards),
            tf.dynamic_partition(positions, owners, self.num_shards))

  def lookup(self, ids: tf.Tensor, training: bool = True, default_value=0.0,
             timestamp: tf.Tensor | None = None) -> tf.Tensor:
    """Rows of `ids`, each read on its owner PS (inserted there first when training).

    Args:
      ids: [any shape] int32/int64/string ids (core/key_index.to_keys).
      training: True inserts absent keys (a row each on their owner; with
        admission, once their count reaches access_threshold); False reads
        `default_value` for them and inserts and counts nothing.
      default_value: Scalar or [dim] row read by absent keys (eval) and, in
        training, by keys not admitted yet.
      timestamp: int64 scalar, the batch's time in seconds
        (core/admission.batch_timestamp), recorded by the owners as the
        keys' last-seen time; required in training when the table has
        eviction_threshold_s, ignored otherwise.

    Returns:
      [ids' shape + [dim]] embeddings, differentiable w.r.t. shard_variables
      (the gradient of shard i is IndexedSlices of its touched rows, without
      the keys not admitted yet).

    Raises:
      ValueError: a training lookup without `timestamp` on a table with
        eviction_threshold_s (naming the table).
      tf.errors.*: a full shard (MxKeyIndexInsert, naming the table).
    """
    ids = tf.convert_to_tensor(ids)
    keys = tf.reshape(key_index_lib.to_keys(ids, f"table '{self.table_name}'"), [-1])
    counting = training and (self.admit_evict.access_threshold is not None or
                             self.admit_evict.eviction_threshold_s is not None)
    if counting:
      if timestamp is None and self.admit_evict.eviction_threshold_s is not None:
        raise ValueError(f"PSShardedTable('{self.table_name}'): eviction_threshold_s needs the "
                         "batch's `timestamp` in training lookups")
      timestamp = tf.constant(-1, tf.int64) if timestamp is None else tf.cast(timestamp, tf.int64)
    admitting = training and self.admit_evict.admits
    key_parts, position_parts = self._split(keys)
    parts = []
    for i, device in enumerate(self.devices):
      with tf.device(device):
        handle = key_index_lib.handle(CONTAINER, self.table_name)
        # Each occurrence counts once, as one process counts the batch. Every occurrence
        # goes to its owner anyway, so counting adds only the timestamp scalar to a step's bytes.
        if counting:
          unique_rows, restore, _ = key_index_lib.insert_admit(
              handle, key_parts[i], tf.ones_like(key_parts[i]), timestamp,
              self.admit_evict.access_threshold or 0)
        else:
          unique_rows, restore, _ = key_index_lib.insert(handle, key_parts[i], training)
        if self.tiered_shards is not None:
          values = self.tiered_shards[i].lookup(unique_rows, training, default_value, admitting)
        else:
          values = lookup_lib.gather_rows(self.shard_variables[i], unique_rows, training=training,
                                          default_value=default_value, admitting=admitting)
      parts.append(tf.gather(values, restore))
    stitched = tf.dynamic_stitch(position_parts, parts)
    return tf.reshape(stitched, tf.concat([tf.shape(ids), [self.dim]], 0))

  def apply_gradients(self, grads: Sequence[tf.IndexedSlices | None]) -> tf.Operation:
    """Applies the optimizer's row update of each shard on its PS.

    Args:
      grads: [num_shards] gradients of shard_variables (tape.gradient's
        IndexedSlices; None for a shard the loss did not touch). Repeated
        indices are summed first, as one process sums a batch's repeats.

    Returns:
      The op of the updates (eagerly: None).
    """
    if len(grads) != self.num_shards:
      raise ValueError(f"PSShardedTable('{self.table_name}'): {len(grads)} gradients for "
                       f"{self.num_shards} shards")
    with tf.device(self.devices[0]):
      step = self.step.assign_add(1)
    updates = []
    for i, grad in enumerate(grads):
      shard_updates = []
      if grad is not None and not isinstance(grad, tf.IndexedSlices):
        raise ValueError(f"PSShardedTable('{self.table_name}'): the gradient of shard {i} is "
                         f"{type(grad).__name__}, expected IndexedSlices (tape.gradient of "
                         "lookup's rows); a dense gradient would update every row")
      with tf.device(self.devices[i]):
        if grad is not None:
          shard_updates = self.optimizer.apply_sparse(self.shard_variables[i], self.slots[i], grad,
                                                      step)
        if self.tiered_shards is not None:  # The step's rows stop being pinned.
          shard_updates = shard_updates + self.tiered_shards[i].finish(shard_updates)
      updates += shard_updates
    return tf.group(updates)

  def evict(self) -> list[tf.Tensor]:
    """Removes every shard's keys idle longer than eviction_threshold_s, on their PS.

    core/admission.evict on each shard: a key (or a pending count) last
    seen more than eviction_threshold_s seconds before the latest timestamp
    its owner saw is removed; its row gets the shard's initial row again and
    its optimizer slots their initial values. Call it from the coordinator
    (eagerly) or inside a scheduled tf.function.

    Returns:
      [num_shards] [num_evicted] int64: the freed rows of each shard.

    Raises:
      ValueError: the table has no eviction_threshold_s.
    """
    if self.admit_evict.eviction_threshold_s is None:
      raise ValueError(f"PSShardedTable('{self.table_name}'): evict needs eviction_threshold_s")
    freed = []
    for i, device in enumerate(self.devices):
      with tf.device(device):
        freed.append(
            admission.evict(ShardView(self, i), self.admit_evict.eviction_threshold_s,
                            [ShardOptimizerView(self, i)]))
    return freed

  def export_shard(self, shard: int) -> dict[str, np.ndarray]:
    """Eagerly, on the coordinator: shard `shard`'s keys and their rows and slots.

    Returns:
      {"keys": [n] int64, "values": [n, dim], and one [n, dim] array per slot
       name}, in the key index's export order.
    """
    keys, rows = self._key_indexes[shard].export()
    with tf.device(self.devices[shard]):
      if self.tiered_shards is not None:  # Rows of every tier: [n, dim * (1 + slots)].
        whole = self.tiered_shards[shard].read_rows(self.shard_variables[shard], rows).numpy()
        blocks = np.split(whole, 1 + len(self.slots[shard]), axis=1)
        slots = dict(zip(self.slots[shard], blocks[1:]))
        return {"keys": keys.numpy(), "values": blocks[0]} | slots
      out = {"keys": keys.numpy(), "values": tf.gather(self.shard_variables[shard], rows).numpy()}
      for slot, variable in self.slots[shard].items():
        out[slot] = tf.gather(variable, rows).numpy()
    return out


class ShardView:
  """Shard `shard_id` of a PSShardedTable as the core reads a flat table.

  What distributed/checkpoint.py reads of a ShardedTable (shard_id,
  num_shards, `shard`) and core/admission.evict of a SparseEmbedding
  (key_index, variable, initial_rows, is_tiered, tiers). Use its ops under
  `tf.device(table.devices[shard_id])`.
  """

  def __init__(self, table: PSShardedTable, shard_id: int):
    self.shard = self
    self.shard_id, self.num_shards = shard_id, table.num_shards
    self.table_name, self.dim = table.table_name, table.dim
    self.device_vocabulary_size = table.rows_per_shard
    # A tiered shard's tiers (ps_tiers.TieredShard: read_rows, import_rows,
    # release as core/tiers.TieredStorage's), or None.
    self.is_tiered = table.tiered_shards is not None
    self.tiers = table.tiered_shards[shard_id] if self.is_tiered else None
    self.key_index = table.key_indexes[shard_id]
    self.variable = table.shard_variables[shard_id]
    self.initial_rows = table.initial_rows


class ShardOptimizerView:
  """The table's optimizer on shard `shard_id` as the core reads a hash optimizer (its slots)."""

  def __init__(self, table: PSShardedTable, shard_id: int):
    self.optimizer_name = table.optimizer.optimizer_name
    self.slot_initial_values = table.optimizer.slot_initial_values
    self.iterations = table.step  # The step count t of the update, as optimizer.iterations.
    self._slots = table.slots[shard_id]

  def build(self, var_list) -> None:
    del var_list  # The table created its slots.

  def get_slot(self, table_name: str, slot_name: str) -> tf.Variable:
    del table_name  # One table.
    return self._slots[slot_name]


# Bytes of one key (int64) and of one restore index (int32).
KEY_BYTES = 8
RESTORE_BYTES = 4


def step_bytes(keys: np.ndarray, num_shards: int, dim: int, value_bytes: int = 4) -> np.ndarray:
  """Bytes one `lookup` + `apply_gradients` of `keys` ships between a worker and each shard.

  Counted from the tensors that cross devices in the step, as `lookup` and
  `apply_gradients` place them: to shard i go its n_i keys (int64) and,
  after the backward pass, the gradient rows of its u_i distinct keys
  ([u_i, dim]); from shard i come those u_i rows ([u_i, dim]) and the n_i
  restore indices (int32, computed by the key index on the ps). The row
  indices of the gradient are produced and consumed on the ps and do not
  travel. Scalars (the step count) and gRPC framing are not counted.

  Args:
    keys: [n] int64 keys of one lookup (core/key_index.to_keys of the ids,
      padding included).
    num_shards: The table's shards (ps tasks), >= 1.
    dim: The table's embedding dimension.
    value_bytes: Bytes of a row component (4: float32).

  Returns:
    [num_shards, 2] int64: bytes to shard i (column 0) and from it (column 1).
  """
  keys = np.asarray(keys, np.int64).reshape(-1)
  owners = sharding.owner_numpy(keys, num_shards)
  out = np.zeros([num_shards, 2], np.int64)
  for i in range(num_shards):
    part = keys[owners == i]
    rows_bytes = len(np.unique(part)) * dim * value_bytes
    out[i] = (len(part) * KEY_BYTES + rows_bytes, rows_bytes + len(part) * RESTORE_BYTES)
  return out
