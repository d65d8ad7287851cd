"""The native key index through its TF ops: import/export, errors, concurrency."""

import threading

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import key_index
from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.util.initialize import init

import sparse_testlib as lib


@pytest.fixture(autouse=True)
def _run():
  init()


def _rows_of(index, keys):
  """Rows of keys as the eval path reads them (-1 when absent); never inserts."""
  rows, restore, _ = index.insert(tf.constant(keys, tf.int64), training=False)
  return tf.gather(rows, restore).numpy()


def test_insert_outputs_and_lowest_free_rows_first():
  table = lib.make_table(capacity=6)
  rows, restore, unique_keys = table.key_index.insert(tf.constant([[30, 10], [30, 20]], tf.int64),
                                                      training=True)
  np.testing.assert_array_equal(unique_keys, [30, 10, 20])  # First-occurrence order.
  np.testing.assert_array_equal(rows, [0, 1, 2])
  np.testing.assert_array_equal(restore, [[0, 1], [0, 2]])
  assert restore.dtype == tf.int32
  rows, _, _ = table.key_index.insert(tf.constant([20, 40], tf.int64), training=True)
  np.testing.assert_array_equal(rows, [2, 3])  # Known keys keep their rows.
  assert table.key_index.size().numpy() == 4
  assert table.key_index.memory_bytes().numpy() >= 16 * 2 * 6


def _reference_insert(known: dict, keys: np.ndarray):
  """NumPy/dict reference of one training insert: (rows, restore, unique keys)."""
  unique, first, restore = np.unique(keys, return_index=True, return_inverse=True)
  order = np.argsort(first, kind="stable")  # First-occurrence order.
  position = np.empty_like(order)
  position[order] = np.arange(order.size)
  unique = unique[order]
  for key in unique:
    known.setdefault(int(key), len(known))
  rows = np.array([known[int(key)] for key in unique], np.int64)
  return rows, position[restore.reshape(-1)], unique


def test_insert_matches_reference_across_batches_of_very_different_sizes():
  # The op sizes its deduplication by the previous batch's distinct count
  # (a hint only): a batch with far more, then far fewer, then many repeated
  # keys than the one before, and batches past the index's 2-MB (in-place
  # growth) size, all match a dict reference.
  table = lib.make_table(capacity=400_000)
  rng = np.random.default_rng(3)
  known = {}
  for size, space in ((10, 10), (200_000, 2**62), (5, 3), (50_000, 1000), (120_000, 2**62)):
    keys = rng.integers(-space, space, size=size, dtype=np.int64)
    rows, restore, unique_keys = table.key_index.insert(tf.constant(keys), training=True)
    want_rows, want_restore, want_unique = _reference_insert(known, keys)
    np.testing.assert_array_equal(unique_keys, want_unique)
    np.testing.assert_array_equal(restore, want_restore)
    np.testing.assert_array_equal(rows, want_rows)
  assert table.key_index.size().numpy() == len(known)
  assert table.key_index.memory_bytes().numpy() <= 24 * len(known)
  keys, rows = lib.sorted_export(*table.key_index.export())
  want_keys = np.array(sorted(known), np.int64)
  np.testing.assert_array_equal(keys, want_keys)
  np.testing.assert_array_equal(rows, [known[int(k)] for k in want_keys])


def test_import_replaces_content_and_holes_are_reused_lowest_first():
  table = lib.make_table(capacity=6)
  table.key_index.insert(tf.constant([1, 2, 3], tf.int64), training=True)
  table.key_index.import_(tf.constant([20, 10], tf.int64), tf.constant([3, 0], tf.int64))
  keys, rows = lib.sorted_export(*table.key_index.export())
  np.testing.assert_array_equal(keys, [10, 20])
  np.testing.assert_array_equal(rows, [0, 3])
  np.testing.assert_array_equal(_rows_of(table.key_index, [1, 10, 20]), [-1, 0, 3])
  rows, _, _ = table.key_index.insert(tf.constant([30, 40, 50], tf.int64), training=True)
  np.testing.assert_array_equal(rows, [1, 2, 4])


@pytest.mark.parametrize("keys, rows, message", [
    ([1, 2, 1], [0, 1, 2], r"table 't': key 1 is imported twice"),
    ([1, 2], [4, 4], r"table 't': row 4 is imported twice"),
    ([1, 2], [0, 6], r"table 't': imported row 6 of key 2 is outside \[0, 6\)"),
    ([1], [-1], r"imported row -1 of key 1 is outside \[0, 6\)"),
    (list(range(7)), list(range(7)), r"cannot import 7 keys into device_vocabulary_size=6"),
])
def test_bad_import_is_rejected_and_changes_nothing(keys, rows, message):
  table = lib.make_table(capacity=6)
  table.key_index.insert(tf.constant([5, 6], tf.int64), training=True)
  with pytest.raises(tf.errors.InvalidArgumentError, match=message):
    table.key_index.import_(tf.constant(keys, tf.int64), tf.constant(rows, tf.int64))
  assert lib.index_dict(table) == {5: 0, 6: 1}


def test_import_of_mismatched_lengths_is_rejected():
  table = lib.make_table(capacity=6)
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                     match=r"keys and rows must be vectors of one length|Dimensions must be equal"):
    table.key_index.import_(tf.constant([1, 2], tf.int64), tf.constant([0], tf.int64))


def test_insert_into_a_missing_index_names_the_table():
  handle = key_index.handle("no_such_container", "nope")
  with pytest.raises(tf.errors.FailedPreconditionError,
                     match=r"the key index of table 'nope' does not exist"):
    key_index.insert(handle, tf.constant([1], tf.int64), training=True)


def test_index_exists_with_another_capacity():
  table = lib.make_table(capacity=6)
  with pytest.raises(
      tf.errors.InvalidArgumentError,
      match=r"table 't' already has a key index with device_vocabulary_size=6, "
      r"not 9"):
    key_index.KeyIndex(table.key_index._container, "t", 9)  # pylint: disable=protected-access


def test_threads_inserting_overlapping_keys_give_each_key_one_row():
  num_threads, chunks = 8, 5
  table = lib.make_table(capacity=2000)
  barrier = threading.Barrier(num_threads * 2)
  seen = [dict() for _ in range(num_threads)]
  read = [[] for _ in range(num_threads)]
  errors = []

  def writer(t):
    try:
      keys = np.random.RandomState(t).permutation(np.arange(t * 100, t * 100 + 400))
      barrier.wait()
      for chunk in np.array_split(keys, chunks):
        rows, _, unique_keys = table.key_index.insert(tf.constant(chunk), training=True)
        seen[t].update(zip(unique_keys.numpy().tolist(), rows.numpy().tolist()))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  def reader(t):
    try:
      keys = np.arange(t * 100, t * 100 + 400)
      barrier.wait()
      for _ in range(chunks):
        read[t].append((keys, _rows_of(table.key_index, keys)))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [
      threading.Thread(target=f, args=(t,)) for t in range(num_threads) for f in (writer, reader)
  ]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors, errors

  num_keys = 100 * (num_threads - 1) + 400
  keys, rows = lib.sorted_export(*table.key_index.export())
  np.testing.assert_array_equal(keys, np.arange(num_keys))
  np.testing.assert_array_equal(np.sort(rows), np.arange(num_keys))  # Distinct, no holes.
  final = dict(zip(keys.tolist(), rows.tolist()))
  for t in range(num_threads):
    assert seen[t] == {k: final[k] for k in seen[t]}  # Every thread saw the final rows.
    assert len(seen[t]) == 400
    for keys_read, rows_read in read[t]:  # Readers saw -1 or the final row, nothing else.
      final_rows = np.array([final[k] for k in keys_read.tolist()])
      assert np.all((rows_read == -1) | (rows_read == final_rows))


def test_parallel_dataset_insertion_gives_each_key_one_row():
  table = lib.make_table("item", capacity=500)
  batches = np.stack([np.random.RandomState(b).randint(0, 300, size=[4, 8]) for b in range(24)])
  dataset = tf.data.Dataset.from_tensor_slices({"item": batches.astype(np.int64)}).map(
      get_asc_insert_func([FeatureSpec("item")], is_training=True), num_parallel_calls=4,
      deterministic=False)
  results = list(dataset)
  final = lib.index_dict(table)
  assert sorted(final) == np.unique(batches).tolist()
  assert sorted(final.values()) == list(range(len(final)))
  for batch in results:
    rows = tf.gather(batch[fs.unique_rows_key("item")], batch[fs.restore_key("item")]).numpy()
    expected = np.vectorize(final.get)(batch["item"].numpy())
    np.testing.assert_array_equal(rows, expected)


def _changed(changes) -> dict[int, int]:
  return dict(zip(changes["keys"].numpy().tolist(), changes["rows"].numpy().tolist()))


def test_export_changes_reports_trained_rows_and_evicted_keys_since_the_last_clear():
  """Delta checkpoints' change tracking, through the op (C++: ChangeTrackingTest)."""
  table = lib.make_table(capacity=8)
  index = table.key_index
  index.insert(tf.constant([30, 10], tf.int64), training=True)
  first = index.export_changes(clear=True)  # Tracking was off: every key; now on.
  assert _changed(first) == {30: 0, 10: 1}
  assert first["deleted_keys"].shape == [0] and first["counters"].shape == [3]
  assert _changed(index.export_changes(clear=True)) == {}
  index.insert(tf.constant([10, 20], tf.int64), training=True)
  _rows_of(index, [30, 40])  # Evaluation lookups change nothing.
  assert _changed(index.export_changes(clear=False)) == {10: 1, 20: 2}
  assert _changed(index.export_changes(clear=True)) == {10: 1, 20: 2}
  assert _changed(index.export_changes(clear=True)) == {}
  # A restore is the new base: nothing changed relative to it.
  index.import_(tf.constant([5, 6], tf.int64), tf.constant([0, 3], tf.int64))
  assert _changed(index.export_changes(clear=False)) == {}
