"""Tiered tables: a device cache in front of host-memory and SSD tiers.

mxRec's "DDR" and "SSD" modes (create_table's host_vocabulary_size,
ssd_vocabulary_size, ssd_data_path): a table's rows, with their optimizer
slots, live in three tiers. The table variable [device_vocabulary_size, dim]
is a device cache; native TierStore rows in host memory (host_vocabulary_size)
and records in files under ssd_data_path (ssd_vocabulary_size) hold the rest,
the oldest-written host rows spilling to SSD when the host is full.

The key process (get_asc_insert_func) maps ids to global rows and plans the
device cache (native DeviceCache: device slots and a plan token go into the
batch); the training step applies the plan (rows and slots swapped with the
TierStore, fresh rows from their RowInitializer) before gathering. Planning
runs ahead (prefetch) but never evicts a slot a pending batch uses, and a
row's initial value depends only on its global row (core/initializers.py), so
a tiered table trains exactly as an all-on-device table with the same
RowInitializer. Main names: `TierConfig`, `TieredStorage`.
See docs/tiers.md#how-it-works.
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf
# TF1 Savers take SaveableObjects; TensorFlow exposes the class only here.
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import

from mxrec_pipeline import ops
from mxrec_pipeline.core import default_value as default_value_lib
from mxrec_pipeline.core import initializers
from mxrec_pipeline.core import key_index as key_index_lib

HOST_DEVICE = key_index_lib.HOST_DEVICE
CACHE_POLICIES = ("lru", "lfu")
# How long the key process waits for in-flight batches to train when the device
# cache has no evictable slot left, before failing (seconds).
DEFAULT_WAIT_SECONDS = 60.0

CACHE_STATE_NAMES = ("slots", "globals", "last_used", "frequency", "dropped", "counters")
STORE_STATE_NAMES = ("store_globals", "store_values")
STATS_NAMES = ("device_rows", "occupied", "hits", "misses", "swap_outs", "swap_ins",
               "host_rows_used", "ssd_rows_used", "host_bytes", "ssd_bytes")


@dataclasses.dataclass(frozen=True)
class TierConfig:
  """Sizes and places of a table's tiers (create_table's arguments).

  Attributes:
    device_vocabulary_size: Device cache rows.
    host_vocabulary_size: Host-memory rows, > 0 for a tiered table.
    ssd_vocabulary_size: SSD rows (0: no SSD tier).
    ssd_data_path: Directories of the SSD files, used in order as each fills.
    cache_policy: "lru" or "lfu": which device rows make room.
    wait_seconds: See DEFAULT_WAIT_SECONDS.
    pin_until_finish: The planner's concurrent-steps mode (a table shard on a
      parameter server, distributed/ps_table.py): each step's plan pins its
      device rows until that step's `finish`, whatever order steps end in;
      a step unfinished 2 x wait_seconds after its plan counts as lost. False:
      one training loop, plans made ahead by the key process.
  """

  device_vocabulary_size: int
  host_vocabulary_size: int
  ssd_vocabulary_size: int = 0
  ssd_data_path: tuple[str, ...] = ()
  cache_policy: str = "lru"
  wait_seconds: float = DEFAULT_WAIT_SECONDS
  pin_until_finish: bool = False

  @property
  def total_rows(self) -> int:
    """The most keys the table holds: device + host + SSD rows."""
    return self.device_vocabulary_size + self.host_vocabulary_size + self.ssd_vocabulary_size


def check_tier_args(table_name: str, device_vocabulary_size: int, host_vocabulary_size,
                    ssd_vocabulary_size, ssd_data_path, cache_policy: str,
                    value_dtype: tf.DType) -> TierConfig | None:
  """Validates create_table's tier arguments; None for an all-on-device table.

  As mxRec: ssd_vocabulary_size > 0 needs host_vocabulary_size > 0, and an
  empty ssd_data_path means the current directory. Every SSD directory must
  exist and be writable now.

  Raises:
    ValueError: naming the table and the argument or path.
  """
  where = f"create_table('{table_name}')"
  for arg, value in (("host_vocabulary_size", host_vocabulary_size), ("ssd_vocabulary_size",
                                                                      ssd_vocabulary_size)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ValueError(f"{where}: `{arg}` must be an int >= 0, got {value!r}")
  if isinstance(ssd_data_path, (str, bytes, os.PathLike)):
    ssd_data_path = [ssd_data_path]
  paths = tuple(os.fspath(p) for p in (ssd_data_path or ()))
  if host_vocabulary_size == 0:
    if ssd_vocabulary_size or paths:
      raise ValueError(f"{where}: an SSD tier (ssd_vocabulary_size={ssd_vocabulary_size}, "
                       f"ssd_data_path={list(paths)}) needs host_vocabulary_size > 0")
    return None
  if paths and not ssd_vocabulary_size:
    raise ValueError(f"{where}: ssd_data_path={list(paths)} needs ssd_vocabulary_size > 0")
  if cache_policy not in CACHE_POLICIES:
    raise ValueError(f"{where}: `cache_policy` must be one of {CACHE_POLICIES}, "
                     f"got {cache_policy!r}")
  if value_dtype != tf.float32:
    raise ValueError(f"{where}: a tiered table's value_dtype must be float32 (as mxRec's), "
                     f"got {value_dtype.name}")
  if ssd_vocabulary_size and not paths:
    paths = (os.getcwd(),)
  for path in paths:
    if not os.path.isdir(path):
      raise ValueError(f"{where}: SSD directory '{path}' does not exist or is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
      raise ValueError(f"{where}: SSD directory '{path}' is not writable")
  return TierConfig(device_vocabulary_size, host_vocabulary_size, ssd_vocabulary_size, paths,
                    cache_policy)


def cache_handle(container: str, table_name: str) -> tf.Tensor:
  """Handle of the table's device cache (does not create it)."""
  with tf.device(HOST_DEVICE):
    return ops.load().mx_device_cache_handle(container=container, shared_name=table_name)


def store_handle(container: str, table_name: str) -> tf.Tensor:
  """Handle of the table's host/SSD store (does not create it)."""
  with tf.device(HOST_DEVICE):
    return ops.load().mx_tier_store_handle(container=container, shared_name=table_name)


def plan(container: str, table_name: str, global_rows: tf.Tensor, wait: bool = True):
  """The key process's half: device slots for a batch's global rows.

  Args:
    container: The run's resource container.
    table_name: A tiered table.
    global_rows: [num_unique] int64 distinct global rows (-1: no row).
    wait: Without room, wait up to `TierConfig.wait_seconds` for training
      steps to free pinned rows (the key process on tf.data threads). False
      for a plan made by the training thread itself (an eager or in-step
      lookup with tensor ids): nothing can free rows while it waits, so it
      fails at once, naming the unfinished training lookups.

  Returns:
    (slots [num_unique] int64, -1 where global_rows is -1;
     token [1] int64: what sparse_lookup hands to `TieredStorage.apply_plan`).

  Raises:
    tf.errors.ResourceExhaustedError (at run time): the cache cannot hold the
      batch and the batches in flight (names the table).
  """
  with tf.device(HOST_DEVICE):
    slots, token = ops.load().mx_device_cache_plan(cache_handle(container, table_name), global_rows,
                                                   wait=wait)
  return slots, tf.reshape(token, [1])


class TieredStorage(tf.Module):
  """The native half of a tiered table: device cache planner and host/SSD store.

  Owned by a SparseEmbedding with tiers (its `tiers` attribute). Checkpointed
  with it: the cache's applied mapping and every host/SSD row (embedding and
  optimizer slots), as int64/float32 tensors (CACHE_STATE_NAMES,
  STORE_STATE_NAMES).

  Args:
    table_name: The owning table's name (the native resources' shared name).
    dim: Its embedding dimension.
    config: The TierConfig.
    row_initializer: Initial rows by global row.
    container: The run's resource container.
    slot_variables: (slot variable, initial value) pairs of optimizer slots
      created by the caller (a parameter-server shard's, in that order in the
      stored rows); optimizers attached later add theirs after them.
  """

  def __init__(self, table_name: str, dim: int, config: TierConfig,
               row_initializer: initializers.RowInitializer, container: str, slot_variables=()):
    super().__init__(name=None)
    self._table_name = table_name
    self._dim = dim
    self.config = config
    self.row_initializer = row_initializer
    self._container = container
    self._optimizers = []
    # (variable, initial value) in attach order
    self._slot_variables = [(v, float(initial)) for v, initial in slot_variables]
    self._applied_ops = {}  # token tensor ref -> the step's moves (one apply per batch)
    self._last_token = None  # of the latest apply_plan: what `finish` reports done
    self._frozen = False
    self.cache_handle = cache_handle(container, table_name)
    self.store_handle = store_handle(container, table_name)
    self.create_ops = []

  # -- creation ----------------------------------------------------------------

  @property
  def width(self) -> int:
    """Floats per stored row: the embedding and one block per optimizer slot."""
    return self._dim * (1 + len(self._slot_variables))

  def _cache_attrs(self) -> dict:
    return dict(device_rows=self.config.device_vocabulary_size, total_rows=self.config.total_rows,
                policy=self.config.cache_policy, table_name=self._table_name,
                wait_seconds=self.config.wait_seconds,
                pin_until_finish=self.config.pin_until_finish)

  def _store_attrs(self) -> dict:
    return dict(width=self.width, host_rows=self.config.host_vocabulary_size,
                ssd_rows=self.config.ssd_vocabulary_size, ssd_dirs=list(self.config.ssd_data_path),
                total_rows=self.config.total_rows, table_name=self._table_name)

  def make_create_ops(self, slot_count: int) -> list:
    """Ops creating (or emptying) the cache and the store; eagerly, runs them.

    `slot_count`: optimizer slots that will be attached (the store's row width).
    """
    width = self._dim * (1 + slot_count)
    with tf.device(HOST_DEVICE):
      cache_op = ops.load().mx_device_cache_create(self.cache_handle, **self._cache_attrs())
      store_attrs = self._store_attrs() | {"width": width}
      store_op = ops.load().mx_tier_store_create(self.store_handle, **store_attrs)
    self.create_ops = [op for op in (cache_op, store_op) if op is not None]
    return self.create_ops

  def attach(self, optimizer, variable: tf.Variable) -> None:
    """Adds an optimizer's slots of the table to what moves between tiers.

    Creates the slots (HashOptimizer slot variables) now. Eagerly, before the
    first training step, the store is re-created with the wider rows.

    Raises:
      ValueError: the table already trained (rows of the old width exist), or
        a TF1 graph (pass optimizer_list to create_table there).
    """
    if any(o is optimizer for o in self._optimizers):
      return
    if self._frozen or not tf.executing_eagerly():
      raise ValueError(
          f"table '{self._table_name}': optimizer '{optimizer.optimizer_name}' must be given to "
          "create_table(optimizer_list=[...]) (or attached before the first training step): "
          "a tiered table moves the optimizer's slots with the rows")
    self._add_slots(optimizer, variable)
    with tf.device(HOST_DEVICE):
      tf.raw_ops.DestroyResourceOp(resource=self.store_handle, ignore_lookup_error=True)
      ops.load().mx_tier_store_create(self.store_handle, **self._store_attrs())

  def _add_slots(self, optimizer, variable) -> None:
    with tf.init_scope():
      optimizer._create_slots(variable, self._table_name, tiered_attach=True)  # pylint: disable=protected-access
    for name, initial in optimizer.slot_initial_values.items():
      self._slot_variables.append((optimizer.get_slot(self._table_name, name), float(initial)))
    self._optimizers.append(optimizer)

  def attach_at_creation(self, optimizers, variable) -> None:
    """create_table(optimizer_list=...): slots made with the table, store sized for them."""
    for optimizer in optimizers:
      if not any(o is optimizer for o in self._optimizers):
        self._add_slots(optimizer, variable)

  def has_optimizer(self, optimizer) -> bool:
    return any(o is optimizer for o in self._optimizers)

  # -- training ----------------------------------------------------------------

  def _row_variables(self, variable) -> list[list[tf.Variable]]:
    """Per row variable (the embedding, then each slot): its replica copies.

    One entry per replica under a MirroredStrategy (identical values: moves
    write every copy), else the variable alone.
    """
    return [_components(v) for v in [variable] + [v for v, _ in self._slot_variables]]

  def fresh_rows(self, global_rows: tf.Tensor) -> tf.Tensor:
    """[n, width] initial rows: RowInitializer(g) and the slots' initial values."""
    embedding = self.row_initializer.rows(global_rows, self._dim, tf.float32)
    blocks = [embedding] + [
        tf.fill([tf.size(global_rows), self._dim], initial) for _, initial in self._slot_variables
    ]
    return tf.concat(blocks, axis=1)

  def apply_plan(self, variable: tf.Variable, token: tf.Tensor) -> tf.Operation:
    """Makes the batch of `token` find its rows on the device.

    Applies the cache's moves up to this batch's plan: swap-out rows (embedding
    and optimizer slots) go to the host/SSD store, swap-in rows come from it or
    start fresh. One op per batch in a graph: several lookups of one table share it.

    Under a strategy of N > 1 replicas (one host), each replica's batch carries
    the token of the global batch's plan: called in a replica context, the
    moves run once (in `merge_call`), reading replica 0's copies and writing
    every replica's copy of the rows and slots, so the copies stay identical.

    Args:
      variable: The table's device rows (mirrored under a strategy).
      token: [1] or scalar int64 from the batch (see `plan`).

    Returns:
      The op (eagerly: after the moves are done) to run before the lookup.
    """
    context = tf.distribute.get_replica_context()
    if (tf.distribute.has_strategy() and context is not None and context.num_replicas_in_sync > 1):
      return context.merge_call(
          lambda strategy, tokens: self._apply_once(variable,
                                                    strategy.experimental_local_results(tokens)[0]),
          args=(token,))
    return self._apply_once(variable, token)

  def _apply_once(self, variable: tf.Variable, token: tf.Tensor) -> tf.Operation:
    """`apply_plan` in one context: the moves to every replica copy."""
    key = token.ref() if not tf.executing_eagerly() else None
    self._last_token = tf.reshape(token, [])
    if key is not None and key in self._applied_ops:
      return self._applied_ops[key]
    self._frozen = True
    applied = self.apply_moves(variable, token)
    if key is not None:
      self._applied_ops[key] = applied
    return applied

  def apply_moves(self, variable: tf.Variable, token: tf.Tensor) -> tf.Operation:
    """The data movement of plan `token` (and of the pending plans before it), every time.

    Reads the swap-out rows (embedding and slots) and the device-to-device
    sources, swaps with the host/SSD store, writes the swap-in rows. No
    caching per token and no replica merge: `apply_plan` is the entry of
    the single-process pipeline; a parameter-server shard calls this inside
    its critical section, right after the plan (distributed/ps_table.py).

    Args:
      variable: The table's (or shard's) device rows; a mirrored variable
        writes every replica's copy.
      token: [1] or scalar int64 from `plan`.

    Returns:
      The op of the moves (eagerly: after they are done).
    """
    variables = self._row_variables(variable)
    dim = self._dim
    with tf.name_scope(f"{self._table_name}_apply_plan"):
      with tf.device(HOST_DEVICE):
        (out_slots, out_globals, in_slots, in_globals, in_sources,
         erase) = ops.load().mx_device_cache_apply(self.cache_handle, tf.reshape(token, []))
      # Read everything that moves before writing anything (replica copies are equal).
      out_rows = tf.concat([tf.gather(v[0], out_slots) for v in variables], axis=1)
      from_device = in_sources >= 0
      device_positions = tf.where(from_device)[:, 0]
      store_positions = tf.where(tf.logical_not(from_device))[:, 0]
      moved_rows = tf.concat(
          [tf.gather(v[0], tf.gather(in_sources, device_positions)) for v in variables], axis=1)
      store_globals = tf.gather(in_globals, store_positions)
      with tf.control_dependencies([out_rows, moved_rows]):
        with tf.device(HOST_DEVICE):
          taken, found = ops.load().mx_tier_store_swap(self.store_handle, erase, store_globals,
                                                       out_globals, out_rows)
      store_rows = tf.where(found[:, None], taken, self.fresh_rows(store_globals))
      in_rows = tf.dynamic_stitch(
          [tf.cast(device_positions, tf.int32),
           tf.cast(store_positions, tf.int32)], [moved_rows, store_rows])
      in_rows = tf.reshape(in_rows, [-1, dim * len(variables)])
      updates = [
          copy.scatter_update(tf.IndexedSlices(in_rows[:, i * dim:(i + 1) * dim], in_slots))
          for i, copies in enumerate(variables) for copy in copies
      ]
      return tf.group(updates)

  def finish(self, after) -> tf.Operation | None:
    """Tells the cache the step of the latest applied plan is done (after `after`).

    The hash optimizers call it once their update of the table ran: that
    batch's device rows may then make room for the next batch at once, instead
    of staying pinned until the next step applies its plan. Returns None when
    no plan was applied in the current graph (or eagerly, none yet).
    """
    token = self._last_token
    if token is None or (tf.is_symbolic_tensor(token) and
                         token.graph is not tf.compat.v1.get_default_graph()):
      return None
    with tf.control_dependencies(after):
      return self.finish_token(token)

  def finish_token(self, token: tf.Tensor) -> tf.Operation:
    """Tells the cache the step of plan `token` is done (its optimizer update ran)."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_device_cache_finish(self.cache_handle, tf.reshape(token, []))

  def slot_block(self, slot_variable) -> int:
    """Block of `slot_variable` in `read_rows`' layout: 1 + its attach position.

    Raises:
      ValueError: not a slot variable of this table (naming the table).
    """
    for i, (variable, _) in enumerate(self._slot_variables):
      if variable is slot_variable:
        return i + 1
    raise ValueError(f"table '{self._table_name}': {slot_variable.name} is not a slot variable "
                     "moving with its tiered rows")

  def _locate(self, global_rows: tf.Tensor):
    """(device slot or -1/-2 per Locate, stored row [n, width], found [n]) of global rows."""
    with tf.device(HOST_DEVICE):
      slots = ops.load().mx_device_cache_locate(self.cache_handle, global_rows)
      # -1 (no row) reads global row 0 here; callers read the default for it.
      stored, found = ops.load().mx_tier_store_read(self.store_handle, tf.maximum(global_rows, 0))
    return slots, stored, found

  def read(self, variable: tf.Variable, global_rows: tf.Tensor, default_value=None) -> tf.Tensor:
    """Embeddings of global rows wherever they live, without moving them (evaluation).

    Args:
      variable: The table's device rows.
      global_rows: [n] int64; -1 reads `default_value`.
      default_value: Scalar or [dim] (zeros when None).

    Returns:
      [n, dim] float32.
    """
    variable = _replica_copy(variable)
    slots, stored, found = self._locate(global_rows)
    on_device = tf.gather(variable, tf.maximum(slots, 0))
    fresh = self.row_initializer.rows(tf.maximum(global_rows, 0), self._dim, variable.dtype)
    off_device = tf.where((found & tf.equal(slots, -1))[:, None], stored[:, :self._dim], fresh)
    values = tf.where((slots >= 0)[:, None], on_device, off_device)
    default = default_value_lib.default_embedding(default_value, self._dim, variable.dtype,
                                                  self._table_name)
    return tf.where((global_rows >= 0)[:, None], values, default)

  def read_rows(self, variable: tf.Variable, global_rows: tf.Tensor) -> tf.Tensor:
    """Whole rows (embedding and every slot block) of global rows, wherever they live.

    Args:
      variable: The table's device rows.
      global_rows: [n] int64 global rows (>= 0).

    Returns:
      [n, width] float32: device rows gathered from the variable and the slot
      variables, stored ones from the host/SSD store, never-trained ones fresh.
    """
    variables = self._row_variables(variable)
    slots, stored, found = self._locate(global_rows)
    on_device = tf.concat([tf.gather(v[0], tf.maximum(slots, 0)) for v in variables], axis=1)
    off_device = tf.where((found & tf.equal(slots, -1))[:, None],
                          tf.reshape(stored, [-1, self.width]), self.fresh_rows(global_rows))
    return tf.where((slots >= 0)[:, None], on_device, off_device)

  def import_rows(self, variable: tf.Variable, global_rows: tf.Tensor,
                  rows: tf.Tensor) -> tf.Operation:
    """Replaces the tiers' content with `rows` of `global_rows` (restores).

    The first device_vocabulary_size rows go to device slots 0, 1, ... (as
    recently used), the rest to the host/SSD store; pending plans are dropped
    (batches planned before must be planned again).

    Args:
      variable: The table's device rows.
      global_rows: [n] int64 distinct global rows.
      rows: [n, width] float32 (`read_rows`' layout).

    Returns:
      The op (None eagerly, where it has run).
    """
    variables = self._row_variables(variable)
    n = tf.size(global_rows, out_type=tf.int64)
    on_device = tf.minimum(n, self.config.device_vocabulary_size)
    slots = tf.range(on_device)
    empty = tf.zeros([0], tf.int64)
    cache_state = {
        "slots": slots, "globals": global_rows[:on_device], "last_used": tf.zeros_like(slots),
        "frequency": tf.ones_like(slots), "dropped": empty, "counters": tf.zeros([5], tf.int64)
    }
    with tf.device(HOST_DEVICE):
      cache_op = ops.load().mx_device_cache_import_state(
          self.cache_handle, *[cache_state[k] for k in CACHE_STATE_NAMES], **self._cache_attrs())
      store_op = ops.load().mx_tier_store_import(self.store_handle, global_rows[on_device:],
                                                 rows[on_device:], **self._store_attrs())
    dim = self._dim
    updates = [
        copy.scatter_update(tf.IndexedSlices(rows[:on_device, i * dim:(i + 1) * dim], slots))
        for i, copies in enumerate(variables) for copy in copies
    ]
    if tf.executing_eagerly():
      return None
    return tf.group(cache_op, store_op, *updates)

  def release(self, global_rows: tf.Tensor):
    """Drops evicted keys' global rows from every tier (applied with the next plan)."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_device_cache_release(self.cache_handle, global_rows)

  def stats(self) -> dict[str, tf.Tensor]:
    """STATS_NAMES -> int64 scalars: cache occupancy, hits, misses, moves, tier usage."""
    with tf.device(HOST_DEVICE):
      cache = ops.load().mx_device_cache_stats(self.cache_handle)
      store = ops.load().mx_tier_store_stats(self.store_handle)
    return dict(zip(STATS_NAMES, list(cache) + list(store)))

  # -- checkpoints ---------------------------------------------------------------

  def export_state(self) -> dict[str, tf.Tensor]:
    """The cache's applied state and every host/SSD row (keys of both NAMES tuples)."""
    with tf.device(HOST_DEVICE):
      cache = dict(
          zip(CACHE_STATE_NAMES,
              ops.load().mx_device_cache_export_state(self.cache_handle)))
      globals_, values = ops.load().mx_tier_store_export(self.store_handle, cache["dropped"])
    return cache | {"store_globals": globals_, "store_values": values}

  def import_state(self, state: dict) -> tf.Operation:
    """Replaces both with an `export_state()`; creates them if needed."""
    with tf.device(HOST_DEVICE):
      cache_op = ops.load().mx_device_cache_import_state(self.cache_handle,
                                                         *[state[n] for n in CACHE_STATE_NAMES],
                                                         **self._cache_attrs())
      store_op = ops.load().mx_tier_store_import(self.store_handle, state["store_globals"],
                                                 state["store_values"], **self._store_attrs())
    if tf.executing_eagerly():
      return None
    return tf.group(cache_op, store_op)

  def _serialize_to_tensors(self):
    return self.export_state()

  def _restore_from_tensors(self, restored_tensors):
    return self.import_state(restored_tensors)

  def saveable(self) -> saveable_object.SaveableObject:
    """The TF1 SaveableObject `<table>/tiers` (for tf.compat.v1.train.Saver)."""
    return _TiersSaveable(self)

  def release_resources(self) -> None:
    """Frees eagerly created native resources (terminate_config_initializer)."""
    if tf.executing_eagerly() and not tf.is_symbolic_tensor(self.cache_handle):
      with tf.device(HOST_DEVICE):
        for handle in (self.cache_handle, self.store_handle):
          tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)


def _components(variable) -> list:
  """The replica copies of a mirrored variable (one host), or [variable]."""
  if isinstance(variable, tf.distribute.DistributedValues):
    return list(variable.values)
  return [variable]


def _replica_copy(variable):
  """In a replica context, the replica's copy of a mirrored variable; else replica 0's."""
  copies = _components(variable)
  if len(copies) == 1:
    return copies[0]
  context = tf.distribute.get_replica_context()
  if context is not None and not tf.distribute.in_cross_replica_context():
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is not None:
      return copies[replica]
  return copies[0]


class _TiersSaveable(saveable_object.SaveableObject):
  """TieredStorage as a TF1 SaveableObject: `<table>/tiers-{slots,...,store_values}`."""

  def __init__(self, tiers: TieredStorage):
    name = f"{tiers._table_name}/tiers"  # pylint: disable=protected-access
    state = tiers.export_state()
    names = CACHE_STATE_NAMES + STORE_STATE_NAMES
    specs = [saveable_object.SaveSpec(state[part], "", f"{name}-{part}") for part in names]
    super().__init__(tiers.cache_handle, specs, name)
    self._tiers = tiers

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes
    names = CACHE_STATE_NAMES + STORE_STATE_NAMES
    return self._tiers.import_state(dict(zip(names, restored_tensors)))
