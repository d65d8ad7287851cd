"""Coordinator (chief) of the API-on-parameter-servers tests: ps_coordinator's toy model written
with mx_rec's calls (distributed/ps_mxrec.py) or TPUEmbedding's (distributed/ps_embedding.py).

Usage: ps_api_coordinator.py OUT.npz STEPS [--local] [--api mxrec|embedding]

With TF_CONFIG (a chief task of a cluster whose ps and worker tasks run
mxrec_pipeline.cluster.ps_server) the steps are scheduled with
ClusterCoordinator.schedule; with --local every table is one shard in this
process.
  mxrec: init(), ps_mxrec.create_table, sparse_lookup (tensor ids),
    ps_mxrec.apply_gradients with lazy Adam; an SGD bias created in the
    strategy's scope.
  embedding: PSEmbedding with features (FEATURES) "item" (ragged, the item
    table, mean), "history" (ragged, the item table again) and "user" (dense,
    the user table, its own SGD); Adam on the item table.
OUT.npz gets the loss of every step, the bias (mxrec) and per table and shard
its keys, values and slots ("<table>/shard<i>_<name>") and step count
("<table>/step").
"""

import argparse
import os

import numpy as np
import tensorflow as tf

import distributed_testlib as lib
import ps_coordinator
from mxrec_pipeline import embedding as tpu_embedding
from mxrec_pipeline import ops
from mxrec_pipeline.cluster import reach
from mxrec_pipeline.cluster import tf_config
from mxrec_pipeline.distributed import ps_embedding
from mxrec_pipeline.distributed import ps_mxrec
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init
from mxrec_pipeline.util.initialize import terminate_config_initializer

# Not ps_coordinator's names: tests in one process share the local key indexes.
TABLE, ITEM_TABLE, USER_TABLE = "mx_item", "tpu_item", "tpu_user"
SEND_COUNT = lib.GLOBAL_BATCH * lib.IDS_PER_EXAMPLE
USER_LEARNING_RATE = 0.1


def features_of(step: int) -> tuple[dict, np.ndarray]:
  """The embedding API's features of batch `step % CYCLE` and its labels."""
  ids, labels = lib.batch(step % ps_coordinator.CYCLE)
  return {
      "item": tf.RaggedTensor.from_tensor(tf.constant(ids)),
      "history": tf.RaggedTensor.from_tensor(tf.constant(ids[:, 1:])),
      "user": tf.constant(lib.second_table_ids(ids[:, 0])),
  }, labels


def feature_config() -> dict:
  constant = tf.keras.initializers.Constant(ps_coordinator.INITIAL)
  item = tpu_embedding.TableConfig(vocabulary_size=lib.ROWS, dim=lib.DIM, initializer=constant,
                                   name=ITEM_TABLE)
  user = tpu_embedding.TableConfig(vocabulary_size=lib.ROWS, dim=lib.DIM, initializer=constant,
                                   name=USER_TABLE,
                                   optimizer=tpu_embedding.SGD(learning_rate=USER_LEARNING_RATE))
  return {
      "item": tpu_embedding.FeatureConfig(table=item),
      "history": tpu_embedding.FeatureConfig(table=item),
      "user": tpu_embedding.FeatureConfig(table=user)
  }


def global_optimizer() -> tpu_embedding.Adam:
  return tpu_embedding.Adam(learning_rate=ps_coordinator.LEARNING_RATE)


def embedding_loss(activations: dict, labels) -> tf.Tensor:
  """Squared error of score = sum over features of sum(activation * W), / batch."""
  w = tf.constant(ps_coordinator.W)
  scores = tf.add_n([tf.reduce_sum(activations[f] * w, axis=-1) for f in sorted(activations)])
  return tf.reduce_sum(tf.square(scores - labels)) / lib.GLOBAL_BATCH


def embedding_train_step(embedding):
  """TPUEmbedding's training step (enqueue, dequeue, apply_gradients) of `embedding`."""

  @tf.function
  def train_step(features, labels):
    embedding.enqueue(features, training=True)
    with tf.GradientTape() as tape:
      activations = embedding.dequeue()
      tape.watch(activations)
      loss = embedding_loss(activations, labels)
    embedding.apply_gradients(tape.gradient(loss, activations))
    return loss

  return train_step


def _mxrec(strategy):
  """(train_step, batches, tables, extra arrays) of the mx_rec loop."""
  sparse_optimizer = lazy_adam.create_hash_optimizer(learning_rate=ps_coordinator.LEARNING_RATE)
  table = ps_mxrec.create_table(
      strategy, key_dtype=tf.int64, dim=tf.TensorShape([lib.DIM]), name=TABLE,
      emb_initializer=tf.keras.initializers.Constant(ps_coordinator.INITIAL),
      device_vocabulary_size=lib.ROWS, optimizer_list=[sparse_optimizer])
  if strategy is None:
    bias = tf.Variable(0.0, name="bias")
  else:
    with strategy.scope():
      bias = tf.Variable(0.0, name="bias")
  w = tf.constant(ps_coordinator.W)

  @tf.function
  def train_step(ids, labels):
    with tf.GradientTape() as tape:
      emb = ps_mxrec.sparse_lookup(table, ids, send_count=SEND_COUNT, name="item_lookup")
      scores = tf.reduce_sum(emb * w, axis=[1, 2]) + bias
      loss = tf.reduce_sum(tf.square(scores - labels)) / lib.GLOBAL_BATCH
    *table_grads, bias_grad = tape.gradient(loss, [*table.shard_variables, bias])
    ps_mxrec.apply_gradients(sparse_optimizer, [(table_grads, table)])
    bias.assign_sub(ps_coordinator.BIAS_LEARNING_RATE * bias_grad)
    return loss

  def batch(step):
    return tuple(map(tf.constant, lib.batch(step % ps_coordinator.CYCLE)))

  return train_step, batch, [table], lambda: {"bias": bias.numpy()}


def _embedding(strategy):
  """(train_step, batches, tables, extra arrays) of the TPUEmbedding-style loop."""
  embedding = ps_embedding.PSEmbedding(strategy, feature_config(), global_optimizer())
  train_step = embedding_train_step(embedding)

  def batch(step):
    features, labels = features_of(step)
    return features, tf.constant(labels)

  return train_step, batch, list(embedding.tables.values()), dict


def main(out: str, steps: int, local: bool = False, api: str = "mxrec") -> None:
  ops.load()
  if local:
    strategy, coordinator = None, None
  else:
    reach.wait_for_tasks(tf_config.parse(os.environ[tf_config.ENV_VAR]), timeout_s=30)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  init()
  try:
    train_step, batch, tables, extra = {"mxrec": _mxrec, "embedding": _embedding}[api](strategy)
    batches = [batch(s) for s in range(steps)]
    if coordinator is None:
      losses = [float(train_step(*b)) for b in batches]
    else:
      results = [coordinator.schedule(train_step, args=b) for b in batches]
      coordinator.join()
      losses = [float(r.fetch()) for r in results]
    arrays = {"losses": np.array(losses), **extra()}
    for table in tables:
      arrays[f"{table.table_name}/step"] = np.array(int(table.step.numpy()))
      arrays[f"{table.table_name}/num_shards"] = np.array(table.num_shards)
      for i in range(table.num_shards):
        for name, value in table.export_shard(i).items():
          arrays[f"{table.table_name}/shard{i}_{name}"] = value
    np.savez(out, **arrays)
  finally:
    terminate_config_initializer()


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("out")
  parser.add_argument("steps", type=int)
  parser.add_argument("--local", action="store_true")
  parser.add_argument("--api", choices=["mxrec", "embedding"], default="mxrec")
  a = parser.parse_args()
  main(a.out, a.steps, a.local, a.api)
