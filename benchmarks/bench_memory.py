"""Bytes of host memory per stored key, by component, at 10%, 50% and 100% fill.

Fills a flat table's key index (capacity `--capacity` rows) with distinct random
int64 keys in batches of 4096 (as training inserts them) and reads
`KeyIndex.memory_bytes()` at each fill level; then the same with admission
(`access_threshold=1` and a timestamp per batch: the last-seen times and the
admission counters are kept) and with a quarter of an extra batch pending
(`access_threshold=2`, keys seen once), and with change tracking on (delta
checkpoints: one bit per row). Rows and lazy Adam slots are computed:
a flat table's variable and slots hold every row of capacity ([capacity, dim]
float32 each), so per stored key they cost capacity / keys times their row.

Prints one table (the one in docs/benchmarks.md) and the projection to 10^9
keys at 100% fill. Figures are exact byte counts of the index's allocations
(no timing), so the machine's load does not matter.

Usage:
  python benchmarks/bench_memory.py                  # capacity 2,000,000, ~1 minute
  python benchmarks/bench_memory.py --capacity 200000
"""

from __future__ import annotations

import argparse

FILLS = (0.1, 0.5, 1.0)
DIMS = (16, 64)
BATCH = 4096


def index_bytes_per_key(capacity: int, admission: int | None,
                        track_changes: bool = False) -> dict[float, float]:
  """Index bytes per stored key at each fill of FILLS.

  Args:
    capacity: Rows of the table.
    admission: None (plain insertion) or the access_threshold of an admitting
      insertion with a timestamp per batch.
    track_changes: Change tracking on (for delta checkpoints,
      KeyIndex.export_changes) from the start.

  Returns:
    {fill: bytes per stored key}.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import ops  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core import key_index  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(16)
  keys = np.unique(rng.integers(-2**62, 2**62, int(capacity * 1.01), dtype=np.int64))
  rng.shuffle(keys)
  keys = keys[:capacity]
  index = key_index.KeyIndex("bench_memory", f"t_{admission}_{track_changes}", capacity)
  handle = index.resource_handle
  if track_changes:
    index.export_changes(clear=True)
  out, done = {}, 0
  for step, fill in enumerate(FILLS):
    target = int(capacity * fill)
    while done < target:
      batch = tf.constant(keys[done:min(done + BATCH, target)])
      if admission is None:
        key_index.insert(handle, batch, training=True)
      else:
        ops.load().mx_key_index_insert_admit(handle, batch, tf.ones_like(batch),
                                             tf.constant(step * 1000 + done, tf.int64),
                                             tf.constant(1, tf.int64))
      done = min(done + BATCH, target)
    out[fill] = int(index.memory_bytes()) / int(index.size())
  if admission is not None and admission > 1:
    # Pending keys: a quarter of capacity seen once under threshold 2, on a
    # table at 50% fill.
    pending = key_index.KeyIndex("bench_memory", "t_pending", capacity)
    half, quarter = keys[:capacity // 2], keys[capacity // 2:capacity // 2 + capacity // 4]
    for threshold, part in ((1, half), (2, quarter)):
      for start in range(0, part.size, BATCH):
        batch = tf.constant(part[start:start + BATCH])
        ops.load().mx_key_index_insert_admit(pending.resource_handle, batch, tf.ones_like(batch),
                                             tf.constant(start, tf.int64),
                                             tf.constant(threshold, tf.int64))
    before = out[0.5] * half.size
    out["pending"] = (int(pending.memory_bytes()) - before) / quarter.size
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--capacity", type=int, default=2_000_000, help="rows of the table")
  args = parser.parse_args(argv)
  plain = index_bytes_per_key(args.capacity, None)
  admit = index_bytes_per_key(args.capacity, 2)
  tracked = index_bytes_per_key(args.capacity, None, track_changes=True)
  print(f"capacity {args.capacity:,} rows; bytes per stored key (B)")
  print("| component | " + " | ".join(f"{int(f * 100)}% fill" for f in FILLS) + " |")
  print("|---|" + "---:|" * len(FILLS))
  print("| key index (slots) | " + " | ".join(f"{plain[f]:.1f}" for f in FILLS) + " |")
  print("| key index with admission (slots + last-seen) | " +
        " | ".join(f"{admit[f]:.1f}" for f in FILLS) + " |")
  print("| key index tracking changes (slots + changed-row bitmap) | " +
        " | ".join(f"{tracked[f]:.2f} (+{tracked[f] - plain[f]:.2f})" for f in FILLS) + " |")
  for dim in DIMS:
    row, slots = 4 * dim, 8 * dim
    print(f"| rows, dim {dim} ([capacity, {dim}] float32) | " +
          " | ".join(f"{row / f:.0f}" for f in FILLS) + " |")
    print(f"| lazy Adam m + v, dim {dim} | " + " | ".join(f"{slots / f:.0f}" for f in FILLS) + " |")
    print(f"| total, dim {dim} | " +
          " | ".join(f"{plain[f] + (row + slots) / f:.0f}" for f in FILLS) + " |")
  print(f"each pending key (admission, not yet admitted): {admit['pending']:.1f} B")
  print("\nprojection, 10^9 keys at 100% fill:")
  for dim in DIMS:
    row, slots = 4 * dim, 8 * dim
    total = plain[1.0] + row + slots
    print(f"  dim {dim}: index {plain[1.0]:.1f} GB (with admission {admit[1.0]:.1f} GB), "
          f"rows {row} GB, Adam slots {slots} GB, total {total:.0f} GB "
          f"(index {100 * plain[1.0] / total:.1f}% of it)")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
