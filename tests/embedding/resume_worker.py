"""A TPUEmbedding-style training loop that resumes from its latest checkpoint.

  python resume_worker.py MODEL_DIR OUT_JSON [--steps N] [--save-every K] [--kill-after S]

enqueue / dequeue / apply_gradients in a tf.function step, a Keras model with
Adam, and tf.train.Checkpoint(model=..., embedding=..., optimizer=..., step=...)
saved by a CheckpointManager every K steps. Batch i (0-based) is a function of
i alone; a run that finds a checkpoint restores it, skips the `step` batches it
trained (`dataset.skip(step)`; ids are inserted by `enqueue`, so skipped
batches insert nothing) and trains to step N. With --kill-after S the process
SIGKILLs itself after step S (after that step's save, if any).

Writes OUT_JSON: the losses of the steps this process trained, the restored
step, per table the sorted keys with their rows, rows' values and optimizer
slots, and the model's and optimizer's variables.
"""

import argparse
import json
import os
import signal
import sys

import numpy as np
import tensorflow as tf

from mxrec_pipeline import embedding as tpu_embedding

BATCH_SIZE, DIM = 8, 4


def make_batch(step):
  """Batch `step`: (user [8, 1], items ragged [8, (0..3)] int64), labels [8] float32."""
  seed = tf.stack([step, tf.constant(0, tf.int64)])
  user = tf.random.stateless_uniform([BATCH_SIZE, 1], seed, maxval=30, dtype=tf.int64)
  lengths = tf.random.stateless_uniform([BATCH_SIZE], seed + 1, maxval=4, dtype=tf.int64)
  items = tf.random.stateless_uniform([tf.reduce_sum(lengths)], seed + 2, maxval=60, dtype=tf.int64)
  labels = tf.random.stateless_normal([BATCH_SIZE], seed + 3)
  return {"user": user, "items": tf.RaggedTensor.from_row_lengths(items, lengths)}, labels


def main() -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("model_dir")
  parser.add_argument("out_json")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--save-every", type=int, default=5)
  parser.add_argument("--kill-after", type=int)
  args = parser.parse_args()
  tf.keras.utils.set_random_seed(3)

  user = tpu_embedding.TableConfig(64, DIM, name="user", optimizer=tpu_embedding.Adagrad(0.1))
  item = tpu_embedding.TableConfig(128, DIM, name="item", combiner="mean")
  embedding = tpu_embedding.Embedding(
      {"user": tpu_embedding.FeatureConfig(user), "items": tpu_embedding.FeatureConfig(item)},
      optimizer=tpu_embedding.Adam(0.05))
  model = tf.keras.Sequential(
      [tf.keras.layers.Dense(8, activation="relu"),
       tf.keras.layers.Dense(1)])
  optimizer = tf.keras.optimizers.Adam(0.01)
  step = tf.Variable(0, dtype=tf.int64, name="step")
  checkpoint = tf.train.Checkpoint(model=model, embedding=embedding, optimizer=optimizer, step=step)
  model.build([None, 2 * DIM])  # Restored at once, even if no step is left to train.
  optimizer.build(model.trainable_variables)
  manager = tf.train.CheckpointManager(checkpoint, args.model_dir, max_to_keep=None)
  if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint)
    print(f"resumed from {manager.latest_checkpoint} at step {int(step)}", flush=True)
  start = int(step)
  # The trained batches are skipped before enqueue inserts their ids.
  dataset = tf.data.Dataset.range(args.steps).map(make_batch).skip(start).prefetch(2)

  @tf.function
  def training_step(features, labels):
    embedding.enqueue(features, training=True)
    with tf.GradientTape() as tape:
      activations = embedding.dequeue()
      tape.watch(activations)
      x = tf.concat([activations["user"], activations["items"]], -1)
      loss = tf.reduce_mean(tf.square(tf.squeeze(model(x), -1) - labels))
    embedding_gradients, model_gradients = tape.gradient(loss,
                                                         [activations, model.trainable_variables])
    embedding.apply_gradients(embedding_gradients)
    optimizer.apply_gradients(zip(model_gradients, model.trainable_variables))
    step.assign_add(1)
    return loss

  losses = {}
  for features, labels in dataset:
    loss = training_step(features, labels)
    done = int(step)
    losses[str(done)] = float(loss)
    if done % args.save_every == 0:
      manager.save(checkpoint_number=done)
    if done == args.kill_after:
      os.kill(os.getpid(), signal.SIGKILL)

  tables = {}
  for config, (keys, rows) in embedding.export_key_index().items():
    order = np.argsort(keys.numpy())
    rows = rows.numpy()[order]
    variables = {"values": embedding.embedding_tables[config]}
    for optimizer_name, hash_optimizer in embedding._optimizers.items():  # pylint: disable=protected-access
      for slot in hash_optimizer.slot_initial_values:
        try:
          variables[f"{optimizer_name}/{slot}"] = hash_optimizer.get_slot(config.name, slot)
        except KeyError:  # This optimizer does not train this table.
          pass
    tables[config.name] = {
        "keys": keys.numpy()[order].tolist(), "rows": rows.tolist(),
        **{name: v.numpy()[rows].tolist() for name, v in variables.items()}
    }
  out = {
      "start": start, "losses": losses, "tables": tables,
      "variables": {v.name: v.numpy().tolist() for v in model.variables + optimizer.variables}
  }
  with open(args.out_json, "w", encoding="utf-8") as f:
    json.dump(out, f)
  return 0


if __name__ == "__main__":
  sys.exit(main())
