"""Feature admission and eviction on PS tables equal one process's (core/admission.py).

The reference is the single-process core table (create_table, admission.insert,
lookup.unique_embeddings, lazy Adam) trained on ps_coordinator.py's toy model
with access_threshold 2 and eviction_threshold_s 10 (step s at time
distributed_testlib.step_time(s), an eviction after every step). A
PSShardedTable with one local shard, and a local cluster of 1 worker and 2 ps
restored from its checkpoint (then restored back into one shard), must hold
the same keys with the same rows and slots, the same pending keys with the
same admission counts, the same last-seen times and admission/eviction
totals, to 1e-5.
"""

import numpy as np
import pytest
import tensorflow as tf

import distributed_testlib as lib
import ps_coordinator
import ps_testlib
import test_distributed_ps_table as ps_test
from mxrec_pipeline.core import admission
from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import key_index
from mxrec_pipeline.core import lookup
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.distributed import sharding
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util import initialize

ACCESS_THRESHOLD = 2
EVICTION_THRESHOLD_S = 10  # Keys unseen for 2 steps (6 s each) are evicted.
ADMIT_ARGS = [
    f"--access_threshold={ACCESS_THRESHOLD}", f"--eviction_threshold_s={EVICTION_THRESHOLD_S}"
]


def _core_reference(steps: int) -> dict:
  """One process, the core's table: losses, rows/m/v by key, key index state, bias."""
  initialize.init()
  try:
    table = embedding.create_table(
        key_dtype=tf.int64, dim=lib.DIM, name=lib.TABLE,
        emb_initializer=tf.keras.initializers.Constant(ps_coordinator.INITIAL),
        device_vocabulary_size=lib.ROWS)
    admission.configure(lib.TABLE, admission.AdmitEvictConfig(ACCESS_THRESHOLD,
                                                              EVICTION_THRESHOLD_S), "reference")
    optimizer = lazy_adam.create_hash_optimizer(ps_coordinator.LEARNING_RATE)
    bias = tf.Variable(0.0)
    container = initialize.get_config_initializer().container
    losses = []
    for step in range(steps):
      ids, labels = lib.batch(step % ps_coordinator.CYCLE)
      with tf.GradientTape() as tape:
        rows, restore = admission.insert(container, lib.TABLE, tf.constant(ids.ravel()), True,
                                         timestamp=tf.constant(lib.step_time(step), tf.int64))
        unique = lookup.unique_embeddings(table, rows, training=True, admitting=True)
        emb = tf.reshape(lookup.per_id(unique, restore), [*ids.shape, lib.DIM])
        scores = tf.reduce_sum(emb * ps_coordinator.W, axis=[1, 2]) + bias
        loss = tf.reduce_sum(tf.square(scores - labels)) / lib.GLOBAL_BATCH
      table_grad, bias_grad = tape.gradient(loss, [table.variable, bias])
      optimizer.apply_gradients([(table_grad, table.variable)])
      bias.assign_sub(ps_coordinator.BIAS_LEARNING_RATE * bias_grad)
      admission.evict(table, EVICTION_THRESHOLD_S, [optimizer])
      losses.append(float(loss))
    state = {n: v.numpy() for n, v in table.key_index.export_state().items()}
    by_row = {
        "values": table.variable.numpy(),
        **{s: optimizer.get_slot(lib.TABLE, s).numpy() for s in ("m", "v")}
    }
    return {
        "losses": np.array(losses),
        "bias": bias.numpy(),
        "step": int(optimizer.iterations.numpy()),
        "state": state,
        **{what: lib.by_key(state["keys"], rows[state["rows"]]) for what, rows in by_row.items()},
    }
  finally:
    initialize.terminate_config_initializer()


def _merged_state(out: dict) -> dict:
  """The shards' key index states of a ps_coordinator output, as one process's."""
  shards = range(int(out["num_shards"]))
  merged = {
      name: np.concatenate([out[f"shard{i}_state_{name}"] for i in shards])
      for name in key_index.STATE_NAMES if name != "counters"
  }
  counters = np.stack([out[f"shard{i}_state_counters"] for i in shards])
  merged["counters"] = np.array([counters[:, 0].sum(), counters[:, 1].sum(), counters[:, 2].max()])
  return merged


def _check_equals_reference(out: dict, want: dict, first_step: int = 0, check_losses=True):
  if check_losses:
    np.testing.assert_allclose(out["losses"], want["losses"][first_step:], rtol=1e-5, atol=1e-6)
  assert int(out["step"]) == want["step"]
  np.testing.assert_allclose(out["bias"], want["bias"], rtol=1e-5, atol=1e-6)
  for what in ("values", "m", "v"):
    got = ps_test._by_key(out, what)
    assert sorted(got) == sorted(want[what]), what
    for key, row in want[what].items():
      np.testing.assert_allclose(got[key], row, rtol=1e-5, atol=1e-6,
                                 err_msg=f"{what} of key {key}")
  got, state = _merged_state(out), want["state"]
  for keys, values in (("keys", "last_seen"), ("pending_keys", "pending_counts"),
                       ("pending_keys", "pending_last_seen")):
    assert lib.by_key(got[keys], got[values]) == lib.by_key(state[keys], state[values]), values
  np.testing.assert_array_equal(got["counters"], state["counters"])


def test_reference_admits_evicts_and_keeps_pending_keys():
  # The case is not trivial: keys wait, some are evicted, some stay pending.
  want = _core_reference(8)
  state = want["state"]
  admissions, evictions, latest = state["counters"]
  assert state["pending_keys"].size > 0 and evictions > 0
  assert admissions > state["keys"].size and latest == lib.step_time(7)
  seen = np.unique(np.concatenate([lib.batch(s)[0].ravel() for s in range(ps_coordinator.CYCLE)]))
  assert state["keys"].size + state["pending_keys"].size < seen.size  # Evicted pending keys too.


@pytest.mark.slow
def test_one_shard_equals_one_process(tmp_path):
  ps_coordinator.main(str(tmp_path / "out.npz"), 8, local=True, access_threshold=ACCESS_THRESHOLD,
                      eviction_threshold_s=EVICTION_THRESHOLD_S)
  _check_equals_reference(dict(np.load(tmp_path / "out.npz")), _core_reference(8))


@pytest.mark.cluster
@pytest.mark.slow
def test_one_process_to_two_ps_and_back_keeps_counts_rows_and_slots(tmp_path):
  first, more = 8, 4
  ps_coordinator.main(str(tmp_path / "first.npz"), first, local=True, save=str(tmp_path / "ckpt1"),
                      access_threshold=ACCESS_THRESHOLD, eviction_threshold_s=EVICTION_THRESHOLD_S)
  out = ps_testlib.train(
      1, 2, more, tmp_path / "cluster",
      ["--restore",
       str(tmp_path / "ckpt1"), "--save",
       str(tmp_path / "ckpt2"), *ADMIT_ARGS])
  want = _core_reference(first + more)
  ps_test._check_owners(out)
  for i in range(2):
    pending = out[f"shard{i}_state_pending_keys"]
    assert pending.size > 0, f"ps {i} holds no pending key"
    np.testing.assert_array_equal(sharding.owner_numpy(pending, 2), i)
  _check_equals_reference(out, want, first_step=first)
  ps_coordinator.main(str(tmp_path / "back.npz"), 0, local=True, restore=str(tmp_path / "ckpt2"),
                      access_threshold=ACCESS_THRESHOLD, eviction_threshold_s=EVICTION_THRESHOLD_S)
  _check_equals_reference(dict(np.load(tmp_path / "back.npz")), want, check_losses=False)


def _table(name: str, **kwargs) -> ps_table.PSShardedTable:
  return ps_table.PSShardedTable(None, name=name, dim=2, device_vocabulary_size=8,
                                 optimizer=lazy_adam.create_hash_optimizer(),
                                 emb_initializer=tf.keras.initializers.Constant(0.5), **kwargs)


def test_pending_keys_read_the_default_and_eval_lookups_count_nothing():
  table = _table("ps_pending", access_threshold=3)
  ids = tf.constant([4, 4, 9], tf.int64)
  with tf.GradientTape() as tape:
    emb = table.lookup(ids, default_value=-1.0)
  np.testing.assert_array_equal(emb, np.full([3, 2], -1.0))  # 4 seen twice, 9 once: pending.
  grad = tape.gradient(tf.reduce_sum(emb), table.shard_variables[0])
  assert grad is None or grad.indices.shape[0] == 0  # No row, no update.
  for _ in range(2):  # Evaluation neither counts nor admits.
    np.testing.assert_array_equal(table.lookup(ids, training=False, default_value=-2.0),
                                  np.full([3, 2], -2.0))
  state = table.key_indexes[0].export_state()
  assert lib.by_key(state["pending_keys"].numpy(), state["pending_counts"].numpy()) == {4: 2, 9: 1}
  np.testing.assert_array_equal(table.lookup(ids), [[0.5, 0.5], [0.5, 0.5], [0.0, 0.0]])
  np.testing.assert_array_equal(table.export_shard(0)["keys"], [4])  # The third sighting admits.


def test_bad_admission_settings_and_a_missing_timestamp_name_the_table():
  with pytest.raises(ValueError, match=r"PSShardedTable\('ps_bad'\): `access_threshold` must be"):
    _table("ps_bad", access_threshold=-1)
  with pytest.raises(ValueError, match=r"PSShardedTable\('ps_bad'\): `eviction_threshold_s` must"):
    _table("ps_bad", eviction_threshold_s=True)
  table = _table("ps_evicting", eviction_threshold_s=5)
  with pytest.raises(
      ValueError, match=r"PSShardedTable\('ps_evicting'\): eviction_threshold_s "
      "needs the batch's `timestamp`"):
    table.lookup(tf.constant([1], tf.int64))
  table.lookup(tf.constant([1], tf.int64), training=False)  # Eval needs no timestamp.
  with pytest.raises(ValueError, match=r"PSShardedTable\('ps_plain'\): evict needs "
                     "eviction_threshold_s"):
    _table("ps_plain").evict()
