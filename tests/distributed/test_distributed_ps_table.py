"""PSShardedTable on a real local ParameterServerStrategy cluster (chief + workers + 2 ps).

The coordinator (ps_coordinator.py) trains the toy table with lazy Adam
through ClusterCoordinator.schedule. With one worker the steps run in order,
so the losses and every key's row, m and v must equal a NumPy lazy Adam of the
same batches (and the table's one-process mode) to 1e-5. With two workers the
updates are asynchronous: every key must sit on its owner PS, every key of the
batches must be there, and the loss must fall.
"""

import numpy as np
import pytest
import tensorflow as tf

import distributed_testlib as lib
import ps_coordinator
import ps_testlib
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.distributed import sharding
from mxrec_pipeline.optimizers import lazy_adam

STEPS = 8


def _reference(steps: int):
  """NumPy lazy Adam (optimizers/lazy_adam.py's math) + SGD bias of ps_coordinator's model."""
  lr, beta1, beta2, eps = ps_coordinator.LEARNING_RATE, 0.9, 0.999, 1e-8
  rows, m, v, losses, bias = {}, {}, {}, [], 0.0
  w = ps_coordinator.W.astype(np.float64)
  for t in range(1, steps + 1):
    ids, labels = lib.batch((t - 1) % ps_coordinator.CYCLE)
    for key in ids.ravel():
      if key not in rows:
        rows[key] = np.full(lib.DIM, ps_coordinator.INITIAL)
        m[key], v[key] = np.zeros(lib.DIM), np.zeros(lib.DIM)
    emb = np.array([[rows[k] for k in example] for example in ids])  # [B, L, D]
    err = (emb * w).sum(axis=(1, 2)) + bias - labels
    losses.append((err**2).sum() / lib.GLOBAL_BATCH)
    bias -= ps_coordinator.BIAS_LEARNING_RATE * 2 * err.sum() / lib.GLOBAL_BATCH
    grads = {}
    for b, example in enumerate(ids):
      for key in example:
        grads[key] = grads.get(key, 0) + 2 * err[b] * w / lib.GLOBAL_BATCH
    lr_t = lr * np.sqrt(1 - beta2**t) / (1 - beta1**t)
    for key, g in grads.items():
      m[key] = beta1 * m[key] + (1 - beta1) * g
      v[key] = beta2 * v[key] + (1 - beta2) * g * g
      rows[key] = rows[key] - lr_t * m[key] / (np.sqrt(v[key]) + eps)
  return np.array(losses), rows, m, v, bias


def _by_key(out, what):
  got = {}
  for i in range(int(out["num_shards"])):
    got.update(lib.by_key(out[f"shard{i}_keys"], out[f"shard{i}_{what}"]))
  return got


def _check_owners(out):
  num_shards = int(out["num_shards"])
  for i in range(num_shards):
    keys = out[f"shard{i}_keys"]
    assert keys.size > 0, f"ps {i} holds no key"
    np.testing.assert_array_equal(sharding.owner_numpy(keys, num_shards), i,
                                  err_msg=f"a key on ps {i} is owned by another ps")


def _check_equals_reference(out, steps, check_losses=True):
  losses, rows, m, v, bias = _reference(steps)
  if check_losses:
    np.testing.assert_allclose(out["losses"], losses, rtol=1e-5, atol=1e-6)
  assert int(out["step"]) == steps
  np.testing.assert_allclose(out["bias"], bias, rtol=1e-5, atol=1e-6)
  for what, want in (("values", rows), ("m", m), ("v", v)):
    got = _by_key(out, what)
    assert sorted(got) == sorted(want), what
    for key in want:
      np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6,
                                 err_msg=f"{what} of key {key}")


@pytest.mark.slow
def test_one_process_equals_numpy_lazy_adam(tmp_path):
  ps_coordinator.main(str(tmp_path / "out.npz"), STEPS, local=True)
  _check_equals_reference(dict(np.load(tmp_path / "out.npz")), STEPS)


@pytest.mark.cluster
@pytest.mark.slow
def test_one_worker_two_ps_equals_one_process(tmp_path):
  out = ps_testlib.train(num_workers=1, num_ps=2, steps=STEPS, tmp=tmp_path)
  assert int(out["num_shards"]) == 2
  _check_owners(out)
  _check_equals_reference(out, STEPS)


@pytest.mark.cluster
@pytest.mark.slow
def test_two_workers_two_ps_async_keys_on_owners_loss_falls(tmp_path):
  steps = 4 * ps_coordinator.CYCLE
  out = ps_testlib.train(num_workers=2, num_ps=2, steps=steps, tmp=tmp_path)
  _check_owners(out)
  want_keys = set(np.concatenate([lib.batch(s)[0].ravel() for s in range(ps_coordinator.CYCLE)]))
  assert set(_by_key(out, "values")) == want_keys
  assert int(out["step"]) == steps
  losses = out["losses"].reshape(-1, ps_coordinator.CYCLE).mean(axis=1)
  assert losses[-1] < 0.7 * losses[0], losses


def test_eval_lookup_reads_the_default_for_absent_ids_and_inserts_nothing():
  table = ps_table.PSShardedTable(None, name="ps_eval", dim=2, device_vocabulary_size=8,
                                  optimizer=lazy_adam.create_hash_optimizer(),
                                  emb_initializer=tf.keras.initializers.Constant(0.5))
  np.testing.assert_array_equal(
      table.lookup(tf.constant([[3, 4]], tf.int64), training=False, default_value=-1.0),
      np.full([1, 2, 2], -1.0))
  assert table.export_shard(0)["keys"].size == 0
  table.lookup(tf.constant([4], tf.int64))  # Inserts 4.
  np.testing.assert_array_equal(
      table.lookup(tf.constant([3, 4, 4], tf.int64), training=False, default_value=-1.0),
      [[-1, -1], [0.5, 0.5], [0.5, 0.5]])
  np.testing.assert_array_equal(table.export_shard(0)["keys"], [4])


def test_step_bytes_counts_keys_rows_gradients_and_restore_indices_per_owner():
  keys = np.array([5, 9, 5, 12, 9, 9, 30], np.int64)
  owners = sharding.owner_numpy(keys, 2)
  expected = np.zeros([2, 2], np.int64)
  for i in range(2):
    n, u = int((owners == i).sum()), len(set(keys[owners == i].tolist()))
    # To the ps: n keys (8 B) + u gradient rows (3 x 4 B); back: u rows + n restore indices (4 B).
    expected[i] = (8 * n + 12 * u, 12 * u + 4 * n)
  np.testing.assert_array_equal(ps_table.step_bytes(keys, 2, dim=3), expected)
  # One shard: 7 keys, 4 distinct.
  np.testing.assert_array_equal(ps_table.step_bytes(keys, 1, dim=3), [[8 * 7 + 48, 48 + 4 * 7]])
