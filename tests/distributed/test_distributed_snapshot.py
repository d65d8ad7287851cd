"""Serving snapshots built one shard at a time (distributed/export.py), in one process.

Two shards of a table, as a 2-worker job holds them (core tables marked shard
i of 2, each holding the keys it owns): shard 1 is staged and read back by
the exporter, which reads its own shard 0 in place; or both are read from a
checkpoint's shard files: the snapshot equals a dense
reference (every key's row, in key order, a zero default row) whatever the
chunk size, and equals a one-process table's compact export of the same rows.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import export
from mxrec_pipeline.distributed import sharding
from mxrec_pipeline.util import initialize

DIM, ROWS = 3, 32
KEYS = np.arange(1, 26, dtype=np.int64) * 104729


def _row(key) -> np.ndarray:
  return np.array([key % 97, key % 89, -(key % 83)], np.float32)


@pytest.fixture(name="shards")
def _shards():
  """Shards 0 and 1 of 2 of table "snap", each holding its owned keys with rows _row(key)."""
  initialize.init()
  tables = []
  for shard_id in range(2):
    table = embedding.create_table(tf.int64, DIM, f"snap{shard_id}", tf.keras.initializers.Zeros(),
                                   device_vocabulary_size=ROWS).as_shard(shard_id, 2)
    owned = KEYS[sharding.owner_numpy(KEYS, 2) == shard_id]
    rows = table.key_index.insert(tf.constant(owned), training=True)[0]
    table.variable.scatter_update(
        tf.IndexedSlices(tf.constant(np.stack([_row(k) for k in owned])), rows))
    tables.append(table)
  yield tables
  initialize.terminate_config_initializer()


def _move_files(source, target):
  target.mkdir(parents=True, exist_ok=True)
  for path in source.iterdir():
    path.rename(target / path.name)


def _served(snapshot, keys) -> np.ndarray:
  return tf.gather(snapshot.rows, snapshot.positions.lookup(tf.constant(keys, tf.int64))).numpy()


def _check(snapshot):
  order = np.sort(KEYS)
  rows = snapshot.rows.numpy()
  np.testing.assert_array_equal(rows[:-1], np.stack([_row(k) for k in order]))  # Key order.
  np.testing.assert_array_equal(rows[-1], 0.0)
  unseen = [5, 104729 * 1000]
  np.testing.assert_array_equal(_served(snapshot, [*KEYS, *unseen]),
                                np.stack([*(_row(k) for k in KEYS), *np.zeros([2, DIM])]))


@pytest.mark.parametrize("chunk_rows", [1, 4, 1 << 16])
def test_staged_shards_build_the_whole_table_in_the_exporter_only(shards, tmp_path, chunk_rows):
  staging = str(tmp_path / "staging")
  barriers = []
  # Worker 1 stages its shard and gets nothing; the chief (shard 0) reads its own in place.
  assert export.table_snapshot(shards[1], staging, lambda: barriers.append(1),
                               chunk_rows=chunk_rows) is None
  # One file per chunk: the worker held one chunk's rows at a time.
  staged_keys = int(shards[1].key_index.size())
  assert len(list((tmp_path / "staging" /
                   "snap1").glob("shard-1-of-2-part-*.index"))) == (-(-staged_keys // chunk_rows))
  _move_files(tmp_path / "staging" / "snap1", tmp_path / "staging" / "snap0")  # One table's name.
  snapshot = export.table_snapshot(shards[0], staging, lambda: barriers.append(0),
                                   chunk_rows=chunk_rows)
  assert barriers == [1, 0]
  _check(snapshot)
  assert not list((tmp_path / "staging").glob("*/shard-0-of-2*"))  # The chief staged nothing.
  export.remove_staging(staging)
  assert not (tmp_path / "staging").exists()


def test_files_snapshot_equals_a_one_process_compact_export(shards, tmp_path):
  for table in shards:  # A checkpoint's shards, under one table name.
    checkpoint.save_shard(str(tmp_path / "src"), table)
    _move_files(tmp_path / "src" / table.table_name, tmp_path / "ckpt" / "snap")
  snapshot = export.files_snapshot(str(tmp_path / "ckpt"), "snap", chunk_rows=3)
  _check(snapshot)
  one = embedding.create_table(tf.int64, DIM, "snap_one", tf.keras.initializers.Zeros(),
                               device_vocabulary_size=ROWS)
  rows = one.key_index.insert(tf.constant(KEYS), training=True)[0]
  one.variable.scatter_update(tf.IndexedSlices(tf.constant(np.stack([_row(k) for k in KEYS])),
                                               rows))
  positions, compact = one.key_index.to_compact_table(lambda r: tf.gather(
      tf.concat([one.variable, tf.zeros([1, DIM])], 0), tf.where(r < 0, ROWS, r)))
  np.testing.assert_array_equal(snapshot.rows.numpy(), compact.numpy())
  np.testing.assert_array_equal(snapshot.positions.keys.numpy(), positions.keys.numpy())


def test_a_sharded_table_without_staging_is_refused(shards):
  with pytest.raises(ValueError, match="table 'snap1': sharded over workers, its snapshot needs"):
    export.table_snapshot(shards[1])


def test_a_key_in_two_shards_is_named():
  part = export.ShardRows(np.array([4, 9], np.int64), lambda a, b: np.zeros([b - a, 2], np.float32),
                          2, np.float32)
  with pytest.raises(ValueError, match=r"'dup_positions'.*\(9\) follows 9"):
    export.build_snapshot(
        "dup", [part, export.ShardRows(np.array([9], np.int64), part.read, 2, np.float32)])


def test_shards_of_different_dims_are_refused():
  parts = [
      export.ShardRows(np.array([k], np.int64), lambda a, b, d=d: np.zeros([b - a, d]), d,
                       np.float32) for k, d in ((1, 2), (2, 3))
  ]
  with pytest.raises(ValueError, match=r"table 'mixed': its shards' rows differ in \(dim, dtype\)"):
    export.build_snapshot("mixed", parts)
