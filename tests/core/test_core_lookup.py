"""Lookups equal tf.gather on an equivalent dense variable; FeatureSpec path; errors."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.util.initialize import init

import sparse_testlib as lib

DIM = 3
# Raw ids of each key dtype; position i is dense row i of the reference variable.
VOCAB = {
    # -1 and the extremes: no key value is reserved as an "empty slot" marker.
    tf.int64: np.array([-7, 0, -1, 2**63 - 1, -(2**63), 2**40], np.int64),
    tf.int32: np.array([-7, 0, -1, 2**31 - 1, -(2**31), 12], np.int32),
    tf.string: np.array([b"a", b"bb", b"", b"item:9", "é".encode(), b"z" * 40], object),
}
# Dense positions of the ids of each rank: repeats within a batch, one id unused.
POSITIONS = {
    1: np.array([3, 0, 3, 1]),
    2: np.array([[1, 2, 2], [0, 4, 1]]),
    3: np.array([[[4, 4], [0, 2]], [[1, 3], [4, 0]], [[2, 2], [2, 2]]]),
}


@pytest.fixture(autouse=True)
def _run():
  init()


def _keys(key_dtype, raw):
  if key_dtype == tf.string:
    return lib.hash_strings(list(raw))
  return np.asarray(raw, np.int64)


def _ids(key_dtype, positions):
  return tf.constant(VOCAB[key_dtype][positions], key_dtype)


def _dense_reference(num, seed=5):
  return tf.Variable(np.random.RandomState(seed).normal(size=[num, DIM]).astype(np.float32))


def _copy_dense_rows_into_table(table, key_dtype, dense):
  """Sets the row of every inserted vocabulary id to its dense row."""
  index = lib.index_dict(table)
  keys = _keys(key_dtype, VOCAB[key_dtype])
  for position, key in enumerate(keys.tolist()):
    if key in index:
      table.variable.scatter_update(tf.IndexedSlices(dense[position][None], [index[key]]))


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64, tf.string], ids=lambda d: d.name)
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_lookup_equals_dense_gather(key_dtype, rank):
  table = lib.make_table(dim=DIM, capacity=8, key_dtype=key_dtype)
  positions = POSITIONS[rank]
  ids = _ids(key_dtype, positions)

  first = embedding.sparse_lookup(table, ids)
  assert first.shape == ids.shape + [DIM]
  assert first.dtype == tf.float32

  # Every distinct id got its own row in [0, capacity); the first lookup read them.
  index = lib.index_dict(table)
  used = np.unique(positions)
  assert sorted(index) == sorted(_keys(key_dtype, VOCAB[key_dtype][used]).tolist())
  assert len(set(index.values())) == len(used)
  assert all(0 <= row < 8 for row in index.values())
  keys_of_ids = _keys(key_dtype, VOCAB[key_dtype][positions].reshape(-1))
  rows_of_ids = np.array([index[k] for k in keys_of_ids.tolist()]).reshape(positions.shape)
  np.testing.assert_array_equal(first.numpy(), lib.initial_rows(8, DIM)[rows_of_ids])

  dense = _dense_reference(len(VOCAB[key_dtype]))
  _copy_dense_rows_into_table(table, key_dtype, dense)
  np.testing.assert_array_equal(
      embedding.sparse_lookup(table, ids).numpy(),
      tf.gather(dense, positions).numpy())
  assert table.key_index.size().numpy() == len(used)  # The second lookup added nothing.


def test_string_keys_are_stock_tf_fingerprints():
  table = lib.make_table(key_dtype=tf.string)
  embedding.sparse_lookup(table, tf.constant(["x", "y", "x"]))
  keys, _ = lib.sorted_export(*table.key_index.export())
  expected = tf.strings.to_hash_bucket_fast(["x", "y"], 2**63 - 1).numpy()
  np.testing.assert_array_equal(keys, np.sort(expected))


def test_lookup_inside_tf_function_equals_eager():
  table = lib.make_table(capacity=8)
  lookup = tf.function(lambda ids: embedding.sparse_lookup(table, ids))
  ids = tf.constant([[5, 6], [6, 9]], tf.int64)
  traced = lookup(ids)
  np.testing.assert_array_equal(traced.numpy(), embedding.sparse_lookup(table, ids).numpy())
  # Dynamic shapes: one trace serves batches of other sizes (unknown-rank-safe shape fns).
  lookup = tf.function(lambda ids: embedding.sparse_lookup(table, ids),
                       input_signature=[tf.TensorSpec(None, tf.int64)])
  assert lookup(tf.constant([5, 7, 9], tf.int64)).shape == [3, 3]
  assert lookup(tf.constant([[[5]]], tf.int64)).shape == [1, 1, 1, 3]
  assert table.key_index.size().numpy() == 4


def test_empty_ids():
  table = lib.make_table()
  assert embedding.sparse_lookup(table, tf.zeros([0], tf.int64)).shape == [0, 3]
  assert embedding.sparse_lookup(table, tf.zeros([2, 0], tf.int64)).shape == [2, 0, 3]
  assert table.key_index.size().numpy() == 0


def test_is_grad_false_stops_gradients():
  table = lib.make_table()
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(
        embedding.sparse_lookup(table, tf.constant([1, 2], tf.int64), is_grad=False))
  assert tape.gradient(loss, table.variable) is None


def _feature_dataset():
  """Three batches: two features of table 'item' (sharing ids) and one of 'user'."""
  item_a = np.array([[[10, 11], [12, 10]], [[13, 10], [11, 11]], [[14, 15], [10, 16]]], np.int64)
  item_b = np.array([[12, 20], [20, 13], [16, 21]], np.int64)
  user = np.array([[7, 7], [8, 9], [7, 10]], np.int32)
  labels = np.array([[1.0], [0.0], [1.0]], np.float32)
  return tf.data.Dataset.from_tensor_slices(
      ({"item_a": item_a, "item_b": item_b, "user_ids": user, "dense": labels}, labels))


def test_feature_spec_path_equals_tensor_path():
  item = lib.make_table("item", capacity=16, seed=1)
  user = lib.make_table("user", dim=2, capacity=4, key_dtype=tf.int32, seed=2)
  specs = [
      FeatureSpec("item_a", table_name="item"),
      FeatureSpec("item_b", table_name="item"),
      FeatureSpec("user", index_key="user_ids")
  ]
  dataset = _feature_dataset().map(get_asc_insert_func(specs, is_training=True)).prefetch(2)

  seen_item, seen_user = set(), set()
  for features, labels in dataset:
    # Batch contents pass through; the insertion adds rows and restore indices.
    assert labels.shape == [1]
    assert features["dense"].shape == [1]
    rows = features[fs.unique_rows_key("item")].numpy()
    assert len(set(rows.tolist())) == len(rows)
    assert features[fs.restore_key("item_a")].shape == features["item_a"].shape
    assert features[fs.restore_key("item_a")].dtype == tf.int32
    seen_item |= set(features["item_a"].numpy().ravel()) | set(features["item_b"].numpy().ravel())
    seen_user |= set(features["user_ids"].numpy().ravel())
    # Both item features' distinct ids, deduplicated together.
    assert len(rows) == len(
        np.unique(
            np.concatenate([features["item_a"].numpy().ravel(),
                            features["item_b"].numpy().ravel()])))

    for spec, table in ((specs[0], item), (specs[1], item), (specs[2], user)):
      from_spec = embedding.sparse_lookup(table, spec, batch=features)
      from_tensor = embedding.sparse_lookup(table, features[spec.index_key])
      assert from_spec.shape == features[spec.index_key].shape + [table.dim]
      np.testing.assert_array_equal(from_spec.numpy(), from_tensor.numpy())

  # The tensor lookups found every id already inserted by the dataset.
  assert item.key_index.size().numpy() == len(seen_item)
  assert user.key_index.size().numpy() == len(seen_user)


def test_wrong_key_dtype_names_table_expected_and_got():
  table = lib.make_table("item")
  with pytest.raises(
      ValueError, match=r"sparse_lookup\('item'\): ids must be int64 \(the "
      r"table's key_dtype\), got int32"):
    embedding.sparse_lookup(table, tf.constant([1], tf.int32))
  with pytest.raises(ValueError, match=r"ids must be int64 .*got string"):
    embedding.sparse_lookup(table, tf.constant(["1"]))

  spec = FeatureSpec("f", table_name="item")
  int32_ids = tf.data.Dataset.from_tensors({"f": tf.constant([1, 2], tf.int32)})
  with pytest.raises(
      ValueError, match=r"FeatureSpec 'f': ids are int32, but table 'item' has "
      r"key_dtype int64"):
    int32_ids.map(get_asc_insert_func([spec], is_training=True))  # Refused before insertion.
  batch = next(
      iter(
          tf.data.Dataset.from_tensors({"f": tf.constant([1, 2], tf.int64)
                                       }).map(get_asc_insert_func([spec], is_training=True))))
  batch["f"] = tf.constant([1, 2], tf.int32)  # A batch changed after insertion.
  with pytest.raises(
      ValueError, match=r"sparse_lookup\('item'\): FeatureSpec 'f' ids must be "
      r"int64 \(the table's key_dtype\), got int32"):
    embedding.sparse_lookup(table, spec, batch=batch)


def test_insert_func_rejects_bad_batches():
  insert = get_asc_insert_func([FeatureSpec("f")], is_training=True)
  with pytest.raises(ValueError, match=r"FeatureSpec 'f': ids must be int32, int64 or string, "
                     r"got float32"):
    tf.data.Dataset.from_tensors({"f": tf.constant([1.0])}).map(insert)
  with pytest.raises(ValueError, match=r"FeatureSpec 'f': batch has no key 'f'; keys are \['g'\]"):
    tf.data.Dataset.from_tensors({"g": tf.constant([1], tf.int64)}).map(insert)
  with pytest.raises(ValueError, match=r"duplicate FeatureSpec names \['f'\]"):
    get_asc_insert_func([FeatureSpec("f"), FeatureSpec("f", table_name="t2")], is_training=True)
  with pytest.raises(ValueError, match=r"at least one FeatureSpec"):
    get_asc_insert_func([], is_training=True)


def test_batch_not_mapped_with_insert_func_raises():
  table = lib.make_table("item")
  spec = FeatureSpec("f", table_name="item")
  raw = {"f": tf.constant([1, 2], tf.int64)}
  with pytest.raises(
      ValueError, match=r"the batch has no insertion results of FeatureSpec 'f'; "
      r"map the dataset with get_asc_insert_func"):
    embedding.sparse_lookup(table, spec, batch=raw)
  with pytest.raises(ValueError, match=r"FeatureSpec 'f' needs `batch`"):
    embedding.sparse_lookup(table, spec)
  with pytest.raises(ValueError, match=r"FeatureSpec 'g' belongs to table 'other'"):
    embedding.sparse_lookup(table, FeatureSpec("g", table_name="other"), batch=raw)
  with pytest.raises(ValueError, match=r"`hashtable` must come from create_table"):
    embedding.sparse_lookup("item", raw["f"])
  assert table.key_index.size().numpy() == 0
