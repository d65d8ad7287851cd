"""Tiered tables (device cache + host + SSD) train exactly as all-on-device tables.

The reference is a flat table of the same RowInitializer, so a key starts from
the same row in both; every step's loss and every final embedding (and optimizer
slot) must agree to float tolerance.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import initializers
from mxrec_pipeline.core import tiers
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.core.embedding import create_table, sparse_lookup
from mxrec_pipeline.optimizers import adagrad, lazy_adam
from mxrec_pipeline.util.initialize import init, terminate_config_initializer

DIM = 4
NUM_IDS = 1000
INIT = initializers.RowInitializer("truncated_normal", stddev=0.1, seed=7)


def _batches(steps, seed=0, batch=4, width=4):
  """Zipf-like id batches over NUM_IDS ids."""
  rng = np.random.default_rng(seed)
  weights = 1.0 / np.arange(1, NUM_IDS + 1)**1.05
  weights /= weights.sum()
  return [
      rng.choice(NUM_IDS, size=(batch, width), p=weights).astype(np.int64) * 7 + 3
      for _ in range(steps)
  ]


def _loss(emb, ids):
  target = tf.cast(ids % 5, tf.float32) / 5.0
  return tf.reduce_sum(tf.square(tf.reduce_sum(emb, -1) - target))


def _flat_table(optimizer, name="t"):
  return create_table(tf.int64, DIM, name, INIT, device_vocabulary_size=NUM_IDS)


def _tiered_table(optimizer, name="t", device=NUM_IDS // 10, host=NUM_IDS, ssd=0, ssd_path=(),
                  policy="lru"):
  return create_table(tf.int64, DIM, name, INIT, device_vocabulary_size=device,
                      host_vocabulary_size=host, ssd_vocabulary_size=ssd, ssd_data_path=ssd_path,
                      optimizer_list=[optimizer], cache_policy=policy)


def _train_eager(table, optimizer, batches):
  losses = []
  for ids in batches:
    with tf.GradientTape() as tape:
      emb = sparse_lookup(table, tf.constant(ids))
      loss = _loss(emb, ids)
    optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])
    losses.append(float(loss))
  return losses


def _embeddings(table, keys):
  return sparse_lookup(table, tf.constant(keys), is_train=False).numpy()


def _first_adam_move(lr, t, beta1=0.9, beta2=0.999):
  """|change| of a row's first lazy Adam update at optimizer step t (epsilon ~ 0)."""
  return lr * np.sqrt(1 - beta2**t) / (1 - beta1**t) * (1 - beta1) / np.sqrt(1 - beta2)


def _all_keys():
  return np.arange(NUM_IDS, dtype=np.int64) * 7 + 3


def _run(make, make_optimizer, batches):
  init()
  optimizer = make_optimizer()
  table = make(optimizer)
  losses = _train_eager(table, optimizer, batches)
  emb = _embeddings(table, _all_keys())
  stats = ({k: int(v) for k, v in table.tiers.stats().items()} if table.tiers is not None else None)
  terminate_config_initializer()
  return losses, emb, stats


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_tiered_equals_flat_eager_lazy_adam(policy):
  batches = _batches(40)

  def adam():
    return lazy_adam.create_hash_optimizer(0.05)

  flat_losses, flat_emb, _ = _run(_flat_table, adam, batches)
  tier_losses, tier_emb, stats = _run(lambda o: _tiered_table(o, policy=policy), adam, batches)
  np.testing.assert_allclose(tier_losses, flat_losses, rtol=1e-5)
  np.testing.assert_allclose(tier_emb, flat_emb, rtol=1e-5, atol=1e-6)
  # The cache really was too small: rows went to the host and came back.
  assert stats["swap_outs"] > 0 and stats["swap_ins"] > stats["swap_outs"]
  assert stats["host_rows_used"] > 0
  assert stats["occupied"] <= NUM_IDS // 10
  assert stats["hits"] > 0 and stats["misses"] > 0


def test_tiered_with_ssd_equals_flat(tmp_path):
  dirs = [tmp_path / "ssd0", tmp_path / "ssd1"]
  for d in dirs:
    d.mkdir()
  batches = _batches(30, seed=1)

  def adagrad_opt():
    return adagrad.create_hash_optimizer(0.1)

  flat_losses, flat_emb, _ = _run(_flat_table, adagrad_opt, batches)
  tier_losses, tier_emb, stats = _run(
      lambda o: _tiered_table(o, device=40, host=20, ssd=NUM_IDS, ssd_path=[str(d) for d in dirs]),
      adagrad_opt, batches)
  np.testing.assert_allclose(tier_losses, flat_losses, rtol=1e-5)
  np.testing.assert_allclose(tier_emb, flat_emb, rtol=1e-5, atol=1e-6)
  assert stats["ssd_rows_used"] > 0 and stats["host_rows_used"] <= 20
  # The SSD files are unlinked at creation: nothing is left behind.
  assert not any(os.listdir(d) for d in dirs)


def _dataset(batches, is_training):
  spec = FeatureSpec("ids", table_name="t")
  dataset = tf.data.Dataset.from_tensor_slices({"ids": np.stack(batches)})
  return spec, dataset.map(get_asc_insert_func([spec], is_training=is_training)).prefetch(3)


def _train_feature_spec(table, optimizer, batches):
  spec, dataset = _dataset(batches, is_training=True)

  @tf.function
  def step(batch):
    with tf.GradientTape() as tape:
      emb = sparse_lookup(table, spec, batch=batch)
      loss = _loss(emb, batch["ids"])
    optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])
    return loss

  return [float(step(batch)) for batch in dataset]


@pytest.mark.slow
def test_key_process_plans_ahead_with_prefetch():
  """FeatureSpec insertion plans in tf.data (prefetch 3) while tf.function steps train."""
  batches = _batches(40, seed=2)
  results = []
  for tiered in (False, True):
    init()
    optimizer = lazy_adam.create_hash_optimizer(0.05)
    table = _tiered_table(optimizer) if tiered else _flat_table(optimizer)
    losses = _train_feature_spec(table, optimizer, batches)
    spec, eval_data = _dataset(batches[:3], is_training=False)
    evaluated = [sparse_lookup(table, spec, batch=b, is_train=False).numpy() for b in eval_data]
    results.append((losses, _embeddings(table, _all_keys()), evaluated))
    terminate_config_initializer()
  (flat_losses, flat_emb, flat_eval), (tier_losses, tier_emb, tier_eval) = results
  np.testing.assert_allclose(tier_losses, flat_losses, rtol=1e-5)
  np.testing.assert_allclose(tier_emb, flat_emb, rtol=1e-5, atol=1e-6)
  for a, b in zip(tier_eval, flat_eval):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_checkpoint_holds_every_tier_and_restoring_reproduces_training(tmp_path):
  batches = _batches(30, seed=3)
  first, second = batches[:15], batches[15:]

  def build():
    init()
    optimizer = lazy_adam.create_hash_optimizer(0.05)
    table = _tiered_table(optimizer, device=40, host=40, ssd=NUM_IDS, ssd_path=[str(tmp_path)])
    return table, optimizer, tf.train.Checkpoint(table=table, optimizer=optimizer)

  table, optimizer, ckpt = build()
  _train_eager(table, optimizer, first)
  stats = {k: int(v) for k, v in table.tiers.stats().items()}
  assert stats["ssd_rows_used"] > 0 and stats["host_rows_used"] > 0  # all three tiers in use
  path = ckpt.write(str(tmp_path / "ckpt"))
  expected = _train_eager(table, optimizer, second)
  expected_emb = _embeddings(table, _all_keys())
  terminate_config_initializer()

  table, optimizer, ckpt = build()
  ckpt.read(path).assert_consumed()
  restored = {k: int(v) for k, v in table.tiers.stats().items()}
  assert restored["host_rows_used"] + restored["ssd_rows_used"] == (stats["host_rows_used"] +
                                                                    stats["ssd_rows_used"])
  np.testing.assert_allclose(_train_eager(table, optimizer, second), expected, rtol=1e-5)
  np.testing.assert_allclose(_embeddings(table, _all_keys()), expected_emb, rtol=1e-5, atol=1e-6)


def test_tf1_session_with_saver_matches_flat(tmp_path):
  batches = _batches(12, seed=4)
  results = []
  for tiered in (False, True):
    with tf.Graph().as_default():
      init()
      optimizer = lazy_adam.create_hash_optimizer(0.05)
      table = _tiered_table(optimizer) if tiered else _flat_table(optimizer)
      spec, dataset = _dataset(batches, is_training=True)
      batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
      emb = sparse_lookup(table, spec, batch=batch)
      loss = _loss(emb, batch["ids"])
      grad = tf.gradients(loss, table.variable)[0]
      train_op = optimizer.apply_gradients([(grad, table.variable)])
      saver = tf.compat.v1.train.Saver()
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        losses = [sess.run([loss, train_op])[0] for _ in batches]
        saver.save(sess, str(tmp_path / f"model{int(tiered)}"))
      results.append(losses)
      terminate_config_initializer()
  np.testing.assert_allclose(results[1], results[0], rtol=1e-5)
  assert tf.train.list_variables(str(tmp_path / "model1"))  # the tiers were saved too
  names = [n for n, _ in tf.train.list_variables(str(tmp_path / "model1"))]
  assert "t/tiers-store_values" in names and "t/tiers-slots" in names


def test_eviction_drops_keys_from_every_tier_and_they_restart_fresh():
  init()
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  table = _tiered_table(optimizer, device=4, host=20)
  spec = FeatureSpec("ids", table_name="t", access_threshold=1, eviction_threshold=10)
  ts = FeatureSpec("ts", is_timestamp=True)
  data = [({"ids": np.array(ids, np.int64), "ts": np.array([t], np.int64)})
          for ids, t in (([1, 2], 0), ([3, 4], 50), ([5, 6], 100), ([1, 6], 101))]
  dataset = tf.data.Dataset.from_generator(
      lambda: iter(data),
      output_signature={"ids": tf.TensorSpec([None], tf.int64), "ts": tf.TensorSpec([1], tf.int64)})
  options = tf.data.Options()
  options.experimental_optimization.inject_prefetch = False  # insert batch by batch
  dataset = dataset.map(get_asc_insert_func([spec, ts], is_training=True)).with_options(options)
  batches = iter(dataset)

  def train(batch):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(sparse_lookup(table, spec, batch=batch))
    optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])

  for _ in range(3):
    train(next(batches))  # keys 1 and 2 went to the host to make room for 5 and 6
  assert int(table.tiers.stats()["host_rows_used"]) == 2
  freed = admission.evict(table, 10, [optimizer]).numpy()
  assert sorted(freed.tolist()) == [0, 1, 2, 3]  # keys 1-4, idle for 50 s or more
  train(next(batches))  # key 1 comes back as a new key
  stats = {k: int(v) for k, v in table.tiers.stats().items()}
  assert stats["host_rows_used"] == 0  # the evicted host rows were erased
  keys, rows = table.key_index.export()
  row_of = dict(zip(keys.numpy().tolist(), rows.numpy().tolist()))
  assert sorted(row_of) == [1, 5, 6]
  emb = _embeddings(table, np.array([1, 2], np.int64))
  np.testing.assert_array_equal(emb[1], np.zeros(DIM))  # evicted, never seen again: default
  # Key 1 trained one step (the optimizer's 4th) from its fresh initial row,
  # not from the row the evicted key 1 had.
  fresh = INIT.rows(tf.constant([row_of[1]], tf.int64), DIM).numpy()[0]
  np.testing.assert_allclose(emb[0], fresh - _first_adam_move(0.1, 4), rtol=1e-4, atol=1e-5)


def test_stats_count_hits_and_tiers():
  init()
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  table = _tiered_table(optimizer, device=4, host=10)
  _train_eager(table, optimizer,
               [np.array([[1, 2]]),
                np.array([[1, 2]]),
                np.array([[3, 4]]),
                np.array([[5, 6]])])
  stats = {k: int(v) for k, v in table.tiers.stats().items()}
  # The last batch's rows stay pinned until the next plan is applied: 5 and 6
  # push out 1 and 2 (least recently used), not 3 and 4.
  assert stats["hits"] == 2 and stats["misses"] == 6
  assert stats["occupied"] == 4 and stats["host_rows_used"] == 2
  assert stats["swap_outs"] == 2 and stats["swap_ins"] == 6
  assert stats["host_bytes"] > 0 and stats["ssd_bytes"] == 0


# -- bad input -------------------------------------------------------------------


def test_bad_tier_arguments_name_the_table_and_path(tmp_path):
  init()
  opt = lazy_adam.create_hash_optimizer(0.1)
  with pytest.raises(ValueError, match=r"'t'.*needs host_vocabulary_size > 0"):
    create_table(tf.int64, DIM, "t", INIT, 10, ssd_vocabulary_size=5)
  missing = str(tmp_path / "nope")
  with pytest.raises(ValueError, match=rf"'t'.*SSD directory '{missing}' does not exist"):
    create_table(tf.int64, DIM, "t", INIT, 10, host_vocabulary_size=5, ssd_vocabulary_size=5,
                 ssd_data_path=[missing], optimizer_list=[opt])
  a_file = tmp_path / "file"
  a_file.write_text("x")
  with pytest.raises(ValueError, match="not a directory"):
    create_table(tf.int64, DIM, "t", INIT, 10, host_vocabulary_size=5, ssd_vocabulary_size=5,
                 ssd_data_path=str(a_file), optimizer_list=[opt])
  with pytest.raises(ValueError, match="cache_policy"):
    create_table(tf.int64, DIM, "t", INIT, 10, host_vocabulary_size=5, cache_policy="fifo")
  with pytest.raises(ValueError, match="float32"):
    create_table(tf.int64, DIM, "t", INIT, 10, host_vocabulary_size=5, value_dtype=tf.float64)
  with pytest.raises(ValueError, match=r"'t'.*per-row distribution.*GlorotUniform"):
    create_table(tf.int64, DIM, "t", tf.keras.initializers.GlorotUniform(), 10,
                 host_vocabulary_size=5)
  with pytest.raises(ValueError, match="host_vocabulary_size"):
    create_table(tf.int64, DIM, "t", INIT, 10, host_vocabulary_size=-1)


def test_full_tiers_stop_training_naming_the_table():
  init()
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  table = _tiered_table(optimizer, device=2, host=2)
  _train_eager(table, optimizer, [np.array([[k]]) for k in (1, 2, 3, 4)])
  with pytest.raises(tf.errors.ResourceExhaustedError, match="'t'"):
    _train_eager(table, optimizer, [np.array([[5]])])  # 4 rows in all: the table is full
  # Nothing was lost: the four keys still read their trained rows.
  trained = _embeddings(table, np.array([1, 2, 3, 4], np.int64))
  initial = INIT.rows(tf.constant([0, 1, 2, 3], tf.int64), DIM).numpy()
  # One lazy Adam step each (key k at step k) from its initial value.
  moves = [_first_adam_move(0.1, t) for t in (1, 2, 3, 4)]
  np.testing.assert_allclose(np.abs(trained - initial), np.repeat([moves], DIM, 0).T, rtol=1e-3)


def test_batch_larger_than_the_device_cache_fails_naming_the_table():
  init()
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  table = _tiered_table(optimizer, device=2, host=10)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"'t'.*device_vocabulary_size=2"):
    _train_eager(table, optimizer, [np.array([[1, 2, 3]])])


def test_optimizer_must_be_known_before_the_first_step():
  init()
  table = _tiered_table(lazy_adam.create_hash_optimizer(0.1), device=4, host=4)
  other = adagrad.create_hash_optimizer(0.1)
  _train_eager(table, table.tiers._optimizers[0], [np.array([[1, 2]])])  # pylint: disable=protected-access
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(sparse_lookup(table, tf.constant([1, 2], tf.int64)))
  with pytest.raises(ValueError, match=r"'t'.*optimizer_list"):
    other.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])


def test_modify_graph_is_refused_for_tiered_tables():
  with tf.Graph().as_default():
    init()
    table = _tiered_table(lazy_adam.create_hash_optimizer(0.1), device=4, host=4)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    with pytest.raises(NotImplementedError, match="'t'.*modify_graph"):
      sparse_lookup(table, ids, modify_graph=True)


def test_tier_config_totals():
  config = tiers.TierConfig(10, 20, 30)
  assert config.total_rows == 60
