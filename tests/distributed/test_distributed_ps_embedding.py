"""TPUEmbedding's API on parameter-server tables (distributed/ps_embedding.py) against one process.

ps_api_coordinator.py --api embedding trains three features on two tables
(ragged "item" and "history" sharing the item table, Adam; dense "user" on the
user table with its own SGD) with PSEmbedding's enqueue / dequeue /
apply_gradients, scheduled on 1 worker + 2 ps (or as one local shard per
table). With one worker the steps run in order: losses and every key's row of
both tables must equal the single-process Embedding (embedding/embedding.py)
running the same loop, to 1e-5.
"""

import numpy as np
import pytest
import tensorflow as tf

import distributed_testlib as lib
import ps_api_coordinator
import ps_testlib
from mxrec_pipeline import embedding as tpu_embedding
from mxrec_pipeline.distributed import ps_embedding
from mxrec_pipeline.util import initialize

STEPS = 6
TABLES = (ps_api_coordinator.ITEM_TABLE, ps_api_coordinator.USER_TABLE)


def _one_process_embedding(steps: int) -> dict:
  """Losses and {table: {key: row}} of the single-process Embedding on the same loop."""
  try:
    embedding = tpu_embedding.Embedding(ps_api_coordinator.feature_config(),
                                        ps_api_coordinator.global_optimizer())
    train_step = ps_api_coordinator.embedding_train_step(embedding)
    losses = []
    for s in range(steps):
      features, labels = ps_api_coordinator.features_of(s)
      losses.append(float(train_step(features, tf.constant(labels))))
    rows = {}
    keys_rows = embedding.export_key_index()
    for config, variable in embedding.embedding_tables.items():
      keys, at = keys_rows[config]
      rows[config.name] = lib.by_key(keys.numpy(), tf.gather(variable, at).numpy())
    return {"losses": np.array(losses), "rows": rows}
  finally:
    initialize.terminate_config_initializer()


def _check_equals_one_process(out: dict, steps: int) -> None:
  want = _one_process_embedding(steps)
  np.testing.assert_allclose(out["losses"], want["losses"], rtol=1e-5, atol=1e-6)
  for table in TABLES:
    assert int(out[f"{table}/step"]) == steps
    lib.assert_rows_equal(ps_testlib.rows_by_key(out, table), want["rows"][table])


def test_one_local_shard_per_table_equals_one_process_embedding(tmp_path):
  ps_api_coordinator.main(str(tmp_path / "out.npz"), STEPS, local=True, api="embedding")
  _check_equals_one_process(dict(np.load(tmp_path / "out.npz")), STEPS)


@pytest.mark.cluster
@pytest.mark.slow
def test_one_worker_two_ps_equals_one_process_embedding(tmp_path):
  out = ps_testlib.train(num_workers=1, num_ps=2, steps=STEPS, tmp=tmp_path,
                         extra=["--api", "embedding"], coordinator=ps_testlib.API_COORDINATOR)
  for table in TABLES:
    assert int(out[f"{table}/num_shards"]) == 2
    for i in range(2):
      assert out[f"{table}/shard{i}_keys"].size > 0, f"ps {i} holds no key of {table}"
  _check_equals_one_process(out, STEPS)


def _embedding():
  table = tpu_embedding.TableConfig(vocabulary_size=8, dim=2, initializer=tf.zeros, name="misuse")
  return ps_embedding.PSEmbedding(None, {"f": tpu_embedding.FeatureConfig(table=table)},
                                  tpu_embedding.SGD(0.1))


@pytest.fixture(name="run")
def _run():
  yield initialize.init()
  initialize.terminate_config_initializer()


def test_misuse_is_named(run):
  table = tpu_embedding.TableConfig(vocabulary_size=8, dim=2, name="no_opt")
  with pytest.raises(ValueError, match=r"tables \['no_opt'\] have no optimizer"):
    ps_embedding.PSEmbedding(None, {"f": tpu_embedding.FeatureConfig(table=table)}, None)
  embedding = _embedding()
  assert run.ps_tables["misuse"] is embedding.tables["misuse"]
  with pytest.raises(ValueError, match=r"the current run already has tables named \['misuse'\]"):
    _embedding()
  with pytest.raises(RuntimeError, match="apply_gradients was called without enqueue"):
    embedding.apply_gradients({"f": tf.zeros([2, 2])})
  ids = {"f": tf.constant([3, 4], tf.int64)}
  embedding.enqueue(ids, training=False)
  np.testing.assert_array_equal(embedding.dequeue()["f"], np.zeros([2, 2]))
  with pytest.raises(RuntimeError, match=r"after enqueue\(training=False\)"):
    embedding.apply_gradients({"f": tf.zeros([2, 2])})
  embedding.enqueue(ids, training=True)
  with pytest.raises(ValueError, match=r"Found gradient of shape \(3, 2\) at path f"):
    embedding.apply_gradients({"f": tf.zeros([3, 2])})
  embedding.apply_gradients({"f": tf.ones([2, 2])})
  with pytest.raises(RuntimeError, match="called twice after one enqueue"):
    embedding.apply_gradients({"f": tf.ones([2, 2])})
  # SGD(0.1) on the zero rows of ids 3 and 4.
  embedding.enqueue(ids, training=False)
  np.testing.assert_allclose(embedding.dequeue()["f"], np.full([2, 2], -0.1))
