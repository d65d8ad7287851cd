"""Coordinator (chief) of the parameter-server tests: trains the toy table, writes what it learned.

Usage: ps_coordinator.py OUT.npz STEPS [--local] [--restore DIR] [--save DIR] [--export DIR]
                         [--access_threshold N] [--eviction_threshold_s S]
                         [--tiers DEVICE,HOST] [--chain_at K --delta DIR]
                         [--restore_delta DIR]

With TF_CONFIG (a chief task of a cluster with ps and worker tasks running
mxrec_pipeline.cluster.ps_server) it trains through ParameterServerStrategy +
ClusterCoordinator.schedule; with --local it trains the same PSShardedTable as
one shard in this process. The toy model is distributed_testlib's ids and
labels (batch s % CYCLE at global step s) with score = sum(emb * W) + bias,
loss = sum of squared errors / batch, lazy Adam on the table, SGD on the bias
(a dense variable created in the strategy's scope). --restore starts from
a checkpoint (at its step), --save and --export write the table after
training. --access_threshold and --eviction_threshold_s give the table
admission and eviction: step s has time distributed_testlib.step_time(s) and
every step evicts after its update. --tiers makes the table tiered
(distributed/ps_tiers.py): DEVICE cache rows and HOST host rows per shard.
--chain_at K with --save and --delta: the full save (starting a chain of
delta checkpoints) after the first K steps, a delta (distributed/delta.py)
after the rest; --restore_delta restores --restore and that delta as a chain.
OUT.npz gets per shard its keys, values, m and v and its key index's state
(state_<name>, key_index.STATE_NAMES), the loss of every step (in step order)
and steps/s of the training loop.
"""

import argparse
import os
import time

import numpy as np
import tensorflow as tf

import distributed_testlib as lib
from mxrec_pipeline import ops
from mxrec_pipeline.cluster import reach
from mxrec_pipeline.cluster import tf_config
from mxrec_pipeline.core import tiers as tiers_lib
from mxrec_pipeline.distributed import delta as delta_lib
from mxrec_pipeline.distributed import ps_checkpoint
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.optimizers import lazy_adam

LEARNING_RATE = 0.05
W = np.linspace(0.5, 1.5, lib.DIM).astype(np.float32)
INITIAL = 0.1  # Every row's initial value.
CYCLE = 4  # Step s trains distributed_testlib.batch(s % CYCLE): the loss of a batch falls.
BIAS_LEARNING_RATE = 0.1  # SGD of the dense bias, a variable of the strategy (on a ps).


def main(out: str, steps: int, local: bool = False, restore: str = "", save: str = "",
         export_dir: str = "", reach_timeout_s: float = 30.0, access_threshold: int | None = None,
         eviction_threshold_s: int | None = None, tiers: str = "", chain_at: int = 0,
         delta: str = "", restore_delta: str = "") -> None:
  ops.load()
  if local:
    strategy, coordinator = None, None
  else:
    reach.wait_for_tasks(tf_config.parse(os.environ[tf_config.ENV_VAR]), timeout_s=reach_timeout_s)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  tier_config = None
  if tiers:
    device_rows, host_rows = (int(n) for n in tiers.split(","))
    tier_config = tiers_lib.TierConfig(device_rows, host_rows)
  table = ps_table.PSShardedTable(
      strategy, name=lib.TABLE, dim=lib.DIM, device_vocabulary_size=lib.ROWS
      if tier_config is None else tier_config.device_vocabulary_size,
      optimizer=lazy_adam.create_hash_optimizer(LEARNING_RATE),
      emb_initializer=tf.keras.initializers.Constant(INITIAL), access_threshold=access_threshold,
      eviction_threshold_s=eviction_threshold_s, tiers=tier_config)
  if restore_delta:
    delta_lib.restore_chain(restore, [restore_delta], table, [table.optimizer])
  elif restore:
    ps_checkpoint.restore(restore, table)
  w = tf.constant(W)
  if strategy is None:
    bias = tf.Variable(0.0, name="bias")
  else:
    with strategy.scope():  # Placed by the strategy, as any dense variable of a model.
      bias = tf.Variable(0.0, name="bias")
  checkpoint = tf.train.Checkpoint(bias=bias)
  if restore:
    checkpoint.read(os.path.join(restore_delta or restore, "dense")).assert_consumed()

  @tf.function
  def train_step(ids, labels, time):
    with tf.GradientTape() as tape:
      emb = table.lookup(ids, timestamp=time)
      scores = tf.reduce_sum(emb * w, axis=[1, 2]) + bias
      loss = tf.reduce_sum(tf.square(scores - labels)) / lib.GLOBAL_BATCH
    *table_grads, bias_grad = tape.gradient(loss, [*table.shard_variables, bias])
    update = table.apply_gradients(table_grads)
    bias.assign_sub(BIAS_LEARNING_RATE * bias_grad)
    if eviction_threshold_s is not None:
      with tf.control_dependencies([update]):
        table.evict()
    return loss

  first = int(table.step.numpy())
  batches = []
  for step in range(first, first + steps):
    ids, labels = lib.batch(step % CYCLE)
    batches.append(
        (tf.constant(ids), tf.constant(labels), tf.constant(lib.step_time(step), tf.int64)))
  print(f"ps_coordinator: training {steps} steps", flush=True)
  start = time.perf_counter()
  if chain_at:
    losses = _train(coordinator, train_step, batches[:chain_at])
    ps_checkpoint.save(save, table, start_chain=True)
    checkpoint.write(os.path.join(save, "dense"))
    losses += _train(coordinator, train_step, batches[chain_at:])
    delta_lib.save_delta(delta, table, [table.optimizer])
    checkpoint.write(os.path.join(delta, "dense"))
  else:
    losses = _train(coordinator, train_step, batches)
  steps_per_s = steps / (time.perf_counter() - start)
  if save and not chain_at:
    ps_checkpoint.save(save, table)
    checkpoint.write(os.path.join(save, "dense"))
  if export_dir:
    ps_checkpoint.snapshot_tables([table]).save(export_dir)
  arrays = {
      "losses": np.array(losses), "steps_per_s": np.array(steps_per_s),
      "num_shards": np.array(table.num_shards), "step": np.array(int(table.step.numpy())),
      "bias": bias.numpy()
  }
  for i in range(table.num_shards):
    for name, value in table.export_shard(i).items():
      arrays[f"shard{i}_{name}"] = value
    for name, value in table.key_indexes[i].export_state().items():
      arrays[f"shard{i}_state_{name}"] = value.numpy()
  np.savez(out, **arrays)
  print(f"ps_coordinator: {steps} steps, {steps_per_s:.1f} steps/s", flush=True)


def _train(coordinator, train_step, batches) -> list[float]:
  """The losses of `train_step` on `batches`, in order (scheduled on the workers, if any)."""
  if coordinator is None:
    return [float(train_step(*batch)) for batch in batches]
  try:  # schedule, join and fetch all raise a ps's loss.
    results = [coordinator.schedule(train_step, args=batch) for batch in batches]
    coordinator.join()
    return [float(r.fetch()) for r in results]
  except tf.errors.UnavailableError as e:
    lost = reach.lost_ps_error(tf_config.parse(os.environ[tf_config.ENV_VAR]), e)
    if lost is None:
      raise
    raise lost from e


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("out")
  parser.add_argument("steps", type=int)
  parser.add_argument("--local", action="store_true")
  parser.add_argument("--restore", default="")
  parser.add_argument("--save", default="")
  parser.add_argument("--export", default="")
  parser.add_argument("--reach_timeout_s", type=float, default=30.0)
  parser.add_argument("--access_threshold", type=int, default=None)
  parser.add_argument("--eviction_threshold_s", type=int, default=None)
  parser.add_argument("--tiers", default="")
  parser.add_argument("--chain_at", type=int, default=0)
  parser.add_argument("--delta", default="")
  parser.add_argument("--restore_delta", default="")
  a = parser.parse_args()
  main(a.out, a.steps, a.local, a.restore, a.save, a.export, a.reach_timeout_s, a.access_threshold,
       a.eviction_threshold_s, a.tiers, a.chain_at, a.delta, a.restore_delta)
