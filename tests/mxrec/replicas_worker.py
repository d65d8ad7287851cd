"""An mx_rec custom loop in `strategy.run` with 2 replicas and with one; saves both.

Run in a fresh process (logical CPU devices must be set before TensorFlow
initializes them): `python replicas_worker.py OUT.npz`. FeatureSpecs and
get_asc_insert_func insert each global batch once in the dataset;
`replicas.distribute_dataset` gives each replica its part; inside
`strategy.run` sparse_lookup reads it and a lazy Adam hash optimizer and a
Keras SGD train. The same loop runs under a MirroredStrategy over two logical
CPUs and under no strategy; the test compares losses, rows by key, Adam slots
and the dense kernel.
"""

import sys

import numpy as np
import tensorflow as tf

CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

# pylint: disable=wrong-import-position
from mxrec_pipeline.core import lookup  # noqa: E402
from mxrec_pipeline.core.asc import replicas  # noqa: E402
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec  # noqa: E402
from mxrec_pipeline.core.asc.helper import get_asc_insert_func  # noqa: E402
from mxrec_pipeline.core.asc.manager import start_asc_pipeline  # noqa: E402
from mxrec_pipeline.core.embedding import create_table, sparse_lookup  # noqa: E402
from mxrec_pipeline.optimizers.lazy_adam import create_hash_optimizer  # noqa: E402
from mxrec_pipeline.util import initialize  # noqa: E402

GLOBAL_BATCH, STEPS, DIM = 8, 6, 4


def make_arrays() -> dict:
  """STEPS global batches: user [1], item [1] and a 3-item history per example, a label."""
  rng = np.random.RandomState(0)
  n = GLOBAL_BATCH * STEPS
  return {
      "user": rng.randint(0, 6, [n, 1]).astype(np.int64),
      "item": rng.randint(100, 120,
                          [n, 1]).astype(np.int64), "history": rng.randint(100, 120,
                                                                           [n, 3]).astype(np.int64),
      "label": rng.normal(size=[n]).astype(np.float32)
  }


def constant(seed, rows):
  values = np.random.RandomState(seed).uniform(-0.5, 0.5, [rows, DIM]).astype(np.float32)
  return lambda shape, dtype: tf.constant(values, dtype)


def train(strategy) -> dict:
  """Losses and final state of STEPS steps of the loop under `strategy`."""
  initialize.init()
  with strategy.scope():
    user = create_table(tf.int64, DIM, "user", emb_initializer=constant(1, 16),
                        device_vocabulary_size=16)
    item = create_table(tf.int64, DIM, "item", emb_initializer=constant(2, 64),
                        device_vocabulary_size=64)
    kernel = tf.Variable(np.random.RandomState(3).normal(size=[3 * DIM, 1]).astype(np.float32))
    dense_optimizer = tf.keras.optimizers.SGD(0.1)
    sparse_optimizer = create_hash_optimizer(learning_rate=0.05)
  specs = [
      FeatureSpec("user"),
      FeatureSpec("item"),
      FeatureSpec("history", table_name="item"),
  ]
  dataset = tf.data.Dataset.from_tensor_slices(make_arrays()).batch(GLOBAL_BATCH).map(
      get_asc_insert_func(specs, is_training=True))
  start_asc_pipeline()
  iterator = iter(replicas.distribute_dataset(strategy, dataset, specs))

  def replica_step(batch):
    with tf.GradientTape() as tape:
      embedded = [
          tf.reduce_mean(sparse_lookup(table, spec, batch=batch, send_count=64), axis=1)
          for table, spec in zip((user, item, item), specs)
      ]
      prediction = tf.squeeze(tf.matmul(tf.concat(embedded, axis=1), kernel), 1)
      loss = tf.reduce_sum(tf.square(prediction - batch["label"])) / GLOBAL_BATCH
    kernel_grad, *table_grads = tape.gradient(loss, [kernel, user.variable, item.variable])
    dense_optimizer.apply_gradients([(kernel_grad, kernel)])
    sparse_optimizer.apply_gradients(zip(table_grads, [user.variable, item.variable]))
    return loss

  @tf.function
  def step():
    losses = strategy.run(replica_step, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

  out = {"losses": np.array([float(step()) for _ in range(STEPS)]), "kernel": kernel.numpy()}
  for table in (user, item):
    keys, rows = table.key_index.export()
    order = np.argsort(keys.numpy())
    rows = tf.constant(rows.numpy()[order])
    out[f"{table.table_name}_keys"] = keys.numpy()[order]
    out[f"{table.table_name}_rows"] = lookup.unique_embeddings(table, rows, training=False).numpy()
    for slot in ("m", "v"):
      values = sparse_optimizer.get_slot(table.table_name, slot)
      out[f"{table.table_name}_{slot}"] = tf.gather(values, rows).numpy()
  initialize.terminate_config_initializer()
  return out


def main(path):
  mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  two = train(mirrored)
  with tf.device("/cpu:0"):
    one = train(tf.distribute.get_strategy())
  np.savez(path, **{f"two_{k}": v for k, v in two.items()},
           **{f"one_{k}": v for k, v in one.items()})


if __name__ == "__main__":
  main(sys.argv[1])
