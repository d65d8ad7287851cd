"""The ops of a training lookup and update, alone: the dedup read against the per-id read.

On bench_sparse_core's step shape (the ids of its first training step: 4096 x
16, 24k distinct; rows of a [5M, 64] table), each op group in its own
tf.function, median wall time of `--calls` calls:

  forward, dedup read:    gather(gather(variable, unique_rows), restore)
  forward, per-id read:   gather(variable, gather(unique_rows, restore))
  backward of the dedup read: unsorted_segment_sum(grad, restore, num_unique)
  backward of the training read (core/restore_sum.py): MxSumByRestore, the
    same sum by restore index on TF's intra-op threads
  MxLazyAdamRows on the distinct rows (the dedup read's gradient)
  MxLazyAdamRows on every id's row (the per-id read's gradient: the op sums
    the repeated rows itself)
  tf.unique + unsorted_segment_sum of every id's row (what the TF-op
    optimizer path adds for the per-id read)

core/lookup.py's `id_embeddings` in training is the dedup read with the
MxSumByRestore gradient, outside training (flat tables) the per-id read;
benchmarks/HISTORY.md ("Each id's row read from the table", "Gradients summed by
restore index") reads the figures.

Usage:
  python benchmarks/bench_lookup_ops.py [--calls 30]   # ~1 minute, 4 GB of RAM
"""

from __future__ import annotations

import argparse
import statistics
import time

import bench_sparse_core


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--calls", type=int, default=30, help="timed calls per op group")
  args = parser.parse_args(argv)

  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import ops  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core import restore_sum  # pylint: disable=import-outside-toplevel

  sizes = bench_sparse_core.FULL
  per_step = sizes.batch_size * sizes.ids_per_example
  steps = sizes.sparse_warmup_steps + sizes.sparse_steps
  # bench_sparse_core's ids (child_gen_ids), of its first step.
  ids = bench_sparse_core.zipf_keys(np.random.default_rng(bench_sparse_core.SEED + 1),
                                    steps * per_step, sizes.step_key_space)[:per_step]
  distinct, positions = np.unique(ids, return_inverse=True)
  rng = np.random.RandomState(bench_sparse_core.SEED)
  rows, dim = sizes.table_rows, sizes.dim
  unique_rows = tf.constant(rng.choice(rows, distinct.size, replace=False).astype(np.int64))
  restore = tf.constant(positions.astype(np.int32))
  variable = tf.Variable(tf.random.uniform([rows, dim], -0.05, 0.05, seed=1))
  m = tf.Variable(tf.zeros([rows, dim]))
  v = tf.Variable(tf.zeros([rows, dim]))
  grad = tf.random.normal([per_step, dim], seed=1)
  id_rows = tf.gather(unique_rows, restore)

  def adam(rows, values):
    ops.load().mx_lazy_adam_rows(variable.handle, m.handle, v.handle, rows, values, 1e-3, 0.9,
                                 0.999, 1e-8)
    return tf.constant(0.0)

  groups = {
      "forward, dedup read": lambda: tf.gather(tf.gather(variable, unique_rows), restore)[0, 0],
      "forward, per-id read": lambda: tf.gather(variable, tf.gather(unique_rows, restore))[0, 0],
      "backward of the dedup read (segment sum)": lambda: tf.math.unsorted_segment_sum(
          grad, restore, distinct.size)[0, 0],
      "backward of the training read (MxSumByRestore)": lambda: restore_sum.sum_by_restore(
          grad, restore, distinct.size)[0, 0],
      "MxLazyAdamRows, distinct rows": lambda: adam(unique_rows, grad[:distinct.size]),
      "MxLazyAdamRows, every id's row": lambda: adam(id_rows, grad),
      "tf.unique + segment sum of every id's row": lambda: tf.math.unsorted_segment_sum(
          grad,
          tf.unique(id_rows)[1], distinct.size)[0, 0],
  }
  print(f"{ids.size} ids, {distinct.size} distinct; table [{rows}, {dim}]; median of "
        f"{args.calls} calls; load average {open('/proc/loadavg').read().split()[0]}")
  for name, fn in groups.items():
    fn = tf.function(fn)
    for _ in range(3):
      fn().numpy()
    seconds = []
    for _ in range(args.calls):
      start = time.perf_counter()
      fn().numpy()
      seconds.append(time.perf_counter() - start)
    print(f"  {name:48s} {1000 * statistics.median(seconds):7.2f} ms  "
          f"(min {1000 * min(seconds):.2f})")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
