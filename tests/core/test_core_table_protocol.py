"""core/table_protocol.py: every placement's table is a Table of TableShards, read by one code.

A single-process table (create_table), a worker-sharded table (ShardedTable,
one shard here: no cluster) and a ps-sharded table (PSShardedTable, one shard
on this process's CPU) are trained on the same keys; checkpoints, eviction,
statistics and the serving rows then go through the protocol alone, and a
checkpoint written by one placement restores into another.
"""

from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import placement
from mxrec_pipeline.core import table_protocol
from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.distributed import sharded_table
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.optimizers import adagrad
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init

ROWS, DIM = 8, 3
KEYS = tf.constant([7, 3, 7, 11], tf.int64)
CONSTANT = tf.keras.initializers.Constant(0.5)


def _core(name, optimizer, **kwargs):
  table = embedding.create_table(tf.int64, DIM, name, CONSTANT, device_vocabulary_size=ROWS,
                                 **kwargs)
  optimizer.build([table.variable])
  return table


def _ps(name, optimizer, **kwargs):
  return ps_table.PSShardedTable(None, name=name, dim=DIM, device_vocabulary_size=ROWS,
                                 optimizer=optimizer, emb_initializer=CONSTANT, **kwargs)


def _train_ps(table, ids=KEYS):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(table.lookup(ids)))
  table.apply_gradients(tape.gradient(loss, table.shard_variables))


def _train_core(table, optimizer, ids=KEYS):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(embedding.sparse_lookup(table, ids)))
  optimizer.apply_gradients(zip(tape.gradient(loss, [table.variable]), [table.variable]))


def test_every_placement_is_a_table_of_shards():
  init()
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  core = _core("p_core", optimizer)
  worker = sharded_table.ShardedTable(tf.distribute.get_strategy(), name="p_worker", dim=DIM,
                                      device_vocabulary_size=ROWS, emb_initializer=CONSTANT)
  ps = _ps("p_ps", optimizer)
  for table in (core, worker, ps):
    assert isinstance(table, table_protocol.Table), table.table_name
    assert table.device_vocabulary_size == ROWS and table.num_shards == 1
    (shard,) = table.local_shards()
    assert isinstance(shard, table_protocol.TableShard)
    assert (shard.shard_id, shard.num_shards, shard.dim) == (0, 1, DIM)
    assert set(shard.slot_variables(optimizer, create=True)) == {"m", "v"}
  assert worker.local_shards()[0] is worker.shard and core.local_shards() == [core]


def test_the_same_training_gives_the_same_stats_rows_and_checkpoint_in_two_placements(tmp_path):
  init()
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  core = _core("same_core", optimizer)
  ps = _ps("same_ps", lazy_adam.create_hash_optimizer(0.1))
  _train_core(core, optimizer)
  _train_ps(ps)
  expected_stats = {"size": 3, "capacity": ROWS, "admissions": 3, "evictions": 0, "pending": 0}
  assert core.stats() == ps.stats() == expected_stats
  core_keys, core_rows = core.gather_rows()
  ps_keys, ps_rows = ps.gather_rows()
  np.testing.assert_array_equal(core_keys, [3, 7, 11])
  np.testing.assert_array_equal(ps_keys, core_keys)
  np.testing.assert_allclose(ps_rows, core_rows, rtol=1e-6)

  # The ps table's checkpoint restores into a single-process table, slots and step count too.
  checkpoint.save_table(str(tmp_path), ps, [ps.optimizer])
  (tmp_path / "moved").symlink_to(tmp_path / "same_ps")
  restored_optimizer = lazy_adam.create_hash_optimizer(0.1)
  moved = _core("moved", restored_optimizer)
  assert checkpoint.restore_table(str(tmp_path), moved, [restored_optimizer]) == [3]
  keys, rows = moved.gather_rows()
  np.testing.assert_array_equal(keys, core_keys)
  np.testing.assert_allclose(rows, core_rows, rtol=1e-6)
  assert int(restored_optimizer.iterations.numpy()) == 1


def test_evict_gives_freed_rows_per_local_shard_and_resets_slots():
  init()
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  ps = _ps("evict_ps", optimizer, eviction_threshold_s=5)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(ps.lookup(KEYS, timestamp=tf.constant(100, tf.int64)))
  ps.apply_gradients(tape.gradient(loss, ps.shard_variables))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(ps.lookup(tf.constant([3], tf.int64), timestamp=tf.constant(110)))
  ps.apply_gradients(tape.gradient(loss, ps.shard_variables))
  (freed,) = ps.evict()
  assert len(freed.numpy()) == 2  # Keys 7 and 11, idle for 10 s > 5 s.
  slots = ps.shards[0].slot_variables(optimizer)
  np.testing.assert_array_equal(tf.gather(slots["m"], freed).numpy(), 0.0)
  np.testing.assert_array_equal(tf.gather(ps.shard_variables[0], freed).numpy(), 0.5)
  assert ps.stats()["evictions"] == 2

  core = _core("evict_core", optimizer)
  with pytest.raises(ValueError, match="evict_core.*eviction_threshold_s"):
    core.evict()


def test_a_ps_shard_refuses_another_optimizers_slots():
  ps = _ps("slots_ps", lazy_adam.create_hash_optimizer(0.1))
  with pytest.raises(KeyError, match="slots_ps.*LazyAdam.*Adagrad"):
    ps.shards[0].slot_variables(adagrad.create_hash_optimizer(0.1))


def test_table_checkpoints_save_prune_restore_any_placement(tmp_path):
  init()
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  core = _core("tc_core", optimizer)
  _train_core(core, optimizer)
  checkpoints = table_checkpoints.TableCheckpoints(tf.distribute.get_strategy(), str(tmp_path),
                                                   {"tc_core": core}, [optimizer])
  checkpoints.save(1)
  _train_core(core, optimizer, tf.constant([20], tf.int64))
  checkpoints.save(2)
  checkpoints.prune([1])
  assert sorted(p.name for p in tmp_path.iterdir()) == ["shards-1"]
  checkpoints.restore(1)
  np.testing.assert_array_equal(core.gather_rows()[0], [3, 7, 11])
  assert int(optimizer.iterations.numpy()) == 1
  with pytest.raises(FileNotFoundError, match="tc_core"):
    checkpoints.restore(2)


@pytest.mark.parametrize("strategy_class, mirrored, expected", [
    (tf.distribute.MultiWorkerMirroredStrategy, False, placement.GradientRoute.LOCAL),
    (tf.distribute.MultiWorkerMirroredStrategy, True, placement.GradientRoute.ALL_REDUCE),
    (tf.distribute.MirroredStrategy, False, placement.GradientRoute.CONCAT),
    (tf.distribute.MirroredStrategy, True, placement.GradientRoute.CONCAT),
    (tf.distribute.OneDeviceStrategy, True, placement.GradientRoute.ALL_REDUCE),
])
def test_gradient_route_follows_the_strategy_and_the_variables(strategy_class, mirrored, expected):
  strategy = mock.create_autospec(strategy_class, instance=True)
  assert placement.gradient_route(strategy, mirrored) is expected
