"""HashOptimizer: the lazy, row-wise optimizer base of the sparse tables.

A step touches only the rows a batch looked up, and only their slots: the
gradient of a table is IndexedSlices (see sparse_lookup); duplicate rows are
summed first, then a subclass's `_update_rows` updates those rows (a fused
native update sums them in its own pass: `sums_repeated_rows_of`). Works eagerly,
in tf.function / Keras train steps (also under tf.distribute strategies, which
all-reduce the gradients first) and in tf.compat.v1 sessions, where
`apply_gradients` returns the training op, as mxRec's hash optimizers do.

Subclasses give the slot names with their initial values and the row math:

  class Sgd(HashOptimizer):
    slot_initial_values = {}

    def _update_rows(self, var, slots, rows, grad, step):
      return [var.scatter_sub(tf.IndexedSlices(self.learning_rate * grad, rows))]
"""

from __future__ import annotations

import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import placement
from mxrec_pipeline.util import initialize


def init_common_state(optimizer: tf.Module, learning_rate: float, name: str) -> None:
  """Sets `learning_rate`, `optimizer_name` and the `iterations` variable.

  Shared by every table optimizer (device tables and by-address ones).
  mxRec accepts any name of 1-200 characters; tf.Module names are stricter, so
  optimizers stay unnamed modules and `optimizer_name` keeps the name.

  Raises:
    ValueError: a bad name, or learning_rate <= 0.
  """
  if not isinstance(name, str) or not 1 <= len(name) <= 200 or "/" in name:
    raise ValueError(f"optimizer `name` must be a string of 1 to 200 characters without '/', "
                     f"got {name!r}")
  if not learning_rate > 0:
    raise ValueError(f"{name}: `learning_rate` must be positive, got {learning_rate}")
  optimizer.learning_rate = float(learning_rate)
  optimizer.optimizer_name = name
  with tf.init_scope():
    optimizer.iterations = tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                                 use_resource=True, name=f"{name}/iterations")


class HashOptimizer(tf.Module):
  """Base of the lazy table optimizers (mxRec's CustomizedOptimizer family).

  Attributes:
    learning_rate: Python float.
    iterations: int64 variable, the number of apply_gradients calls so far.
    slot_initial_values: Slot name -> initial value of its rows (class level).
    sums_repeated_rows_of: Table dtypes whose `_update_rows` takes the
      gradient's rows as they are, repeated ones included, and sums their
      gradients itself (a fused native op, see native/core/row_optimizers.h);
      for other dtypes apply_gradients sums them first with tf.unique +
      unsorted_segment_sum (class level).
  """

  slot_initial_values: dict[str, float] = {}
  sums_repeated_rows_of: tuple[tf.DType, ...] = ()

  def __init__(self, learning_rate: float, name: str):
    super().__init__(name=None)
    init_common_state(self, learning_rate, name)
    self._slots: dict[str, dict[str, tf.Variable]] = {}
    # Table name -> the table variable its slots belong to. Set around
    # tf.Module's attribute tracking: checkpoints must not hold the tables twice.
    object.__setattr__(self, "_slot_owners", {})

  def get_slot(self, table_name: str, slot_name: str) -> tf.Variable:
    """The slot variable `slot_name` of a table, [rows, dim] like the table.

    Raises:
      KeyError: no such slot yet (slots appear at the first apply_gradients).
    """
    return self._slots[table_name][slot_name]

  def build(self, var_list) -> None:
    """Creates the slots of these table variables now (Keras' `Optimizer.build`).

    apply_gradients creates missing slots itself; building first makes a
    checkpoint restore fill the slots at once (a run resumed after its last
    epoch trains no step but exports and saves them).

    Args:
      var_list: Table variables of the current run.

    Raises:
      ValueError: a variable that is not a table's.
    """
    with tf.init_scope():
      for var in var_list:
        self._create_slots(var, self._table_of(var).table_name)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Applies gradients of table variables, row-wise.

    Args:
      grads_and_vars: Pairs (gradient, table variable); gradients are
        IndexedSlices (or None, skipped). Variables must belong to tables of
        the current run.
      global_step: Optional int variable, incremented once (TF1 convention).
      name: Name scope.

    Returns:
      The update op in graph mode; None eagerly.

    Raises:
      ValueError: a variable that is not a table's (use a dense optimizer for
        it), or a dense gradient (look tables up with sparse_lookup).
    """
    pairs = [(g, v) for g, v in grads_and_vars if g is not None]
    if not pairs:
      return None if tf.executing_eagerly() else tf.no_op()
    tables = [self._table_of(v) for _, v in pairs]
    for (grad, _), table in zip(pairs, tables):
      if not isinstance(grad, tf.IndexedSlices):
        raise ValueError(
            f"{self.optimizer_name}: the gradient of table '{table.table_name}' is dense "
            f"({type(grad).__name__}); look tables up with sparse_lookup, which gives "
            "IndexedSlices")
    self.build([v for _, v in pairs])
    with tf.name_scope(name or self.optimizer_name):
      in_replica = tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
      if in_replica:
        context = tf.distribute.get_replica_context()
        route = placement.gradient_route(
            context.strategy, any(isinstance(v, tf.distribute.DistributedValues) for _, v in pairs))
        if route is placement.GradientRoute.LOCAL:
          # Each worker's own variables (a shard of distributed.ShardedTable):
          # their gradients are already complete at the owner, so neither
          # all-reduce nor merge_call; slots and `iterations` must be plain too.
          return self._apply_local(pairs, tables, global_step)
        grads = [g for g, _ in pairs]
        concat = route is placement.GradientRoute.CONCAT
        if not concat:
          grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        return context.merge_call(self._distributed_apply,
                                  args=(grads, [v for _, v in pairs], tables, global_step, concat))
      return self._distributed_apply(tf.distribute.get_strategy(), [g for g, _ in pairs],
                                     [v for _, v in pairs], tables, global_step)

  def _distributed_apply(self, strategy, grads, variables, tables, global_step,
                         concat_replicas=False):
    step = self.iterations + 1
    updates = []
    if concat_replicas:
      grads = [_concat_replicas(strategy, grad) for grad in grads]
    for grad, var, table in zip(grads, variables, tables):
      slots = self._slots[table.table_name]
      update = strategy.extended.update(var, self._apply_one, args=(grad, slots, step), group=True)
      updates.append(update)
      if table.is_tiered:
        # The batch's rows are trained: its device-cache slots may make room.
        finish = table.tiers.finish([] if update is None else [update])
        if finish is not None:
          updates.append(finish)
    with tf.control_dependencies(updates):
      increments = [
          strategy.extended.update(self.iterations, lambda v: v.assign_add(1), group=True)
      ]
      if global_step is not None:
        increments.append(
            strategy.extended.update(global_step, lambda v: v.assign_add(1), group=True))
    if tf.executing_eagerly():
      return None
    return tf.group(updates + increments)

  def _apply_local(self, pairs, tables, global_step):
    """Applies (grad, var) pairs of non-distributed variables in a replica context."""
    for var in [self.iterations] + [self._slots[t.table_name] for t in tables]:
      for v in (var.values() if isinstance(var, dict) else [var]):
        if isinstance(v, tf.distribute.DistributedValues):
          raise ValueError(
              f"{self.optimizer_name}: the variables of this worker's own tables need the "
              "optimizer's slots and `iterations` outside the strategy; create and build the "
              "hash optimizer outside strategy.scope()")
    step = self.iterations + 1
    updates = [
        self._apply_one(var, grad, self._slots[table.table_name], step)
        for (grad, var), table in zip(pairs, tables)
    ]
    with tf.control_dependencies(updates):
      increments = [self.iterations.assign_add(1)]
      if global_step is not None:
        increments.append(global_step.assign_add(1))
    if tf.executing_eagerly():
      return None
    return tf.group(updates + increments)

  def _apply_one(self, var, grad, slots, step):
    # Per-replica slot copies are reached through the strategy's mirrored values.
    local_slots = {name: _local(slot, var) for name, slot in slots.items()}
    return tf.group(self.apply_sparse(var, local_slots, grad, step))

  def apply_sparse(self, var, slots, grad: tf.IndexedSlices, step) -> list:
    """One row update of `var` and `slots`, both the caller's: the optimizer's math, nothing else.

    Sums the gradients of repeated rows (a fused native update, for dtypes
    in `sums_repeated_rows_of`, sums them in its own pass), then updates
    those rows (`_update_rows`). Unlike `apply_gradients` it neither looks
    the table up nor increments `iterations` nor handles a strategy: for
    tables that hold their own slots and step count, e.g. each shard of
    distributed/ps_table.PSShardedTable, updated on its ps task. Mirrors
    TF1's `Optimizer._apply_sparse_duplicate_indices`.

    Args:
      var: [capacity, dim] table variable.
      slots: Slot name (`slot_initial_values`) -> [capacity, dim] variable.
      grad: tf.IndexedSlices of var: indices [n] int32 or int64 rows, which
        may repeat; values [n, dim].
      step: int64 scalar, the step count t of this update (1 at the first).

    Returns:
      A list of update ops (eagerly: run already).
    """
    if var.dtype in self.sums_repeated_rows_of:
      return list(self._update_rows(var, slots, grad.indices, grad.values, step))
    rows, position = tf.unique(grad.indices)
    summed = tf.math.unsorted_segment_sum(grad.values, position, tf.size(rows))
    return list(self._update_rows(var, slots, rows, summed, step))

  def _update_rows(self, var, slots, rows, grad, step):
    """Updates `rows` of `var` and `slots` (dict name -> variable).

    Args:
      var: [capacity, dim] table variable.
      slots: Slot name -> [capacity, dim] variable.
      rows: [n] int32 or int64 distinct rows; they may repeat when var's dtype
        is in `sums_repeated_rows_of`.
      grad: [n, dim] gradient of those rows (summed per row when they are
        distinct).
      step: int64 scalar, 1 at the first apply_gradients.

    Returns:
      A list of update ops.
    """
    raise NotImplementedError

  def _create_slots(self, var, table_name: str, tiered_attach: bool = False) -> None:
    table = initialize.get_config_initializer().tables.get(table_name)
    tiers = table.tiers if table is not None and table.is_tiered else None
    if tiers is not None and not tiered_attach and not tiers.has_optimizer(self):
      # A tiered table moves its slots between tiers with the rows: they must
      # exist (and size the host rows) before its first step.
      tiers.attach(self, var)
      return
    if table_name in self._slots:
      if self._slot_owners[table_name] is not var:
        raise ValueError(f"{self.optimizer_name}: it already holds slots of another table named "
                         f"'{table_name}' (from an earlier init()); create a new optimizer per run")
      return
    self._slot_owners[table_name] = var
    slots = {}
    for slot_name, initial in self.slot_initial_values.items():
      with tf.distribute.get_strategy().extended.colocate_vars_with(var):
        slots[slot_name] = tf.compat.v1.Variable(
            lambda initial=initial: tf.fill(tf.shape(var), tf.cast(initial, var.dtype)),
            dtype=var.dtype, trainable=False, use_resource=True,
            name=f"{table_name}/{self.optimizer_name}/{slot_name}")
    self._slots[table_name] = slots
    run = initialize.get_config_initializer()
    if not any(o is self for o in run.hash_optimizers):
      run.hash_optimizers.append(self)

  def _table_of(self, var):
    for table in initialize.get_config_initializer().tables.values():
      if table.variable is var:
        if not isinstance(table, embedding.SparseEmbedding):
          raise ValueError(
              f"{self.optimizer_name}: table '{table.table_name}' uses dynamic expansion; "
              "train it with a *_by_addr optimizer (create_hash_optimizer_by_address)")
        return table
    raise ValueError(
        f"{self.optimizer_name}: variable '{var.name}' is not a table of the current run; "
        "give dense variables to a dense optimizer (see get_dense_and_sparse_variable())")


def _concat_replicas(strategy, grad):
  """The sum over local replicas of IndexedSlices, as one IndexedSlices (rows repeat)."""
  parts = strategy.experimental_local_results(grad)
  if len(parts) == 1:
    return parts[0]
  return tf.IndexedSlices(tf.concat([p.values for p in parts], 0),
                          tf.concat([p.indices for p in parts], 0), parts[0].dense_shape)


def _local(slot, var):
  """The component of a mirrored slot that lives beside `var`'s component."""
  if isinstance(slot, tf.distribute.DistributedValues):
    for value in slot.values:
      if value.device == var.device:
        return value
  return slot
