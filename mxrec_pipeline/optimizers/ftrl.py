"""FTRL-Proximal for tables, as mx_rec.optimizers.ftrl.create_hash_optimizer.

FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches",
KDD 2013), as tf.compat.v1.train.FtrlOptimizer computes it (ApplyFtrlV2), on the
touched rows r only. With n = accum, z = linear, p = -learning_rate_power:

  g_s    = g[r] + 2 * l2_shrinkage * w[r]
  n_new  = n[r] + g[r]^2
  z[r]   = z[r] + g_s - (n_new^p - n[r]^p) / learning_rate * w[r]
  q      = n_new^p / learning_rate + 2 * l2
  w[r]   = (sign(z[r]) * l1 - z[r]) / q   if |z[r]| > l1   else 0
  n[r]   = n_new

Other rows and their slots are left as they are. float32 tables update rows
and both slots in one pass of the fused native op MxFtrlRows
(native/core/row_optimizers.cc); other dtypes with TF ops.
"""

from __future__ import annotations

import tensorflow as tf

from mxrec_pipeline import ops
from mxrec_pipeline.optimizers import by_addr
from mxrec_pipeline.optimizers.base import HashOptimizer


class Ftrl(HashOptimizer):
  """Row-wise FTRL-Proximal; slots accumulator (n) and linear (z).

  Args:
    learning_rate: > 0.
    learning_rate_power: <= 0; -0.5 is AdaGrad-style decay.
    initial_accumulator_value: > 0, the accumulator's start.
    l1_regularization_strength, l2_regularization_strength,
      l2_shrinkage_regularization_strength: >= 0.
    accum_name, linear_name: Names of the two slots (and of their variables,
      `<table>/<name>/<slot>`); "accum" and "linear" when None.
    name: Optimizer name.

  Raises:
    ValueError: a value out of range (named), or equal or ill-formed slot names.
  """

  sums_repeated_rows_of = (tf.float32,)  # The fused native op sums them.

  def __init__(self, learning_rate, learning_rate_power=-0.5, initial_accumulator_value=0.1,
               l1_regularization_strength=0.0, l2_regularization_strength=0.0, accum_name=None,
               linear_name=None, l2_shrinkage_regularization_strength=0.0, name="Ftrl"):
    super().__init__(learning_rate, name)
    if not learning_rate_power <= 0:
      raise ValueError(f"{name}: `learning_rate_power` must be <= 0, got {learning_rate_power}")
    if not initial_accumulator_value > 0:
      raise ValueError(f"{name}: `initial_accumulator_value` must be positive, "
                       f"got {initial_accumulator_value}")
    for arg, value in (("l1_regularization_strength", l1_regularization_strength),
                       ("l2_regularization_strength",
                        l2_regularization_strength), ("l2_shrinkage_regularization_strength",
                                                      l2_shrinkage_regularization_strength)):
      if not value >= 0:
        raise ValueError(f"{name}: `{arg}` must be >= 0, got {value}")
    self.accum_name = accum_name or "accum"
    self.linear_name = linear_name or "linear"
    for arg, value in (("accum_name", self.accum_name), ("linear_name", self.linear_name)):
      if not isinstance(value, str) or "/" in value:
        raise ValueError(f"{name}: `{arg}` must be a string without '/', got {value!r}")
    if self.accum_name == self.linear_name:
      raise ValueError(f"{name}: `accum_name` and `linear_name` must differ, both are "
                       f"{self.accum_name!r}")
    self.learning_rate_power = float(learning_rate_power)
    self.l1 = float(l1_regularization_strength)
    self.l2 = float(l2_regularization_strength)
    self.l2_shrinkage = float(l2_shrinkage_regularization_strength)
    self.slot_initial_values = {
        self.accum_name: float(initial_accumulator_value), self.linear_name: 0.0
    }

  def _update_rows(self, var, slots, rows, grad, step):
    if var.dtype != tf.float32:
      return self._update_rows_tf(var, slots, rows, grad, step)
    scalars = (self.learning_rate, -self.learning_rate_power, self.l1, self.l2, self.l2_shrinkage)
    return [
        ops.load().mx_ftrl_rows(var.handle, slots[self.accum_name].handle,
                                slots[self.linear_name].handle, tf.cast(rows, tf.int64), grad,
                                *(tf.constant(value, tf.float32) for value in scalars))
    ]

  def _update_rows_tf(self, var, slots, rows, grad, step):
    """The update with TF gather/scatter ops (any float dtype); as _update_rows."""
    del step
    dtype = var.dtype
    accum, linear = slots[self.accum_name], slots[self.linear_name]
    w = tf.gather(var, rows)
    n = tf.gather(accum, rows)
    z = tf.gather(linear, rows)
    lr = tf.cast(self.learning_rate, dtype)
    power = tf.cast(-self.learning_rate_power, dtype)
    shrunk_grad = grad + 2.0 * tf.cast(self.l2_shrinkage, dtype) * w if self.l2_shrinkage else grad
    n_new = n + tf.square(grad)
    if self.learning_rate_power == -0.5:
      n_new_p, n_p = tf.sqrt(n_new), tf.sqrt(n)
    else:
      n_new_p, n_p = tf.pow(n_new, power), tf.pow(n, power)
    z_new = z + shrunk_grad - (n_new_p - n_p) / lr * w
    quadratic = n_new_p / lr + 2.0 * tf.cast(self.l2, dtype)
    l1 = tf.cast(self.l1, dtype)
    w_new = tf.where(
        tf.abs(z_new) > l1, (tf.sign(z_new) * l1 - z_new) / quadratic, tf.zeros_like(z_new))
    return [
        accum.scatter_update(tf.IndexedSlices(n_new, rows)),
        linear.scatter_update(tf.IndexedSlices(z_new, rows)),
        var.scatter_update(tf.IndexedSlices(w_new, rows))
    ]


def create_hash_optimizer(learning_rate, use_locking=False, name="Ftrl", *,
                          learning_rate_power=-0.5, initial_accumulator_value=0.1,
                          l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                          accum_name=None, linear_name=None,
                          l2_shrinkage_regularization_strength=0.0) -> Ftrl:
  """mxRec's factory of the table FTRL optimizer; arguments and defaults as mxRec's.

  mxRec takes the keyword arguments after `name` through **kwargs and ignores
  unknown ones; here they are explicit keyword-only arguments, so a misspelt one
  raises TypeError instead of being dropped.

  Args:
    learning_rate: > 0.
    use_locking: Accepted for mxRec scripts; row updates of one step are
      ordered by their data dependencies here.
    name: Optimizer name.
    learning_rate_power, initial_accumulator_value, l1_regularization_strength,
      l2_regularization_strength, accum_name, linear_name,
      l2_shrinkage_regularization_strength: See `Ftrl`.

  Raises:
    ValueError: a value out of range, or init(use_dynamic_expansion=True)
      (FTRL has no *_by_addr variant), as mxRec.
  """
  del use_locking  # See Args.
  by_addr.check_not_expansion_mode(name)
  return Ftrl(learning_rate, learning_rate_power, initial_accumulator_value,
              l1_regularization_strength, l2_regularization_strength, accum_name, linear_name,
              l2_shrinkage_regularization_strength, name)
