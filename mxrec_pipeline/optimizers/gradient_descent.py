"""SGD for tables, as mx_rec.optimizers.gradient_descent.create_hash_optimizer.

w[r] = w[r] - learning_rate * (g[r] + weight_decay * w[r]) for the touched rows r
(duplicates summed; weight_decay 0 when None), as gradient_descent_by_addr.
"""

import tensorflow as tf

from mxrec_pipeline import ops
from mxrec_pipeline.optimizers import by_addr
from mxrec_pipeline.optimizers.base import HashOptimizer


class GradientDescent(HashOptimizer):
  """Row-wise gradient descent with optional weight decay; no slots.

  Raises:
    ValueError: weight_decay outside [0, 1].
  """

  slot_initial_values = {}

  sums_repeated_rows_of = (tf.float32,)  # The fused native op sums them.

  def __init__(self, learning_rate, name="GradientDescent", weight_decay=None):
    super().__init__(learning_rate, name)
    weight_decay = 0.0 if weight_decay is None else float(weight_decay)
    if not 0.0 <= weight_decay <= 1.0:
      raise ValueError(f"{name}: `weight_decay` must be in [0, 1], got {weight_decay}")
    self.weight_decay = weight_decay

  def _update_rows(self, var, slots, rows, grad, step):
    if var.dtype != tf.float32:
      return self._update_rows_tf(var, slots, rows, grad, step)
    # One pass of the fused native op (native/core/row_optimizers.cc).
    return [
        ops.load().mx_sgd_rows(var.handle, tf.cast(rows, tf.int64), grad,
                               tf.constant(self.learning_rate, tf.float32),
                               tf.constant(self.weight_decay, tf.float32))
    ]

  def _update_rows_tf(self, var, slots, rows, grad, step):
    """The update with TF gather/scatter ops (any float dtype); as _update_rows."""
    if self.weight_decay:
      grad = grad + self.weight_decay * tf.gather(var, rows)
    return [var.scatter_sub(tf.IndexedSlices(self.learning_rate * grad, rows))]


def create_hash_optimizer(learning_rate, use_locking=False, name="GradientDescent",
                          use_fusion_optim=False, weight_decay=None) -> GradientDescent:
  """mxRec's factory of the table SGD optimizer (same parameters and defaults).

  `use_locking` and `use_fusion_optim` are accepted for mxRec scripts: updates
  are row-wise scatters either way (no NPU fusion operator here).

  Raises:
    ValueError: init(use_dynamic_expansion=True) (use gradient_descent_by_addr), as mxRec.
  """
  del use_locking, use_fusion_optim
  by_addr.check_not_expansion_mode(name)
  return GradientDescent(learning_rate, name, weight_decay)
