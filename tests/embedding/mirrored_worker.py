"""Trains the TPUEmbedding docs' loop with 2 replicas and with 1; saves both states.

Run in a fresh process (logical CPU devices must be set before TensorFlow
initializes them): `python mirrored_worker.py OUT.npz`. The same global batches
go to a MirroredStrategy over two logical CPUs and to no strategy; the test
compares losses, row assignment, rows, slots and dense weights.
"""

import sys

import numpy as np
import tensorflow as tf

CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

# pylint: disable=wrong-import-position
from mxrec_pipeline import embedding as tpu_embedding
from mxrec_pipeline.util import initialize

GLOBAL_BATCH, STEPS, DIM = 8, 6, 4


def make_batches():
  """STEPS global batches: user [8, 1], item [8, 1], history ragged, tags sparse + weights."""
  rng = np.random.RandomState(0)
  batches = []
  for _ in range(STEPS):
    lengths = rng.randint(0, 4, GLOBAL_BATCH)
    history = tf.RaggedTensor.from_row_lengths(
        rng.randint(100, 120, lengths.sum()).astype(np.int64), lengths)
    tags = tf.sparse.from_dense(
        rng.randint(0, 3, [GLOBAL_BATCH, 3]).astype(np.int64) *
        rng.randint(0, 2, [GLOBAL_BATCH, 3]))
    tag_weights = tf.SparseTensor(tags.indices,
                                  rng.uniform(0.5, 2.0, tags.values.shape[0]).astype(np.float32),
                                  tags.dense_shape)
    features = {
        "user": rng.randint(0, 6, [GLOBAL_BATCH, 1]).astype(np.int64),
        "item": rng.randint(100, 120,
                            [GLOBAL_BATCH, 1]).astype(np.int64), "history": history, "tags": tags
    }
    label = rng.normal(size=[GLOBAL_BATCH]).astype(np.float32)
    batches.append(((features, {"tags": tag_weights}), label))
  return batches


def constant(seed, rows):
  values = np.random.RandomState(seed).uniform(-0.5, 0.5, [rows, DIM]).astype(np.float32)
  return lambda shape, dtype: tf.constant(values, dtype)


def train(strategy):
  """Losses and final state of STEPS steps of the TPUEmbedding docs' loop."""
  initialize.init()
  movie = tpu_embedding.TableConfig(64, DIM, initializer=constant(1, 64), name="movie",
                                    combiner="mean")
  user = tpu_embedding.TableConfig(16, DIM, initializer=constant(2, 16), name="user",
                                   optimizer=tpu_embedding.Adagrad(0.2))
  tag = tpu_embedding.TableConfig(8, DIM, initializer=constant(3, 8), name="tag", combiner="sqrtn",
                                  optimizer=tpu_embedding.SGD(0.3))
  feature_config = {
      "user": tpu_embedding.FeatureConfig(user), "item": tpu_embedding.FeatureConfig(movie),
      "history": tpu_embedding.FeatureConfig(movie), "tags": tpu_embedding.FeatureConfig(tag)
  }
  with strategy.scope():
    embedding = tpu_embedding.Embedding(feature_config, tpu_embedding.Adam(0.05))
    kernel = tf.Variable(np.random.RandomState(4).normal(size=[4 * DIM, 1]).astype(np.float32))
    dense_optimizer = tf.keras.optimizers.SGD(0.1)

  batches = make_batches()
  dataset = tf.data.Dataset.from_generator(
      lambda: iter(batches), output_signature=(({
          "user": tf.TensorSpec([GLOBAL_BATCH, 1],
                                tf.int64), "item": tf.TensorSpec([GLOBAL_BATCH, 1], tf.int64),
          "history": tf.RaggedTensorSpec([GLOBAL_BATCH, None], tf.int64),
          "tags": tf.SparseTensorSpec([GLOBAL_BATCH, 3], tf.int64)
      }, {"tags": tf.SparseTensorSpec([GLOBAL_BATCH, 3],
                                      tf.float32)}), tf.TensorSpec([GLOBAL_BATCH], tf.float32)))
  iterator = iter(
      strategy.experimental_distribute_dataset(
          dataset, options=tf.distribute.InputOptions(experimental_fetch_to_device=False)))

  @tf.function
  def training_step(dataset_iterator, num_steps):
    """The docs' loop: `num_steps` steps in one tf.while_loop; returns their losses."""

    def tpu_step(labels):
      with tf.GradientTape() as tape:
        activations = embedding.dequeue()
        tape.watch(activations)
        x = tf.concat([activations[k] for k in ("user", "item", "history", "tags")], axis=1)
        per_example = tf.square(tf.squeeze(tf.matmul(x, kernel), 1) - labels)
        loss = tf.reduce_sum(per_example) / GLOBAL_BATCH
      activation_grads, kernel_grad = tape.gradient(loss, [activations, kernel])
      embedding.apply_gradients(activation_grads)
      dense_optimizer.apply_gradients([(kernel_grad, kernel)])
      return loss

    losses = tf.TensorArray(tf.float32, size=num_steps)
    for step in tf.range(num_steps):
      (embedding_features, tag_weights), labels = next(dataset_iterator)
      weights = {"user": None, "item": None, "history": None, "tags": tag_weights["tags"]}
      embedding.enqueue(embedding_features, weights=weights, training=True)
      per_replica = strategy.run(tpu_step, args=(labels,))
      losses = losses.write(step, strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                                                  axis=None))
    return losses.stack()

  losses = training_step(iterator, tf.constant(STEPS)).numpy().tolist()
  out = {"losses": np.array(losses), "kernel": kernel.numpy()}
  for config, (keys, rows) in embedding.export_key_index().items():
    name = config.name
    out[f"{name}_keys"], out[f"{name}_rows"] = keys.numpy(), rows.numpy()
    out[f"{name}_table"] = embedding.embedding_tables[config].numpy()
  slots = {"movie": ("Adam", ["momenta", "velocities"]), "user": ("Adagrad", ["accumulators"])}
  hash_optimizers = embedding._optimizers  # pylint: disable=protected-access
  for table, (key, names) in slots.items():
    for slot in names:
      out[f"{table}_{slot}"] = hash_optimizers[key].get_slot(table, slot).numpy()
  initialize.terminate_config_initializer()
  return out


def main(path):
  mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  assert mirrored.num_replicas_in_sync == 2
  two = train(mirrored)
  with tf.device("/cpu:0"):
    one = train(tf.distribute.get_strategy())
  np.savez(path, **{f"two_{k}": v for k, v in two.items()},
           **{f"one_{k}": v for k, v in one.items()})


if __name__ == "__main__":
  main(sys.argv[1])
