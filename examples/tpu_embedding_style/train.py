"""The TPUEmbedding docs' training_step / evaluation_step loop, on the sparse core.

A listwise ranker on MovieLens-100k. Two features share the "movie" table: the
listed movies (a sequence feature) and the user's earlier movies (a bag,
mean-combined); the user id has its own table with its own optimizer. Apart
from the import (`tf.tpu.experimental.embedding` -> `mxrec_pipeline.embedding`)
and the strategy (TPUStrategy -> MirroredStrategy), the loop is the one of
tf.tpu.experimental.embedding.TPUEmbedding's docstring.

Run (about a minute on 2 CPU cores):
  python examples/tpu_embedding_style/train.py [--epochs 2] [--replicas 2] [--seed 0]
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import tensorflow as tf
import tensorflow_ranking as tfr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402  pylint: disable=wrong-import-position

# The one changed import; was: tpu_embedding = tf.tpu.experimental.embedding
from mxrec_pipeline import embedding as tpu_embedding  # noqa: E402

DIM = 16
METRICS = {"ndcg@1": 1, "ndcg@5": 5, "ndcg@10": 10}


def make_strategy(replicas: int) -> tf.distribute.Strategy:
  """MirroredStrategy over `replicas` logical CPUs (or every GPU)."""
  if replicas > 1 and not tf.config.list_physical_devices("GPU"):
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu,
                                               [tf.config.LogicalDeviceConfiguration()] * replicas)
  return tf.distribute.MirroredStrategy()


class Ranker(tf.keras.Model):
  """Scores each listed movie from the user, history and movie embeddings and its statistics.

  Call with `activations` (the embeddings: user_id [B, DIM], history [B, DIM],
  item_id [B, L, DIM]) and `dense` (item_mean_rating, item_rating_count and
  neighbor_rating_deviation, [B, L] float32 each; data.py); returns [B, L]
  float32 logits: a DNN over [user, history, history * movie, statistics]
  plus a linear term in the statistics (the wide part of Wide & Deep, Cheng et
  al., DLRS 2016). The movie embedding enters only through its product with
  the history: fed in alone it memorizes each movie's training ratings, which
  the leave-one-out statistics leave out, and the ranker fell below the
  item-mean baseline.
  """

  def __init__(self):
    super().__init__()
    self.hidden = [
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(32, activation="relu")
    ]
    self.score = tf.keras.layers.Dense(1)
    self.wide = tf.keras.layers.Dense(1, use_bias=False)  # linear in the statistics

  def call(self, activations, dense):
    item = activations["item_id"]  # [B, L, DIM]
    context = tf.concat([activations["user_id"], activations["history"]], -1)
    context = tf.tile(context[:, None, :], [1, tf.shape(item)[1], 1])
    statistics = tf.stack(
        [(dense["item_mean_rating"] - 3.0) / 2.0,
         tf.math.log1p(dense["item_rating_count"]) / 6.0, dense["neighbor_rating_deviation"] / 2.0],
        -1)  # [B, L, 3]
    x = tf.concat([context, context[..., DIM:] * item, statistics], -1)  # history . movie
    for layer in self.hidden:
      x = layer(x)
    return tf.squeeze(self.score(x) + self.wide(statistics), -1)  # [B, L]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--batch-size", type=int, default=32, help="lists per global batch")
  parser.add_argument("--replicas", type=int, default=1)
  parser.add_argument("--embedding-lr", type=float, default=0.001)
  parser.add_argument("--dense-lr", type=float, default=0.001)
  parser.add_argument("--model-dir", default="/tmp/tpu_embedding_style")
  parser.add_argument("--seed", type=int, default=0, help="seed of the model and the shuffling")
  args = parser.parse_args()
  strategy = make_strategy(args.replicas)
  tf.keras.utils.set_random_seed(args.seed)
  train_lists, valid_lists, mean_rating = data.load()

  # ---- As in the TPUEmbedding docs: tables, features, the embedding object. ----
  movie = tpu_embedding.TableConfig(vocabulary_size=2_000, dim=DIM, combiner="mean", name="movie")
  user = tpu_embedding.TableConfig(vocabulary_size=1_000, dim=DIM, name="user",
                                   optimizer=tpu_embedding.Adagrad(0.005))
  feature_config = {
      "user_id": tpu_embedding.FeatureConfig(table=user),
      "item_id": tpu_embedding.FeatureConfig(table=movie, max_sequence_length=data.LIST_SIZE),
      "history": tpu_embedding.FeatureConfig(table=movie)
  }
  with strategy.scope():
    embedding = tpu_embedding.TPUEmbedding(feature_config=feature_config,
                                           optimizer=tpu_embedding.Adam(args.embedding_lr))
    model = Ranker()
    optimizer = tf.keras.optimizers.Adam(args.dense_lr)
    metrics = {name: tfr.keras.metrics.NDCGMetric(topn=k) for name, k in METRICS.items()}
  loss_fn = tfr.keras.losses.PairwiseLogisticLoss(lambda_weight=tfr.keras.losses.NDCGLambdaWeight(),
                                                  reduction=tf.keras.losses.Reduction.NONE)

  options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
  train_iterator = iter(
      strategy.experimental_distribute_dataset(
          data.dataset(train_lists, args.batch_size, training=True, seed=args.seed),
          options=options))
  steps_per_epoch = len(train_lists["labels"]) // args.batch_size
  eval_steps = math.ceil(len(valid_lists["labels"]) / (2 * args.batch_size))

  @tf.function
  def training_step(dataset_iterator, num_steps):

    def tpu_step(tpu_features):
      dense, labels = tpu_features
      with tf.GradientTape() as tape:
        activations = embedding.dequeue()
        tape.watch(activations)
        model_output = model(activations, dense)
        loss = tf.reduce_sum(loss_fn(labels, model_output)) / args.batch_size
      embedding_gradients, model_gradients = tape.gradient(loss,
                                                           [activations, model.trainable_variables])
      embedding.apply_gradients(embedding_gradients)
      optimizer.apply_gradients(zip(model_gradients, model.trainable_variables))
      return loss

    total = 0.0
    for _ in tf.range(num_steps):
      embedding_features, tpu_features = next(dataset_iterator)
      embedding.enqueue(embedding_features, training=True)
      losses = strategy.run(tpu_step, args=(tpu_features,))
      total += strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
    return total / tf.cast(num_steps, tf.float32)

  @tf.function
  def evaluation_step(dataset_iterator, num_steps):

    def tpu_step(tpu_features):
      dense, labels = tpu_features
      activations = embedding.dequeue()
      model_output = model(activations, dense)
      for metric in metrics.values():
        metric.update_state(labels, model_output)

    for _ in tf.range(num_steps):
      embedding_features, tpu_features = next(dataset_iterator)
      embedding.enqueue(embedding_features, training=False)
      strategy.run(tpu_step, args=(tpu_features,))

  def evaluate():
    for metric in metrics.values():
      metric.reset_state()
    valid = data.dataset(valid_lists, 2 * args.batch_size, training=False)
    evaluation_step(iter(strategy.experimental_distribute_dataset(valid, options=options)),
                    tf.constant(eval_steps))
    return {name: float(metric.result()) for name, metric in metrics.items()}

  print(f"{strategy.num_replicas_in_sync} replica(s); {len(train_lists['labels'])} training "
        f"lists, {len(valid_lists['labels'])} validation lists of up to {data.LIST_SIZE} movies")
  start = time.time()
  for epoch in range(args.epochs):
    loss = float(training_step(train_iterator, tf.constant(steps_per_epoch)))
    scores = evaluate()
    print(f"epoch {epoch + 1}: loss {loss:.4f}  " +
          "  ".join(f"{name} {value:.4f}" for name, value in scores.items()) +
          f"  ({time.time() - start:.0f} s)")

  checkpoint = tf.train.Checkpoint(model=model, embedding=embedding)
  path = checkpoint.save(os.path.join(args.model_dir, "ckpt"))
  print(f"checkpoint (tables, key indexes, slots, model): {path}")
  print("baseline (mean training rating of each movie): " + "  ".join(
      f"{name} {value:.4f}" for name, value in baseline(valid_lists, mean_rating).items()))


def baseline(valid_lists: dict, mean_rating: dict) -> dict:
  """The validation metrics of scoring each movie by its mean training rating."""
  default = float(np.mean(list(mean_rating.values())))
  scores = np.full(valid_lists["labels"].shape, -1e9, np.float32)
  for i, items in enumerate(valid_lists["item_id"]):
    scores[i, :len(items)] = [mean_rating.get(item, default) for item in items]
  out = {}
  for name, k in METRICS.items():
    metric = tfr.keras.metrics.NDCGMetric(topn=k)
    metric.update_state(valid_lists["labels"], scores)
    out[name] = float(metric.result())
  return out


if __name__ == "__main__":
  main()
