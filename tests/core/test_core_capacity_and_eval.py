"""Full tables, the evaluation path (serving_default_value) and send_count."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.util.initialize import init, terminate_config_initializer

import sparse_testlib as lib

FULL = (r"table 'item' is full: device_vocabulary_size=4 rows, 3 used, and this batch brings "
        r"2 new keys\. Nothing was inserted\. Create the table with a larger "
        r"device_vocabulary_size")


def _insert_batches(specs, is_training, batches):
  dataset = tf.data.Dataset.from_tensor_slices(batches)
  return list(dataset.map(get_asc_insert_func(specs, is_training=is_training)))


@pytest.fixture(autouse=True)
def _run():
  init()


def test_full_table_fails_naming_table_and_inserts_nothing():
  table = lib.make_table("item", capacity=4)
  embedding.sparse_lookup(table, tf.constant([30, 10, 20, 10], tf.int64))
  before = lib.sorted_export(*table.key_index.export())

  with pytest.raises(tf.errors.ResourceExhaustedError, match=FULL):
    embedding.sparse_lookup(table, tf.constant([[10, 40], [50, 40]], tf.int64))
  assert table.key_index.size().numpy() == 3
  after = lib.sorted_export(*table.key_index.export())
  np.testing.assert_array_equal(after[0], before[0])
  np.testing.assert_array_equal(after[1], before[1])

  # A repeated new key counts once: the last row is still free for it.
  embedding.sparse_lookup(table, tf.constant([40, 10, 40, 40], tf.int64))
  assert table.key_index.size().numpy() == 4
  assert sorted(lib.index_dict(table).values()) == [0, 1, 2, 3]
  # Full, yet known keys are still looked up in training.
  embedding.sparse_lookup(table, tf.constant([20, 40], tf.int64))


def test_full_table_fails_the_dataset_batch():
  table = lib.make_table("item", capacity=4)
  spec = FeatureSpec("ids", table_name="item")
  insert = get_asc_insert_func([spec], is_training=True)
  dataset = tf.data.Dataset.from_tensor_slices({"ids": np.array([[1, 2, 3], [4, 5, 1]],
                                                                np.int64)}).map(insert)
  iterator = iter(dataset)
  next(iterator)
  with pytest.raises(tf.errors.ResourceExhaustedError, match=FULL):
    next(iterator)
  assert sorted(lib.index_dict(table)) == [1, 2, 3]


@pytest.mark.parametrize("default, expected", [
    (None, np.zeros(3, np.float32)),
    (1.5, np.full(3, 1.5, np.float32)),
    ([0.25, -1.0, 2.0], np.array([0.25, -1.0, 2.0], np.float32)),
    (np.array([7.0, 8.0, 9.0]), np.array([7.0, 8.0, 9.0], np.float32)),
], ids=["zeros", "scalar", "list", "array"])
def test_eval_reads_serving_default_for_unseen_keys(default, expected):
  table = lib.make_table("item", capacity=8)
  embedding.sparse_lookup(table, tf.constant([5, 6], tf.int64))
  index = lib.index_dict(table)
  rows = lib.initial_rows(8, 3)

  out = embedding.sparse_lookup(table, tf.constant([[6, 99], [99, 5], [-1, 6]], tf.int64),
                                is_train=False, serving_default_value=default)
  assert out.shape == [3, 2, 3]
  np.testing.assert_array_equal(out[0, 0], rows[index[6]])
  np.testing.assert_array_equal(out[1, 1], rows[index[5]])
  for unseen in (out[0, 1], out[1, 0], out[2, 0]):
    np.testing.assert_array_equal(unseen, expected)
  assert table.key_index.size().numpy() == 2
  assert sorted(lib.index_dict(table)) == [5, 6]


def test_eval_on_a_full_table_and_gradient_of_unseen_keys_is_zero():
  table = lib.make_table("item", capacity=2)
  embedding.sparse_lookup(table, tf.constant([5, 6], tf.int64))
  with tf.GradientTape() as tape:
    out = embedding.sparse_lookup(table, tf.constant([7, 8, 9, 5], tf.int64), is_train=False)
    loss = tf.reduce_sum(out)
  np.testing.assert_array_equal(out[:3], 0.0)
  dense = tf.convert_to_tensor(tape.gradient(loss, table.variable)).numpy()
  np.testing.assert_array_equal(dense[lib.index_dict(table)[5]], 1.0)
  np.testing.assert_array_equal(dense[lib.index_dict(table)[6]], 0.0)


@pytest.mark.parametrize("default, shape", [([1.0, 2.0], r"\(2,\)"),
                                            (np.zeros([1, 3]), r"\(1, 3\)"),
                                            (np.zeros([3, 3]), r"\(3, 3\)")])
def test_serving_default_of_wrong_shape_raises(default, shape):
  table = lib.make_table("item", capacity=8)
  with pytest.raises(
      ValueError, match=r"serving_default_value.* must be a scalar or of "
      rf"shape \[3\], got shape {shape}") as error:
    embedding.sparse_lookup(table, tf.constant([1], tf.int64), is_train=False,
                            serving_default_value=default)
  assert "'item" in str(error.value)  # Names the table.


def test_eval_insert_func_does_not_grow_the_table():
  table = lib.make_table("item", capacity=8)
  spec = FeatureSpec("ids", table_name="item")
  train_batch, = _insert_batches([spec], True, {"ids": np.array([[1, 2, 2]], np.int64)})
  eval_batch, = _insert_batches([spec], False, {"ids": np.array([[2, 3, 1, 3]], np.int64)})
  index = lib.index_dict(table)
  assert sorted(index) == [1, 2]

  out = embedding.sparse_lookup(table, spec, batch=eval_batch, is_train=False,
                                serving_default_value=-4.0)
  rows = lib.initial_rows(8, 3)
  np.testing.assert_array_equal(out.numpy(),
                                [rows[index[2]], [-4.0] * 3, rows[index[1]], [-4.0] * 3])
  assert lib.index_dict(table) == index
  assert train_batch["ids"].shape == [3]


def test_send_count_exceeded_fails_naming_table():
  table = lib.make_table("item", capacity=8)
  ids = tf.constant([[1, 2], [2, 3]], tf.int64)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"table 'item': more distinct ids in one batch than send_count=2"):
    embedding.sparse_lookup(table, ids, send_count=2)
  # Duplicates count once: 3 distinct ids fit send_count=3.
  assert embedding.sparse_lookup(table, ids, send_count=3).shape == [2, 2, 3]

  spec = FeatureSpec("f", table_name="item")
  batch, = _insert_batches([spec], True, {"f": np.array([[4, 5, 6, 7]], np.int64)})
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"table 'item'.*send_count=3"):
    embedding.sparse_lookup(table, spec, batch=batch, send_count=3)

  lookup = tf.function(lambda ids: embedding.sparse_lookup(table, ids, send_count=2))
  # Graph-mode asserts print the message with escaped quotes.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"table \\?'item\\?': more distinct ids .* send_count=2"):
    lookup(ids)


def test_static_mode_needs_send_count():
  terminate_config_initializer()
  init(use_dynamic=False)
  table = lib.make_table("item")
  with pytest.raises(
      ValueError, match=r"sparse_lookup\('item'\): init\(use_dynamic=False\) "
      r"needs `send_count`"):
    embedding.sparse_lookup(table, tf.constant([1], tf.int64))
  assert embedding.sparse_lookup(table, tf.constant([1], tf.int64), send_count=4).shape == [1, 3]
