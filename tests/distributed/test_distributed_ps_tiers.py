"""Tiered PSShardedTable shards (distributed/ps_tiers.py), in one process (one shard on the CPU).

A shard whose device cache is far smaller than the keys it trains must train
exactly as an all-on-device shard with the same RowInitializer: every key's
row and lazy Adam slots to 1e-5 after steps that swap rows out and in. Steps
whose optimizer update has not run keep their rows pinned; the planner's
concurrency (several workers' steps in flight) is tested natively
(native/tests/device_cache_test.cc, PinUntilFinish*). On real local
clusters (ps_coordinator.py --tiers, 2 ps with 14 device rows each for 17 and
25 keys): 1 worker equals one all-on-device process; 2 asynchronous workers
keep every key on its owner and the loss falls.
"""

import numpy as np
import pytest
import tensorflow as tf

import distributed_testlib as lib
import ps_coordinator
import ps_testlib

from mxrec_pipeline.core import initializers
from mxrec_pipeline.core import tiers as tiers_lib
from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import ps_checkpoint
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.distributed import sharding
from mxrec_pipeline.optimizers import lazy_adam

DIM = 3
DEVICE_ROWS = 8
INIT = initializers.RowInitializer("truncated_normal", stddev=0.1, seed=11)


def _table(name, tiers=None, rows=DEVICE_ROWS, optimizer=None):
  return ps_table.PSShardedTable(None, name=name, dim=DIM, device_vocabulary_size=rows,
                                 optimizer=optimizer or lazy_adam.create_hash_optimizer(0.05),
                                 emb_initializer=INIT, tiers=tiers)


def _tiers(tmp_path=None, host=20, ssd=0, wait_seconds=60.0):
  paths = (str(tmp_path),) if ssd else ()
  return tiers_lib.TierConfig(DEVICE_ROWS, host, ssd, paths, "lru", wait_seconds)


def _batches(steps: int):
  """[steps] ([4, 2] int64 ids, [4] labels): 30 keys, so 8 device rows keep swapping."""
  rng = np.random.default_rng(5)
  ids = rng.integers(0, 30, size=[steps, 4, 2]).astype(np.int64)
  labels = rng.normal(size=[steps, 4]).astype(np.float32)
  return list(zip(ids, labels))


def _train(table, batches):
  w = tf.constant([0.5, -1.0, 2.0])

  @tf.function
  def step(ids, labels):
    with tf.GradientTape() as tape:
      emb = table.lookup(ids)
      loss = tf.reduce_mean((tf.reduce_sum(emb * w, axis=[1, 2]) - labels)**2)
    table.apply_gradients(tape.gradient(loss, table.shard_variables))
    return loss

  return [float(step(tf.constant(ids), tf.constant(labels))) for ids, labels in batches]


def _assert_same_rows(got, want):
  assert sorted(got) == sorted(want) and set(got) == {"keys", "values", "m", "v"}
  order_got, order_want = np.argsort(got["keys"]), np.argsort(want["keys"])
  np.testing.assert_array_equal(got["keys"][order_got], want["keys"][order_want])
  for part in ("values", "m", "v"):
    np.testing.assert_allclose(got[part][order_got], want[part][order_want], atol=1e-5)


def test_tiered_shard_trains_as_an_all_on_device_shard(tmp_path):
  batches = _batches(14)
  flat = _table("ps_flat", rows=64)
  tiered = _table("ps_tiered", _tiers(tmp_path, host=4, ssd=40))
  losses_flat, losses_tiered = _train(flat, batches), _train(tiered, batches)
  np.testing.assert_allclose(losses_tiered, losses_flat, rtol=1e-5)
  _assert_same_rows(tiered.export_shard(0), flat.export_shard(0))
  stats = {k: int(v) for k, v in tiered.tiered_shards[0].storage.stats().items()}
  assert stats["swap_outs"] > 10 and stats["swap_ins"] > 10, stats
  assert stats["ssd_rows_used"] > 0, stats  # host tier of 4 rows spilled to SSD
  # Evaluation reads each key where it lives, moving nothing; absent keys read the default.
  ids = tf.constant([[0, 29, 31]], tf.int64)
  np.testing.assert_allclose(tiered.lookup(ids, training=False, default_value=-1.0),
                             flat.lookup(ids, training=False, default_value=-1.0), atol=1e-6)
  after = {k: int(v) for k, v in tiered.tiered_shards[0].storage.stats().items()}
  assert after["swap_outs"] == stats["swap_outs"]


def test_pinned_rows_of_unfinished_steps_are_never_evicted():
  # Plans in flight count as lost after 2 x wait_seconds: far more than this test takes.
  table = _table("ps_pinned", _tiers(host=40, wait_seconds=3.0))
  first = table.lookup(tf.constant([1, 2, 3, 4], tf.int64))  # a step in flight
  table.lookup(tf.constant([5, 6, 7, 8], tf.int64))  # another: the 8 rows are all pinned
  with pytest.raises(tf.errors.ResourceExhaustedError, match="ps_pinned.*training steps in flight"):
    table.lookup(tf.constant([9], tf.int64))
  # The pinned rows still hold their keys' rows (nothing was half-planned).
  np.testing.assert_allclose(table.lookup(tf.constant([1, 2, 3, 4], tf.int64), training=False),
                             first, atol=0)
  table.apply_gradients([None])  # both steps finish: their rows may leave
  np.testing.assert_allclose(table.lookup(tf.constant([9], tf.int64)),
                             INIT.rows(tf.constant([8], tf.int64), DIM), atol=1e-7)
  table.apply_gradients([None])


def test_tiered_checkpoint_restores_every_tier_onto_tiered_and_flat_tables(tmp_path):
  optimizer = lazy_adam.create_hash_optimizer(0.05)
  tiered = _table("tiers_ckpt", _tiers(host=30), optimizer=optimizer)
  _train(tiered, _batches(10))
  saved = tiered.export_shard(0)
  assert saved["keys"].size > DEVICE_ROWS  # keys in the host tier too
  ps_checkpoint.save(str(tmp_path), tiered)
  # Into a fresh tiered table (rows now in other tiers) and into an all-on-device one.
  again = _table("tiers_ckpt2", _tiers(host=30))
  flat = _table("tiers_ckpt3", rows=64)
  for table, name in ((again, "tiers_ckpt2"), (flat, "tiers_ckpt3")):
    (tmp_path / name).symlink_to(tmp_path / "tiers_ckpt")
    assert ps_checkpoint.restore(str(tmp_path), table) == [saved["keys"].size]
    _assert_same_rows(table.export_shard(0), saved)
    assert int(table.step) == 10
  # Both keep training identically from there.
  more = _batches(16)[10:]
  np.testing.assert_allclose(_train(again, more), _train(flat, more), rtol=1e-5)
  _assert_same_rows(again.export_shard(0), flat.export_shard(0))
  # A shard too small for the checkpoint's keys is refused, naming the table.
  small = _table("tiers_ckpt4", tiers_lib.TierConfig(DEVICE_ROWS, 2))
  (tmp_path / "tiers_ckpt4").symlink_to(tmp_path / "tiers_ckpt")
  with pytest.raises(ValueError, match="tiers_ckpt4.*more than its 10 rows"):
    checkpoint.restore_table(str(tmp_path), small, [small.optimizer])


def test_tiered_table_arguments_are_checked():
  with pytest.raises(ValueError,
                     match="ps_bad.*device_vocabulary_size=8 must equal device_vocabulary_size=9"):
    _table("ps_bad", _tiers(), rows=9)
  with pytest.raises(ValueError, match="ps_bad.*float32"):
    ps_table.PSShardedTable(None, name="ps_bad", dim=DIM, device_vocabulary_size=DEVICE_ROWS,
                            optimizer=lazy_adam.create_hash_optimizer(), emb_initializer=INIT,
                            value_dtype=tf.float64, tiers=_tiers())


def test_eviction_drops_keys_from_every_tier_and_they_restart_from_initial_rows():
  table = ps_table.PSShardedTable(None, name="ps_evict", dim=DIM,
                                  device_vocabulary_size=DEVICE_ROWS,
                                  optimizer=lazy_adam.create_hash_optimizer(0.05),
                                  emb_initializer=INIT, eviction_threshold_s=10,
                                  tiers=_tiers(host=20))

  def step(ids, timestamp):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(table.lookup(tf.constant(ids, tf.int64), timestamp=timestamp))
    table.apply_gradients(tape.gradient(loss, table.shard_variables))

  step(list(range(8)), 0)  # keys 0-7 fill the device cache (global rows 0-7)
  step(list(range(8, 16)), 100)  # keys 8-15 swap them out to the host tier
  freed = table.evict()[0].numpy()
  np.testing.assert_array_equal(freed, np.arange(8))  # idle since t=0: evicted from the host
  assert sorted(table.export_shard(0)["keys"]) == list(range(8, 16))
  # Key 20 gets the freed global row 0: its initial row, not key 0's trained one.
  np.testing.assert_allclose(table.lookup(tf.constant([20], tf.int64), timestamp=100),
                             INIT.rows(tf.constant([0], tf.int64), DIM), atol=1e-7)
  table.apply_gradients([None])


CLUSTER_TIERS = ["--tiers", "14,32"]  # Per shard: 14 device rows, 32 host rows.


def _rows_by_key(out, part: str) -> dict:
  got = {}
  for i in range(int(out["num_shards"])):
    keys = out[f"shard{i}_keys"]
    assert (sharding.owner_numpy(keys, int(out["num_shards"])) == i).all()  # on its owner
    got.update(zip(keys.tolist(), out[f"shard{i}_{part}"]))
  return got


@pytest.mark.cluster
@pytest.mark.slow
def test_one_worker_two_tiered_ps_equal_one_all_on_device_process(tmp_path):
  steps = 2 * ps_coordinator.CYCLE
  ps_coordinator.main(str(tmp_path / "local.npz"), steps, local=True)
  want = dict(np.load(tmp_path / "local.npz"))
  got = ps_testlib.train(num_workers=1, num_ps=2, steps=steps, tmp=tmp_path / "cluster",
                         extra=CLUSTER_TIERS)
  assert int(got["num_shards"]) == 2
  np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)
  for part in ("values", "m", "v"):
    got_rows, want_rows = _rows_by_key(got, part), _rows_by_key(want, part)
    assert sorted(got_rows) == sorted(want_rows)
    for key, row in want_rows.items():
      np.testing.assert_allclose(got_rows[key], row, atol=1e-5, err_msg=f"{part} of {key}")
  # 17 and 25 keys on shards of 14 device rows: the host tiers hold the rest.
  assert max(got[f"shard{i}_keys"].size for i in range(2)) > 14


@pytest.mark.cluster
@pytest.mark.slow
def test_two_workers_two_tiered_ps_async_keys_on_owners_loss_falls(tmp_path):
  steps = 4 * ps_coordinator.CYCLE
  out = ps_testlib.train(num_workers=2, num_ps=2, steps=steps, tmp=tmp_path, extra=CLUSTER_TIERS)
  want_keys = set(np.concatenate([lib.batch(s)[0].ravel() for s in range(ps_coordinator.CYCLE)]))
  assert set(_rows_by_key(out, "values")) == want_keys
  assert int(out["step"]) == steps
  losses = out["losses"].reshape(-1, ps_coordinator.CYCLE).mean(axis=1)
  assert losses[-1] < 0.7 * losses[0], losses
