"""Restore reads only what a shard owns (distributed/checkpoint.read_owned), in one process.

Two shards of a table are saved as a 2-worker job would save them (core
tables marked as shard i of 2, each holding the keys it owns, with lazy Adam
slots and key state). Restoring onto 2 shards reads each shard's own
bundle alone; onto 3 shards or 1 it streams every bundle in chunks; either way
the restored keys, rows, slots and key state equal the whole checkpoint
filtered by owner (read_all_shards), whatever the chunk size.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import shard_files
from mxrec_pipeline.distributed import sharding
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util import initialize

DIM, ROWS = 3, 64
KEYS = np.arange(1, 41, dtype=np.int64) * 7919
PER_KEY = ("keys", "values", "last_seen", "slot/LazyAdam/m", "slot/LazyAdam/v")


def _shard(name: str, shard_id: int, num_shards: int, optimizer):
  table = embedding.create_table(tf.int64, DIM, name, tf.keras.initializers.Constant(0.25),
                                 device_vocabulary_size=ROWS).as_shard(shard_id, num_shards)
  optimizer.build([table.variable])
  return table


@pytest.fixture(name="saved")
def _saved(tmp_path):
  """A 2-shard checkpoint of table "item": trained rows, slots and step counts."""
  initialize.init()
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  tables = [_shard(f"item_src{shard_id}", shard_id, 2, optimizer) for shard_id in range(2)]
  for shard_id, table in enumerate(tables):  # One step each: both save step count 2.
    owned = KEYS[sharding.owner_numpy(KEYS, 2) == shard_id]
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(embedding.sparse_lookup(table, tf.constant(owned))))
    optimizer.apply_gradients(zip(tape.gradient(loss, [table.variable]), [table.variable]))
  for shard_id, table in enumerate(tables):
    checkpoint.save_shard(str(tmp_path / "src"), table, [optimizer])
    (tmp_path / "src" / f"item_src{shard_id}").rename(tmp_path / f"part{shard_id}")
  (tmp_path / "ckpt" / "item").mkdir(parents=True)
  for shard_id in range(2):
    for path in (tmp_path / f"part{shard_id}").iterdir():
      path.rename(tmp_path / "ckpt" / "item" / path.name)
  return str(tmp_path / "ckpt"), optimizer


def _expected(directory, optimizer, shard_id, num_shards):
  whole = checkpoint.read_all_shards(directory, "item", [optimizer])
  keep = sharding.owner_numpy(whole["keys"], num_shards) == shard_id
  return {n: v[keep] for n, v in whole.items() if n in PER_KEY}


@pytest.mark.parametrize("num_shards", [1, 2, 3])
@pytest.mark.parametrize("chunk_rows", [1, 4, 1 << 16])
def test_owned_state_equals_the_whole_checkpoint_filtered_by_owner(saved, num_shards, chunk_rows):
  directory, optimizer = saved
  for shard_id in range(num_shards):
    got = checkpoint.read_owned(directory, "item", shard_id, num_shards, [optimizer],
                                chunk_rows=chunk_rows)
    want = _expected(directory, optimizer, shard_id, num_shards)
    order_got, order_want = np.argsort(got["keys"]), np.argsort(want["keys"])
    assert got["keys"].size == want["keys"].size > 0
    for name in PER_KEY:
      np.testing.assert_array_equal(got[name][order_got], want[name][order_want], err_msg=name)
    assert int(got["iterations/LazyAdam"]) == 2


def test_the_same_shard_count_reads_only_its_own_bundle(saved, tmp_path):
  directory, optimizer = saved
  want = _expected(directory, optimizer, 1, 2)
  for path in (tmp_path / "ckpt" / "item").glob("shard-0-of-2.data-*"):
    path.unlink()  # Shard 0's rows are gone: shard 1 restores anyway, shard 0 names its file.
  table = _shard("item", 1, 2, optimizer)
  assert checkpoint.restore_shard(directory, table, [optimizer]) == want["keys"].size
  keys, rows = table.gather_rows()
  np.testing.assert_array_equal(keys, np.sort(want["keys"]))
  np.testing.assert_array_equal(rows, want["values"][np.argsort(want["keys"])])
  with pytest.raises(FileNotFoundError, match="table 'item': cannot read .*shard-0-of-2"):
    checkpoint.read_owned(directory, "item", 0, 2, [optimizer])
  # Another count streams every bundle, so shard 0's loss is named there too.
  with pytest.raises(FileNotFoundError, match="table 'item': cannot read .*shard-0-of-2"):
    checkpoint.read_owned(directory, "item", 0, 3, [optimizer])


def test_a_bundle_holding_keys_its_shard_does_not_own_is_refused(saved, tmp_path):
  directory, optimizer = saved
  item = tmp_path / "ckpt" / "item"
  for path in item.glob("shard-1-of-2.*"):  # Shard 0's bundle in shard 1's place.
    path.unlink()
  for path in item.glob("shard-0-of-2.*"):
    (item / path.name.replace("shard-0", "shard-1")).symlink_to(path)
  with pytest.raises(ValueError, match="shard-1-of-2 holds keys that shard 1 of 2 does not own"):
    checkpoint.read_owned(directory, "item", 1, 2, [optimizer])


@pytest.mark.parametrize("chunk_rows", [1, 3, 1 << 16])
def test_restore_streams_rows_into_the_shard_whatever_the_chunk(saved, chunk_rows):
  directory, optimizer = saved
  want = _expected(directory, optimizer, 2, 3)
  order = np.argsort(want["keys"])
  table = _shard("item", 2, 3, optimizer)
  table.variable.assign(tf.fill(table.variable.shape, 9.0))  # Rows past the keys are reset.
  count = checkpoint.restore_shard(directory, table, [optimizer], chunk_rows=chunk_rows)
  assert count == want["keys"].size
  keys, rows = table.gather_rows()
  np.testing.assert_array_equal(keys, want["keys"][order])
  np.testing.assert_array_equal(rows, want["values"][order])
  np.testing.assert_array_equal(table.variable.numpy()[count:], 0.25)
  slots = table.slot_variables(optimizer)
  for name in ("m", "v"):
    np.testing.assert_array_equal(slots[name].numpy()[:count], want[f"slot/LazyAdam/{name}"][order])
    np.testing.assert_array_equal(slots[name].numpy()[count:], 0.0)
  assert int(optimizer.iterations.numpy()) == 2


def test_a_shard_saved_in_slices_reads_as_the_shard_saved_whole(saved, tmp_path):
  # Per-key tensors saved in slices of 3 keys: a reader of a chunk reads only its slices.
  directory, optimizer = saved
  table = _shard("item", 0, 1, optimizer)
  checkpoint.restore_shard(directory, table, [optimizer])
  for name, chunk_rows in (("whole", shard_files.CHUNK_ROWS), ("sliced", 3)):
    checkpoint.save_shard(str(tmp_path / name), table, [optimizer], chunk_rows=chunk_rows)
  whole = checkpoint.read_all_shards(str(tmp_path / "whole"), "item", [optimizer])
  sliced = checkpoint.read_all_shards(str(tmp_path / "sliced"), "item", [optimizer])
  assert whole["keys"].size == KEYS.size and sorted(whole) == sorted(sliced)
  for name, value in whole.items():
    np.testing.assert_array_equal(sliced[name], value, err_msg=name)
  owned = sharding.owner_numpy(whole["keys"], 2) == 1
  want = dict(zip(whole["keys"][owned].tolist(), whole["values"][owned]))
  for chunk_rows in (2, 5):  # Chunks across slice boundaries, onto shard 1 of 2.
    initialize.terminate_config_initializer()
    initialize.init()
    restored_optimizer = lazy_adam.create_hash_optimizer(0.1)
    restored = _shard("item", 1, 2, restored_optimizer)
    checkpoint.restore_shard(str(tmp_path / "sliced"), restored, [restored_optimizer],
                             chunk_rows=chunk_rows)
    keys, rows = restored.gather_rows()
    assert sorted(keys.tolist()) == sorted(want)
    for key, row in zip(keys.tolist(), rows):
      np.testing.assert_array_equal(row, want[key])


def test_a_bundle_saves_int32_rows_and_no_last_seen_when_no_key_has_one(saved):
  # No admission or eviction: 12 bytes of state per key (int64 key, int32 row), not 24.
  directory, _ = saved
  prefix = checkpoint.saved_shards(directory, "item")[0]
  dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
  assert dtypes["keys"] == tf.int64 and dtypes["rows"] == tf.int32 and "last_seen" not in dtypes
  read = shard_files.read_tensors(prefix, "item", ["keys", "rows", "last_seen"])
  assert read["rows"].dtype == read["last_seen"].dtype == np.int64
  np.testing.assert_array_equal(read["last_seen"], np.full(read["keys"].shape, -1))


def test_key_state_past_int32_rows_or_with_last_seen_times_is_saved_whole(tmp_path):
  rows = tf.constant([0, 2**31, 1], tf.int64)
  last_seen = tf.constant([5, -1, 7], tf.int64)
  entries = shard_files.key_state_entries(rows, last_seen)
  assert entries["rows"].dtype == tf.int64 and sorted(entries) == ["last_seen", "rows"]
  prefix = checkpoint.write_bundle(shard_files.shard_prefix(str(tmp_path), "t", 0, 1),
                                   [("keys", "", tf.constant([1, 2, 3], tf.int64))] +
                                   [(n, "", v) for n, v in entries.items()])
  read = shard_files.read_tensors(prefix, "t", ["keys", "rows", "last_seen"])
  np.testing.assert_array_equal(read["rows"], rows.numpy())
  np.testing.assert_array_equal(read["last_seen"], last_seen.numpy())
  # Rows that fit are narrowed whatever the times.
  assert shard_files.key_state_entries(tf.constant([3], tf.int64),
                                       tf.constant([-1], tf.int64))["rows"].dtype == tf.int32
