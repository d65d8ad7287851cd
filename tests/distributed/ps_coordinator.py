"""Coordinator (chief) of the parameter-server tests: trains the toy table, writes what it learned.

Usage: ps_coordinator.py OUT.npz STEPS [--local]

With TF_CONFIG (a chief task of a cluster with ps and worker tasks running
mxrec_pipeline.cluster.ps_server) it trains through ParameterServerStrategy +
ClusterCoordinator.schedule; with --local it trains the same PSShardedTable as
one shard in this process. The toy model is distributed_testlib's ids and
labels (batch s % CYCLE at step s) with score = sum(emb * W), loss = sum of
squared errors / batch, lazy Adam on the table. OUT.npz gets per shard its
keys, values, m and v, the loss of every step (in step order) and steps/s of
the training loop.
"""

import sys
import time

import numpy as np
import tensorflow as tf

import distributed_testlib as lib
from mxrec_pipeline import ops
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.optimizers import lazy_adam

LEARNING_RATE = 0.05
W = np.linspace(0.5, 1.5, lib.DIM).astype(np.float32)
INITIAL = 0.1  # Every row's initial value.
CYCLE = 4  # Step s trains distributed_testlib.batch(s % CYCLE): the loss of a batch falls.


def main(out: str, steps: int, local: bool) -> None:
  ops.load()
  if local:
    strategy, coordinator = None, None
  else:
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  optimizer = lazy_adam.create_hash_optimizer(LEARNING_RATE)
  initializer = tf.keras.initializers.Constant(INITIAL)
  table = ps_table.PSShardedTable(strategy, name=lib.TABLE, dim=lib.DIM, rows_per_shard=lib.ROWS,
                                  optimizer=optimizer, emb_initializer=initializer)
  w = tf.constant(W)

  @tf.function
  def train_step(ids, labels):
    with tf.GradientTape() as tape:
      emb = table.lookup(ids)
      scores = tf.reduce_sum(emb * w, axis=[1, 2])
      loss = tf.reduce_sum(tf.square(scores - labels)) / lib.GLOBAL_BATCH
    table.apply_gradients(tape.gradient(loss, table.shard_variables))
    return loss

  batches = [lib.batch(step % CYCLE) for step in range(steps)]
  start = time.perf_counter()
  if coordinator is None:
    losses = [float(train_step(ids, labels)) for ids, labels in batches]
  else:
    results = [coordinator.schedule(train_step, args=(ids, labels)) for ids, labels in batches]
    coordinator.join()
    losses = [float(r.fetch()) for r in results]
  steps_per_s = steps / (time.perf_counter() - start)
  arrays = {
      "losses": np.array(losses), "steps_per_s": np.array(steps_per_s),
      "num_shards": np.array(table.num_shards), "step": np.array(int(table.step.numpy()))
  }
  for i in range(table.num_shards):
    for name, value in table.export_shard(i).items():
      arrays[f"shard{i}_{name}"] = value
  np.savez(out, **arrays)
  print(f"ps_coordinator: {steps} steps, {steps_per_s:.1f} steps/s", flush=True)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), "--local" in sys.argv[3:])
