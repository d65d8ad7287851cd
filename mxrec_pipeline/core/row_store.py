"""Python side of the native row store of dynamic-expansion tables.

One RowStore per expansion table holds its rows on the host as
[embedding | optimizer slots] (float32), addressed by the row ids its growable
key index hands out (native/core/row_store.h). Like the key index it is a
TensorFlow resource named by the run's container and the table name.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
# TF1 Savers take SaveableObjects; TensorFlow exposes the class only here.
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import

from mxrec_pipeline import ops
from mxrec_pipeline.core.key_index import HOST_DEVICE


def handle(container: str, table_name: str) -> tf.Tensor:
  """Handle of the row store of `table_name` in `container` (does not create it)."""
  with tf.device(HOST_DEVICE):
    return ops.load().mx_row_store_handle(container=container, shared_name=table_name)


class RowStore(tf.Module):
  """The row store of one table, checkpointed with the table.

  `tf.train.Checkpoint` saves it as every row ([size, dim * (1 + slots)]
  float32) plus the slots' initial values, through `_serialize_to_tensors`; in a
  TF1 graph a SaveableObject named `<table>/row_store` joins the
  SAVEABLE_OBJECTS collection, which `tf.compat.v1.train.Saver()` saves beside
  the variables. Restoring creates the store if needed and replaces its content.

  Thread safety: the native store locks per call (shared for reads, exclusive
  for writes); ops of one step that must not interleave are ordered by the
  callers with control dependencies.

  Args:
    container: Resource container of the run.
    table_name: The table's name (the resource's shared name).
    dim: Embedding dimension.
  """

  def __init__(self, container: str, table_name: str, dim: int):
    super().__init__(name=None)
    self._table_name = table_name
    self._dim = dim
    self._handle = handle(container, table_name)
    with tf.device(HOST_DEVICE):
      # Eagerly: the store exists from here on. In a graph: the op that creates
      # (or empties) it, run by the table's initializer.
      self.create_op = ops.load().mx_row_store_create(self._handle, dim=dim, table_name=table_name)
    if not tf.executing_eagerly():
      tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                                     _RowStoreSaveable(self))

  @property
  def resource_handle(self) -> tf.Tensor:
    return self._handle

  def size(self):
    """(rows held, slots per row or -1 before any update, bytes): int64 scalars."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_size(self._handle)

  def append(self, expected_size: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """Appends rows [n, dim] if the store holds `expected_size` rows; new size."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_append(self._handle, expected_size, values, dim=self._dim)

  def set_slots(self, initial_values: Sequence[float] | tf.Tensor):
    """Sets the rows' optimizer slots, one per initial value (see the op)."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_set_slots(self._handle,
                                               tf.convert_to_tensor(initial_values, tf.float32))

  def lookup(self, rows: tf.Tensor, anchor: tf.Variable):
    """(embeddings [n, dim], addresses [n]) of distinct rows; -1 reads zeros."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_lookup(self._handle, rows, anchor, dim=self._dim,
                                            table_name=self._table_name)

  def read_rows(self, rows: tf.Tensor):
    """(whole rows [n, dim * (1 + k)], the k slots' initial values [k])."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_read_rows(self._handle, rows)

  def write_rows(self, rows: tf.Tensor, values: tf.Tensor):
    """Overwrites rows with whole rows, or embeddings only (slots reset)."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_write_rows(self._handle, rows, values)

  def export(self):
    """(values [size, dim * (1 + k)], slot_initial_values [k]) float32."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_export(self._handle)

  def import_(self, values: tf.Tensor, slot_initial_values: tf.Tensor):
    """Replaces the content (as `export` gives); creates the store if needed."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_import(self._handle, values, slot_initial_values,
                                            dim=self._dim, table_name=self._table_name)

  def apply_sgd(self, rows, grad, learning_rate, weight_decay):
    """Fused SGD on distinct rows; see MxRowStoreApplySgd."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_apply_sgd(self._handle, rows, grad, learning_rate,
                                               weight_decay, dim=self._dim)

  def apply_adagrad(self, rows, grad, learning_rate):
    """Fused Adagrad on distinct rows; see MxRowStoreApplyAdagrad."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_apply_adagrad(self._handle, rows, grad, learning_rate,
                                                   dim=self._dim)

  def apply_adam(self, rows, grad, lr_t, beta1, beta2, epsilon):
    """Fused lazy Adam on distinct rows; see MxRowStoreApplyAdam."""
    with tf.device(HOST_DEVICE):
      return ops.load().mx_row_store_apply_adam(self._handle, rows, grad, lr_t, beta1, beta2,
                                                epsilon, dim=self._dim)

  def release(self) -> None:
    """Frees an eagerly created store (see KeyIndex.release)."""
    if tf.executing_eagerly() and not tf.is_symbolic_tensor(self._handle):
      with tf.device(HOST_DEVICE):
        tf.raw_ops.DestroyResourceOp(resource=self._handle, ignore_lookup_error=True)

  def _serialize_to_tensors(self):
    values, slot_initial_values = self.export()
    return {"values": values, "slot_initial_values": slot_initial_values}

  def _restore_from_tensors(self, restored_tensors):
    return self.import_(restored_tensors["values"], restored_tensors["slot_initial_values"])


class _RowStoreSaveable(saveable_object.SaveableObject):
  """The row store as a TF1 SaveableObject: `<table>/row_store-{values,slot_initial_values}`."""

  def __init__(self, store: RowStore):
    name = f"{store._table_name}/row_store"  # pylint: disable=protected-access
    values, slot_initial_values = store.export()
    specs = [
        saveable_object.SaveSpec(values, "", f"{name}-values"),
        saveable_object.SaveSpec(slot_initial_values, "", f"{name}-slot_initial_values")
    ]
    super().__init__(store.resource_handle, specs, name)
    self._store = store

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes  # As saved.
    return self._store.import_(restored_tensors[0], restored_tensors[1])
