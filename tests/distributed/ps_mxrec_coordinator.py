"""Coordinator (chief) of the mx_rec-API-on-parameter-servers tests: ps_coordinator's toy model
written with mx_rec's calls (distributed/ps_mxrec.py).

Usage: ps_mxrec_coordinator.py OUT.npz STEPS [--local]

With TF_CONFIG (a chief task of a cluster whose ps and worker tasks run
mxrec_pipeline.cluster.ps_server) it runs init(), ps_mxrec.create_table,
ps_mxrec.sparse_lookup and ps_mxrec.apply_gradients in steps scheduled with
ClusterCoordinator.schedule; with --local the same table is one shard in this
process. OUT.npz gets the loss of every step, the dense bias, the table's
step count and per shard its keys, values, m and v.
"""

import argparse
import os

import numpy as np
import tensorflow as tf

import distributed_testlib as lib
import ps_coordinator
from mxrec_pipeline import ops
from mxrec_pipeline.cluster import reach
from mxrec_pipeline.cluster import tf_config
from mxrec_pipeline.distributed import ps_mxrec
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init
from mxrec_pipeline.util.initialize import terminate_config_initializer

TABLE = "mx_item"  # Not ps_coordinator's name: tests in one process share the local key index.
SEND_COUNT = lib.GLOBAL_BATCH * lib.IDS_PER_EXAMPLE


def main(out: str, steps: int, local: bool = False) -> None:
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

    batches = [tuple(map(tf.constant, lib.batch(s % ps_coordinator.CYCLE))) for s in range(steps)]
    if coordinator is None:
      losses = [float(train_step(*batch)) for batch in batches]
    else:
      results = [coordinator.schedule(train_step, args=batch) for batch in batches]
      coordinator.join()
      losses = [float(r.fetch()) for r in results]
    arrays = {
        "losses": np.array(losses), "bias": bias.numpy(), "num_shards": np.array(table.num_shards),
        "step": np.array(int(table.step.numpy()))
    }
    for i in range(table.num_shards):
      for name, value in table.export_shard(i).items():
        arrays[f"shard{i}_{name}"] = value
    np.savez(out, **arrays)
  finally:
    terminate_config_initializer()


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("out")
  parser.add_argument("steps", type=int)
  parser.add_argument("--local", action="store_true")
  a = parser.parse_args()
  main(a.out, a.steps, a.local)
