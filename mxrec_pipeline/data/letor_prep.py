"""Preparing LETOR training files: a seeded holdout of queries, and feature statistics.

`split_holdout` holds some training queries out for validation while training
(early stopping on data nobody reports on); `feature_moments` gives the mean
and standard deviation of each feature after `sign(x) * log1p(|x|)`, which
the LETOR rankers standardize with (builders/mslr.py). NumPy only.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from mxrec_pipeline.data import letor
from mxrec_pipeline.data import validation

PathLike = str | os.PathLike


def holdout_size(num_queries: int, fraction: float, min_queries: int) -> int:
  """Queries held out of `num_queries`: ceil(fraction * n), at least `min_queries`, at most n // 2.

  0 when `fraction` is 0. The cap keeps at least half the queries to train on
  (a file of fewer than 2 * min_queries queries holds out half).
  """
  if fraction == 0.0 or num_queries < 2:
    return 0
  return min(max(math.ceil(fraction * num_queries), min_queries), num_queries // 2)


def split_holdout(src: PathLike, rest: PathLike, holdout: PathLike, fraction: float,
                  min_queries: int, seed: int) -> tuple[int, int]:
  """Writes the queries of LETOR file `src` to `rest` and `holdout`, lines unchanged.

  The held-out queries (`holdout_size` of them) are drawn uniformly without
  replacement by `numpy.random.default_rng(seed)`; a query is the run of
  consecutive lines with one `qid:` token, as `letor.iter_letor` reads them
  (lines are not parsed here: converting the outputs reports bad lines).
  Each output is written to a temporary file and renamed into place.

  Returns:
    (queries in `rest`, queries in `holdout`).

  Raises:
    ValueError: `src` holds fewer than 2 queries (naming it).
  """
  queries = [[line if line.endswith("\n") else line + "\n" for line, _ in run]
             for run in letor.query_runs(src)]
  size = holdout_size(len(queries), fraction, min_queries)
  if size == 0:
    raise ValueError(f"{src}: {len(queries)} queries, too few to hold any out (data.holdout_*)")
  held = set(np.random.default_rng(seed).choice(len(queries), size, replace=False).tolist())
  for path, keep in ((rest, False), (holdout, True)):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
      for i, lines in enumerate(queries):
        if (i in held) == keep:
          f.writelines(lines)
    os.replace(tmp, path)
  return len(queries) - size, size


def feature_moments(paths: Sequence[PathLike], num_features: int,
                    label_range: tuple[float, float] = letor.LABEL_RANGE,
                    on_bad_record: str = "error") -> tuple[np.ndarray, np.ndarray]:
  """Mean and standard deviation of each feature's `sign(x) * log1p(|x|)` over documents.

  Over every document of the LETOR files `paths` (a feature missing from a
  line counts as 0, as the rankers read it; bad lines follow `on_bad_record`
  as the conversion does). A constant feature gets standard deviation 1, so
  standardizing leaves it at 0.

  Returns:
    ([num_features] float64 means, [num_features] float64 standard deviations).

  Raises:
    ValueError: as `letor.iter_letor`.
  """
  total = np.zeros(num_features)
  squares = np.zeros(num_features)
  count = 0
  for path in paths:
    skipped = validation.BadRecords(str(path), on_bad_record)
    for query in letor.iter_letor(path, num_features, label_range, skipped):
      x = np.sign(query.features) * np.log1p(np.abs(query.features.astype(np.float64)))
      total += x.sum(axis=0)
      squares += np.square(x).sum(axis=0)
      count += len(x)
  mean = total / count
  std = np.sqrt(np.maximum(squares / count - np.square(mean), 0.0))
  return mean, np.where(std > 1e-12, std, 1.0)
