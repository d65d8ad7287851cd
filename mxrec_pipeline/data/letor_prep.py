"""Preparing LETOR training data: a seeded holdout of queries, and feature statistics.

`split_holdout` holds some training queries out of a converted (ELWC) training
file, for validation while training (early stopping on data nobody reports
on); `feature_moments` gives the mean and standard deviation of each feature
after `sign(x) * log1p(|x|)`, which the LETOR rankers standardize with
(builders/mslr.py). NumPy, and TensorFlow's record I/O for the split.
"""

from __future__ import annotations

import math
import os
from typing import Collection, Sequence

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
                  min_queries: int, seed: int) -> list[int] | None:
  """Writes the lists of ELWC file `src` (one a query) to `rest` and `holdout`, records unchanged.

  The held-out lists (`holdout_size` of them) are drawn uniformly without
  replacement by `numpy.random.default_rng(seed)`; both files keep the order
  of `src` and are written atomically (`elwc.write_records`). Two passes over
  `src`, one list in memory at a time.

  Returns:
    The held-out lists' qids (their context feature `qid`), ascending; None
    when `src` has too few lists to hold any out (nothing written).
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  from mxrec_pipeline.data import elwc  # pylint: disable=import-outside-toplevel

  def records():
    return tf.data.TFRecordDataset(str(src)).as_numpy_iterator()

  count = sum(1 for _ in records())
  size = holdout_size(count, fraction, min_queries)
  if size == 0:
    return None
  held = set(np.random.default_rng(seed).choice(count, size, replace=False).tolist())
  elwc.write_records(rest, (r for i, r in enumerate(records()) if i not in held))
  elwc.write_records(holdout, (r for i, r in enumerate(records()) if i in held))
  return sorted(
      int(lst.context.features.feature[letor.QID_FEATURE].int64_list.value[0])
      for lst in elwc.read_elwc_tfrecord(holdout))


def feature_moments(
    paths: Sequence[PathLike], num_features: int,
    label_range: tuple[float, float] = letor.LABEL_RANGE, on_bad_record: str = "error",
    exclude_qids: Collection[int] = ()) -> tuple[np.ndarray, np.ndarray]:
  """Mean and standard deviation of each feature's `sign(x) * log1p(|x|)` over documents.

  Over every document of the LETOR files `paths` but the queries
  `exclude_qids` (e.g. a holdout); a feature missing from a line counts as 0,
  as the rankers read it; bad lines follow `on_bad_record` as the conversion
  does. A constant feature gets standard deviation 1, so standardizing leaves
  it at 0.

  Returns:
    ([num_features] float64 means, [num_features] float64 standard deviations).

  Raises:
    ValueError: as `letor.iter_letor`, or no document left.
  """
  exclude = frozenset(exclude_qids)
  total = np.zeros(num_features)
  squares = np.zeros(num_features)
  count = 0
  for path in paths:
    skipped = validation.BadRecords(str(path), on_bad_record)
    for query in letor.iter_letor(path, num_features, label_range, skipped):
      if query.qid in exclude:
        continue
      x = np.sign(query.features) * np.log1p(np.abs(query.features.astype(np.float64)))
      total += x.sum(axis=0)
      squares += np.square(x).sum(axis=0)
      count += len(x)
  if count == 0:
    raise ValueError(f"no document in {[str(p) for p in paths]} outside the excluded queries")
  mean = total / count
  std = np.sqrt(np.maximum(squares / count - np.square(mean), 0.0))
  return mean, np.where(std > 1e-12, std, 1.0)
