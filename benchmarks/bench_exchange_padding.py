"""Bytes one worker receives per step of a sharded table, as the routings pad them, at any W.

A model of what distributed/exchange.py and distributed/all_to_all.py send,
evaluated on simulated keys instead of a cluster (one machine cannot run 512
workers): each of W workers draws `--ids` ids (uniform over `--keys` keys, or
Zipf(`--zipf`)), keeps its distinct ones (n_w), and buckets them by owner
with the code's owner function (sharding.owner_numpy). Then per worker and
step, float32 rows of `--dim` (s = 4):

  all_gather: ids 8 W n_max + 8 W, rows d s W n_max, gradients d s N + 4 W
              (N = sum of n_w), as ExchangeBytes of exchange.exchange_lookup;
  all_to_all: ids 8 W (M + 1) + 4, rows and gradients d s W M each, M the
              largest count any worker sends any owner (all_to_all sends
              equal chunks), as all_to_all.exchange_lookup's.

It prints, per W, the mean n, M against the even share n / W (the padding
factor of the all-to-all's chunks), both routings' bytes (mean over
`--steps` simulated steps) and the formula without padding
(exchange.bytes_per_step_formula). The counted bytes of real 2- and 4-worker
runs are benchmarks/bench_sharded_exchange.py's.

With `--tables T` each worker draws T such tables' ids a step (table t's keys
offset by t x keys) and it prints, beside one table's figures, the bytes of
the T tables' all-to-alls run one exchange per table and grouped in one
(all_to_all.exchange_lookup_group: ids 8 W (M_g + T) + 8, a count per table
leading each chunk, rows and gradients d s W M_g each, M_g the largest count of
all the tables' keys any worker sends any owner), and the grouped chunks'
padding M_g / (T n / W).

Usage:
  python benchmarks/bench_exchange_padding.py
  python benchmarks/bench_exchange_padding.py --zipf 1.1 --workers 2 8 64
  python benchmarks/bench_exchange_padding.py --zipf 1.2 --keys 100000 --tables 4
"""

from __future__ import annotations

import argparse

import numpy as np

from mxrec_pipeline.distributed import exchange
from mxrec_pipeline.distributed import sharding


def _draw(rng, args) -> np.ndarray:
  if args.zipf:
    return (rng.zipf(args.zipf, args.ids) - 1) % args.keys
  return rng.integers(0, args.keys, args.ids)


def _to_all(workers: int, largest: int, row: int, tables: int = 1) -> int:
  """The all-to-all routing's bytes per worker for chunks of `largest` keys (rows `row` bytes)."""
  return (8 * workers * (largest + tables) + 4 * (2 if tables > 1 else 1) +
          2 * row * workers * largest)


def step_bytes(rng, workers: int, args) -> dict:
  """One simulated step: n per worker, M, and each routing's bytes per worker (mean).

  With args.tables > 1 also the T tables' all-to-all bytes, one exchange per
  table ("separate") and grouped in one ("grouped", M_g).
  """
  counts = np.zeros((args.tables, workers, workers), np.int64)  # table, sender, owner
  sizes = None
  for t in range(args.tables):
    distinct = [np.unique(_draw(rng, args)) + t * args.keys for _ in range(workers)]
    if t == 0:
      sizes = np.array([d.size for d in distinct])
    for w, d in enumerate(distinct):
      counts[t, w] = np.bincount(sharding.owner_numpy(d, workers), minlength=workers)
  largest = int(counts[0].max())
  row = args.dim * 4
  gather = (8 * workers * sizes.max() + 8 * workers + row * workers * sizes.max() +
            row * sizes.sum() + 4 * workers)
  grouped = int(counts.sum(axis=0).max())
  return {
      "n": sizes.mean(), "M": largest, "all_gather": gather,
      "all_to_all": _to_all(workers, largest, row),
      "separate": sum(_to_all(workers, int(c.max()), row) for c in counts), "M_g": grouped,
      "grouped": _to_all(workers, grouped, row, tables=args.tables)
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 64, 512])
  parser.add_argument("--ids", type=int, default=4096,
                      help="ids per worker and step (512 examples x 8: the Zipf job's)")
  parser.add_argument("--keys", type=int, default=1_000_000)
  parser.add_argument("--zipf", type=float, default=0.0, help="Zipf exponent; 0: uniform ids")
  parser.add_argument("--dim", type=int, default=16)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
      "--tables", type=int, default=1,
      help="tables per step, all-to-all bytes also one exchange per table and "
      "grouped")
  args = parser.parse_args()
  rng = np.random.default_rng(args.seed)
  print(f"ids per worker {args.ids}, keys {args.keys:,}, "
        f"{'Zipf ' + str(args.zipf) if args.zipf else 'uniform'}, dim {args.dim} float32; "
        f"means over {args.steps} steps")
  print(f"{'W':>5} {'n':>7} {'M':>6} {'M/(n/W)':>8} {'all_gather':>12} {'all_to_all':>12} "
        f"{'a2a formula':>12} {'a2a/formula':>11}" +
        (f" {args.tables} tables: {'separate':>10} {'grouped':>10} {'M_g/(Tn/W)':>10}" if args.
         tables > 1 else ""))
  for workers in args.workers:
    steps = [step_bytes(rng, workers, args) for _ in range(args.steps)]
    n = np.mean([s["n"] for s in steps])
    largest = np.mean([s["M"] for s in steps])
    gather = np.mean([s["all_gather"] for s in steps])
    to_all = np.mean([s["all_to_all"] for s in steps])
    formula = exchange.bytes_per_step_formula(n, args.dim, workers, routing="all_to_all")
    line = (f"{workers:>5} {n:>7.0f} {largest:>6.1f} {largest / (n / workers):>8.2f} "
            f"{gather / 1e3:>10.1f}KB {to_all / 1e3:>10.1f}KB {formula / 1e3:>10.1f}KB "
            f"{to_all / formula:>11.2f}")
    if args.tables > 1:
      separate = np.mean([s["separate"] for s in steps])
      grouped = np.mean([s["grouped"] for s in steps])
      padding = np.mean([s["M_g"] for s in steps]) / (args.tables * n / workers)
      line += (f" {'':>{len(str(args.tables)) + 8}}{separate / 1e3:>8.1f}KB "
               f"{grouped / 1e3:>8.1f}KB {padding:>10.2f}")
    print(line)


if __name__ == "__main__":
  main()
