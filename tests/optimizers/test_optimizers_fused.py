"""The fused native row updates (MxLazyAdamRows, MxAdagradRows, MxFtrlRows, MxSgdRows).

Each fused `_update_rows` is compared with the optimizer's TF gather/scatter
update (`_update_rows_tf`) on the same variables, and the kernels' checks of
rows, shapes and dtypes are exercised.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline import ops
from mxrec_pipeline.optimizers import adagrad, ftrl, gradient_descent, lazy_adam

CAPACITY, DIM = 6, 4


def _variables(names, seed):
  rng = np.random.RandomState(seed)
  var = tf.Variable(rng.uniform(-1, 1, [CAPACITY, DIM]).astype(np.float32))
  slots = {
      name: tf.Variable(rng.uniform(0.1, 1, [CAPACITY, DIM]).astype(np.float32)) for name in names
  }
  return var, slots


@pytest.mark.parametrize("make", [
    lambda: lazy_adam.LazyAdam(0.01),
    lambda: adagrad.Adagrad(0.1),
    lambda: gradient_descent.GradientDescent(0.1, weight_decay=0.01),
    lambda: ftrl.Ftrl(0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02,
                      l2_shrinkage_regularization_strength=0.03),
    lambda: ftrl.Ftrl(0.1, learning_rate_power=-0.3, l1_regularization_strength=0.5),
], ids=["lazy_adam", "adagrad", "sgd", "ftrl", "ftrl_power"])
def test_fused_update_equals_the_tf_op_update(make):
  optimizer = make()
  names = sorted(optimizer.slot_initial_values)
  rows = tf.constant([4, 0, 2], tf.int64)
  for step in (1, 2, 3):
    grad = tf.constant(np.random.RandomState(step).normal(size=[3, DIM]).astype(np.float32))
    fused_var, fused_slots = _variables(names, seed=step)
    ref_var, ref_slots = _variables(names, seed=step)
    optimizer._update_rows(fused_var, fused_slots, rows, grad, tf.constant(step, tf.int64))
    optimizer._update_rows_tf(ref_var, ref_slots, rows, grad, tf.constant(step, tf.int64))
    np.testing.assert_allclose(fused_var.numpy(), ref_var.numpy(), rtol=1e-6, atol=1e-7)
    for name in names:
      np.testing.assert_allclose(fused_slots[name].numpy(), ref_slots[name].numpy(), rtol=1e-6,
                                 atol=1e-7)
    # Rows 1, 3 and 5 are untouched.
    untouched = _variables(names, seed=step)[0].numpy()[[1, 3, 5]]
    np.testing.assert_array_equal(fused_var.numpy()[[1, 3, 5]], untouched)


@pytest.mark.parametrize("make", [
    lambda: lazy_adam.LazyAdam(0.01),
    lambda: adagrad.Adagrad(0.1),
    lambda: gradient_descent.GradientDescent(0.1, weight_decay=0.01),
    lambda: ftrl.Ftrl(0.1, l1_regularization_strength=0.01, l2_shrinkage_regularization_strength=
                      0.03),
], ids=["lazy_adam", "adagrad", "sgd", "ftrl"])
def test_fused_update_sums_the_gradients_of_repeated_rows(make):
  # Row 4 at positions 0, 2 and 3 (int32 indices, as autodiff may give them):
  # the same update as the TF-op one on the distinct rows and summed gradients.
  optimizer = make()
  assert tf.float32 in optimizer.sums_repeated_rows_of
  names = sorted(optimizer.slot_initial_values)
  grad = np.random.RandomState(7).normal(size=[5, DIM]).astype(np.float32)
  summed = np.stack([grad[0] + grad[2] + grad[3], grad[1], grad[4]])
  fused_var, fused_slots = _variables(names, seed=3)
  ref_var, ref_slots = _variables(names, seed=3)
  step = tf.constant(2, tf.int64)
  optimizer._update_rows(fused_var, fused_slots, tf.constant([4, 0, 4, 4, 2], tf.int32),
                         tf.constant(grad), step)
  optimizer._update_rows_tf(ref_var, ref_slots, tf.constant([4, 0, 2], tf.int64),
                            tf.constant(summed), step)
  np.testing.assert_allclose(fused_var.numpy(), ref_var.numpy(), rtol=1e-6, atol=1e-7)
  for name in names:
    np.testing.assert_allclose(fused_slots[name].numpy(), ref_slots[name].numpy(), rtol=1e-6,
                               atol=1e-7)


@pytest.mark.parametrize("capacity", [6, 7000], ids=["bitmap", "hash"])
def test_distinct_and_repeated_rows_update_alike_by_bitmap_or_hash(capacity):
  # The kernels tell distinct rows apart with a bitmap of the capacity when it
  # is at most 1024 rows per gradient row, else by hashing: both ways, a
  # gradient on distinct rows and the same gradient split over repeated rows
  # update the same.
  optimizer = lazy_adam.LazyAdam(0.01)
  rng = np.random.RandomState(11)
  grad = rng.normal(size=[3, DIM]).astype(np.float32)
  halves = np.concatenate([grad * 0.25, grad * 0.75])
  results = []
  for rows, values in (([5, 0, 2], grad), ([5, 0, 2, 5, 0, 2], halves)):
    var = tf.Variable(np.ones([capacity, DIM], np.float32))
    slots = {name: tf.Variable(np.zeros([capacity, DIM], np.float32)) for name in ("m", "v")}
    optimizer._update_rows(var, slots, tf.constant(rows, tf.int64), tf.constant(values),
                           tf.constant(1, tf.int64))
    results.append([var.numpy()[[0, 2, 5, 1]], slots["m"].numpy()[[0, 2, 5]]])
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(results[0][0][3], 1)  # Row 1: untouched.


def test_fused_update_of_a_graph_function_sees_earlier_reads():
  # A value read before the update keeps its old content (copy on write).
  var, slots = _variables(["m", "v"], seed=0)
  before = var.read_value()
  kept = before.numpy().copy()
  lazy_adam.LazyAdam(0.1)._update_rows(var, slots, tf.constant([1], tf.int64), tf.ones([1, DIM]),
                                       tf.constant(1, tf.int64))
  np.testing.assert_array_equal(before.numpy(), kept)
  assert not np.array_equal(var.numpy()[1], kept[1])


def test_kernels_reject_bad_rows_shapes_and_variables():
  var, slots = _variables(["m", "v"], seed=0)
  lib = ops.load()
  one = tf.constant(1.0)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"MxSgdRows: row 6 \(position 1\) "
                     r"is outside \[0, 6\)"):
    lib.mx_sgd_rows(var.handle, tf.constant([0, 6], tf.int64), tf.ones([2, DIM]), one, one)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"grad \[n, 4\], got \[2\] and \[2,3\]"):
    lib.mx_sgd_rows(var.handle, tf.constant([0, 1], tf.int64), tf.ones([2, 3]), one, one)
  small = tf.Variable(tf.zeros([3, DIM]))
  with pytest.raises(tf.errors.InvalidArgumentError, match="variable 2 must be float32 of the "
                     r"shape \[6,4\]"):
    lib.mx_lazy_adam_rows(var.handle, slots["m"].handle, small.handle, tf.constant([0], tf.int64),
                          tf.ones([1, DIM]), one, one, one, one)
  wide = tf.Variable(tf.zeros([CAPACITY, DIM], tf.float64))
  with pytest.raises(tf.errors.InvalidArgumentError, match="must be float32"):
    lib.mx_adagrad_rows(var.handle, wide.handle, tf.constant([0], tf.int64), tf.ones([1, DIM]), one)
  with pytest.raises(tf.errors.InvalidArgumentError, match="is the table variable itself"):
    lib.mx_adagrad_rows(var.handle, var.handle, tf.constant([0], tf.int64), tf.ones([1, DIM]), one)
  np.testing.assert_array_equal(var.numpy(), _variables(["m", "v"], seed=0)[0].numpy())
