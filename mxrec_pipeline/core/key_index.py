"""Python side of the native key index: handles, insertion, checkpointing.

One KeyIndex per table maps raw int64 ids to rows of the table's variable. The
index lives on the host (`/CPU:0`) as a TensorFlow resource named by the run's
container and the table name, so the input pipeline can reach it by name before
the table object exists, as mxRec's key process does.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf
# TF1 Savers take SaveableObjects; TensorFlow exposes the class only here.
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import

from mxrec_pipeline import ops
from mxrec_pipeline.core.sorted_key_table import SortedKeyTable

HOST_DEVICE = "/CPU:0"

# What a checkpoint holds of a key index (MxKeyIndexExportState's outputs): the
# (key, row) pairs, their last-seen times, the admission counts of keys without
# a row, and [admissions, evictions, latest timestamp].
STATE_NAMES = ("keys", "rows", "last_seen", "pending_keys", "pending_counts", "pending_last_seen",
               "counters")

# Salt-free stable 64-bit fingerprint range for string ids; stock TF computes the
# same at serving time (Fingerprint64 modulo 2^63 - 1).
_STRING_BUCKETS = 2**63 - 1


def to_keys(ids: tf.Tensor, what: str = "ids") -> tf.Tensor:
  """Converts raw ids to int64 keys.

  int64 ids pass through, int32 ids are widened, strings are hashed with
  `tf.strings.to_hash_bucket_fast(ids, 2**63 - 1)` (FarmHash Fingerprint64), a
  stable fingerprint that plain TensorFlow reproduces at serving time.

  Args:
    ids: Tensor of any shape, int32, int64 or string.
    what: Name of the ids for the error message.

  Returns:
    int64 tensor of ids' shape.

  Raises:
    ValueError: ids of another dtype, naming `what`.
  """
  if ids.dtype == tf.int64:
    return ids
  if ids.dtype == tf.int32:
    return tf.cast(ids, tf.int64)
  if ids.dtype == tf.string:
    return tf.strings.to_hash_bucket_fast(ids, _STRING_BUCKETS)
  raise ValueError(f"{what}: ids must be int32, int64 or string, got {ids.dtype.name}")


def handle(container: str, table_name: str) -> tf.Tensor:
  """Handle of the key index of `table_name` in `container` (does not create it)."""
  with tf.device(HOST_DEVICE):
    return ops.load().mx_key_index_handle(container=container, shared_name=table_name)


def insert(index_handle: tf.Tensor, keys: tf.Tensor, training: bool):
  """Deduplicates keys and maps them to rows (see the MxKeyIndexInsert op).

  Args:
    index_handle: From `handle()`.
    keys: [any shape] int64.
    training: True inserts absent keys (fails when the table is full); False
      reads -1 for them.

  Returns:
    (unique_rows [num_unique] int64, restore [keys' shape] int32,
     unique_keys [num_unique] int64).
  """
  with tf.device(HOST_DEVICE):
    return ops.load().mx_key_index_insert(index_handle, keys, training=training)


def insert_admit(index_handle: tf.Tensor, keys: tf.Tensor, counts: tf.Tensor, timestamp: tf.Tensor,
                 access_threshold: int):
  """Training insertion with admission counts and last-seen times (MxKeyIndexInsertAdmit).

  Each occurrence of a key without a row adds its count; the key gets a row
  once its total reaches `access_threshold` (core/admission.py, mxRec's
  feature admission). Every key gets `timestamp` as its last-seen time.

  Args:
    index_handle: From `handle()`.
    keys: [n] int64.
    counts: [n] int64 sighting weights (faae_coefficient).
    timestamp: int64 scalar, the batch's time in seconds; -1: none.
    access_threshold: Sightings a key needs, >= 0 (0 and 1 admit at once).

  Returns:
    (unique_rows [num_unique] int64, -1 for keys without a row yet;
     restore [n] int32; unique_keys [num_unique] int64).
  """
  with tf.device(HOST_DEVICE):
    return ops.load().mx_key_index_insert_admit(index_handle, keys, counts, timestamp,
                                                tf.constant(access_threshold, tf.int64))


class KeyIndex(tf.Module):
  """The key index of one table, checkpointed with the table.

  `tf.train.Checkpoint` saves it as int64 vectors (STATE_NAMES: keys, rows and
  the admission/eviction state) through `_serialize_to_tensors`; in a TF1 graph
  a SaveableObject named `<table>/key_index` joins the SAVEABLE_OBJECTS collection, which
  `tf.compat.v1.train.Saver()` saves beside the variables. Restoring creates the
  index if needed and replaces its content.

  Args:
    container: Resource container of the run (`ConfigInitializer.container`).
    table_name: The table's name (the resource's shared name).
    capacity: Rows of the table (device_vocabulary_size), > 0.
    growable: Rows are handed out past `capacity` instead of failing when the
      table is full (dynamic-expansion tables, see core/expansion.py).
    rows_text, grow_text: How the "table is full" error states the rows and
      the remedy (a tiered table's device + host + SSD rows); empty: the
      device_vocabulary_size wording (MxKeyIndexCreate).
  """

  def __init__(self, container: str, table_name: str, capacity: int, growable: bool = False,
               rows_text: str = "", grow_text: str = ""):
    super().__init__(name=None)
    self._container = container
    self._table_name = table_name
    self._capacity = capacity
    self._growable = growable
    self._text = dict(rows_text=rows_text, grow_text=grow_text)
    self._handle = handle(container, table_name)
    with tf.device(HOST_DEVICE):
      # Eagerly: the index exists from here on. In a graph: the op that creates
      # (or empties) it, run by the table variable's initializer.
      self.create_op = ops.load().mx_key_index_create(self._handle, capacity=capacity,
                                                      growable=growable, table_name=table_name,
                                                      **self._text)
    if not tf.executing_eagerly():
      tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                                     _KeyIndexSaveable(self))

  @property
  def table_name(self) -> str:
    return self._table_name

  @property
  def capacity(self) -> int:
    return self._capacity

  @property
  def growable(self) -> bool:
    return self._growable

  @property
  def resource_handle(self) -> tf.Tensor:
    return self._handle

  def insert(self, keys: tf.Tensor, training: bool):
    """See module function `insert`."""
    return insert(self._handle, keys, training)

  def size(self) -> tf.Tensor:
    """Number of stored keys, int64 scalar."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_key_index_size(self._handle).size

  def memory_bytes(self) -> tf.Tensor:
    """Bytes held by the index itself (slots and free list), int64 scalar."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_key_index_size(self._handle).memory_bytes

  def export(self):
    """(keys [size] int64, rows [size] int64), unordered."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_key_index_export(self._handle)

  def to_stock_table(self) -> SortedKeyTable:
    """A snapshot of the key -> row map for plain TensorFlow (-1 if absent); eager only.

    Needs no custom op to load or run: what SavedModels and serving use. Keys
    and rows are variables of a core/sorted_key_table.SortedKeyTable, so a
    SavedModel's graph does not grow with them.
    """
    keys, rows = self.export()
    order = np.argsort(keys.numpy())
    return SortedKeyTable(keys.numpy()[order],
                          rows.numpy()[order], default_value=-1, name=f"{self._table_name}_rows")

  def to_compact_table(
      self, read_rows: Callable[[tf.Tensor], tf.Tensor]) -> tuple[SortedKeyTable, tf.Tensor]:
    """A snapshot holding only the used rows, for serving with plain TensorFlow.

    Gathers the rows of the index's keys into a compact block whose last row,
    at position `num_keys`, is the default row; a SortedKeyTable (stock TF
    ops, its keys in a variable) maps each key to its position and every
    other key to `num_keys`. A table of capacity C with n keys exports n + 1
    rows instead of C. Eager only.

    Args:
      read_rows: Reads rows: [m] int64 rows of the table (-1: the default
        row) -> [m, dim] their embeddings, e.g. a gather from the table's
        variable, or a tiered table's read from every tier.

    Returns:
      (positions, rows): SortedKeyTable int64 key -> int64 position in
      `rows` (num_keys when absent); rows [num_keys + 1, dim] of read_rows'
      dtype, the keys' rows in increasing key order, then the default row.
    """
    keys, rows = self.export()
    order = tf.argsort(keys)  # Deterministic exports: the index's order is its own.
    keys, rows = tf.gather(keys, order), tf.gather(rows, order)
    compact = read_rows(tf.concat([rows, tf.constant([-1], tf.int64)], 0))
    positions = SortedKeyTable(keys, default_value=int(tf.size(keys)),
                               name=f"{self._table_name}_positions")
    return positions, compact

  def import_(self, keys: tf.Tensor, rows: tf.Tensor):
    """Replaces the content with (keys, rows); creates the index if needed.

    Raises:
      tf.errors.InvalidArgumentError: duplicate keys or rows, or rows outside
        [0, capacity) (growable: [0, max(capacity, number of keys))); the index
        is then left unchanged.
    """
    with tf.device(HOST_DEVICE):
      return ops.load().mx_key_index_import(self._handle, keys, rows, capacity=self._capacity,
                                            growable=self._growable, table_name=self._table_name,
                                            **self._text)

  def release(self) -> None:
    """Frees an eagerly created index; later uses fail with FailedPrecondition.

    Called by terminate_config_initializer(). A no-op for an index of a
    tf.compat.v1 graph (its session owns it) or when not executing eagerly.
    """
    if tf.executing_eagerly() and not tf.is_symbolic_tensor(self._handle):
      with tf.device(HOST_DEVICE):
        tf.raw_ops.DestroyResourceOp(resource=self._handle, ignore_lookup_error=True)

  def export_state(self) -> dict[str, tf.Tensor]:
    """The content with its admission and eviction state, as STATE_NAMES -> int64 vector."""
    with tf.device(HOST_DEVICE):
      return dict(zip(STATE_NAMES, ops.load().mx_key_index_export_state(self._handle)))

  def export_changes(self, clear: bool, min_count: int = 0) -> dict[str, tf.Tensor]:
    """What changed since change tracking began or the last `clear` (delta checkpoints).

    Tracking is off until the first call with `clear`; from then on every
    row a training insert gives or finds (the rows a step updates) is marked
    changed and every key eviction removes is logged; `import_`,
    `import_state` and a restore start a new base. Costs one bit per row
    (C++ KeyIndex::ExportChanges).

    Args:
      clear: Start anew afterwards (and turn tracking on); False: a peek.
      min_count: mxRec's `recent_key_count_threshold` (>= 0): > 0 leaves out
        the changed keys touched fewer times since the last clear (their
        occurrences in training batches; their admission counts with
        admission), as mxRec's incremental saves filter rare keys. With
        `clear`, touches are counted from then on (4 B per row) when > 0.

    Returns:
      STATE_NAMES -> int64 vectors as `export_state` gives them, of the
      admitted keys whose rows changed (every admitted key before tracking
      began), the whole pending state and the counters; plus
      "deleted_keys": [d] int64, the keys eviction removed since.
    """
    with tf.device(HOST_DEVICE):
      out = ops.load().mx_key_index_export_changes(self._handle, clear=clear, min_count=min_count)
    return dict(zip((*STATE_NAMES, "deleted_keys"), out))

  def import_state(self, state: dict):
    """Replaces the content with an `export_state()`; creates the index if needed."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_key_index_import_state(self._handle,
                                                  *[state[name] for name in STATE_NAMES],
                                                  capacity=self._capacity, growable=self._growable,
                                                  table_name=self._table_name, **self._text)

  def _serialize_to_tensors(self):
    return self.export_state()

  def _restore_from_tensors(self, restored_tensors):
    return self.import_state(restored_tensors)


class _KeyIndexSaveable(saveable_object.SaveableObject):
  """The key index as a TF1 SaveableObject: `<table>/key_index-{keys,rows,...}`."""

  def __init__(self, index: KeyIndex):
    name = f"{index.table_name}/key_index"
    state = index.export_state()
    specs = [saveable_object.SaveSpec(state[part], "", f"{name}-{part}") for part in STATE_NAMES]
    super().__init__(index.resource_handle, specs, name)
    self._index = index

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes  # Vectors of the saved length.
    return self._index.import_state(dict(zip(STATE_NAMES, restored_tensors)))
