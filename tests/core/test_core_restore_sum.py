"""core/restore_sum.py: the ids' gradients summed per distinct row by restore index.

`sum_by_restore` (the native MxSumByRestore for float32) is compared with
`tf.math.unsorted_segment_sum` and a NumPy loop; `gather_by_restore`'s values
and gradient with TF's gather and its densified gradient. Its float32 read is
the native MxGatherByRestore, which reuses its output buffer from call to call:
an output still held must keep its values when the op runs again.
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


def _graph_op_types(fn, *args):
  return {op.type for op in fn.get_concrete_function(*args).graph.get_operations()}


@pytest.mark.parametrize("ids_shape", [[7], [2, 3], [0], [2, 0], [3, 1, 2]])
def test_gather_by_restore_float32_is_native_and_reads_as_tf_gather(ids_shape):
  rng = np.random.RandomState(6)
  unique_emb = tf.constant(rng.normal(size=[5, 4]).astype(np.float32))
  restore = tf.constant(rng.randint(0, 5, size=ids_shape).astype(np.int32))
  read = tf.function(restore_sum.gather_by_restore)
  assert "MxGatherByRestore" in _graph_op_types(read, unique_emb, restore)
  got = read(unique_emb, restore)
  assert got.shape == (*ids_shape, 4) and got.dtype == tf.float32
  np.testing.assert_array_equal(got.numpy(), tf.gather(unique_emb, restore).numpy())
  # Eager, the same.
  np.testing.assert_array_equal(
      restore_sum.gather_by_restore(unique_emb, restore).numpy(), got.numpy())


def test_gather_by_restore_other_dtypes_use_tf_gather():
  unique_emb = tf.constant([[1.0, 2.0], [3.0, 4.0]], tf.float64)
  restore = tf.constant([1, 1, 0], tf.int32)
  read = tf.function(restore_sum.gather_by_restore)
  assert "MxGatherByRestore" not in _graph_op_types(read, unique_emb, restore)
  np.testing.assert_array_equal(read(unique_emb, restore).numpy(), [[3, 4], [3, 4], [1, 2]])


def test_gather_by_restore_keeps_an_output_still_held_when_it_runs_again():
  """The kept buffer is reused only once no one holds the last output."""
  restore = tf.constant([[1, 0], [1, 1]], tf.int32)
  read = tf.function(restore_sum.gather_by_restore)
  first = read(tf.constant([[1.0, 2.0], [3.0, 4.0]]), restore)
  first_values = first.numpy().copy()
  second = read(tf.constant([[-1.0, -2.0], [-3.0, -4.0]]), restore)
  np.testing.assert_array_equal(first.numpy(), first_values)
  np.testing.assert_array_equal(second.numpy(), -first_values)
  # Held in a NumPy view only (zero-copy on the CPU): still kept.
  view = second.numpy()
  del first, second
  third = read(tf.constant([[5.0, 6.0], [7.0, 8.0]]), restore)
  np.testing.assert_array_equal(view, -first_values)
  np.testing.assert_array_equal(third.numpy(), [[[7, 8], [5, 6]], [[7, 8], [7, 8]]])


def test_gather_by_restore_in_a_loop_keeps_each_iterations_output():
  """One node run per iteration, its outputs held in a TensorArray until the end."""
  restore = tf.constant([[1, 0], [1, 1]], tf.int32)

  @tf.function
  def loop(embs):
    outputs = tf.TensorArray(tf.float32, size=3)
    for i in tf.range(3):
      outputs = outputs.write(i, restore_sum.gather_by_restore(embs[i], restore))
    return outputs.stack()

  embs = tf.reshape(tf.range(12, dtype=tf.float32), [3, 2, 2])
  np.testing.assert_array_equal(
      loop(embs).numpy(), np.stack([tf.gather(embs[i], restore).numpy() for i in range(3)]))


@pytest.mark.parametrize("bad", [4, -1])
def test_gather_by_restore_names_a_restore_value_out_of_range(bad):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"restore\[1\] = {bad} is outside \[0, num_unique = 4\)"):
    restore_sum.gather_by_restore(tf.ones([4, 2]), tf.constant([0, bad, 1], tf.int32))
