"""Benchmark of the compact export: SavedModel size of a big table with few ids used.

One table of `--capacity` rows (5M) x `--dim` (64) float32 through the public
TPUEmbedding-style API (`mxrec_pipeline.embedding.Embedding`), with `--keys`
(100k) distinct random int64 ids inserted (lookups with training=True). The
table is then saved as a serving SavedModel two ways:

  full      what exports held before: the [capacity, dim] rows variable
            (`embedding_tables`) and the stock id -> row table
            (`row_lookup_tables()`), unseen ids masked to zeros;
  compact   the [keys + 1, dim] snapshot and its stock id -> position table
            (`serving_tables()`, `KeyIndex.to_compact_table`, the path of
            keras/export.py), unseen ids reading the default row.

Printed: each SavedModel's size (bytes of its files, as `du -sb`), the save
time, and the ratio full / compact. Both SavedModels are loaded back and must
give the same embeddings for 2,000 seen and 2,000 unseen ids.

Usage:
  python benchmarks/bench_export.py                 # 5M x 64, 100k ids: ~1.3 GB written
  python benchmarks/bench_export.py --capacity 200000 --keys 10000   # quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

from mxrec_pipeline import embedding as mx_embedding

_INSERT_BATCH = 10_000
_CHECKED_IDS = 2_000


class _Served(tf.Module):
  """A SavedModel root serving one table: `lookup(ids [n] int64) -> [n, dim] float32`.

  Args:
    rows: [num_rows, dim] float32 variable.
    ids: StaticHashTable int64 id -> int64 row of `rows`; ids mapped to -1
      read zeros (the compact table maps absent ids to its default row).
  """

  def __init__(self, rows: tf.Variable, ids: tf.lookup.StaticHashTable):
    super().__init__(name="served_table")
    self.rows, self.ids = rows, ids

  @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
  def lookup(self, ids):
    rows = self.ids.lookup(ids)
    emb = tf.nn.embedding_lookup(self.rows, tf.maximum(rows, 0))
    return emb * tf.cast(rows >= 0, emb.dtype)[:, None]


def directory_bytes(path: str) -> int:
  """Bytes of the files under `path` (what `du -sb` reports, less directory entries)."""
  return sum(
      os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path)
      for name in names)


def save(module: tf.Module, path: str) -> tuple[int, float]:
  """Saves `module`; returns (bytes on disk, seconds)."""
  start = time.perf_counter()
  tf.saved_model.save(module, path)
  return directory_bytes(path), time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--capacity", type=int, default=5_000_000, help="table rows")
  parser.add_argument("--dim", type=int, default=64, help="embedding dimension")
  parser.add_argument("--keys", type=int, default=100_000, help="distinct ids inserted")
  parser.add_argument(
      "--out", help="directory for the SavedModels (default: a temp dir, "
      "removed at the end)")
  args = parser.parse_args()

  rng = np.random.default_rng(0)
  ids = np.unique(rng.integers(0, 2**62, size=args.keys + 1000, dtype=np.int64))
  ids = rng.permutation(ids)[:args.keys]
  table = mx_embedding.TableConfig(vocabulary_size=args.capacity, dim=args.dim, name="items")
  embedding = mx_embedding.Embedding(mx_embedding.FeatureConfig(table, name="item"), optimizer=None)
  for start in range(0, len(ids), _INSERT_BATCH):
    embedding(tf.constant(ids[start:start + _INSERT_BATCH]), training=True)

  out = args.out or tempfile.mkdtemp(prefix="bench_export_")
  try:
    full = _Served(embedding.embedding_tables[table], embedding.row_lookup_tables()[table])
    positions, compact_rows = embedding.serving_tables()[table]
    compact = _Served(tf.Variable(compact_rows, trainable=False), positions)
    full_bytes, full_s = save(full, os.path.join(out, "full"))
    compact_bytes, compact_s = save(compact, os.path.join(out, "compact"))

    unseen = np.setdiff1d(rng.integers(0, 2**62, size=_CHECKED_IDS, dtype=np.int64), ids)
    checked = tf.constant(np.concatenate([ids[:_CHECKED_IDS], unseen]))
    loaded = [tf.saved_model.load(os.path.join(out, name)) for name in ("full", "compact")]
    served = [module.lookup(checked).numpy() for module in loaded]
    np.testing.assert_array_equal(served[0], served[1])
    assert served[1][:_CHECKED_IDS].any(axis=1).all()  # Seen ids: their trained rows.
    assert not served[1][_CHECKED_IDS:].any()

    print(f"table: {args.capacity:,} x {args.dim} float32, {args.keys:,} ids used")
    print(f"{'export':<10}{'rows saved':>14}{'bytes (du -sb)':>18}{'MB':>10}{'save s':>9}")
    for name, rows, size, seconds in (("full", args.capacity, full_bytes, full_s),
                                      ("compact", args.keys + 1, compact_bytes, compact_s)):
      print(f"{name:<10}{rows:>14,}{size:>18,}{size / 1e6:>10.1f}{seconds:>9.1f}")
    print(f"ratio full / compact: {full_bytes / compact_bytes:.1f}x "
          f"(rows: {args.capacity / (args.keys + 1):.1f}x); served embeddings equal for "
          f"{_CHECKED_IDS:,} seen and {len(unseen):,} unseen ids")
  finally:
    if not args.out:
      shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
  main()
