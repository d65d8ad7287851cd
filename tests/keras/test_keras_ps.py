"""keras/ps.py in one process: per-worker data, tables from specs, shard checkpoints, snapshots.

The tables here are PSShardedTables with one local shard (strategy None), the
one-process mode of distributed/ps_table.py; the multi-process pipeline is
tested in tests/cluster/test_cluster_ps_training.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.keras import callbacks
from mxrec_pipeline.keras import ps
from mxrec_pipeline.keras import sharded
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.keras.layers import TableSpec
from mxrec_pipeline.optimizers import lazy_adam


def test_per_worker_dataset_gives_each_worker_every_wth_batch_repeated():
  creator = ps.per_worker_dataset(lambda: tf.data.Dataset.range(7))
  for worker, expected in ((0, [0, 2, 4, 6, 0, 2]), (1, [1, 3, 5, 1, 3, 5])):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker)
    assert list(creator(context).take(6).as_numpy_iterator()) == expected


def test_create_ps_tables_follow_the_specs_with_tiers_per_shard(tmp_path):
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  tables = ps.create_ps_tables(
      None,
      [TableSpec("ps_a", 4, 10),
       TableSpec("ps_b", 2, 6, key_dtype="string", initializer="zeros")], optimizer)
  assert sorted(tables) == ["ps_a", "ps_b"]
  assert tables["ps_a"].shard_variables[0].shape == (10, 4)
  assert tables["ps_b"].key_dtype == tf.string and tables["ps_b"].optimizer is optimizer
  (tiered,) = ps.create_ps_tables(None, [
      TableSpec("ps_c", 4, 10, host_vocabulary_size=20, ssd_vocabulary_size=5,
                ssd_data_path=(str(tmp_path),), cache_policy="lfu")
  ], optimizer).values()
  assert tiered.tiers.total_rows == 35 and tiered.tiered_shards[0].config.pin_until_finish
  assert tiered.tiered_shards[0].config.ssd_data_path == (str(tmp_path / "shard_0"),)
  assert (tmp_path / "shard_0").is_dir()
  with pytest.raises(ValueError, match="create_table\\('ps_d'\\): SSD directory '/nonexistent'"):
    ps.create_ps_tables(None, [
        TableSpec("ps_d", 4, 10, host_vocabulary_size=20, ssd_vocabulary_size=5,
                  ssd_data_path=("/nonexistent",))
    ], optimizer)


def _train_step(table, ids):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(table.lookup(ids))
  table.apply_gradients(tape.gradient(loss, table.shard_variables))


def _trained_table(name: str):
  (table,) = ps.create_ps_tables(None, [TableSpec(name, 3, 8, initializer="zeros")],
                                 lazy_adam.create_hash_optimizer(0.1)).values()
  ids = tf.constant([7, 3, 7, 11], tf.int64)
  _train_step(table, ids)
  return table, ids


def _sorted_shard(table) -> dict:
  shard = table.export_shard(0)
  order = np.argsort(shard["keys"])
  return {name: value[order] for name, value in shard.items()}


def test_shard_checkpoints_save_prune_and_restore_every_key_row_and_slot(tmp_path):
  table, ids = _trained_table("ps_ckpt")
  checkpoints = table_checkpoints.TableCheckpoints(tf.distribute.get_strategy(), str(tmp_path),
                                                   {"ps_ckpt": table}, [table.optimizer])
  for number in (1, 2):
    checkpoints.save(number)
  checkpoints.prune([2])
  assert sorted(p.name for p in tmp_path.iterdir()) == ["shards-2"]
  saved = _sorted_shard(table)

  _train_step(table, tf.constant([3, 20], tf.int64))  # A new key, other rows and slots.
  assert _sorted_shard(table)["keys"].tolist() == [3, 7, 11, 20]
  checkpoints.restore(2)
  restored = _sorted_shard(table)
  assert restored["keys"].tolist() == [3, 7, 11]
  for name in ("values", "m", "v"):
    np.testing.assert_allclose(restored[name], saved[name], err_msg=name)
  assert int(table.step.numpy()) == 1
  with pytest.raises(FileNotFoundError):
    checkpoints.restore(1)  # Pruned.
  del ids


def test_snapshots_of_ps_tables_hold_every_key_in_order_and_a_zero_default_row():
  table, ids = _trained_table("ps_snap")
  snapshot = sharded.snapshots({"ps_snap": table})["ps_snap"]
  rows = snapshot.rows.numpy()
  assert rows.shape == (4, 3)  # Keys 3, 7, 11 and the default row.
  np.testing.assert_array_equal(rows[-1], 0.0)
  positions = snapshot.positions.lookup(tf.constant([3, 7, 11, 99], tf.int64)).numpy()
  np.testing.assert_array_equal(positions, [0, 1, 2, 3])
  np.testing.assert_allclose(rows[positions[:3]],
                             table.lookup(tf.constant([3, 7, 11], tf.int64), training=False))
  del ids


def test_table_stats_logger_logs_ps_tables_over_every_shard(tmp_path):
  table, ids = _trained_table("ps_stats")
  logger = callbacks.TableStatsLogger(str(tmp_path), tables={"ps_stats": table})
  logger.on_epoch_end(0)
  assert logger.last["ps_stats"] == {
      "size": 3.0, "capacity": 8.0, "admissions": 3.0, "evictions": 0.0, "pending": 0.0
  }
  assert list((tmp_path / "tables").iterdir())  # The TensorBoard event file.
  del ids
