"""Tests for mxrec_pipeline.data.letor on small inline LETOR files."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import letor
from mxrec_pipeline.data import validation

# Two queries; feature 2 missing in the second line, a comment, CRLF endings
# and a blank line, as hand-checkable input with num_features=3.
_GOOD = ("2 qid:10 1:0.5 2:1 3:-2\r\n"
         "0 qid:10 3:4 1:1.5 # doc b\r\n"
         "\r\n"
         "1 qid:7 1:0 2:0 3:9\r\n")


def _write(tmp_path, text, name="in.txt"):
  path = tmp_path / name
  path.write_bytes(text.encode())
  return path


def test_read_letor_groups_by_query(tmp_path):
  lists = letor.read_letor(_write(tmp_path, _GOOD), num_features=3)

  assert [q.qid for q in lists] == [10, 7]
  np.testing.assert_array_equal(lists[0].labels, [2.0, 0.0])
  np.testing.assert_array_equal(lists[0].features, [[0.5, 1.0, -2.0], [1.5, 0.0, 4.0]])
  np.testing.assert_array_equal(lists[1].labels, [1.0])
  np.testing.assert_array_equal(lists[1].features, [[0.0, 0.0, 9.0]])
  assert lists[0].labels.dtype == np.float32
  assert lists[0].features.dtype == np.float32
  assert lists[0].features.shape == (2, 3)


def test_iter_letor_yields_queries_one_at_a_time(tmp_path):
  lazy = letor.iter_letor(_write(tmp_path, _GOOD), num_features=3)
  assert next(lazy).qid == 10
  assert next(lazy).qid == 7
  assert next(lazy, None) is None


@pytest.mark.parametrize(
    "line, match",
    [
        ("x qid:1 1:1", r"in\.txt:2: bad label 'x'"),
        ("1 1:1 2:1", r"in\.txt:2: expected 'qid:<int>', got '1:1'"),
        ("1", r"in\.txt:2: expected 'qid:<int>', got 'end of line'"),
        ("1 qid:a 1:1", r"in\.txt:2: bad qid token 'qid:a'"),
        ("1 qid:1 1:abc", r"in\.txt:2: bad feature token '1:abc'"),
        ("1 qid:1 1.5", r"in\.txt:2: bad feature token '1\.5'"),
        ("1 qid:1 x:1", r"in\.txt:2: bad feature token 'x:1'"),
        ("1 qid:1 4:1", r"in\.txt:2: feature id 4 out of range \[1, 3\] \(the data's width, "
         r"data.num_features\) in token '4:1'"),
        ("1 qid:1 0:1", r"in\.txt:2: feature id 0 out of range .* '0:1'"),
        ("1 qid:1 2:1 2:3", r"in\.txt:2: repeated feature id in token '2:3'"),
    ],
)
def test_bad_line_names_file_line_and_token(tmp_path, line, match):
  path = _write(tmp_path, "0 qid:1 1:1\n" + line + "\n")
  with pytest.raises(ValueError, match=match):
    letor.read_letor(path, num_features=3)


def test_query_lines_must_be_consecutive(tmp_path):
  path = _write(tmp_path, "0 qid:1 1:1\n0 qid:2 1:1\n0 qid:1 1:1\n")
  with pytest.raises(ValueError, match=r"in\.txt:3: qid 1 appears again"):
    letor.read_letor(path, num_features=3)


def test_num_features_must_be_positive(tmp_path):
  with pytest.raises(ValueError, match="`num_features` must be positive, "
                     "got 0"):
    letor.read_letor(_write(tmp_path, _GOOD), num_features=0)


def test_letor_to_elwc_uses_tfr_dnn_example_names(tmp_path):
  dst = tmp_path / "out.tfrecord"
  assert letor.letor_to_elwc(_write(tmp_path, _GOOD), dst, num_features=3) == 2

  records = list(elwc.read_elwc_tfrecord(dst))
  assert [r.context.features.feature["qid"].int64_list.value[0] for r in records] == [10, 7]
  first = records[0].examples[1].features.feature
  assert sorted(first) == ["custom_features_1", "custom_features_2", "custom_features_3", "utility"]
  assert first["custom_features_2"].float_list.value == [0.0]
  assert first["utility"].float_list.value == [0.0]

  # The feature spec of TF-Ranking's examples/keras/keras_dnn_tfrecord.py.
  example_spec = {
      name: tf.io.FixedLenFeature([1], tf.float32, default_value=0.0)
      for name in letor.feature_names(3)
  }
  example_spec["utility"] = tf.io.FixedLenFeature([1], tf.float32, default_value=-1.0)
  dataset = tfr.data.build_ranking_dataset(file_pattern=str(dst), data_format=tfr.data.ELWC,
                                           batch_size=2, context_feature_spec={},
                                           example_feature_spec=example_spec, list_size=2,
                                           num_epochs=1, shuffle=False)
  features = next(iter(dataset))
  np.testing.assert_allclose(features["custom_features_3"][..., 0], [[-2.0, 4.0], [9.0, 0.0]])
  np.testing.assert_allclose(features["utility"][..., 0], [[2.0, 0.0], [1.0, -1.0]])


@pytest.mark.parametrize(
    "line, match",
    [
        ("1 qid:1 1:nan", r"in\.txt:2: feature 'custom_features_1' is nan"),
        ("1 qid:1 3:-inf", r"in\.txt:2: feature 'custom_features_3' is -inf"),
        ("1 qid:1 2:1e39", r"in\.txt:2: feature 'custom_features_2' is 1e\+39"),  # float32 inf.
        ("nan qid:1 1:1", r"in\.txt:2: label 'utility' is nan"),
        ("5 qid:1 1:1", r"in\.txt:2: label 'utility' is 5, outside \[0, 4\]"),
        ("-0.5 qid:1 1:1", r"in\.txt:2: label 'utility' is -0\.5, outside \[0, 4\]"),
    ])
def test_bad_values_name_file_line_feature_and_value(tmp_path, line, match):
  path = _write(tmp_path, "0 qid:1 1:1\n" + line + "\n")
  with pytest.raises(validation.BadRecordError, match=match + "; fix the record or set"):
    letor.read_letor(path, num_features=3)


def test_label_range_is_a_parameter(tmp_path):
  path = _write(tmp_path, "0 qid:1 1:1\n2 qid:1 1:1\n")
  assert len(letor.read_letor(path, num_features=3, label_range=(0, 2))) == 1
  with pytest.raises(ValueError, match=r"label 'utility' is 2, outside \[0, 1\]"):
    letor.read_letor(path, num_features=3, label_range=(0, 1))


def test_skip_drops_and_counts_bad_lines(tmp_path):
  path = _write(tmp_path, _GOOD + "9 qid:7 1:1\n1 qid:7 2:inf\n1 qid:8 x\n0 qid:8 1:2\n")
  skipped = validation.BadRecords(str(path), "skip")
  lists = letor.read_letor(path, num_features=3, bad_records=skipped)
  assert [(q.qid, len(q.labels)) for q in lists] == [(10, 2), (7, 1), (8, 1)]
  assert skipped.report()["by_reason"] == {
      "label out of range": 1, "malformed record": 1, "non-finite feature": 1
  }
  assert skipped.first == f"{path}:5: label 'utility' is 9, outside [0, 4]"


@pytest.mark.parametrize("text, policy, match", [
    ("", "error", r"in\.txt: no records \(empty file\)"),
    ("# comment\n\n", "skip", r"in\.txt: no records \(empty file\)"),
    ("7 qid:1 1:1\n", "skip", r"in\.txt: no records left after skipping 1 bad record\(s\) "
     r"\(first: .*in\.txt:1: label 'utility' is 7"),
])
def test_a_file_without_lists_is_an_error(tmp_path, text, policy, match):
  path = _write(tmp_path, text)
  with pytest.raises(validation.BadRecordError, match=match):
    letor.read_letor(path, num_features=3, bad_records=validation.BadRecords(str(path), policy))
