"""A table sharded by key over the parameter servers of a ParameterServerStrategy.

Shard i of a table lives on "/job:ps/task:i": its key index (the native
KeyIndex resource, core/key_index.py), its [rows_per_shard, dim] rows variable
and the hash optimizer's slot variables of those rows. Key k belongs to shard
`sharding.owner(k, num_ps)` (the SplitMix64 owner of distributed/sharding.py,
the same as MultiWorkerMirroredStrategy's ShardedTable). A worker running a
step that the ClusterCoordinator scheduled:

  1. splits the batch's keys by owner (tf.dynamic_partition),
  2. inserts each part into its owner's key index and gathers the rows there
     (ops placed with tf.device on the owner PS: TF's remote execution), so
     only the touched rows travel to the worker,
  3. stitches the rows back in batch order (tf.dynamic_stitch),
  4. after the backward pass, sends each shard its gradient rows
     (IndexedSlices of the shard variable) and applies the hash optimizer's
     row update (optimizers/base.HashOptimizer.apply_sparse: lazy Adam,
     Adagrad, SGD, FTRL) on the owner PS.

Updates from several workers are asynchronous, as ParameterServerStrategy's
dense variables are (Hogwild-style, TF's PS training tutorial): each step reads
the rows current when it runs. The optimizer's step count t is one int64
variable on ps 0, incremented once per `apply_gradients` by whichever worker
applies. This mirrors TF's variable placement under ParameterServerStrategy and
TFRA's / mxRec's PS-sharded hash tables; TorchRec's row-wise sharding splits
the same way.

Example (the chief is the coordinator; ps and worker tasks run
`python -m mxrec_pipeline.cluster.ps_server`):
  >>> strategy = tf.distribute.experimental.ParameterServerStrategy(
  ...     tf.distribute.cluster_resolver.TFConfigClusterResolver())
  >>> coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  >>> optimizer = lazy_adam.create_hash_optimizer(0.01)
  >>> table = PSShardedTable(strategy, name="item", dim=8, rows_per_shard=100_000,
  ...                        optimizer=optimizer)  # Outside strategy.scope().
  >>> @tf.function
  ... def train_step(ids, labels):
  ...   with tf.GradientTape() as tape:
  ...     emb = table.lookup(ids)
  ...     loss = ...(emb, labels)
  ...   table.apply_gradients(tape.gradient(loss, table.shard_variables))
  ...   return loss
  >>> loss = coordinator.schedule(train_step, args=(ids, labels))
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import key_index as key_index_lib
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

  Attributes:
    devices: The shards' devices, shard i first.
    num_shards: len(devices).
    shard_variables: [num_shards] [rows_per_shard, dim] rows variables.
    slots: [num_shards] dicts slot name -> [rows_per_shard, dim] variable.
    step: int64 scalar variable on shard 0: apply_gradients calls so far.

  Raises:
    ValueError: created inside a strategy scope, bad dim/rows_per_shard/
      key_dtype, an optimizer that is not a HashOptimizer, or a strategy
      that ps_devices refuses.
  """

  def __init__(self, strategy: tf.distribute.Strategy | None, *, name: str, dim: int,
               rows_per_shard: int, optimizer: HashOptimizer,
               emb_initializer: Callable = tf.keras.initializers.Zeros(),
               key_dtype: tf.DType = tf.int64, value_dtype: tf.DType = tf.float32):
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
    self._emb_initializer = emb_initializer
    self._value_dtype = value_dtype
    self.devices = ps_devices(strategy)
    self.num_shards = len(self.devices)
    self._key_indexes = []
    self.shard_variables = []
    self.slots = []
    for i, device in enumerate(self.devices):
      with tf.device(device):
        index = key_index_lib.KeyIndex(CONTAINER, name, self.rows_per_shard)
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

  def lookup(self, ids: tf.Tensor, training: bool = True, default_value: float = 0.0) -> tf.Tensor:
    """Rows of `ids`, each read on its owner PS (inserted there first when training).

    Args:
      ids: [any shape] int32/int64/string ids (core/key_index.to_keys).
      training: True inserts absent keys (a row each on their owner); False
        reads `default_value` for them and inserts nothing.
      default_value: Value of every component of an absent key's row (eval).

    Returns:
      [ids' shape + [dim]] embeddings, differentiable w.r.t. shard_variables
      (the gradient of shard i is IndexedSlices of its touched rows).

    Raises:
      tf.errors.*: a full shard (MxKeyIndexInsert, naming the table).
    """
    ids = tf.convert_to_tensor(ids)
    keys = tf.reshape(key_index_lib.to_keys(ids, f"table '{self.table_name}'"), [-1])
    key_parts, position_parts = self._split(keys)
    parts = []
    for i, device in enumerate(self.devices):
      with tf.device(device):
        handle = key_index_lib.handle(CONTAINER, self.table_name)
        unique_rows, restore, _ = key_index_lib.insert(handle, key_parts[i], training)
        values = tf.gather(self.shard_variables[i], tf.maximum(unique_rows, 0))
        if not training:
          values = tf.where(tf.expand_dims(unique_rows >= 0, 1), values,
                            tf.cast(default_value, values.dtype))
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
      if grad is None:
        continue
      if not isinstance(grad, tf.IndexedSlices):
        raise ValueError(f"PSShardedTable('{self.table_name}'): the gradient of shard {i} is "
                         f"{type(grad).__name__}, expected IndexedSlices (tape.gradient of "
                         "lookup's rows); a dense gradient would update every row")
      with tf.device(self.devices[i]):
        updates += self.optimizer.apply_sparse(self.shard_variables[i], self.slots[i], grad, step)
    return tf.group(updates)

  def export_shard(self, shard: int) -> dict[str, np.ndarray]:
    """Eagerly, on the coordinator: shard `shard`'s keys and their rows and slots.

    Returns:
      {"keys": [n] int64, "values": [n, dim], and one [n, dim] array per slot
       name}, in the key index's export order.
    """
    keys, rows = self._key_indexes[shard].export()
    with tf.device(self.devices[shard]):
      out = {"keys": keys.numpy(), "values": tf.gather(self.shard_variables[shard], rows).numpy()}
      for slot, variable in self.slots[shard].items():
        out[slot] = tf.gather(variable, rows).numpy()
    return out


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
