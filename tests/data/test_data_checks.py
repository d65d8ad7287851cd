"""Tests for mxrec_pipeline.data.checks: the checks of a job's ELWC splits before training."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.data import checks
from mxrec_pipeline.data import elwc


def _write(path, num_lists):
  elwc.write_elwc_tfrecord(path, [elwc.make_elwc({}, [{"utility": 1.0}])] * num_lists)
  return str(path)


def _labels(*batches):
  """A (features, labels) dataset of the given label batches."""
  return [({}, np.asarray(b, np.float32)) for b in batches]


def test_check_split_counts_files_and_lists(tmp_path):
  _write(tmp_path / "a.tfrecord", 2)
  _write(tmp_path / "b.tfrecord", 3)
  assert checks.check_split(str(tmp_path / "*.tfrecord"), "train") == {"files": 2, "lists": 5}


def test_check_split_refuses_empty_or_missing_data(tmp_path):
  empty = _write(tmp_path / "e.tfrecord", 0)
  with pytest.raises(ValueError, match=r"valid data .*e\.tfrecord: no lists \(empty file\)"):
    checks.check_split(empty, "valid")
  with pytest.raises(ValueError, match=r"train data: no file matches .*nothing\*"):
    checks.check_split(str(tmp_path / "nothing*"), "train")


def test_count_relevant_lists_ignores_padding():
  dataset = _labels([[1, 0, -1], [0, 0, -1], [-1, -1, -1]], [[0, 2, 0]])
  assert checks.count_relevant_lists(dataset) == (3, 2)


def test_check_splits_states_the_metric_convention(tmp_path):
  path = _write(tmp_path / "a.tfrecord", 2)
  report, warnings = checks.check_splits(path, path, _labels([[1, 0], [0, 0]]),
                                         {"train": {"skipped": 1}})
  assert report["train"] == {"files": 1, "lists": 2, "bad_records": {"skipped": 1}}
  assert report["valid"]["lists_with_relevant"] == 1
  assert report["valid"]["metric_convention"] == checks.NO_RELEVANT_CONVENTION
  assert not warnings
  report, warnings = checks.check_splits(path, path, _labels([[0, 0], [0, -1]]))
  assert report["valid"]["lists_with_relevant"] == 0
  assert warnings == [
      f"no validation list has a relevant document (label > 0) in {path}: "
      "every ranking metric will be 0"
  ]


def test_the_convention_is_always_stated(tmp_path):
  path = _write(tmp_path / "a.tfrecord", 1)
  report, warnings = checks.check_splits(
      path, path, tf.data.Dataset.from_tensors(({}, tf.constant([[1.0, 2.0]]))))
  assert report["valid"]["metric_convention"] == checks.NO_RELEVANT_CONVENTION and not warnings
  report, _ = checks.check_splits(path, path,
                                  tf.data.Dataset.from_tensors(({}, tf.constant([[1.0, 2.0]]))),
                                  skip_without_relevant=True)
  assert report["valid"]["skip_queries_without_relevant"] is True
  assert report["valid"]["metric_convention"] == checks.SKIP_NO_RELEVANT_CONVENTION
