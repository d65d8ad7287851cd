"""Checkpoints across processes: N + N steps == 2N steps, and a SIGKILL while saving."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.util.initialize import init

import sparse_testlib as lib

# Trains in subprocesses, one of them killed while saving.
pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]

# Trains `steps` steps (restoring `restore` first unless it is "-"), saves to
# `save`, dumps the final state to `out` (.npz). Batches depend on the global step
# only, and rows are handed out in batch order, so a run is reproducible.
TRAIN_SCRIPT = """
import sys

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init

restore, steps, save, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
init()
table = embedding.create_table(
    key_dtype=tf.int64, dim=4, name="item", device_vocabulary_size=64,
    emb_initializer=tf.keras.initializers.RandomNormal(stddev=0.1, seed=7))
optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.05)
dense = tf.Variable(tf.ones([4]), name="dense")
dense_optimizer = tf.keras.optimizers.Adam(0.01)
checkpoint = tf.train.Checkpoint(table=table, optimizer=optimizer, dense=dense,
                                 dense_optimizer=dense_optimizer)
if restore != "-":
  checkpoint.restore(restore).assert_existing_objects_matched()
start = int(optimizer.iterations.numpy())

spec = FeatureSpec("ids", table_name="item")

def make_batch(step):
  seed = tf.stack([step, tf.constant(0, tf.int64)])
  ids = tf.random.stateless_uniform([8, 3], seed=seed, minval=0, maxval=48, dtype=tf.int64)
  return {"ids": ids * 1000003 - 2**40}, tf.random.stateless_normal([8], seed=seed + 1)

dataset = (tf.data.Dataset.range(start, start + steps).map(make_batch)
           .map(get_asc_insert_func([spec], is_training=True)).prefetch(2))

@tf.function
def train_step(features, labels):
  with tf.GradientTape() as tape:
    emb = embedding.sparse_lookup(table, spec, batch=features)
    loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb * dense, axis=[1, 2]) - labels))
  table_grad, dense_grad = tape.gradient(loss, [table.variable, dense])
  optimizer.apply_gradients([(table_grad, table.variable)])
  dense_optimizer.apply_gradients([(dense_grad, dense)])

for features, labels in dataset:
  train_step(features, labels)
checkpoint.save(save)
keys, rows = table.key_index.export()
np.savez(out, keys=keys.numpy(), rows=rows.numpy(), embedding=table.variable.numpy(),
         m=optimizer.get_slot("item", "m").numpy(), v=optimizer.get_slot("item", "v").numpy(),
         dense=dense.numpy(), iterations=optimizer.iterations.numpy())
"""

# Saves checkpoint 1, writes the marker, then keeps saving bigger checkpoints
# until killed. Checkpoint i holds keys [0, i * KEYS) whose rows all equal the key.
SAVE_LOOP_SCRIPT = """
import pathlib
import sys

import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.util.initialize import init

directory, marker = sys.argv[1], pathlib.Path(sys.argv[2])
KEYS, DIM = 5000, 16
init()
table = embedding.create_table(key_dtype=tf.int64, dim=DIM, name="item",
                               emb_initializer=tf.zeros_initializer(),
                               device_vocabulary_size=40 * KEYS)
saved_steps = tf.Variable(0, dtype=tf.int64)
manager = tf.train.CheckpointManager(tf.train.Checkpoint(table=table, steps=saved_steps),
                                     directory, max_to_keep=2)
for i in range(1, 41):
  keys = tf.range((i - 1) * KEYS, i * KEYS, dtype=tf.int64)
  rows, _, _ = table.key_index.insert(keys, training=True)
  table.variable.scatter_update(
      tf.IndexedSlices(tf.tile(tf.cast(keys, tf.float32)[:, None], [1, DIM]), rows))
  saved_steps.assign(i)
  manager.save(checkpoint_number=i)
  if i == 1:
    marker.write_text("saved")
"""


def _python(script_path, *args):
  env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.Popen([sys.executable, str(script_path), *map(str, args)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process):
  output, _ = process.communicate(timeout=300)
  assert process.returncode == 0, output


def test_n_steps_saved_restored_and_n_more_equal_2n_straight(tmp_path):
  script = tmp_path / "train.py"
  script.write_text(TRAIN_SCRIPT)
  n = 3
  first = _python(script, "-", n, tmp_path / "first" / "ckpt", tmp_path / "first.npz")
  straight = _python(script, "-", 2 * n, tmp_path / "straight" / "ckpt", tmp_path / "straight.npz")
  _finish(first)
  second = _python(script, tmp_path / "first" / "ckpt-1", n, tmp_path / "second" / "ckpt",
                   tmp_path / "second.npz")
  _finish(second)
  _finish(straight)

  first, resumed, straight = (
      np.load(tmp_path / f"{name}.npz") for name in ("first", "second", "straight"))
  assert resumed["iterations"] == straight["iterations"] == 2 * n
  assert len(first["keys"]) < len(straight["keys"])  # The second half brought new keys.
  resumed_keys, resumed_rows = lib.sorted_export(resumed["keys"], resumed["rows"])
  straight_keys, straight_rows = lib.sorted_export(straight["keys"], straight["rows"])
  np.testing.assert_array_equal(resumed_keys, straight_keys)
  np.testing.assert_array_equal(resumed_rows, straight_rows)
  for name in ("embedding", "m", "v", "dense"):
    np.testing.assert_allclose(resumed[name], straight[name], rtol=1e-6, atol=1e-7, err_msg=name)
  assert not np.allclose(first["embedding"], straight["embedding"])


def test_kill_while_saving_leaves_latest_checkpoint_loadable(tmp_path):
  script = tmp_path / "save_loop.py"
  script.write_text(SAVE_LOOP_SCRIPT)
  marker = tmp_path / "saved_once"
  directory = tmp_path / "ckpts"
  process = _python(script, directory, marker)
  try:
    for _ in range(12000):  # Polls the marker for at most ~120 s.
      if marker.exists() or process.poll() is not None:
        break
      time.sleep(0.01)
    assert marker.exists(), process.communicate(timeout=60)[0]
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
  finally:
    if process.poll() is None:
      process.kill()
      process.communicate()
  assert process.returncode in (-signal.SIGKILL, 0)

  latest = tf.train.latest_checkpoint(str(directory))
  assert latest is not None
  init()
  table = lib.make_table("item", dim=16, capacity=40 * 5000)
  saved_steps = tf.Variable(0, dtype=tf.int64)
  tf.train.Checkpoint(table=table,
                      steps=saved_steps).restore(latest).assert_existing_objects_matched()
  steps = int(saved_steps.numpy())
  assert latest.endswith(f"ckpt-{steps}") and steps >= 1
  keys, rows = lib.sorted_export(*table.key_index.export())
  np.testing.assert_array_equal(keys, np.arange(steps * 5000))
  values = table.variable.numpy()
  np.testing.assert_array_equal(values[rows], np.repeat(keys[:, None], 16, axis=1))
  untouched = np.setdiff1d(np.arange(40 * 5000), rows)
  np.testing.assert_array_equal(values[untouched], 0.0)
