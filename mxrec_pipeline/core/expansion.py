"""Dynamic-expansion tables: mxRec's `init(use_dynamic_expansion=True)`.

With expansion on, create_table builds an `ExpansionTable` instead of a
[device_vocabulary_size, dim] variable: a growable native key index (ids ->
row addresses) plus a native row store (native/core/row_store.h) whose rows
hold [embedding | optimizer slots] contiguously and which grows by
device_vocabulary_size rows at a time, with no capacity error. The *_by_addr
optimizers (optimizers/by_addr.py) update the rows with fused native ops; the
plain hash optimizers refuse such runs, as in mxRec. core/lookup.py reads them
(TableKind.EXPANSION: MxRowStoreLookup of the batch's distinct rows).

The gradient reaches the table as mxRec's pairs (a training lookup adds its
local embeddings to ASCEND_SPARSE_LOOKUP_LOCAL_EMB and their addresses to
ASCEND_SPARSE_LOOKUP_ID_OFFSET, as DynamicSparseEmbedding does) or as
IndexedSlices of the table's gradient anchor, `table.variable`. The key index
and the store live on the host (`/CPU:0`) like mxRec's key process; rows are
float32 and not replicated under tf.distribute strategies.
See docs/migrating-from-mxrec.md#dynamic-expansion.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from mxrec_pipeline.constants import constants
from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.core import lookup
from mxrec_pipeline.core import row_store as row_store_lib
from mxrec_pipeline.util import initialize

HOST_DEVICE = key_index_lib.HOST_DEVICE
LOOKUP_OP = "MxRowStoreLookup"


class ExpansionKeyIndex(key_index_lib.KeyIndex):
  """The growable key index of an expansion table.

  Releasing it also releases the table's row store, so
  terminate_config_initializer() (which releases every table's key index) frees
  both.
  """

  def __init__(self, container: str, table_name: str, capacity: int, store: row_store_lib.RowStore):
    super().__init__(container, table_name, capacity, growable=True)
    # Not tracked: the table tracks (and checkpoints) the store itself.
    object.__setattr__(self, "_store", store)

  def release(self) -> None:
    super().release()
    self._store.release()


class ExpansionTable(tf.Module):
  """A dynamic-expansion table: growable key index plus native row store.

  Built by create_table when init(use_dynamic_expansion=True); users pass it to
  sparse_lookup as any table. See the module docstring.

  Attributes:
    table_name: Unique name of the table in the run.
    dim: Embedding dimension.
    key_dtype: tf.int32, tf.int64 or tf.string.
    device_vocabulary_size: Initial rows, and the rows added per growth step.
    key_index: The growable KeyIndex mapping ids to row addresses.
    store: The RowStore of the rows.
    variable: The gradient anchor, a trainable [0, dim] float32 variable.
    slot_names: Slot names of the optimizer updating the table, in row order
      (set by the first *_by_addr apply_gradients built); None before.
  """

  kind = lookup.TableKind.EXPANSION
  # Expansion tables are never tiered (mxRec: DDR needs expansion off).
  is_tiered = False
  tiers = None

  def __init__(self, *, table_name: str, dim: int, key_dtype: tf.DType, value_dtype: tf.DType,
               emb_initializer: Callable, device_vocabulary_size: int, init_param: float,
               device: str | None, container: str):
    super().__init__(name=None)
    del device  # Rows live in the host store.
    if tf.distribute.has_strategy():
      raise NotImplementedError(f"create_table('{table_name}'): dynamic-expansion tables are not "
                                "replicated by tf.distribute strategies; create them outside "
                                "strategy.scope()")
    if value_dtype != tf.float32:
      raise ValueError(f"create_table('{table_name}'): dynamic-expansion tables hold float32 "
                       f"rows, got value_dtype={value_dtype.name}")
    self.table_name = table_name
    self.dim = dim
    self.key_dtype = key_dtype
    self.device_vocabulary_size = device_vocabulary_size
    self._emb_initializer = emb_initializer
    self._init_param = init_param
    self.store = row_store_lib.RowStore(container, table_name, dim)
    self.key_index = ExpansionKeyIndex(container, table_name, device_vocabulary_size, self.store)
    object.__setattr__(self, "slot_names", None)
    object.__setattr__(self, "_updater", None)
    create_ops = [op for op in (self.key_index.create_op, self.store.create_op) if op is not None]

    def initial_value():
      # In a graph, initializing the anchor creates (or empties) index and store.
      with tf.control_dependencies(create_ops):
        return tf.zeros([0, dim], tf.float32)

    with tf.device(HOST_DEVICE):
      self.variable = tf.compat.v1.Variable(initial_value, trainable=True, use_resource=True,
                                            dtype=tf.float32, name=f"{table_name}/expansion_anchor")

  def __repr__(self):
    return (f"ExpansionTable(name={self.table_name!r}, dim={self.dim}, "
            f"device_vocabulary_size={self.device_vocabulary_size})")

  def initial_rows(self) -> tf.Tensor:
    """A new chunk: [device_vocabulary_size, dim] float32 from emb_initializer."""
    shape = [self.device_vocabulary_size, self.dim]
    value = tf.convert_to_tensor(self._emb_initializer(shape=shape, dtype=tf.float32), tf.float32)
    if self._init_param != 1.0:
      value = value * tf.constant(self._init_param, tf.float32)
    return tf.ensure_shape(value, shape)

  def grow_to_cover(self, rows: tf.Tensor) -> tf.Tensor:
    """Appends chunks until the store holds every row of `rows`; the new size.

    Two steps racing to grow append once: an append applies only at the size
    its caller saw (MxRowStoreAppend).

    Args:
      rows: [n] int64 row addresses (-1 allowed, for unseen ids).
    """
    with tf.device(HOST_DEVICE):
      needed = tf.reduce_max(tf.concat([rows, tf.constant([-1], tf.int64)], 0)) + 1
      size = self.store.size()[0]
      return tf.while_loop(lambda size: size < needed,
                           lambda size: [self.store.append(size, self.initial_rows())], [size])[0]

  def lookup_unique(self, unique_rows: tf.Tensor, training: bool):
    """(local_emb [u, dim], addresses [u]) of distinct rows, growing the store.

    A training lookup in a graph joins mxRec's collections (module docstring).
    """
    grown = self.grow_to_cover(unique_rows)
    with tf.control_dependencies([grown]):
      local_emb, addresses = self.store.lookup(unique_rows, self.variable)
    if training and not tf.executing_eagerly():
      tf.compat.v1.add_to_collection(constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB, local_emb)
      tf.compat.v1.add_to_collection(constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET, addresses)
    return local_emb, addresses

  def attach_optimizer(self, optimizer, slot_names) -> None:
    """Records the optimizer updating this table (one per table).

    Raises:
      ValueError: another optimizer already updates the table.
    """
    if self._updater is not None and self._updater is not optimizer:
      raise ValueError(
          f"table '{self.table_name}' is already updated by optimizer "
          f"'{self._updater.optimizer_name}' (slots {list(self.slot_names)}); its rows hold one "
          f"optimizer's slots, so '{optimizer.optimizer_name}' cannot update it too")
    object.__setattr__(self, "_updater", optimizer)
    object.__setattr__(self, "slot_names", tuple(slot_names))


@tf.RegisterGradient(LOOKUP_OP)
def _lookup_grad(op, grad_emb, grad_addresses):
  """The anchor's gradient: IndexedSlices of the embeddings' gradients on addresses."""
  del grad_addresses  # Integer output.
  addresses = op.outputs[1]
  if isinstance(grad_emb, tf.IndexedSlices):  # From the gather to the ids' positions.
    values, indices = grad_emb.values, tf.gather(addresses, grad_emb.indices)
  else:
    values, indices = grad_emb, addresses
  anchor_shape = tf.shape(op.inputs[2], out_type=tf.int64)
  return [None, None, tf.IndexedSlices(values, indices, anchor_shape)]


def table_of_anchor(variable) -> ExpansionTable | None:
  """The expansion table of the run whose anchor is `variable`, else None."""
  for table in initialize.get_config_initializer().tables.values():
    if isinstance(table, ExpansionTable) and table.variable is variable:
      return table
  return None


def table_of_address(addresses: tf.Tensor, who: str) -> ExpansionTable:
  """The table whose lookup gave `addresses` (an ASCEND_SPARSE_LOOKUP_ID_OFFSET entry).

  Raises:
    ValueError: `addresses` is not the address output of an expansion lookup
      of the current run (e.g. an eager tensor: eagerly, pass table.variable).
  """
  op = getattr(addresses, "op", None) if not isinstance(addresses, tf.Variable) else None
  if op is None or tf.executing_eagerly():
    raise ValueError(
        f"{who}: {addresses!r} is neither a dynamic-expansion table's `variable` nor the "
        "addresses of one of its lookups; eagerly, apply (gradient, table.variable) pairs")
  if op.type != LOOKUP_OP or addresses is not op.outputs[1]:
    raise ValueError(
        f"{who}: tensor '{addresses.name}' is not the addresses output of a dynamic-expansion "
        f"lookup ({LOOKUP_OP}); take addresses from the "
        f"{constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET} collection")
  name = op.get_attr("table_name")
  name = name.decode() if isinstance(name, bytes) else name
  table = initialize.get_config_initializer().tables.get(name)
  in_graph = not tf.inside_function()  # Functions capture eagerly made tables.
  if not isinstance(table, ExpansionTable) or (in_graph and table.variable.graph is not op.graph):
    raise ValueError(f"{who}: addresses '{addresses.name}' belong to table '{name}' of another "
                     "graph or an earlier init()")
  return table
