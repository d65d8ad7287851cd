"""SortedKeyTable: lookups against a dict, bad keys, SavedModel round trip, pb size vs keys."""

import os

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core.sorted_key_table import SortedKeyTable


def _reference(keys, values, default, queries):
  table = dict(zip(keys.tolist(), (values if values is not None else range(len(keys)))))
  return np.array([table.get(q, default) for q in queries.ravel().tolist()],
                  np.int64).reshape(queries.shape)


@pytest.mark.parametrize("with_values", [False, True])
def test_lookup_matches_a_dict(with_values):
  rng = np.random.default_rng(5)
  keys = np.unique(rng.integers(-2**62, 2**62, 500, dtype=np.int64))
  values = rng.integers(0, 1000, keys.size, dtype=np.int64) if with_values else None
  queries = np.concatenate([
      rng.choice(keys, 300),
      rng.integers(-2**62, 2**62, 300, dtype=np.int64),
      [np.iinfo(np.int64).min, np.iinfo(np.int64).max, keys[0], keys[-1]]
  ]).reshape(-1, 2)  # Any shape: [302, 2].
  table = SortedKeyTable(keys, values, default_value=-7, name="t")
  got = table.lookup(tf.constant(queries)).numpy()
  np.testing.assert_array_equal(got, _reference(keys, values, -7, queries))
  assert table.size().numpy() == keys.size


def test_empty_table_and_empty_queries_give_defaults():
  table = SortedKeyTable(np.zeros([0], np.int64), default_value=0, name="empty")
  np.testing.assert_array_equal(table.lookup(tf.constant([1, 2], tf.int64)).numpy(), [0, 0])
  full = SortedKeyTable([3, 4], default_value=2)
  assert full.lookup(tf.zeros([0], tf.int64)).shape == [0]
  # Inside a tf.function too, as serving runs it.
  np.testing.assert_array_equal(
      tf.function(full.lookup)(tf.constant([[4], [5]], tf.int64)).numpy(), [[1], [2]])


@pytest.mark.parametrize("keys, match", [
    ([1, 3, 3], r"'bad'.*key 2 \(3\) follows 3"),
    ([5, 2], r"key 1 \(2\) follows 5"),
    ([[1, 2]], "1-D"),
])
def test_refuses_unsorted_duplicate_or_non_vector_keys(keys, match):
  with pytest.raises(ValueError, match=match):
    SortedKeyTable(keys, name="bad")


def test_refuses_values_of_another_length():
  with pytest.raises(ValueError, match="'v': 1 values for 2 keys"):
    SortedKeyTable([1, 2], [5], name="v")


def _save(tmp_path, num_keys: int) -> str:
  module = tf.Module()
  module.table = SortedKeyTable(np.arange(num_keys, dtype=np.int64) * 3, default_value=num_keys)
  lookup = tf.function(module.table.lookup, input_signature=[tf.TensorSpec([None], tf.int64)])
  path = str(tmp_path / f"keys_{num_keys}")
  tf.saved_model.save(module, path, signatures={"lookup": lookup})
  return path


def test_saved_model_pb_size_does_not_grow_with_keys(tmp_path):
  """Keys live in the SavedModel's variables: 10k and 1M keys give the same graph."""
  small, large = _save(tmp_path, 10_000), _save(tmp_path, 1_000_000)
  small_pb = os.path.getsize(os.path.join(small, "saved_model.pb"))
  large_pb = os.path.getsize(os.path.join(large, "saved_model.pb"))
  assert abs(large_pb - small_pb) < 64, (small_pb, large_pb)  # Only the digits of shapes differ.
  assert large_pb < 100_000
  loaded = tf.saved_model.load(large)
  got = loaded.signatures["lookup"](tf.constant([0, 3, 4, 2_999_997, 3_000_000], tf.int64))
  np.testing.assert_array_equal(
      list(got.values())[0].numpy(), [0, 1, 1_000_000, 999_999, 1_000_000])
