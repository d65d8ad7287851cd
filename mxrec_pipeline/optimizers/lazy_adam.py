"""Lazy Adam for tables, as mx_rec.optimizers.lazy_adam.create_hash_optimizer.

Adam (Kingma & Ba, 2015, arXiv:1412.6980) applied only to the rows a batch
touched, as mxRec's CustomizedLazyAdam and tfa.optimizers.LazyAdam do. With
t the number of apply_gradients calls so far (1 at the first):

  lr_t = learning_rate * sqrt(1 - beta2^t) / (1 - beta1^t)
  m[r] = beta1 * m[r] + (1 - beta1) * g[r]
  v[r] = beta2 * v[r] + (1 - beta2) * g[r]^2
  w[r] = w[r] - lr_t * m[r] / (sqrt(v[r]) + epsilon)

for the touched rows r only; other rows and their m, v are left as they are.
float32 tables update rows, m and v in one pass of the fused native op
MxLazyAdamRows (native/core/row_optimizers.cc); other dtypes with TF ops.
"""

import tensorflow as tf

from mxrec_pipeline import ops
from mxrec_pipeline.optimizers import by_addr
from mxrec_pipeline.optimizers.base import HashOptimizer


def adam_hyperparameters(name: str, beta1, beta2, epsilon) -> tuple[float, float, float]:
  """Checked (beta1, beta2, epsilon) of an Adam optimizer, as floats.

  Raises:
    ValueError: betas outside [0, 1), epsilon <= 0 (naming the optimizer).
  """
  for arg, value in (("beta1", beta1), ("beta2", beta2)):
    if not 0.0 <= value < 1.0:
      raise ValueError(f"{name}: `{arg}` must be in [0, 1), got {value}")
  if not epsilon > 0:
    raise ValueError(f"{name}: `epsilon` must be positive, got {epsilon}")
  return float(beta1), float(beta2), float(epsilon)


class LazyAdam(HashOptimizer):
  """Row-wise lazy Adam; see the module docstring for the math.

  Raises:
    ValueError: learning_rate <= 0, betas outside [0, 1), epsilon <= 0.
  """

  slot_initial_values = {"m": 0.0, "v": 0.0}

  sums_repeated_rows_of = (tf.float32,)  # The fused native op sums them.

  def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, name="LazyAdam"):
    super().__init__(learning_rate, name)
    self.beta1, self.beta2, self.epsilon = adam_hyperparameters(name, beta1, beta2, epsilon)

  def _update_rows(self, var, slots, rows, grad, step):
    if var.dtype != tf.float32:
      return self._update_rows_tf(var, slots, rows, grad, step)
    lr_t, beta1, beta2 = self._coefficients(var.dtype, step)
    return [
        ops.load().mx_lazy_adam_rows(var.handle, slots["m"].handle, slots["v"].handle,
                                     tf.cast(rows, tf.int64), grad, lr_t, beta1, beta2,
                                     tf.constant(self.epsilon, tf.float32))
    ]

  def _coefficients(self, dtype, step):
    """(lr_t, beta1, beta2) as `dtype` scalars at apply_gradients call `step`."""
    t = tf.cast(step, dtype)
    beta1, beta2 = tf.cast(self.beta1, dtype), tf.cast(self.beta2, dtype)
    return self.learning_rate * tf.sqrt(1 - beta2**t) / (1 - beta1**t), beta1, beta2

  def _update_rows_tf(self, var, slots, rows, grad, step):
    """The update with TF gather/scatter ops (any float dtype); as _update_rows."""
    lr_t, beta1, beta2 = self._coefficients(var.dtype, step)
    m, v = slots["m"], slots["v"]
    m_rows = beta1 * tf.gather(m, rows) + (1 - beta1) * grad
    v_rows = beta2 * tf.gather(v, rows) + (1 - beta2) * tf.square(grad)
    step_rows = lr_t * m_rows / (tf.sqrt(v_rows) + self.epsilon)
    return [
        m.scatter_update(tf.IndexedSlices(m_rows, rows)),
        v.scatter_update(tf.IndexedSlices(v_rows, rows)),
        var.scatter_sub(tf.IndexedSlices(step_rows, rows))
    ]


def create_hash_optimizer(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                          name="LazyAdam", use_fusion_optim=False) -> LazyAdam:
  """mxRec's factory of lazy Adam; arguments and defaults as mxRec's.

  `use_fusion_optim` (mxRec's NPU fusion operator) is accepted and changes
  nothing: the update is row-wise TF ops either way.

  Raises:
    ValueError: init(use_dynamic_expansion=True) (use lazy_adam_by_addr), as mxRec.
  """
  del use_fusion_optim
  by_addr.check_not_expansion_mode(name)
  return LazyAdam(learning_rate, beta1, beta2, epsilon, name)
