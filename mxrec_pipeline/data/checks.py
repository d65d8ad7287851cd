"""Checks of a job's ELWC splits before training: framing, emptiness, relevant documents.

Runs once per `train`, before the model is built (jobs.train), so bad data
fails at once with the file's name instead of as a `DataLossError` inside
`IteratorGetNext`, Keras's "Unexpected result of `train_function` (Empty
logs)" or a `KeyError` of a metric that was never computed.

The metric convention for a validation list without a relevant document (no
label > 0), stated in metrics.json (`metric_convention`): TF-Ranking's by
default, where it scores 0 in NDCG and MRR and counts with the mean list
weight (`tfr.keras.metrics`, `_per_example_weights_to_per_list_weights`; with
no relevant document at all, every metric is 0); or, with
`metrics.skip_queries_without_relevant: true`, such lists are left out.
"""

from typing import Mapping

import numpy as np
import tensorflow as tf

from mxrec_pipeline.data import elwc

NO_RELEVANT_CONVENTION = (
    "tfr: a list without a relevant document (label > 0) scores 0 in NDCG and MRR and counts "
    "with the mean list weight")
SKIP_NO_RELEVANT_CONVENTION = (
    "skip: lists without a relevant document (label > 0) are left out of every metric "
    "(metrics.skip_queries_without_relevant: true)")


def check_split(pattern: str, split: str) -> dict:
  """CRC-checks and counts the ELWC records of one split's files.

  Args:
    pattern: file pattern (tf.io.gfile.glob) of the split's ELWC TFRecords.
    split: "train" or "valid", for messages.

  Returns:
    `{"files": number of files, "lists": number of records}`.

  Raises:
    ValueError: no file matches, a corrupt, truncated or non-ELWC record
      (`elwc.check_tfrecord`), or no record in any file ("... no lists
      (empty file)").
  """
  files = sorted(tf.io.gfile.glob(pattern))
  if not files:
    raise ValueError(f"{split} data: no file matches {pattern}")
  lists = sum(elwc.check_tfrecord(path) for path in files)
  if not lists:
    raise ValueError(f"{split} data {pattern}: no lists (empty file)")
  return {"files": len(files), "lists": lists}


def count_relevant_lists(dataset: tf.data.Dataset) -> tuple[int, int]:
  """(lists, lists with a relevant document) of a finite (features, labels) dataset.

  Args:
    dataset: elements (features, labels [batch_size, list_size] float32),
      padding labels < 0, as tfr's dataset builders give; a list of only
      padding is not counted.
  """
  lists = relevant = 0
  for _, labels in dataset:
    labels = np.asarray(labels)
    lists += int(np.sum(np.any(labels >= 0, axis=1)))
    relevant += int(np.sum(np.any(labels > 0, axis=1)))
  return lists, relevant


def check_splits(train_pattern: str, valid_pattern: str, valid_dataset: tf.data.Dataset,
                 bad_records: Mapping[str, dict] | None = None,
                 skip_without_relevant: bool = False) -> tuple[dict, list[str]]:
  """Checks both splits before training; returns (report for metrics.json, warnings).

  Args:
    train_pattern, valid_pattern: the splits' ELWC file patterns.
    valid_dataset: one pass over the validation (features, labels) with the
      labels the metrics see (after any label transform).
    bad_records: per split, `validation.BadRecords.report()` of its
      conversion (records skipped under `data.on_bad_record: skip`).
    skip_without_relevant: the metrics leave out lists without a relevant
      document (MetricsConfig.skip_queries_without_relevant).

  Returns:
    `({"train": {...}, "valid": {...}}, warnings)`: per split the `check_split`
    counts and `bad_records`; "valid" also holds `lists_with_relevant`,
    `skip_queries_without_relevant` and `metric_convention`, the convention
    text (NO_RELEVANT_CONVENTION or SKIP_NO_RELEVANT_CONVENTION).

  Raises:
    ValueError: as `check_split`.
  """
  report = {
      "train": check_split(train_pattern, "train"), "valid": check_split(valid_pattern, "valid")
  }
  for split, skipped in (bad_records or {}).items():
    report[split]["bad_records"] = skipped
  lists, relevant = count_relevant_lists(valid_dataset)
  report["valid"]["lists_with_relevant"] = relevant
  report["valid"]["skip_queries_without_relevant"] = skip_without_relevant
  report["valid"]["metric_convention"] = (SKIP_NO_RELEVANT_CONVENTION
                                          if skip_without_relevant else NO_RELEVANT_CONVENTION)
  warnings = []
  if not relevant:
    warnings.append(f"no validation list has a relevant document (label > 0) in {valid_pattern}: "
                    "every ranking metric will be 0")
  return report, warnings
