"""A table sharded by key over the parameter servers of a ParameterServerStrategy.

`PSShardedTable`: shard i of a table is a `PSShard` on "/job:ps/task:i" (its
native key index, its [device_vocabulary_size, dim] rows and the hash
optimizer's slots of those rows); key k belongs to shard `sharding.owner(k, num_ps)`. In a step the
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
from mxrec_pipeline.core import placement
from mxrec_pipeline.core import table_protocol
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
  if placement.table_placement(strategy) is not placement.TablePlacement.PARAMETER_SERVERS:
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


class PSShard(tf.Module):
  """Shard `shard_id` of a PSShardedTable: key index, rows, slots and tiers on one ps task.

  A core/table_protocol.TableShard: checkpoints (distributed/checkpoint.py),
  eviction (core/admission.py) and statistics read it as they read a
  single-process table, with their ops under `tf.device(shard.device)`.

  Attributes:
    device: "/job:ps/task:<i>/device:CPU:0" (or the local CPU).
    key_index: Its core/key_index.KeyIndex (the table's name in CONTAINER).
    variable: [device_vocabulary_size, dim] rows.
    slots: Slot name -> [device_vocabulary_size, dim] variable of the table's
      optimizer.
    tiers: Its distributed/ps_tiers.TieredShard, or None.
  """

  def __init__(self, table: "PSShardedTable", shard_id: int, device: str, emb_initializer,
               value_dtype: tf.DType, capacity: int):
    super().__init__(name=None)
    self.table_name, self.dim = table.table_name, table.dim
    self.device_vocabulary_size = table.device_vocabulary_size
    self.shard_id, self.num_shards = shard_id, table.num_shards
    self._device = device
    self._optimizer = table.optimizer
    self._step = table.step
    self._initial = lambda: tf.convert_to_tensor(
        emb_initializer(shape=[self.device_vocabulary_size, self.dim], dtype=value_dtype),
        value_dtype)
    name = self.table_name
    with tf.device(device):
      self.key_index = key_index_lib.KeyIndex(CONTAINER, name, capacity)
      self.variable = tf.Variable(self._initial(), name=f"{name}/shard_{shard_id}")
      self.slots = {
          slot: tf.Variable(
              tf.fill([self.device_vocabulary_size, self.dim],
                      tf.constant(initial, value_dtype)), trainable=False,
              name=f"{name}/shard_{shard_id}/{self._optimizer.optimizer_name}/{slot}")
          for slot, initial in self._optimizer.slot_initial_values.items()
      }
      self.tiers = None
      if table.tiers is not None:
        self.tiers = ps_tiers.TieredShard(
            name, self.dim, ps_tiers.shard_config(table.tiers,
                                                  shard_id), emb_initializer, CONTAINER,
            self.variable, [(self.slots[slot], initial)
                            for slot, initial in self._optimizer.slot_initial_values.items()])

  @property
  def device(self) -> str:
    return self._device

  @property
  def is_tiered(self) -> bool:
    return self.tiers is not None

  def initial_rows(self) -> tf.Tensor:
    """[device_vocabulary_size, dim] initial rows (emb_initializer's values)."""
    return self._initial()

  def slot_variables(self, optimizer, create: bool = False) -> dict[str, tf.Variable]:
    """The shard's slots, created beside it at construction for the table's optimizer.

    Raises:
      KeyError: `optimizer` is another optimizer than the table's.
    """
    del create  # The table created its slots.
    if optimizer.optimizer_name != self._optimizer.optimizer_name:
      raise KeyError(f"PSShardedTable('{self.table_name}') is trained by "
                     f"{self._optimizer.optimizer_name!r}, not {optimizer.optimizer_name!r}")
    return dict(self.slots)

  def iterations(self, optimizer) -> tf.Variable:
    """The table's step count on ps 0 (the t of its row updates)."""
    del optimizer
    return self._step

  def rows_of(self, rows: tf.Tensor) -> dict[str, tf.Tensor]:
    """{"values": [n, dim], slot name: [n, dim]} of global rows `rows` (every tier)."""
    if self.tiers is not None:  # Rows of every tier: [n, dim * (1 + slots)].
      whole = self.tiers.read_rows(self.variable, rows)
      blocks = tf.split(whole, 1 + len(self.slots), axis=1)
      return {"values": blocks[0]} | dict(zip(self.slots, blocks[1:]))
    out = {"values": tf.gather(self.variable, rows)}
    out.update({slot: tf.gather(variable, rows) for slot, variable in self.slots.items()})
    return out


class PSShardedTable(tf.Module):
  """A table sharded by key over the ps tasks: one PSShard per ps task, key k on shard owner(k).

  Create it on the coordinator (the chief) OUTSIDE `strategy.scope()` (its
  variables are placed with tf.device on their shard's ps task); call
  `lookup` and `apply_gradients` inside a tf.function that
  `ClusterCoordinator.schedule` runs on the workers. A
  core/table_protocol.Table: `local_shards()` are every shard (the
  coordinator saves, restores and evicts them all).

  Args:
    strategy: The ParameterServerStrategy (one shard per ps task), or None:
      one shard on this process's CPU (the single-process reference).
    name: Table name (the key index's shared name on each PS).
    dim: Embedding dimension, >= 1.
    device_vocabulary_size: Rows of each shard: the most distinct keys a PS
      owns; a full shard fails naming the table (MxKeyIndexInsert's error).
    optimizer: A row-wise hash optimizer (mxrec_pipeline.optimizers: lazy
      Adam, Adagrad, SGD, FTRL); its slots are created beside each shard.
    emb_initializer: Initializer of each shard's rows, called with
      (shape=[device_vocabulary_size, dim], dtype); rows are drawn per shard,
      so a random one gives other initial rows than one process would.
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
      sizes; its device_vocabulary_size must equal this one, and
      ssd_data_path directories get a `shard_<i>` directory per shard), or
      None: all rows in the shard variable. Tiered rows are float32 and start
      from the RowInitializer of `emb_initializer` (by global row of the
      shard, core/initializers.row_initializer).

  Attributes:
    devices: The shards' devices, shard i first.
    num_shards: len(devices).
    shards: [num_shards] PSShard.
    shard_variables: [num_shards] [device_vocabulary_size, dim] rows variables.
    step: int64 scalar variable on shard 0: apply_gradients calls so far.
    admit_evict: The table's admission.AdmitEvictConfig.
    tiered_shards: [num_shards] ps_tiers.TieredShard, or None (not tiered).

  Raises:
    ValueError: created inside a strategy scope, bad dim/device_vocabulary_size/
      key_dtype/access_threshold/eviction_threshold_s, an optimizer that is
      not a HashOptimizer, a strategy that ps_devices refuses, tiers whose
      device_vocabulary_size is another, a non-float32 tiered table or an
      initializer without a per-row form (all naming the table).
  """

  def __init__(self, strategy: tf.distribute.Strategy | None, *, name: str, dim: int,
               device_vocabulary_size: int, optimizer: HashOptimizer,
               emb_initializer: Callable = tf.keras.initializers.Zeros(),
               key_dtype: tf.DType = tf.int64, value_dtype: tf.DType = tf.float32,
               access_threshold: int | None = None, eviction_threshold_s: int | None = None,
               tiers: tiers_lib.TierConfig | None = None):
    super().__init__(name=None)
    if tf.distribute.has_strategy():
      raise ValueError(f"PSShardedTable('{name}'): create it outside strategy.scope(): "
                       "ParameterServerStrategy places variables created in its scope round-robin "
                       "over the ps tasks, a shard's rows and slots must sit beside its key index")
    for arg, value in (("dim", dim), ("device_vocabulary_size", device_vocabulary_size)):
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"PSShardedTable('{name}'): `{arg}` must be a positive int, got {value!r}")
    if not isinstance(optimizer, HashOptimizer):
      raise ValueError(f"PSShardedTable('{name}'): `optimizer` must be a row-wise hash optimizer "
                       f"of mxrec_pipeline.optimizers, got {type(optimizer).__name__}")
    self.table_name = name
    self.dim = int(dim)
    self.device_vocabulary_size = int(device_vocabulary_size)
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
      if tiers.device_vocabulary_size != self.device_vocabulary_size:
        raise ValueError(f"PSShardedTable('{name}'): tiers.device_vocabulary_size="
                         f"{tiers.device_vocabulary_size} must equal device_vocabulary_size="
                         f"{self.device_vocabulary_size} (the shard variable is the device cache)")
      if tf.as_dtype(value_dtype) != tf.float32:
        raise ValueError(f"PSShardedTable('{name}'): a tiered table's value_dtype must be "
                         f"float32, got {tf.as_dtype(value_dtype).name}")
      emb_initializer = initializers.row_initializer(emb_initializer, name)
    self.tiers = tiers
    self.devices = ps_devices(strategy)
    self.num_shards = len(self.devices)
    with tf.device(self.devices[0]):
      self.step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name=f"{name}/step")
    capacity = self.device_vocabulary_size if tiers is None else tiers.total_rows
    self.shards = [
        PSShard(self, i, device, emb_initializer, value_dtype, capacity)
        for i, device in enumerate(self.devices)
    ]

  @property
  def shard_variables(self) -> list[tf.Variable]:
    """[num_shards] the shards' rows, the variables a step differentiates."""
    return [shard.variable for shard in self.shards]

  @property
  def key_indexes(self) -> list[key_index_lib.KeyIndex]:
    """[num_shards] the shards' key indexes (each on its shard's device)."""
    return [shard.key_index for shard in self.shards]

  @property
  def tiered_shards(self) -> list[ps_tiers.TieredShard] | None:
    """[num_shards] the shards' tiers, or None (not tiered)."""
    return None if self.tiers is None else [shard.tiers for shard in self.shards]

  def local_shards(self) -> list[PSShard]:
    """Every shard: the coordinator saves, restores and evicts them all."""
    return list(self.shards)

  def stats(self) -> dict[str, int]:
    """core/table_protocol.STAT_NAMES -> the shards' key-index counters, summed."""
    return table_protocol.summed_stats(self.shards)

  def _split(self, keys: tf.Tensor):
    """(keys per shard, their positions in `keys`): [num_shards] lists of [n_i] tensors."""
    owners = sharding.owner(keys, self.num_shards)
    positions = tf.range(tf.size(keys, out_type=tf.int32))
    return (tf.dynamic_partition(keys, owners, self.num_shards),
            tf.dynamic_partition(positions, owners, self.num_shards))

  def lookup(self, ids: tf.Tensor, training: bool = True, default_value=None,
             timestamp: tf.Tensor | None = None) -> tf.Tensor:
    """Rows of `ids`, each read on its owner PS (inserted there first when training).

    Args:
      ids: [any shape] int32/int64/string ids (core/key_index.to_keys).
      training: True inserts absent keys (a row each on their owner; with
        admission, once their count reaches access_threshold); False reads
        `default_value` for them and inserts and counts nothing.
      default_value: Scalar or [dim] row read by absent keys (eval) and, in
        training, by keys not admitted yet (zeros by default).
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
    for shard, shard_keys in zip(self.shards, key_parts):
      with tf.device(shard.device):
        handle = key_index_lib.handle(CONTAINER, self.table_name)
        # Each occurrence counts once, as one process counts the batch. Every occurrence
        # goes to its owner anyway, so counting adds only the timestamp scalar to a step's bytes.
        if counting:
          unique_rows, restore, _ = key_index_lib.insert_admit(
              handle, shard_keys, tf.ones_like(shard_keys), timestamp,
              self.admit_evict.access_threshold or 0)
        else:
          unique_rows, restore, _ = key_index_lib.insert(handle, shard_keys, training)
        if shard.tiers is not None:
          values = shard.tiers.lookup(unique_rows, training, default_value, admitting)
        else:
          values = lookup_lib.gather_rows(shard.variable, unique_rows, training=training,
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
    for shard, grad in zip(self.shards, grads):
      shard_updates = []
      if grad is not None and not isinstance(grad, tf.IndexedSlices):
        raise ValueError(
            f"PSShardedTable('{self.table_name}'): the gradient of shard "
            f"{shard.shard_id} is {type(grad).__name__}, expected IndexedSlices "
            "(tape.gradient of lookup's rows); a dense gradient would update every row")
      with tf.device(shard.device):
        if grad is not None:
          shard_updates = self.optimizer.apply_sparse(shard.variable, shard.slots, grad, step)
        if shard.tiers is not None:  # The step's rows stop being pinned.
          shard_updates = shard_updates + shard.tiers.finish(shard_updates)
      updates += shard_updates
    return tf.group(updates)

  def evict(self, optimizers=None) -> list[tf.Tensor]:
    """Removes every shard's keys idle longer than eviction_threshold_s, on their PS.

    core/admission.evict on each shard: a key (or a pending count) last
    seen more than eviction_threshold_s seconds before the latest timestamp
    its owner saw is removed; its row gets the shard's initial row again and
    its optimizer slots their initial values. Call it from the coordinator
    (eagerly) or inside a scheduled tf.function.

    Args:
      optimizers: Whose slots to reset; None: the table's optimizer.

    Returns:
      [num_shards] [num_evicted] int64: the freed rows of each shard.

    Raises:
      ValueError: the table has no eviction_threshold_s.
    """
    if self.admit_evict.eviction_threshold_s is None:
      raise ValueError(f"PSShardedTable('{self.table_name}'): evict needs eviction_threshold_s")
    optimizers = [self.optimizer] if optimizers is None else optimizers
    freed = []
    for shard in self.shards:
      with tf.device(shard.device):
        freed.append(admission.evict(shard, self.admit_evict.eviction_threshold_s, optimizers))
    return freed

  def gather_rows(self) -> tuple[np.ndarray, np.ndarray]:
    """(keys [n] int64 increasing, rows [n, dim]) of every shard, read from the ps tasks."""
    parts = [self.export_shard(i) for i in range(self.num_shards)]
    keys = np.concatenate([p["keys"] for p in parts])
    values = np.concatenate([p["values"] for p in parts])
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]

  def export_shard(self, shard: int) -> dict[str, np.ndarray]:
    """Eagerly, on the coordinator: shard `shard`'s keys and their rows and slots.

    Returns:
      {"keys": [n] int64, "values": [n, dim], and one [n, dim] array per slot
       name}, in the key index's export order.
    """
    part = self.shards[shard]
    keys, rows = part.key_index.export()
    with tf.device(part.device):
      return {"keys": keys.numpy()} | {k: v.numpy() for k, v in part.rows_of(rows).items()}


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
