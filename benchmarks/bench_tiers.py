"""Benchmark of tiered tables: training throughput with a small device cache.

Generated ids, Zipf(1.05) over 50M keys, dim 32, batches of 4096 examples x 16
ids, lazy Adam. One run trains the same id stream:

  all-on-device   a flat table holding every distinct id of the stream (U);
  cache 10%       device_vocabulary_size = 10% of U, host_vocabulary_size = U;
  cache 1%        device_vocabulary_size = 1% of U, host_vocabulary_size = U;
  cache 10% + SSD host_vocabulary_size = 10% of U, ssd_vocabulary_size = U
                  (with --ssd; the oldest host rows spill to a temp directory).

Every variant inserts in tf.data (get_asc_insert_func, the key process, which
plans the device cache), prefetches, and trains with a tf.function step
(sparse_lookup of a FeatureSpec, a linear scorer, lazy Adam). Throughput is
training steps per second over the timed steps after a warm-up; the ratio
tiered / all-on-device is printed next to the goal (>= 0.6 at 10%), with the
ratio of process CPU time per step (less sensitive to other load). Also
printed: the device cache's hit rate over the timed steps and bytes per key in
each tier (device: rows and Adam slots; host and SSD: the store's bytes per
row; the key index's bytes per key).

Usage:
  python benchmarks/bench_tiers.py            # full: 400 steps per variant, ~10 min
  python benchmarks/bench_tiers.py --quick    # smoke run, ~1 min
  python benchmarks/bench_tiers.py --ssd      # also the SSD variant
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tensorflow as tf  # pylint: disable=wrong-import-position

from mxrec_pipeline.core import initializers  # pylint: disable=wrong-import-position
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec  # pylint: disable=wrong-import-position
from mxrec_pipeline.core.asc.helper import get_asc_insert_func  # pylint: disable=wrong-import-position
from mxrec_pipeline.core.embedding import create_table, sparse_lookup  # pylint: disable=wrong-import-position
from mxrec_pipeline.optimizers import lazy_adam  # pylint: disable=wrong-import-position
from mxrec_pipeline.util import initialize  # pylint: disable=wrong-import-position

GOAL_10 = 0.6
ZIPF_A = 1.05
KEY_MULTIPLIER = 0x9E3779B97F4A7C15 % 2**61  # Spreads ranks over the int64 range.
SEED = 20261122


def zipf_batches(num_keys: int, steps: int, batch_size: int, ids_per_example: int,
                 seed: int) -> list[np.ndarray]:
  """[steps] int64 arrays [batch_size, ids_per_example] of Zipf(ZIPF_A) keys.

  Rank r in [1, num_keys] has probability proportional to r^-ZIPF_A (inverse
  CDF sampling over the exact truncated distribution); the key of rank r is
  r * KEY_MULTIPLIER mod 2^61, so hot keys are not neighbours.
  """
  cdf = np.cumsum(np.arange(1, num_keys + 1, dtype=np.float64)**-ZIPF_A)
  cdf /= cdf[-1]
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(steps):
    ranks = np.searchsorted(cdf, rng.random(batch_size * ids_per_example)).astype(np.uint64) + 1
    keys = (ranks * np.uint64(KEY_MULTIPLIER)) % np.uint64(2**61)
    out.append(keys.astype(np.int64).reshape(batch_size, ids_per_example))
  del cdf
  return out


def train(name: str, batches, dim: int, warmup: int, prefetch: int, **table_args) -> dict:
  """Trains one variant on `batches`; returns its figures."""
  initialize.init()
  optimizer = lazy_adam.create_hash_optimizer(0.001)
  tiered = table_args.get("host_vocabulary_size", 0) > 0
  table = create_table(tf.int64, dim, "ids",
                       initializers.RowInitializer("truncated_normal", stddev=0.01, seed=1),
                       optimizer_list=[optimizer] if tiered else None, **table_args)
  spec = FeatureSpec("ids", table_name="ids")
  batch_size, width = batches[0].shape
  dataset = tf.data.Dataset.from_generator(
      lambda: iter(batches), output_signature=tf.TensorSpec([batch_size, width], tf.int64))
  dataset = dataset.map(lambda ids: {"ids": ids, "label": tf.cast(ids[:, 0] % 2, tf.float32)})
  dataset = dataset.map(get_asc_insert_func([spec], is_training=True)).prefetch(prefetch)
  weights = tf.Variable(tf.ones([dim]) / dim)

  @tf.function
  def step(batch):
    with tf.GradientTape() as tape:
      emb = sparse_lookup(table, spec, batch=batch)
      logits = tf.reduce_sum(tf.reduce_mean(emb, axis=1) * weights, axis=-1)
      loss = tf.reduce_mean(tf.square(logits - batch["label"]))
    grad = tape.gradient(loss, table.variable)
    optimizer.apply_gradients([(grad, table.variable)])
    return loss

  stats_before = None
  iterator = iter(dataset)
  for i, batch in enumerate(iterator):
    if i == warmup:
      if tiered:
        stats_before = {k: int(v) for k, v in table.tiers.stats().items()}
      load_before = os.getloadavg()[0]
      start, cpu_start = time.perf_counter(), time.process_time()
    loss = step(batch)
  float(loss)  # Waits for the last step.
  seconds = time.perf_counter() - start
  cpu_seconds = time.process_time() - cpu_start
  timed = len(batches) - warmup
  result = {
      "name": name, "steps_per_s": timed / seconds, "seconds": seconds,
      "cpu_ms_per_step": 1000 * cpu_seconds / timed, "load": (load_before, os.getloadavg()[0]),
      "device_rows": table.device_vocabulary_size, "loss": float(loss)
  }
  index_bytes = int(table.key_index.memory_bytes())
  keys = int(table.key_index.size())
  result["index_bytes_per_key"] = index_bytes / max(keys, 1)
  result["device_bytes_per_row"] = dim * 4 * 3  # embedding + Adam m, v
  if tiered:
    stats = {k: int(v) for k, v in table.tiers.stats().items()}
    hits = stats["hits"] - stats_before["hits"]
    misses = stats["misses"] - stats_before["misses"]
    result["hit_rate"] = hits / max(hits + misses, 1)
    result["host_rows"] = stats["host_rows_used"]
    result["ssd_rows"] = stats["ssd_rows_used"]
    result["host_bytes_per_row"] = stats["host_bytes"] / max(stats["host_rows_used"], 1)
    result["ssd_bytes_per_row"] = stats["ssd_bytes"] / max(stats["ssd_rows_used"], 1)
    result["swap_ins_per_step"] = (stats["swap_ins"] - stats_before["swap_ins"]) / timed
  initialize.terminate_config_initializer()
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small smoke run")
  parser.add_argument("--ssd", action="store_true", help="also the cache 10%% + SSD variant")
  parser.add_argument("--steps", type=int, default=None, help="steps per variant")
  parser.add_argument("--prefetch", type=int, default=2, help="tf.data prefetch depth")
  args = parser.parse_args(argv)
  num_keys, batch_size, width, dim = 50_000_000, 4096, 16, 32
  steps = args.steps or (60 if args.quick else 400)
  warmup = max(steps // 4, 5)
  if args.quick:
    num_keys, batch_size = 5_000_000, 1024
  print(
      f"ids: Zipf({ZIPF_A}) over {num_keys:,} keys, batch {batch_size} x {width}, dim {dim}, "
      f"{steps} steps per variant ({warmup} warm-up), prefetch {args.prefetch}", flush=True)
  t0 = time.perf_counter()
  batches = zipf_batches(num_keys, steps, batch_size, width, SEED)
  unique = len(np.unique(np.concatenate([b.ravel() for b in batches])))
  per_batch = int(np.mean([len(np.unique(b)) for b in batches[:10]]))
  print(
      f"generated in {time.perf_counter() - t0:.1f} s: {unique:,} distinct ids (U), "
      f"~{per_batch:,} distinct per batch", flush=True)

  variants = [("all-on-device", dict(device_vocabulary_size=unique)),
              ("cache 10%",
               dict(device_vocabulary_size=math.ceil(0.10 * unique), host_vocabulary_size=unique)),
              ("cache 1%",
               dict(device_vocabulary_size=math.ceil(0.01 * unique), host_vocabulary_size=unique))]
  ssd_dir = None
  if args.ssd:
    ssd_dir = tempfile.mkdtemp(prefix="mxrec-bench-ssd-")
    variants.append(("cache 10% + SSD",
                     dict(device_vocabulary_size=math.ceil(0.10 * unique),
                          host_vocabulary_size=math.ceil(0.10 * unique), ssd_vocabulary_size=unique,
                          ssd_data_path=[ssd_dir])))
  results = []
  for name, table_args in variants:
    if table_args["device_vocabulary_size"] < 2 * per_batch:
      print(
          f"{name}: device cache of {table_args['device_vocabulary_size']:,} rows holds fewer "
          f"than two batches' distinct ids ({per_batch:,} each): the planner waits for each "
          "step (no overlap)", flush=True)
    result = train(name, batches, dim, warmup, args.prefetch, **table_args)
    results.append(result)
    print(
        f"{name}: {result['steps_per_s']:.2f} steps/s "
        f"({result['steps_per_s'] * batch_size:,.0f} examples/s)" +
        (f", hit rate {result['hit_rate']:.3f}, {result['swap_ins_per_step']:,.0f} "
         "swap-ins/step" if "hit_rate" in result else ""), flush=True)
  if ssd_dir:
    os.rmdir(ssd_dir)

  base = results[0]["steps_per_s"]
  base_cpu = results[0]["cpu_ms_per_step"]
  print("\nvariant           device rows   steps/s   ratio  CPU ms/step  CPU ratio  hit rate"
        "   B/key: device  host   SSD  index   load")
  for r in results:
    print(f"{r['name']:<16} {r['device_rows']:>12,} {r['steps_per_s']:>9.2f} "
          f"{r['steps_per_s'] / base:>7.2f} {r['cpu_ms_per_step']:>12.1f} "
          f"{base_cpu / r['cpu_ms_per_step']:>10.2f} {r.get('hit_rate', 1.0):>9.3f} "
          f"{r['device_bytes_per_row']:>15.0f} {r.get('host_bytes_per_row', 0):>5.0f} "
          f"{r.get('ssd_bytes_per_row', 0):>5.0f} {r['index_bytes_per_key']:>6.1f} "
          f"{r['load'][0]:>4.1f}-{r['load'][1]:.1f}")
  ratio = results[1]["steps_per_s"] / base
  print(f"\ncache 10% / all-on-device: {ratio:.2f}x steps/s (goal >= {GOAL_10}x): "
        f"{'met' if ratio >= GOAL_10 else 'NOT met'}; by CPU time "
        f"{base_cpu / results[1]['cpu_ms_per_step']:.2f}x. Ratios are per run: the machine's "
        "load (1-min average, before-after each variant) skews wall times.")


if __name__ == "__main__":
  main()
