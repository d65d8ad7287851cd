"""ByAddressOptimizer: the base of the *_by_addr optimizers of expansion tables.

With init(use_dynamic_expansion=True) tables keep their rows, [embedding |
optimizer slots], in a native row store (core/expansion.py). These optimizers
update the rows a step touched with one fused native op per table, addressed by
the rows' addresses, as mxRec's LazyAdamByAddress family does. Gradients come
as either of:

- `(grad, addresses)`, mxRec's convention in tf.compat.v1 graphs: `addresses`
  an entry of the ASCEND_SPARSE_LOOKUP_ID_OFFSET collection and `grad` the
  gradient of the matching ASCEND_SPARSE_LOOKUP_LOCAL_EMB entry ([u, dim], or
  IndexedSlices on its positions);
- `(grad, table.variable)`: the gradient of the table's anchor, IndexedSlices on
  row addresses (eager, tf.function, graphs; as for plain tables).

Duplicate addresses (one row looked up twice in a step) are summed before the
update. Works eagerly, in tf.function and in tf.compat.v1 sessions, where
`apply_gradients` returns the training op. Not under tf.distribute strategies.
"""

from __future__ import annotations

import tensorflow as tf

from mxrec_pipeline.core import expansion
from mxrec_pipeline.optimizers import base
from mxrec_pipeline.util import initialize


def check_expansion_mode(name: str) -> None:
  """Raises unless the run uses dynamic expansion (mxRec's check and message).

  Raises:
    RuntimeError: init() was not called.
    ValueError: init(use_dynamic_expansion=False).
  """
  if not initialize.get_use_dynamic_expansion():
    raise ValueError(
        f"{name}: The dynamic expansion mode is not compatible with the optimizer, please config "
        "dynamic expansion mode and optimizer correctly. *_by_addr optimizers update "
        "dynamic-expansion tables: call init(use_dynamic_expansion=True), or use "
        "create_hash_optimizer of lazy_adam / adagrad / gradient_descent / ftrl")


def check_not_expansion_mode(name: str) -> None:
  """Raises if the run uses dynamic expansion (mxRec's check of the plain optimizers).

  Raises:
    ValueError: init(use_dynamic_expansion=True).
  """
  if initialize.is_initialized() and initialize.get_use_dynamic_expansion():
    raise ValueError(
        f"{name}: The dynamic expansion mode is not compatible with the optimizer, please config "
        "dynamic expansion mode and optimizer correctly. With init(use_dynamic_expansion=True) "
        "use create_hash_optimizer_by_address of lazy_adam_by_addr / adagrad_by_addr / "
        "gradient_descent_by_addr")


class ByAddressOptimizer(tf.Module):
  """Base of the fused, address-based table optimizers.

  Attributes:
    learning_rate: Python float.
    optimizer_name: The name given.
    iterations: int64 variable, the number of apply_gradients calls so far.
    slot_initial_values: Slot name -> initial value, in row order (class level
      or set by the subclass before use).

  Raises:
    RuntimeError: init() was not called.
    ValueError: the run is not in dynamic-expansion mode, or learning_rate <= 0.

  Subclasses give the slot names with their initial values and the fused update:

    class Sgd(ByAddressOptimizer):
      slot_initial_values = {}

      def _apply_rows(self, store, rows, grad, step):
        return store.apply_sgd(rows, grad, self.learning_rate, 0.0)
  """

  slot_initial_values: dict[str, float] = {}

  def __init__(self, learning_rate: float, name: str):
    super().__init__(name=None)
    check_expansion_mode(name)
    base.init_common_state(self, learning_rate, name)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Applies gradients of expansion tables, row-wise, with fused native ops.

    Args:
      grads_and_vars: Pairs (gradient, addresses or table.variable); see the
        module docstring. None gradients are skipped; with only those, nothing
        happens (the step is not counted).
      global_step: Optional int variable, incremented once (TF1 convention).
      name: Name scope.

    Returns:
      The update op in graph mode; None eagerly.

    Raises:
      ValueError: a pair that is neither (see the module docstring), naming
        what was given; a dense gradient for table.variable.
      NotImplementedError: under a tf.distribute strategy.
    """
    if tf.distribute.has_strategy():
      raise NotImplementedError(f"{self.optimizer_name}: dynamic-expansion tables are not "
                                "supported under tf.distribute strategies")
    by_table: dict[str, tuple[expansion.ExpansionTable, list, list]] = {}
    for grad, var in grads_and_vars:
      if grad is None:
        continue
      table, rows, values = self._rows_and_values(grad, var)
      entry = by_table.setdefault(table.table_name, (table, [], []))
      entry[1].append(rows)
      entry[2].append(values)
    if not by_table:  # As HashOptimizer: nothing to apply, no step counted.
      return None if tf.executing_eagerly() else tf.no_op()
    for table, _, _ in by_table.values():
      table.attach_optimizer(self, list(self.slot_initial_values))
    with tf.name_scope(name or self.optimizer_name):
      step = self.iterations + 1
      updates = []
      for table, rows, values in by_table.values():
        rows = tf.concat(rows, 0) if len(rows) > 1 else rows[0]
        values = tf.concat(values, 0) if len(values) > 1 else values[0]
        unique, position = tf.unique(rows)
        summed = tf.math.unsorted_segment_sum(values, position, tf.size(unique))
        set_slots = table.store.set_slots(list(self.slot_initial_values.values()))
        with tf.control_dependencies([set_slots]):
          updates.append(self._apply_rows(table.store, unique, summed, step))
      with tf.control_dependencies(updates):
        increments = [self.iterations.assign_add(1)]
        if global_step is not None:
          increments.append(global_step.assign_add(1))
    if tf.executing_eagerly():
      return None
    return tf.group(updates + increments)

  def _rows_and_values(self, grad, var):
    """(table, rows [n] int64, values [n, dim] float32) of one gradient pair."""
    who = self.optimizer_name
    if isinstance(var, tf.Variable):
      table = expansion.table_of_anchor(var)
      if table is None:
        raise ValueError(
            f"{who}: variable '{var.name}' is not the `variable` of a dynamic-expansion table "
            "of the current run; give dense variables to a dense optimizer (see "
            "get_dense_and_sparse_variable())")
      if not isinstance(grad, tf.IndexedSlices):
        raise ValueError(f"{who}: the gradient of table '{table.table_name}' is dense "
                         f"({type(grad).__name__}); look tables up with sparse_lookup")
      return table, tf.cast(grad.indices, tf.int64), grad.values
    table = expansion.table_of_address(var, who)
    if isinstance(grad, tf.IndexedSlices):  # Gradient on positions of the local embeddings.
      return table, tf.gather(var, grad.indices), grad.values
    return table, var, tf.convert_to_tensor(grad)

  def _apply_rows(self, store, rows, grad, step):
    """The fused update op of distinct `rows`.

    Args:
      store: The table's core.row_store.RowStore.
      rows: [n] int64 distinct row addresses.
      grad: [n, dim] float32 summed gradients of those rows.
      step: int64 scalar, 1 at the first apply_gradients.
    """
    raise NotImplementedError
