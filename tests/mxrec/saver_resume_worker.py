"""An mx_rec-API training script (TF1 session) that resumes from its latest checkpoint.

  python saver_resume_worker.py MODEL_DIR OUT_JSON [--steps N] [--save-every K]
      [--kill-after S] [--access-threshold T] [--drained-saves]

The quick start's shape on synthetic data: FeatureSpecs, get_asc_insert_func
in the dataset with prefetch, two tables, sparse_lookup, dense Adam and lazy
Adam, the sparse `mxrec_pipeline.saver` Saver every K steps. Batch i (0-based)
is a function of i alone. When MODEL_DIR holds a checkpoint, the run restores
it and reads its global step g: g batches were trained, so the dataset skips
them, `skip(g)` before the insert map (skipped batches insert nothing), and
training continues to step N.

With --kill-after S the process SIGKILLs itself after step S (after that
step's save, if any). With --drained-saves the iterator is bounded at every
save step (re-initialized to the next K batches after it): insertion, which
prefetch runs ahead of training, has then inserted no batch past the save, so
the checkpoint's admission counters are exact. Without it the iterator runs
over all remaining batches at once.

Writes OUT_JSON: the losses of the steps this process trained, the global
step, and per table the sorted keys with their rows, rows' values, lazy Adam
slots and the pending (not yet admitted) keys' counts; every other variable by
name.
"""

import argparse
import json
import os
import signal
import sys

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.core.asc.manager import start_asc_pipeline
from mxrec_pipeline.core.embedding import create_table, sparse_lookup
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.saver.saver import Saver
from mxrec_pipeline.util.initialize import init, terminate_config_initializer
from mxrec_pipeline.util.variable import get_dense_and_sparse_variable

SEED = 7
BATCH_SIZE, DIM = 8, 4
# Per table: feature, ids per sample, id range.
TABLES = {"user_table": ("user_ids", 1, 40), "item_table": ("item_ids", 2, 90)}


def make_batch(step):
  """Batch `step`: user_ids [8, 1], item_ids [8, 2] int64 (skewed to low ids), labels [8, 1]."""
  batch = {}
  for i, (feature, width, id_range) in enumerate(TABLES.values()):
    u = tf.random.stateless_uniform([BATCH_SIZE, width], seed=tf.stack([step, i]))
    batch[feature] = tf.cast(u * u * id_range, tf.int64)  # Low ids often, high ones rarely.
  batch["label"] = tf.cast(
      tf.random.stateless_uniform([BATCH_SIZE, 1], seed=tf.stack([step, 9])) > 0.5, tf.float32)
  return batch


def build(steps: int, access_threshold: int | None):
  """The graph.

  Returns:
    (placeholders (first batch, count), iterator, loss, train_op, tables, optimizer).
  """
  specs = [
      FeatureSpec(feature, table_name=name, access_threshold=access_threshold)
      for name, (feature, _, _) in TABLES.items()
  ]
  first = tf.compat.v1.placeholder(tf.int64, [], name="first_batch")
  count = tf.compat.v1.placeholder(tf.int64, [], name="num_batches")
  dataset = tf.data.Dataset.range(steps).map(make_batch)
  # Already trained batches are skipped BEFORE insertion: they insert nothing.
  dataset = dataset.skip(first).take(count)
  dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True)).prefetch(2)
  iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
  batch = iterator.get_next()
  tables = [
      create_table(
          key_dtype=tf.int64, dim=DIM, name=name,
          emb_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=SEED + i),
          device_vocabulary_size=128) for i, name in enumerate(TABLES)
  ]
  embeddings = [
      tf.reduce_sum(sparse_lookup(table, spec, batch=batch), axis=1)
      for table, spec in zip(tables, specs)
  ]
  net = tf.compat.v1.layers.dense(
      tf.concat(embeddings, -1), 8, activation=tf.nn.relu, name="hidden",
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=SEED))
  logits = tf.compat.v1.layers.dense(
      net, 1, name="logits",
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=SEED + 1))
  loss = tf.reduce_mean(
      tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"], logits=logits))
  dense_variables, sparse_variables = get_dense_and_sparse_variable()
  global_step = tf.compat.v1.train.get_or_create_global_step()
  sparse_optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.05)
  train_op = tf.group(
      tf.compat.v1.train.AdamOptimizer(0.01).apply_gradients(
          zip(tf.gradients(loss, dense_variables), dense_variables)),
      sparse_optimizer.apply_gradients(zip(tf.gradients(loss, sparse_variables), sparse_variables),
                                       global_step=global_step))
  return (first, count), iterator, loss, train_op, tables, sparse_optimizer


def state_fetches(tables, optimizer) -> dict:
  """Tensors of the final state (see the module docstring), by name."""
  fetches, sparse = {}, set()
  for table in tables:
    name = table.table_name
    slots = {slot: optimizer.get_slot(name, slot) for slot in ("m", "v")}
    sparse |= {id(table.variable)} | {id(v) for v in slots.values()}
    fetches[name] = {
        "index": table.key_index.export_state(), "variable": table.variable.value(),
        "slots": {slot: v.value() for slot, v in slots.items()},
        "stats": admission.table_stats(table)
    }
  fetches["variables"] = {
      v.op.name: v.value() for v in tf.compat.v1.global_variables() if id(v) not in sparse
  }
  return fetches


def to_json(fetched: dict, tables) -> dict:
  """The fetched state with keys sorted, rows and slots gathered in key order."""
  out = {
      "variables": {name: np.asarray(v).tolist() for name, v in fetched["variables"].items()},
      "tables": {}
  }
  for table in tables:
    part = fetched[table.table_name]
    index = part["index"]
    order = np.argsort(index["keys"])
    rows = index["rows"][order]
    pending = np.argsort(index["pending_keys"])
    out["tables"][table.table_name] = {
        "keys": index["keys"][order].tolist(), "rows": rows.tolist(), "values": part["variable"]
                                                                                [rows].tolist(),
        "slots": {slot: v[rows].tolist() for slot, v in part["slots"].items()},
        "pending_keys": index["pending_keys"][pending].tolist(),
        "pending_counts": index["pending_counts"]
                          [pending].tolist(), "stats": {k: int(v) for k, v in part["stats"].items()}
    }
  return out


def main() -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("model_dir")
  parser.add_argument("out_json")
  parser.add_argument("--steps", type=int, default=24)
  parser.add_argument("--save-every", type=int, default=6)
  parser.add_argument("--kill-after", type=int)
  parser.add_argument("--access-threshold", type=int)
  parser.add_argument("--drained-saves", action="store_true")
  parser.add_argument("--plain-saver", action="store_true",
                      help="tf.compat.v1.train.Saver: also saves the admission counters")
  args = parser.parse_args()

  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.set_random_seed(SEED)
  init(train_steps=args.steps)
  (first, count), iterator, loss, train_op, tables, optimizer = build(args.steps,
                                                                      args.access_threshold)
  fetches = state_fetches(tables, optimizer)
  saver = (tf.compat.v1.train.Saver if args.plain_saver else Saver)(max_to_keep=None)
  start_asc_pipeline()

  def start_batches(step: int) -> None:
    """(Re-)initializes the iterator at batch `step`, up to the next save (drained) or the end."""
    end = args.steps
    if args.drained_saves:
      end = min(end, (step // args.save_every + 1) * args.save_every)
    sess.run(iterator.initializer, {first: step, count: end - step})

  losses = {}
  with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    latest = tf.train.latest_checkpoint(args.model_dir)
    start = 0
    if latest:
      saver.restore(sess, latest)
      start = int(sess.run(tf.compat.v1.train.get_global_step()))
      print(f"resumed from {latest} at step {start}", flush=True)
    start_batches(start)
    for step in range(start + 1, args.steps + 1):
      losses[step], _ = sess.run([loss, train_op])
      if step % args.save_every == 0:
        saver.save(sess, os.path.join(args.model_dir, "model"), global_step=step)
        if args.drained_saves and step < args.steps:
          start_batches(step)
      if step == args.kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
    out = to_json(sess.run(fetches), tables)
  terminate_config_initializer()
  out["losses"] = {str(step): float(value) for step, value in losses.items()}
  out["start"] = start
  with open(args.out_json, "w", encoding="utf-8") as f:
    json.dump(out, f)
  return 0


if __name__ == "__main__":
  sys.exit(main())
