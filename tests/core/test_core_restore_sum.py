"""core/restore_sum.py: the ids' gradients summed per distinct row by restore index.

`sum_by_restore` (the native MxSumByRestore for float32) is compared with
`tf.math.unsorted_segment_sum` and a NumPy loop; `gather_by_restore`'s values
and gradient with TF's gather and its densified gradient.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import restore_sum


def _numpy_sum(values, restore, num_unique):
  out = np.zeros([num_unique, values.shape[-1]], values.dtype)
  for value, u in zip(values.reshape(-1, values.shape[-1]), restore.reshape(-1)):
    out[u] += value
  return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sum_by_restore_equals_unsorted_segment_sum_and_numpy(dtype):
  rng = np.random.RandomState(3)
  # [2, 50] ids over 40 distinct rows; rows 37-39 have no id (zeros).
  restore = rng.randint(0, 37, size=[2, 50]).astype(np.int32)
  values = rng.normal(size=[2, 50, 5]).astype(dtype)
  got = restore_sum.sum_by_restore(tf.constant(values), tf.constant(restore), 40).numpy()
  assert got.shape == (40, 5) and got.dtype == dtype
  want = tf.math.unsorted_segment_sum(values.reshape(-1, 5), restore.reshape(-1), 40).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(got, _numpy_sum(values, restore, 40), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[37:], 0)


def test_sum_by_restore_in_a_graph_function_with_unknown_shapes_and_no_ids():

  @tf.function(input_signature=[
      tf.TensorSpec([None, 3], tf.float32),
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([], tf.int32)
  ])
  def summed(values, restore, num_unique):
    out = restore_sum.sum_by_restore(values, restore, num_unique)
    assert out.shape.as_list() == [None, 3]
    return out

  values = np.arange(12, dtype=np.float32).reshape(4, 3)
  np.testing.assert_array_equal(
      summed(values, np.array([1, 0, 1, 1], np.int32), 2).numpy(),
      [[3, 4, 5], [0 + 6 + 9, 1 + 7 + 10, 2 + 8 + 11]])
  assert summed(np.zeros([0, 3], np.float32), np.zeros([0], np.int32),
                2).numpy().tolist() == [[0, 0, 0], [0, 0, 0]]
  assert summed(np.zeros([0, 3], np.float32), np.zeros([0], np.int32), 0).shape == (0, 3)


@pytest.mark.parametrize("bad", [2, -1])
def test_sum_by_restore_names_a_restore_value_out_of_range(bad):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"restore\[1\] = {bad} is outside \[0, num_unique = 2\)"):
    restore_sum.sum_by_restore(tf.ones([3, 2]), tf.constant([0, bad, 1]), 2)


def test_gather_by_restore_reads_as_tf_gather_and_sums_the_gradient_per_row():
  rng = np.random.RandomState(5)
  unique_emb = tf.constant(rng.normal(size=[4, 3]).astype(np.float32))
  restore = tf.constant([[3, 0, 3], [3, 1, 0]], tf.int32)  # Row 2: no id.
  weights = tf.constant(rng.normal(size=[2, 3, 3]).astype(np.float32))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(unique_emb)
    got = restore_sum.gather_by_restore(unique_emb, restore)
    want = tf.gather(unique_emb, restore)
    got_loss, want_loss = tf.reduce_sum(got * weights), tf.reduce_sum(want * weights)
  np.testing.assert_array_equal(got.numpy(), want.numpy())
  got_grad = tape.gradient(got_loss, unique_emb)
  assert isinstance(got_grad, tf.Tensor)  # Dense: summed per row already.
  np.testing.assert_allclose(got_grad.numpy(),
                             tf.convert_to_tensor(tape.gradient(want_loss, unique_emb)).numpy(),
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(got_grad.numpy()[2], 0)
