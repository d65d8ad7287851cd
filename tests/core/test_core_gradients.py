"""Gradients w.r.t. a table equal the dense gradient restricted to the touched rows."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.util.initialize import init

import sparse_testlib as lib

CAPACITY, DIM = 12, 3


@pytest.fixture(autouse=True)
def _run():
  init()


def _loss(emb, weights):
  # Depends on the rows themselves, so a wrong row would change the gradient.
  return tf.reduce_sum(weights * emb) + tf.reduce_sum(tf.square(emb))


@pytest.mark.parametrize("raw_ids", [
    [[101, 102, 101], [103, 101, 104]],
    [[[7, 7], [7, 7]], [[8, 9], [9, 7]]],
    [5, -5, 5],
], ids=["rank2", "rank3", "rank1"])
def test_gradient_is_indexed_slices_equal_to_dense(raw_ids):
  raw_ids = np.array(raw_ids, np.int64)
  vocab, positions = np.unique(raw_ids, return_inverse=True)
  positions = positions.reshape(raw_ids.shape)
  table = lib.make_table(dim=DIM, capacity=CAPACITY)
  embedding.sparse_lookup(table, tf.constant(raw_ids))  # Insert, to learn the rows.
  index = lib.index_dict(table)
  table_rows = np.array([index[k] for k in vocab.tolist()])
  # The dense variable holds, at each vocabulary position, that id's table row.
  dense = tf.Variable(table.variable.numpy()[table_rows])
  weights = tf.constant(np.random.RandomState(0).normal(size=raw_ids.shape + (DIM,)), tf.float32)

  with tf.GradientTape(persistent=True) as tape:
    sparse_loss = _loss(embedding.sparse_lookup(table, tf.constant(raw_ids)), weights)
    dense_loss = _loss(tf.gather(dense, positions), weights)
  np.testing.assert_allclose(sparse_loss.numpy(), dense_loss.numpy(), rtol=1e-6)
  sparse_grad = tape.gradient(sparse_loss, table.variable)
  dense_grad = tf.convert_to_tensor(tape.gradient(dense_loss, dense)).numpy()

  assert isinstance(sparse_grad, tf.IndexedSlices)
  # One slice per distinct row, its ids' gradients summed (core/restore_sum.py).
  assert sorted(sparse_grad.indices.numpy().tolist()) == sorted(table_rows)
  densified = tf.convert_to_tensor(sparse_grad).numpy()
  assert densified.shape == (CAPACITY, DIM)
  np.testing.assert_allclose(densified[table_rows], dense_grad, rtol=1e-5, atol=1e-6)
  untouched = np.setdiff1d(np.arange(CAPACITY), table_rows)
  np.testing.assert_array_equal(densified[untouched], 0.0)


def test_feature_spec_gradient_sums_shared_ids_of_two_features():
  table = lib.make_table("item", dim=DIM, capacity=CAPACITY)
  specs = [FeatureSpec("a", table_name="item"), FeatureSpec("b", table_name="item")]
  ids_a, ids_b = np.array([[1, 2], [2, 3]], np.int64), np.array([3, 3, 4], np.int64)
  batch = next(
      iter(
          tf.data.Dataset.from_tensors({"a": ids_a, "b": ids_b
                                       }).map(get_asc_insert_func(specs, is_training=True))))
  index = lib.index_dict(table)

  with tf.GradientTape() as tape:
    loss = (tf.reduce_sum(3.0 * embedding.sparse_lookup(table, specs[0], batch=batch)) +
            tf.reduce_sum(5.0 * embedding.sparse_lookup(table, specs[1], batch=batch)))
  grad = tape.gradient(loss, table.variable)
  assert isinstance(grad, tf.IndexedSlices)
  densified = tf.convert_to_tensor(grad).numpy()
  # Occurrences times each feature's weight: 1 -> 3, 2 -> 6, 3 -> 3 + 10, 4 -> 5.
  expected = {1: 3.0, 2: 6.0, 3: 13.0, 4: 5.0}
  for key, value in expected.items():
    np.testing.assert_allclose(densified[index[key]], value)
  assert np.count_nonzero(densified.any(axis=1)) == 4
