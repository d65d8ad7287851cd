"""mx_rec's API on parameter-server tables (distributed/ps_mxrec.py) against one process's mx_rec.

ps_api_coordinator.py writes ps_coordinator's toy model with mx_rec's calls
(init, create_table, sparse_lookup, the hash optimizer's apply_gradients) and
runs it through ClusterCoordinator.schedule on 1 worker + 2 ps (or as one
local shard). With one worker the steps run in order, so the losses, the
dense bias and every key's row, m and v must equal the single-process mx_rec
loop (core/embedding.create_table + sparse_lookup + lazy Adam) to 1e-5.
"""

import numpy as np
import pytest
import tensorflow as tf

import distributed_testlib as lib
import ps_coordinator
import ps_api_coordinator
import ps_testlib
from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import initializers
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.distributed import ps_mxrec
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util import initialize

STEPS = 8


def _one_process_mxrec(steps: int) -> dict:
  """The toy model with core create_table / sparse_lookup / lazy Adam in this process."""
  initialize.init()
  try:
    table = embedding.create_table(
        key_dtype=tf.int64, dim=lib.DIM, name="one_process_item",
        emb_initializer=tf.keras.initializers.Constant(ps_coordinator.INITIAL),
        device_vocabulary_size=lib.ROWS)
    optimizer = lazy_adam.create_hash_optimizer(learning_rate=ps_coordinator.LEARNING_RATE)
    bias = tf.Variable(0.0)
    w = tf.constant(ps_coordinator.W)

    @tf.function
    def train_step(ids, labels):
      with tf.GradientTape() as tape:
        emb = embedding.sparse_lookup(table, ids, send_count=ps_api_coordinator.SEND_COUNT)
        scores = tf.reduce_sum(emb * w, axis=[1, 2]) + bias
        loss = tf.reduce_sum(tf.square(scores - labels)) / lib.GLOBAL_BATCH
      table_grad, bias_grad = tape.gradient(loss, [table.variable, bias])
      optimizer.apply_gradients([(table_grad, table.variable)])
      bias.assign_sub(ps_coordinator.BIAS_LEARNING_RATE * bias_grad)
      return loss

    losses = [
        float(train_step(*map(tf.constant, lib.batch(s % ps_coordinator.CYCLE))))
        for s in range(steps)
    ]
    keys, rows = table.key_index.export()
    out = {"losses": np.array(losses), "bias": bias.numpy()}
    for what, variable in (("values", table.variable), ("m",
                                                        optimizer.get_slot(table.table_name, "m")),
                           ("v", optimizer.get_slot(table.table_name, "v"))):
      out[what] = lib.by_key(keys.numpy(), tf.gather(variable, rows).numpy())
    return out
  finally:
    initialize.terminate_config_initializer()


def _check_equals_one_process(out: dict, steps: int) -> None:
  want = _one_process_mxrec(steps)
  np.testing.assert_allclose(out["losses"], want["losses"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out["bias"], want["bias"], rtol=1e-5, atol=1e-6)
  table = ps_api_coordinator.TABLE
  assert int(out[f"{table}/step"]) == steps
  for what in ("values", "m", "v"):
    got = ps_testlib.rows_by_key(out, table, what)
    assert sorted(got) == sorted(want[what]), what
    for key, row in want[what].items():
      np.testing.assert_allclose(got[key], row, rtol=1e-5, atol=1e-6,
                                 err_msg=f"{what} of key {key}")


@pytest.mark.slow
def test_one_local_shard_equals_one_process_mxrec(tmp_path):
  ps_api_coordinator.main(str(tmp_path / "out.npz"), STEPS, local=True)
  _check_equals_one_process(dict(np.load(tmp_path / "out.npz")), STEPS)


@pytest.mark.cluster
@pytest.mark.slow
def test_one_worker_two_ps_equals_one_process_mxrec(tmp_path):
  out = ps_testlib.train(num_workers=1, num_ps=2, steps=STEPS, tmp=tmp_path,
                         coordinator=ps_testlib.API_COORDINATOR)
  table = ps_api_coordinator.TABLE
  assert int(out[f"{table}/num_shards"]) == 2
  for i in range(2):
    assert out[f"{table}/shard{i}_keys"].size > 0, f"ps {i} holds no key"
  _check_equals_one_process(out, STEPS)


@pytest.mark.cluster
@pytest.mark.slow
def test_two_workers_two_ps_async_keys_on_owners_loss_falls(tmp_path):
  steps = 4 * ps_coordinator.CYCLE
  out = ps_testlib.train(num_workers=2, num_ps=2, steps=steps, tmp=tmp_path,
                         coordinator=ps_testlib.API_COORDINATOR)
  table = ps_api_coordinator.TABLE
  want_keys = set(np.concatenate([lib.batch(s)[0].ravel() for s in range(ps_coordinator.CYCLE)]))
  assert set(ps_testlib.rows_by_key(out, table)) == want_keys
  assert int(out[f"{table}/step"]) == steps
  losses = out["losses"].reshape(-1, ps_coordinator.CYCLE).mean(axis=1)
  assert losses[-1] < 0.7 * losses[0], losses


@pytest.fixture(name="run")
def _run():
  yield initialize.init()
  initialize.terminate_config_initializer()


def _ps_table(name="refused", **kwargs):
  optimizer = lazy_adam.create_hash_optimizer()
  args = dict(key_dtype=tf.int64, dim=2, name=name, emb_initializer=tf.zeros,
              device_vocabulary_size=8, optimizer_list=[optimizer])
  args.update(kwargs)
  return ps_mxrec.create_table(None, **args), optimizer


def test_dataset_side_insertion_is_refused_naming_the_table(run):
  table, _ = _ps_table()
  ids = tf.constant([[1, 2]], tf.int64)
  with pytest.raises(
      ValueError, match=r"sparse_lookup\('refused'\): FeatureSpec 'item_ids' "
      r"needs ids inserted in tf\.data.*raw ids tensor"):
    ps_mxrec.sparse_lookup(table, FeatureSpec("item_ids", table_name="refused"),
                           batch={"item_ids": ids})
  with pytest.raises(ValueError, match=r"'refused'\): modify_graph=True needs ids inserted"):
    ps_mxrec.sparse_lookup(table, ids, modify_graph=True)
  with pytest.raises(ValueError, match=r"'refused'\): give access_threshold"):
    ps_mxrec.sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 2})
  with pytest.raises(ValueError, match=r"'refused'\): ids must be int64.*got int32"):
    ps_mxrec.sparse_lookup(table, tf.constant([1], tf.int32))


def test_send_count_bounds_distinct_ids_and_is_grad_false_stops_gradients(run):
  table, _ = _ps_table(emb_initializer=tf.keras.initializers.Constant(0.5))
  ids = tf.constant([[1, 2], [2, 3]], tf.int64)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"table 'refused': more distinct ids in one batch than send_count=2"):
    ps_mxrec.sparse_lookup(table, ids, send_count=2)
  with tf.GradientTape() as tape:
    emb = ps_mxrec.sparse_lookup(table, ids, send_count=3, is_grad=False)
  np.testing.assert_array_equal(emb, np.full([2, 2, 2], 0.5))
  assert tape.gradient(tf.reduce_sum(emb), table.shard_variables) == [None]
  np.testing.assert_array_equal(
      ps_mxrec.sparse_lookup(table, tf.constant([3, 9], tf.int64), is_train=False,
                             serving_default_value=-1.0), [[0.5, 0.5], [-1.0, -1.0]])


def test_create_table_refusals_name_the_table(run):
  with pytest.raises(ValueError, match=r"create_table\('t'\): `optimizer_list` must be \[one hash"):
    _ps_table("t", optimizer_list=None)
  with pytest.raises(ValueError, match=r"create_table\('t'\): an SSD tier .* needs "
                     "host_vocabulary_size > 0"):
    _ps_table("t", ssd_vocabulary_size=16)
  with pytest.raises(ValueError, match=r"PSShardedTable\('t'\): `dim` must be a positive int"):
    _ps_table("t", dim=0)
  embedding.create_table(key_dtype=tf.int64, dim=2, name="taken", emb_initializer=tf.zeros,
                         device_vocabulary_size=4)
  with pytest.raises(ValueError, match=r"create_table\('taken'\): a table named 'taken' already"):
    _ps_table("taken")
  _ps_table("ps_taken")
  with pytest.raises(ValueError, match=r"create_table\('ps_taken'\): a table named 'ps_taken' "):
    _ps_table("ps_taken")
  with pytest.raises(
      ValueError, match="PSShardedTable needs a ParameterServerStrategy, got "
      "MirroredStrategy"):
    ps_mxrec.create_table(tf.distribute.MirroredStrategy(["/CPU:0"]), key_dtype=tf.int64, dim=2,
                          name="t", emb_initializer=tf.zeros,
                          optimizer_list=[lazy_adam.create_hash_optimizer()])


def test_tiered_table_trains_as_an_all_on_device_table(run, tmp_path):
  """mx_rec's DDR/SSD table on a local shard: 6 device rows for 30 keys keep swapping."""
  init = initializers.RowInitializer("truncated_normal", stddev=0.1, seed=3)
  rng = np.random.default_rng(2)
  batches = [
      (rng.integers(0, 30, size=[3, 2]), rng.normal(size=[3]).astype(np.float32)) for _ in range(12)
  ]
  w = tf.constant([0.5, -1.0])
  results = {}
  for name, tiers in (("mx_flat", {}), ("mx_tiered",
                                        dict(host_vocabulary_size=4, ssd_vocabulary_size=40,
                                             ssd_data_path=[str(tmp_path)], cache_policy="lfu"))):
    table, optimizer = _ps_table(name, emb_initializer=init,
                                 device_vocabulary_size=6 if tiers else 64, **tiers)

    @tf.function
    def step(ids, labels, table=table, optimizer=optimizer):
      with tf.GradientTape() as tape:
        emb = ps_mxrec.sparse_lookup(table, ids, send_count=6)
        loss = tf.reduce_mean((tf.reduce_sum(emb * w, axis=[1, 2]) - labels)**2)
      ps_mxrec.apply_gradients(optimizer, [(tape.gradient(loss, table.shard_variables), table)])
      return loss

    losses = [float(step(tf.constant(i, tf.int64), tf.constant(y))) for i, y in batches]
    results[name] = (losses, table.export_shard(0), table)
  np.testing.assert_allclose(results["mx_tiered"][0], results["mx_flat"][0], rtol=1e-5)
  got, want = results["mx_tiered"][1], results["mx_flat"][1]
  order_got, order_want = np.argsort(got["keys"]), np.argsort(want["keys"])
  np.testing.assert_array_equal(got["keys"][order_got], want["keys"][order_want])
  for part in ("values", "m", "v"):
    np.testing.assert_allclose(got[part][order_got], want[part][order_want], atol=1e-5)
  stats = results["mx_tiered"][2].tiered_shards[0].storage.stats()
  assert int(stats["swap_outs"]) > 10 and int(stats["ssd_rows_used"]) > 0
  assert (tmp_path / "shard_0").is_dir()


def test_init_param_scales_the_initial_rows(run):
  table, _ = _ps_table(emb_initializer=tf.keras.initializers.Constant(0.5), init_param=3.0)
  np.testing.assert_allclose(ps_mxrec.sparse_lookup(table, tf.constant([7], tf.int64)),
                             [[1.5, 1.5]])


def test_apply_gradients_needs_the_tables_optimizer(run):
  table, optimizer = _ps_table()
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(ps_mxrec.sparse_lookup(table, tf.constant([1], tf.int64)))
  grads = tape.gradient(loss, table.shard_variables)
  with pytest.raises(ValueError, match=r"table 'refused' was created with optimizer 'LazyAdam'"):
    ps_mxrec.apply_gradients(lazy_adam.create_hash_optimizer(), [(grads, table)])
  with pytest.raises(ValueError, match="is not a table of ps_mxrec.create_table"):
    ps_mxrec.apply_gradients(optimizer, [(grads, tf.Variable(1.0))])
  ps_mxrec.apply_gradients(optimizer, [(grads, table)])
  assert int(table.step.numpy()) == 1
