"""Benchmark of delta checkpoints (distributed/delta.py) against full saves, in one run.

A one-host table of `--keys` keys x dim 64 with lazy Adam (random rows and
slots) is saved in full, starting a chain. Then `--deltas` intervals each
train a Zipf stream (exponent 1.1 over the keys' ranks) of batches of 4,096
ids until about `--touched` of the keys were seen, with real lazy Adam
steps, each followed by a delta save. Printed:

- a delta's bytes and save seconds against the full save's (goals: bytes
  <= 3 %, save >= 20x faster), per delta and their mean;
- restoring the full save plus every delta (restore_chain) against one full
  save taken at the last delta's step (seconds, and that they are equal);
- the key index's insertion (the only part of a step change tracking
  touches) and a whole lazy Adam step (insertion, gather, update), with
  tracking on and off: medians of `--batches` batches on two tables of the
  same keys, alternated (goal for a step <= 3 %); and the index's bytes per
  key both ways (KeyIndex.memory_bytes).

Usage:
  python benchmarks/bench_delta.py                      # 1M keys, ~2 minutes
  python benchmarks/bench_delta.py --keys 5000000       # the issue's size (~4 GB of rows and slots)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import delta
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util import initialize

DIM, BATCH, TABLE = 64, 4096, "item"


def _bytes(directory: str) -> int:
  return sum(
      os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(directory)
      for f in files)


def _zipf_batch(rng, keys: np.ndarray) -> np.ndarray:
  ranks = (rng.zipf(1.1, BATCH) - 1) % keys.size
  return keys[ranks]


def _table(capacity: int):
  table = embedding.create_table(tf.int64, DIM, TABLE, tf.keras.initializers.Zeros(),
                                 device_vocabulary_size=capacity)
  optimizer = lazy_adam.create_hash_optimizer(0.001)
  optimizer.build([table.variable])
  return table, optimizer


def _step(table, optimizer, ids: np.ndarray) -> None:
  """A lazy Adam step on the rows of `ids` (gradient: the rows themselves)."""
  rows, _, _ = table.key_index.insert(tf.constant(ids), training=True)
  grads = tf.IndexedSlices(
      tf.gather(table.variable, rows) * 0.01, rows, tf.constant(table.variable.shape, tf.int64))
  optimizer.apply_gradients([(grads, table.variable)])


def _timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def run(args) -> None:
  rng = np.random.default_rng(0)
  keys = rng.choice(1 << 40, size=args.keys, replace=False).astype(np.int64)
  with tempfile.TemporaryDirectory() as directory:
    initialize.init()
    try:
      table, optimizer = _table(args.keys)
      for start in range(0, keys.size, 1 << 16):
        table.key_index.insert(tf.constant(keys[start:start + (1 << 16)]), training=True)
      table.variable.assign(rng.standard_normal(table.variable.shape, np.float32))
      for variable in table.slot_variables(optimizer).values():  # v >= 0, as Adam's.
        variable.assign(np.abs(rng.standard_normal(variable.shape, np.float32)))
      full = os.path.join(directory, "full")
      _, full_s = _timed(lambda: checkpoint.save_shard(full, table, [optimizer], start_chain=True))
      full_bytes = _bytes(full)
      print(f"table: {args.keys:,} keys x dim {DIM}, lazy Adam; full save {full_bytes / 1e6:.1f} MB"
            f" in {full_s:.2f} s")
      deltas, rows = [], []
      for i in range(args.deltas):
        seen = set()
        while len(seen) < args.touched * args.keys:
          ids = _zipf_batch(rng, keys)
          seen.update(ids.tolist())
          _step(table, optimizer, ids)
        deltas.append(os.path.join(directory, f"delta-{i}"))
        _, seconds = _timed(lambda d=deltas[-1]: delta.save_delta(d, table, [optimizer]))
        size = _bytes(deltas[-1])
        rows.append((size, seconds))
        print(
            f"delta {i + 1}: {len(seen):,} keys touched, {size / 1e6:.2f} MB "
            f"({100 * size / full_bytes:.2f} % of full), {seconds:.3f} s "
            f"({full_s / seconds:.1f}x faster)", flush=True)
      reference = os.path.join(directory, "reference")
      checkpoint.save_shard(reference, table, [optimizer])
    finally:
      initialize.terminate_config_initializer()
    mean_bytes = statistics.mean(r[0] for r in rows)
    mean_s = statistics.mean(r[1] for r in rows)
    print(f"mean delta: {100 * mean_bytes / full_bytes:.2f} % of the full save's bytes "
          f"(goal <= 3 %), saved {full_s / mean_s:.1f}x faster (goal >= 20x)")

    states = []
    for name, restore in (("full + deltas", lambda t, o: delta.restore_chain(
        full, deltas, t, [o], keep_rows=True, scratch_dir=os.path.join(directory, "scratch"))), (
            "one full save",
            lambda t, o: checkpoint.restore_shard(reference, t, [o], keep_rows=True))):
      initialize.init()
      try:
        table, optimizer = _table(args.keys)
        _, seconds = _timed(lambda t=table, o=optimizer, r=restore: r(t, o))
        state = table.key_index.export_state()
        order = np.argsort(state["keys"].numpy())
        states.append(
            (state["keys"].numpy()[order], table.variable.numpy()[state["rows"].numpy()[order]]))
        print(f"restore of {name}: {seconds:.2f} s", flush=True)
      finally:
        initialize.terminate_config_initializer()
    equal = all(np.array_equal(a, b) for a, b in zip(*states))
    print(f"restored chain equals the full save: {equal}")

  # Change tracking's cost: the key index's insertion, a whole lazy Adam step, memory.
  initialize.init()
  try:
    tables = {}
    for tracking in (False, True):
      table = embedding.create_table(tf.int64, DIM, f"{TABLE}_{tracking}",
                                     tf.keras.initializers.Zeros(),
                                     device_vocabulary_size=args.keys)
      optimizer = lazy_adam.create_hash_optimizer(0.001)
      optimizer.build([table.variable])
      for start in range(0, keys.size, 1 << 16):
        table.key_index.insert(tf.constant(keys[start:start + (1 << 16)]), training=True)
      if tracking:
        table.key_index.export_changes(clear=True)
      tables[tracking] = (table, optimizer)
    batches = [_zipf_batch(rng, keys) for _ in range(args.batches)]
    inserts, steps = {False: [], True: []}, {False: [], True: []}
    for ids in batches:  # Alternating, so that load drifts hit both alike.
      for tracking, (table, optimizer) in tables.items():
        start = time.perf_counter()
        table.key_index.insert(tf.constant(ids), training=True)[0].numpy()
        inserts[tracking].append(time.perf_counter() - start)
        start = time.perf_counter()
        _step(table, optimizer, ids)
        steps[tracking].append(time.perf_counter() - start)
    index = tables[True][0].key_index
    print(f"tracking memory: {int(index.memory_bytes()) / args.keys:.2f} B per key in all, "
          f"untracked {int(tables[False][0].key_index.memory_bytes()) / args.keys:.2f}")
    for what, samples in (("insertion of a 4096-id batch", inserts), ("lazy Adam step", steps)):
      off, on = statistics.median(samples[False]), statistics.median(samples[True])
      print(f"{what}: {1e6 * off:.0f} us untracked, {1e6 * on:.0f} us tracked "
            f"({100 * (on / off - 1):+.1f} %; goal for a step <= 3 %)")
  finally:
    initialize.terminate_config_initializer()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--keys", type=int, default=1_000_000)
  parser.add_argument("--deltas", type=int, default=10)
  parser.add_argument("--touched", type=float, default=0.01, help="fraction of keys per delta")
  parser.add_argument("--batches", type=int, default=300)
  run(parser.parse_args(argv))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
