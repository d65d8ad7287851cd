"""tf.train.Checkpoint(model=..., embedding=...): rows, key indexes and slots round trip.

Restoring and training on gives what training on without the checkpoint gives,
and a fresh CPU-only process restores `embedding_tables` and serves lookups
with stock TensorFlow ops (tf.lookup + tf.nn.embedding_lookup).
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline import embedding as tpu_embedding
from mxrec_pipeline.util import initialize

import embedding_testlib as lib

DIM = 3
BATCHES = [
    {"item": [[3], [9], [3]], "history": [[9, 4], [], [5, 5, 3]]},
    {"item": [[4], [8], [8]], "history": [[3], [7, 8], [4]]},
    {"item": [[6], [3], [2]], "history": [[2, 9, 6], [1], []]},  # New ids after the restore.
]
SERVING_IDS = np.array([3, 9, 1, 12345], np.int64)  # 12345 was never trained.

RESTORE_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf
from mxrec_pipeline import embedding as tpu_embedding

checkpoint_path, ids_path, out = sys.argv[1:4]
movie = tpu_embedding.TableConfig(32, 3, name="movie")
user = tpu_embedding.TableConfig(16, 3, name="user")
feature_config = {"item": tpu_embedding.FeatureConfig(movie),
                  "history": tpu_embedding.FeatureConfig(movie),
                  "user": tpu_embedding.FeatureConfig(user)}
model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
model.build([None, 9])
embedding = tpu_embedding.Embedding(feature_config, optimizer=None)   # serving: no slots
tf.train.Checkpoint(model=model, embedding=embedding).restore(checkpoint_path).expect_partial()

# Serving with stock TensorFlow: id -> row tables, then the rows.
tables = embedding.embedding_tables
row_tables = embedding.row_lookup_tables()
ids = tf.constant(np.load(ids_path))
rows = row_tables[movie].lookup(ids)
emb = tf.nn.embedding_lookup(tables[movie], tf.maximum(rows, 0))
emb *= tf.cast(rows >= 0, emb.dtype)[:, None]
np.savez(out, emb=emb.numpy(), rows=rows.numpy(), kernel=model.layers[0].kernel.numpy())
"""


def _feature_config():
  movie = tpu_embedding.TableConfig(32, DIM, name="movie", combiner="sqrtn",
                                    initializer=lib.constant_initializer(lib.initial_rows(32, DIM)))
  user = tpu_embedding.TableConfig(
      16, DIM, name="user", optimizer=tpu_embedding.Adagrad(0.2),
      initializer=lib.constant_initializer(lib.initial_rows(16, DIM, 1)))
  return movie, user, {
      "item": tpu_embedding.FeatureConfig(movie), "history": tpu_embedding.FeatureConfig(movie),
      "user": tpu_embedding.FeatureConfig(user)
  }


def _build():
  """A fresh run with the Embedding and a small model."""
  initialize.terminate_config_initializer()
  initialize.init()
  movie, user, feature_config = _feature_config()
  embedding = tpu_embedding.Embedding(feature_config, tpu_embedding.Adam(0.05))
  tf.keras.utils.set_random_seed(0)
  model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
  model.build([None, 3 * DIM])
  return embedding, model, movie, user


def _step(embedding, model, batch, step):
  features = {
      "item": tf.constant(batch["item"], tf.int64),
      "history": tf.ragged.constant(batch["history"], dtype=tf.int64),
      "user": tf.constant([[step], [step + 1], [7]], tf.int64)
  }

  def loss_fn(activations):
    x = tf.concat([activations["item"], activations["history"], activations["user"]], 1)
    return tf.reduce_sum(tf.square(model(x) - 1.0))

  return lib.train_step(embedding, features, loss_fn)


def _state(embedding, movie, user):
  """Every table's rows, index and slots, as NumPy."""
  out = {}
  for config, name in ((movie, "movie"), (user, "user")):
    out[name] = embedding.embedding_tables[config].numpy()
    out[f"{name}_index"] = lib.row_of(embedding, config)
  optimizers = embedding._optimizers  # pylint: disable=protected-access
  for slot in ("momenta", "velocities"):
    out[f"movie_{slot}"] = optimizers["Adam"].get_slot("movie", slot).numpy()
  out["user_accumulators"] = optimizers["Adagrad"].get_slot("user", "accumulators").numpy()
  return out


def _assert_same(a, b):
  assert a.keys() == b.keys()
  for key in a:
    if isinstance(a[key], dict):
      assert a[key] == b[key], key
    else:
      np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_restore_then_train_equals_training_on(tmp_path):
  embedding, model, movie, user = _build()
  checkpoint = tf.train.Checkpoint(model=model, embedding=embedding)
  for step, batch in enumerate(BATCHES[:2]):
    _step(embedding, model, batch, step)
  saved = _state(embedding, movie, user)
  path = checkpoint.save(str(tmp_path / "ckpt"))
  _step(embedding, model, BATCHES[2], 2)
  expected = _state(embedding, movie, user)

  restored, restored_model, movie, user = _build()
  status = tf.train.Checkpoint(model=restored_model, embedding=restored).restore(path)
  status.assert_existing_objects_matched()
  tables = restored.embedding_tables
  np.testing.assert_array_equal(tables[movie].numpy(), saved["movie"])
  assert lib.row_of(restored, movie) == saved["movie_index"]
  _step(restored, restored_model, BATCHES[2], 2)  # Slots are restored at their creation.
  _assert_same(_state(restored, movie, user), expected)


@pytest.mark.slow
def test_fresh_cpu_process_serves_with_stock_lookups(tmp_path):
  embedding, model, movie, _ = _build()
  for step, batch in enumerate(BATCHES):
    _step(embedding, model, batch, step)
  path = tf.train.Checkpoint(model=model, embedding=embedding).save(str(tmp_path / "ckpt"))
  expected = embedding({
      "item": tf.constant(SERVING_IDS[:, None]),
      "history": tf.ragged.constant([[]] * 4, dtype=tf.int64), "user": tf.constant([[0]] * 4,
                                                                                   tf.int64)
  })["item"].numpy()
  np.save(tmp_path / "ids.npy", SERVING_IDS)
  out = tmp_path / "served.npz"
  subprocess.run([sys.executable, "-c", RESTORE_SCRIPT, path,
                  str(tmp_path / "ids.npy"),
                  str(out)], check=True, cwd=pathlib.Path(__file__).parent, timeout=300,
                 env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"})
  served = np.load(out)
  assert served["rows"][-1] == -1
  np.testing.assert_array_equal(served["emb"][-1], np.zeros(DIM))
  np.testing.assert_allclose(served["emb"], expected, rtol=1e-6)
  np.testing.assert_allclose(served["kernel"], model.layers[0].kernel.numpy())
