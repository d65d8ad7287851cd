"""CPU seconds of key-index lookups with training=False (KeyIndex::Find).

Fills a growable key index with `--keys` distinct random int64 keys (by
`insert(..., training=True)` in batches of 65,536), then times
`insert(queries, training=False)` (Deduplicate + Find, TF eager) over
`--lookups` keys of which half are stored keys and half absent (negative
keys), `--repeats` times, by process CPU time (`time.process_time()`).

Prints each call's CPU seconds, their median, the hits (identical for any
correct build) and the 1-minute load average. To compare two builds, run it
with PYTHONPATH pointing at each checkout (the op library is loaded from
mxrec_pipeline/ops/). Figures: benchmarks/HISTORY.md, "Lookups pipelined".

Usage:
  python benchmarks/bench_key_index_find.py            # 4M keys, 1M lookups, ~1 minute
  python benchmarks/bench_key_index_find.py --keys 400000 --lookups 100000
"""

from __future__ import annotations

import argparse
import os
import time

BATCH = 65536


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--keys", type=int, default=4_000_000, help="keys stored in the index")
  parser.add_argument("--lookups", type=int, default=1_000_000, help="keys per lookup call")
  parser.add_argument("--repeats", type=int, default=7, help="lookup calls timed")
  args = parser.parse_args(argv)

  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core import key_index  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(7)
  keys = rng.integers(0, 2**62, size=args.keys, dtype=np.int64)
  index = key_index.KeyIndex("bench_key_index_find", "t", args.keys, growable=True)
  for start in range(0, args.keys, BATCH):
    index.insert(tf.constant(keys[start:start + BATCH]), training=True)
  hit = rng.random(args.lookups) < 0.5
  queries = tf.constant(
      np.where(hit, keys[rng.integers(0, args.keys, args.lookups)],
               -rng.integers(1, 2**62, size=args.lookups, dtype=np.int64)))
  seconds = []
  for _ in range(args.repeats):
    start = time.process_time()
    rows, restore, _ = index.insert(queries, training=False)
    seconds.append(time.process_time() - start)
  hits = int(np.sum(tf.gather(rows, restore).numpy() >= 0))
  print(f"CPU s per call of {args.lookups} lookups ({args.keys} keys stored): " +
        " ".join(f"{s:.4f}" for s in seconds))
  print(f"median {np.median(seconds):.4f} | hits {hits} | load {os.getloadavg()[0]:.2f}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
