"""One worker of the multi-worker tests (started by distributed_testlib.run_cluster).

Trains the toy model of distributed_testlib with a ShardedTable under
MultiWorkerMirroredStrategy in a custom loop (strategy.run), and writes
this worker's shard and results to `--out` (.npz): losses, the shard's keys
and rows, the dense weights and the bytes exchanged.

Flags: --optimizer KEY, --access_threshold N (admission),
--eviction_threshold_s S (eviction after every step), --routing R
(all_gather or all_to_all), --second_table_routing R (a second table, on
other keys of the same ids, rows twice as wide, folded and added to the first's
embeddings), --grouped (both tables' lookups in one sharded_table.lookup_tables
call: the all-to-all ones share one exchange), --steps N,
--first_step N, --out PATH, --dim D (to make a worker disagree), --timeout_s S
(collective timeout), --die_at_step N (this worker exits at that step, as a
crash), --stall_at_step N (this worker stops answering at that step),
--restore DIR / --save DIR (per-shard checkpoints, distributed/checkpoint.py),
--export DIR (every worker stages its shard, the chief writes the serving
snapshot built from them, distributed/export.py), --lookups_per_group N
(all_to_all's group keys change every N lookups, as past ~11M lookups).
"""

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import distributed_testlib as lib  # noqa: E402  pylint: disable=wrong-import-position

from mxrec_pipeline.distributed import all_to_all  # noqa: E402  pylint: disable=wrong-import-position
from mxrec_pipeline.distributed import checkpoint  # noqa: E402  pylint: disable=wrong-import-position
from mxrec_pipeline.distributed import export  # noqa: E402  pylint: disable=wrong-import-position
from mxrec_pipeline.distributed import sharded_table  # noqa: E402  pylint: disable=wrong-import-position
from mxrec_pipeline.keras import table_checkpoints  # noqa: E402  pylint: disable=wrong-import-position
from mxrec_pipeline.optimizers import factory  # noqa: E402  pylint: disable=wrong-import-position
from mxrec_pipeline.util import initialize  # noqa: E402  pylint: disable=wrong-import-position


def second_table_state(tables) -> dict:
  """The second table's keys and rows (keys2, rows2), if any."""
  if len(tables) < 2:
    return {}
  keys, rows = tables[1].shard.key_index.export()
  return {"keys2": keys.numpy(), "rows2": tf.gather(tables[1].variable, rows).numpy()}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--optimizer", default="lazy_adam")
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--out", required=True)
  parser.add_argument("--dim", type=int, default=lib.DIM)
  parser.add_argument("--timeout_s", type=float, default=60)
  parser.add_argument("--die_at_step", type=int, default=-1)
  parser.add_argument("--stall_at_step", type=int, default=-1)
  parser.add_argument("--restore", default="")
  parser.add_argument("--save", default="")
  parser.add_argument("--first_step", type=int, default=0)
  parser.add_argument("--export", default="")
  parser.add_argument("--access_threshold", type=int, default=None)
  parser.add_argument("--eviction_threshold_s", type=int, default=None)
  parser.add_argument("--routing", default="all_gather")
  parser.add_argument("--second_table_routing", default="")
  parser.add_argument("--grouped", action="store_true")
  parser.add_argument("--lookups_per_group", type=int, default=None)
  args = parser.parse_args()
  if args.lookups_per_group:  # All-to-alls move to the next group key this often.
    all_to_all.LOOKUPS_PER_GROUP = args.lookups_per_group

  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      communication_options=tf.distribute.experimental.CommunicationOptions(
          timeout_seconds=args.timeout_s))
  initialize.init()
  table = sharded_table.ShardedTable(strategy, name=lib.TABLE, dim=args.dim,
                                     device_vocabulary_size=lib.ROWS,
                                     emb_initializer=lib.initializer(),
                                     access_threshold=args.access_threshold,
                                     eviction_threshold_s=args.eviction_threshold_s,
                                     routing=args.routing, collective_timeout_s=args.timeout_s)
  tables = [table]
  if args.second_table_routing:
    tables.append(
        sharded_table.ShardedTable(strategy, name=lib.SECOND_TABLE, dim=2 * args.dim,
                                   device_vocabulary_size=lib.ROWS,
                                   emb_initializer=lib.initializer(),
                                   routing=args.second_table_routing,
                                   collective_timeout_s=args.timeout_s))
  optimizer = factory.get_optimizer(args.optimizer, **lib.OPTIMIZERS[args.optimizer])
  with strategy.scope():
    dense = lib.make_dense()
    dense_opt = lib.dense_optimizer()
    dense_opt.build(list(dense))  # Its slots exist before a restore.
  dense_checkpoint = tf.train.Checkpoint(w=dense[0], b=dense[1], optimizer=dense_opt)
  if args.restore:
    checkpoint.restore_shard(args.restore, table, [optimizer])
    dense_checkpoint.read(os.path.join(args.restore, "dense-0")).assert_consumed()

  def step_fn(ids, labels, timestamp):
    with tf.GradientTape() as tape:
      if args.grouped:
        emb, second = sharded_table.lookup_tables([(table, ids),
                                                   (tables[1], lib.second_table_ids(ids))],
                                                  timestamp=timestamp)
        emb += lib.fold_second(second)
      else:
        emb = table.lookup(ids, timestamp=timestamp)
        for second in tables[1:]:
          emb += lib.fold_second(second.lookup(lib.second_table_ids(ids)))
      loss = lib.loss_of(emb, labels, dense)
    grads = tape.gradient(loss, [*dense, *[t.variable for t in tables]])
    dense_opt.apply_gradients(zip(grads[:2], dense))
    return loss, grads[2:]

  @tf.function
  def train_step(ids, labels, timestamp):
    loss, table_grads = strategy.run(step_fn, (ids, labels, timestamp))
    sharded_table.apply_gradients(optimizer, list(zip(table_grads, tables)))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

  losses = []
  for step in range(args.first_step, args.first_step + args.steps):
    if step == args.die_at_step:
      os._exit(3)  # A crash: no cleanup, no goodbye to the other workers.
    if step == args.stall_at_step:
      time.sleep(600)  # A hung worker, alive but silent (the test kills it).
    ids, labels = lib.worker_slice(step, table.shard_id, table.num_shards)
    # Workers' clocks differ: the owners keep the largest, the global batch's time.
    timestamp = tf.constant(lib.step_time(step) - table.shard_id, tf.int64)
    losses.append(float(train_step(tf.constant(ids), tf.constant(labels), timestamp)))
    if args.eviction_threshold_s is not None:
      table.evict([optimizer])
  if args.save:
    checkpoint.save_shard(args.save, table, [optimizer])
    dense_checkpoint.write(os.path.join(args.save, f"dense-{table.shard_id}"))
  if args.export:  # Every worker stages its shard; the chief reads them and writes.
    staging = args.export + ".staging"
    snapshot = export.table_snapshot(table, staging, lambda: table_checkpoints.barrier(strategy),
                                     chunk_rows=2)
    if snapshot is not None:
      export.TableSnapshot({lib.TABLE: (tf.int64, snapshot)}).save(args.export)
      export.remove_staging(staging)
  keys, rows = table.shard.key_index.export()
  stats = table.exchange_stats()
  # Evaluation lookups (after the counted training ones): each worker asks
  # trained ids of both shards and ids never seen, which read the default.
  eval_ids = lib.eval_ids(table.shard_id)
  eval_fn = tf.function(lambda ids: strategy.run(
      lambda i: table.lookup(i, training=False, default_value=lib.EVAL_DEFAULT), (ids,)))
  eval_emb = eval_fn(tf.constant(eval_ids)).numpy()
  np.savez(args.out, losses=np.array(losses), keys=keys.numpy(),
           rows=tf.gather(table.variable, rows).numpy(), w=dense[0].numpy(), b=dense[1].numpy(),
           shard=table.shard_id, bytes=np.array([stats["ids"], stats["rows"], stats["gradients"]]),
           eval_ids=eval_ids, eval_emb=eval_emb, **second_table_state(tables))


if __name__ == "__main__":
  faulthandler.enable()  # A crash inside TF prints the Python stacks to the log.
  try:
    main()
  except Exception as e:  # pylint: disable=broad-except
    # The test reads the error from here (its type and message), not from logs.
    out = sys.argv[sys.argv.index("--out") + 1]
    with open(out + ".error.json", "w", encoding="utf-8") as f:
      json.dump({"type": type(e).__name__, "message": str(e)}, f)
    traceback.print_exc()
    sys.stdout.flush()
    # TF 2.15 may crash while tearing down aborted collectives at exit: skip it.
    os._exit(1)
