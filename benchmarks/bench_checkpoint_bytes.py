"""Benchmark of a one-host checkpoint's bytes: what format 3 saves against the capacity.

A one-host table of `--capacity` rows x dim 64 holding `--keys` keys (random
rows and optimizer slots) is saved two ways in the same run, for each hash
optimizer (lazy Adam, Adagrad, FTRL, SGD):

- format 3 (today): the table's bundle in `shards-N`, as a one-host
  TrainingCheckpoint saves a flat table (distributed/checkpoint.save_shard:
  the used keys, their rows, slots and key state);
- format 2 (before issue #31's compact saves): a tf.train.Checkpoint of the
  rows variable, the optimizer (slots, step count) and the key index, as
  keras/checkpoints.training_checkpoint saved them inside `ckpt-N`.

Printed per optimizer: the bytes of each (data and index files), the bound
the issue sets, used keys x (row + slots + key state: key, row, last-seen
time, 8 bytes each), and the ratios format 3 / bound (goal <= 1.1) and
format 2 / format 3. The dense model is not here: it is saved the same way
by both (tens of KB for the shipped configs).

Usage:
  python benchmarks/bench_checkpoint_bytes.py                       # 1M rows, 100k keys
  python benchmarks/bench_checkpoint_bytes.py --capacity 200000 --keys 20000
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.optimizers import factory
from mxrec_pipeline.util import initialize

DIM = 64
KEY_STATE_BYTES = 3 * 8  # key, row, last-seen time
OPTIMIZERS = ("lazy_adam", "adagrad", "ftrl", "sgd")


def _bytes(prefix: str) -> int:
  return sum(os.path.getsize(p) for p in tf.io.gfile.glob(prefix + ".*"))


def measure(optimizer_name: str, capacity: int, keys: int, directory: str) -> dict:
  """Bytes of one table's format-3 bundle and format-2 checkpoint (a fresh init() each)."""
  initialize.init()
  try:
    table = embedding.create_table(tf.int64, DIM, "item", tf.keras.initializers.Zeros(),
                                   device_vocabulary_size=capacity)
    optimizer = factory.get_optimizer(optimizer_name, 0.01)
    optimizer.build([table.variable])
    rng = np.random.default_rng(0)
    table.key_index.insert(
        tf.constant(rng.choice(1 << 40, size=keys, replace=False).astype(np.int64)), training=True)
    slots = table.slot_variables(optimizer)
    for variable in [table.variable, *slots.values()]:
      variable.assign(rng.standard_normal(variable.shape, np.float32))
    bundle = checkpoint.save_shard(os.path.join(directory, optimizer_name), table, [optimizer])
    old = tf.train.Checkpoint(rows=table.variable, sparse_optimizer=optimizer,
                              key_index=table.key_index)
    old_prefix = old.write(os.path.join(directory, optimizer_name, "format2"))
    bound = keys * ((1 + len(slots)) * DIM * 4 + KEY_STATE_BYTES)
    return {
        "optimizer": optimizer_name, "format3": _bytes(bundle), "format2": _bytes(old_prefix),
        "bound": bound
    }
  finally:
    initialize.terminate_config_initializer()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--capacity", type=int, default=1_000_000, help="rows of the table")
  parser.add_argument("--keys", type=int, default=100_000, help="keys it holds")
  args = parser.parse_args(argv)
  print(f"one-host table: {args.capacity:,} rows x dim {DIM}, {args.keys:,} keys")
  print(f"{'optimizer':<10}{'format 3 MB':>13}{'bound MB':>10}{'3 / bound':>11}"
        f"{'format 2 MB':>13}{'2 / 3':>8}")
  with tempfile.TemporaryDirectory() as directory:
    for name in OPTIMIZERS:
      row = measure(name, args.capacity, args.keys, directory)
      print(
          f"{name:<10}{row['format3'] / 1e6:>13.2f}{row['bound'] / 1e6:>10.2f}"
          f"{row['format3'] / row['bound']:>10.3f}x{row['format2'] / 1e6:>13.2f}"
          f"{row['format2'] / row['format3']:>7.1f}x", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
