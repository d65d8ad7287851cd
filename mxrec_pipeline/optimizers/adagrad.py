"""Adagrad for tables, as mx_rec.optimizers.adagrad.create_hash_optimizer.

Adagrad (Duchi, Hazan, Singer, 2011), as tf.compat.v1.train.AdagradOptimizer,
on the touched rows r only:

  acc[r] = acc[r] + g[r]^2
  w[r]   = w[r] - learning_rate * g[r] / sqrt(acc[r])
"""

import tensorflow as tf

from mxrec_pipeline import ops
from mxrec_pipeline.optimizers import by_addr
from mxrec_pipeline.optimizers.base import HashOptimizer


class Adagrad(HashOptimizer):
  """Row-wise Adagrad; slot `accumulator` starts at initial_accumulator_value.

  Raises:
    ValueError: learning_rate <= 0 or initial_accumulator_value <= 0.
  """

  sums_repeated_rows_of = (tf.float32,)  # The fused native op sums them.

  def __init__(self, learning_rate=0.001, initial_accumulator_value=0.9, name="Adagrad"):
    super().__init__(learning_rate, name)
    if not initial_accumulator_value > 0:
      raise ValueError(f"{name}: `initial_accumulator_value` must be positive, "
                       f"got {initial_accumulator_value}")
    self.slot_initial_values = {"accumulator": float(initial_accumulator_value)}

  def _update_rows(self, var, slots, rows, grad, step):
    if var.dtype != tf.float32:
      return self._update_rows_tf(var, slots, rows, grad, step)
    # One pass of the fused native op (native/core/row_optimizers.cc).
    return [
        ops.load().mx_adagrad_rows(var.handle, slots["accumulator"].handle, tf.cast(rows, tf.int64),
                                   grad, tf.constant(self.learning_rate, tf.float32))
    ]

  def _update_rows_tf(self, var, slots, rows, grad, step):
    """The update with TF gather/scatter ops (any float dtype); as _update_rows."""
    acc = slots["accumulator"]
    acc_rows = tf.gather(acc, rows) + tf.square(grad)
    return [
        acc.scatter_update(tf.IndexedSlices(acc_rows, rows)),
        var.scatter_sub(tf.IndexedSlices(self.learning_rate * grad / tf.sqrt(acc_rows), rows))
    ]


def create_hash_optimizer(learning_rate=0.001, initial_accumulator_value=0.9, use_locking=False,
                          name="Adagrad") -> Adagrad:
  """mxRec's factory of the table Adagrad optimizer (same parameters and defaults).

  `use_locking` is accepted for mxRec scripts; updates are row-wise scatters.

  Raises:
    ValueError: init(use_dynamic_expansion=True) (use adagrad_by_addr), as mxRec.
  """
  del use_locking
  by_addr.check_not_expansion_mode(name)
  return Adagrad(learning_rate, initial_accumulator_value, name)
