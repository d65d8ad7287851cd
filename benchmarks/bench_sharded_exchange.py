"""Benchmark of a sharded table's exchange: bytes per step per worker, measured and by formula.

Starts `--workers` processes on localhost (TF_CONFIG on free ports,
MultiWorkerMirroredStrategy, one replica each), each training a synthetic job:
`--batch` examples per worker of `--ids` Zipf(`--zipf`) ids among `--keys`
keys, one ShardedTable of `--dim` float32 columns (`--routing`), lazy Adam, score = sum of
the embeddings, squared error. Each worker prints, over the steps after the
first (tracing), its bytes received per step from the exchange's collectives
(`ShardedTable.exchange_stats`: ids, rows, gradients), the formula
`exchange.bytes_per_step_formula` at its measured mean distinct ids per step,
its examples/s, and the collective ops one training step runs, by type (the
Collective* ops of the traced step's graph and the functions it calls: each
one a round of messages between the workers). With `--tables N` every step
looks up N such tables (table t on ids + t * keys), each with its own
exchange, or with `--grouped` all in one `sharded_table.lookup_tables` call
(one exchange for the all-to-all routing); bytes and formula summed over the
tables.

Usage:
  python benchmarks/bench_sharded_exchange.py --workers 2
  python benchmarks/bench_sharded_exchange.py --workers 2 --routing all_to_all
  python benchmarks/bench_sharded_exchange.py --workers 1 --batch 512 --dim 32
  python benchmarks/bench_sharded_exchange.py --workers 2 --routing all_to_all --tables 4 --grouped
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np


def _worker(args) -> None:
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  from mxrec_pipeline.distributed import exchange  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import sharded_table  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.optimizers import lazy_adam  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.util import initialize  # pylint: disable=import-outside-toplevel

  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  initialize.init()
  tables = [
      sharded_table.ShardedTable(strategy, name=f"item{t}", dim=args.dim,
                                 device_vocabulary_size=args.keys,
                                 emb_initializer=tf.keras.initializers.Constant(0.01),
                                 routing=args.routing) for t in range(args.tables)
  ]
  table = tables[0]
  optimizer = lazy_adam.create_hash_optimizer(0.01)
  global_batch = args.batch * table.num_shards

  def step_fn(ids, labels):
    # Table t reads ids + t * keys: the same distribution, other keys.
    lookups = [(t, ids + i * args.keys) for i, t in enumerate(tables)]
    with tf.GradientTape() as tape:
      if args.grouped:
        rows = sharded_table.lookup_tables(lookups)
      else:
        rows = [t.lookup(t_ids) for t, t_ids in lookups]
      scores = tf.add_n([tf.reduce_sum(r, axis=[1, 2]) for r in rows])
      loss = tf.reduce_sum(tf.square(scores - labels)) / global_batch
    return loss, tape.gradient(loss, [t.variable for t in tables])

  @tf.function
  def train_step(ids, labels):
    loss, grads = strategy.run(step_fn, (ids, labels))
    sharded_table.apply_gradients(optimizer, list(zip(grads, tables)))
    return loss

  def exchanged():
    return np.sum([list(t.exchange_stats().values()) for t in tables], axis=0)

  rng = np.random.default_rng(table.shard_id)
  batches = [(np.minimum(rng.zipf(args.zipf, (args.batch, args.ids)), args.keys).astype(np.int64),
              rng.normal(size=args.batch).astype(np.float32)) for _ in range(args.steps + 1)]
  train_step(*batches[0])  # Traces.
  collectives = _collective_ops(train_step.get_concrete_function(*map(tf.constant, batches[0])))
  before = exchanged()
  start = time.perf_counter()
  for ids, labels in batches[1:]:
    train_step(ids, labels)
  seconds = time.perf_counter() - start
  per_step = (exchanged() - before) / args.steps
  distinct = np.mean([np.unique(ids).size for ids, _ in batches[1:]])  # Per table.
  print(
      json.dumps({
          "worker": table.shard_id,
          "workers": table.num_shards,
          "distinct_ids_per_step": distinct,
          "measured_bytes_per_step": dict(zip(("ids", "rows", "gradients"), per_step.tolist())),
          "measured_total": float(per_step.sum()),
          "routing": args.routing,
          "tables": args.tables,
          "grouped": args.grouped,
          "formula_total": args.tables * exchange.bytes_per_step_formula(
              distinct, args.dim, table.num_shards, routing=args.routing),
          "examples_per_s": args.batch * args.steps / seconds,
          "collectives_per_step": collectives,
          "collectives_total": sum(collectives.values()),
      }))


def _collective_ops(concrete) -> dict[str, int]:
  """Collective op types -> their count in a concrete function's graph and its library."""
  graph_def = concrete.graph.as_graph_def()
  nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
  counts: dict[str, int] = {}
  for node in nodes:
    if node.op.startswith("Collective"):
      counts[node.op] = counts.get(node.op, 0) + 1
  return dict(sorted(counts.items()))


def _launch(args) -> None:
  sockets = [socket.socket() for _ in range(args.workers)]
  for s in sockets:
    s.bind(("localhost", 0))
  hosts = [f"localhost:{s.getsockname()[1]}" for s in sockets]
  for s in sockets:
    s.close()
  processes = []
  try:
    for i in range(args.workers):
      config = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}}
      env = dict(os.environ, TF_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="2")
      processes.append(
          subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]], env=env))
    for p in processes:
      if p.wait(timeout=args.timeout_s) != 0:
        raise SystemExit(f"a worker failed (exit {p.returncode})")
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--batch", type=int, default=256, help="examples per worker and step")
  parser.add_argument("--ids", type=int, default=8, help="ids per example")
  parser.add_argument("--dim", type=int, default=16)
  parser.add_argument("--keys", type=int, default=100_000)
  parser.add_argument("--zipf", type=float, default=1.2)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--routing", default="all_gather", choices=("all_gather", "all_to_all"))
  parser.add_argument("--tables", type=int, default=1, help="tables, each looked up every step")
  parser.add_argument("--grouped", action="store_true",
                      help="look the tables up in one sharded_table.lookup_tables call")
  parser.add_argument("--timeout_s", type=float, default=600)
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    _worker(args)
  else:
    _launch(args)


if __name__ == "__main__":
  main()
