"""How long one growth of the key index's slot array takes, up to tens of millions of keys.

The key index (native/core/key_index.h) is sized by use: a batch that would
take its slot array past load 0.8 first grows it by a factor of about 1.2 and
rehashes every key in place, under the index's exclusive lock. Growth is
amortized O(1) per key, but each growth is one pause of O(keys held) for the
batch that triggers it (and for any lookup waiting on the lock). This script
measures that pause as a user meets it: a growable `KeyIndex` (the Python
API), distinct random int64 keys inserted through `key_index.insert` in
batches of `--batch` keys, each batch timed; a batch whose
`memory_bytes()` changed grew the array.

Prints, for every growth past `--from-keys` keys held: the keys held after the
batch, the array's size before and after, the batch's time, the growth's own
time (the batch's time minus the median of the nearest batches that did not
grow, up to two before and two after) and that time per key held; then the
mean of the last figure and the pause it projects for an index of 10^9 keys
(linear in the keys held: every key is rehashed once).

Usage:
  python benchmarks/bench_index_growth.py                  # up to 48M keys, ~20 s, 1.5 GB
  python benchmarks/bench_index_growth.py --keys 8000000   # smaller
"""

from __future__ import annotations

import argparse
import statistics
import time

PROJECTED_KEYS = 10**9


def measure(total_keys: int, batch: int) -> list[dict]:
  """Inserts `total_keys` distinct keys in batches; returns one record per batch.

  Args:
    total_keys: Keys to insert in all (> 0).
    batch: Keys per insertion batch (> 0).

  Returns:
    [{"keys": keys held after the batch, "seconds": the batch's wall time,
      "bytes_before": memory_bytes() before, "bytes_after": after}] in order.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core import key_index  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(20261127)
  index = key_index.KeyIndex("bench_index_growth", "growth", batch, growable=True)
  handle = index.resource_handle

  @tf.function
  def insert(keys):
    rows, _, _ = key_index.insert(handle, keys, training=True)
    return tf.size(rows)

  # Instantiates the function on an empty batch: nothing inserted.
  insert(tf.zeros([0], tf.int64)).numpy()
  records, held = [], 0
  while held < total_keys:
    size = min(batch, total_keys - held)
    # Random int64 keys: distinct from each other with probability ~1 - 10^-4
    # at 48M keys; a repeat is simply found, which costs what a miss costs.
    keys = tf.constant(rng.integers(-2**63, 2**63 - 1, size, dtype=np.int64))
    before = int(index.memory_bytes())
    start = time.perf_counter()
    insert(keys).numpy()
    seconds = time.perf_counter() - start
    held = int(index.size())
    records.append({
        "keys": held, "seconds": seconds, "bytes_before": before,
        "bytes_after": int(index.memory_bytes())
    })
  index.release()
  return records


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--keys", type=int, default=48_000_000, help="keys to insert in all")
  parser.add_argument("--batch", type=int, default=1 << 20, help="keys per insertion batch")
  parser.add_argument("--from-keys", type=int, default=4_000_000,
                      help="report the growths with at least this many keys held")
  args = parser.parse_args(argv)
  if args.keys <= 0 or args.batch <= 0:
    parser.error("--keys and --batch must be > 0")
  records = measure(args.keys, args.batch)
  plain = [i for i, r in enumerate(records) if r["bytes_after"] == r["bytes_before"]]
  if not plain:
    parser.error("every batch grew the index: use a smaller --batch")
  print(f"{len(records)} batches of {args.batch:,} keys; a batch that did not grow the index: "
        f"median {1e3 * statistics.median(records[i]['seconds'] for i in plain):.1f} ms")
  print(f"{'keys held':>12} {'array MB':>16} {'batch ms':>9} {'growth ms':>10} "
        f"{'ns/key held':>12}")
  per_key = []
  for j, r in enumerate(records):
    if r["bytes_after"] == r["bytes_before"] or r["keys"] < args.from_keys:
      continue
    before = [i for i in plain if i < j][-2:]
    after = [i for i in plain if i > j][:2]
    growth = r["seconds"] - statistics.median(records[i]["seconds"] for i in before + after)
    per_key.append(growth / r["keys"])
    print(f"{r['keys']:>12,} {r['bytes_before'] / 2**20:>7.0f} -> {r['bytes_after'] / 2**20:<6.0f}"
          f" {1e3 * r['seconds']:>9.1f} {1e3 * growth:>10.1f} {1e9 * growth / r['keys']:>12.1f}")
  if not per_key:
    print(f"no growth past {args.from_keys:,} keys: raise --keys")
    return 0
  mean = statistics.mean(per_key)
  print(f"growth time per key held: mean {1e9 * mean:.1f} ns over {len(per_key)} growths "
        f"(min {1e9 * min(per_key):.1f}, max {1e9 * max(per_key):.1f})")
  print(f"projected pause of one growth at {PROJECTED_KEYS:.0e} keys: "
        f"{mean * PROJECTED_KEYS:.0f} s (min-max {min(per_key) * PROJECTED_KEYS:.0f}-"
        f"{max(per_key) * PROJECTED_KEYS:.0f} s), under the index's exclusive lock")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
