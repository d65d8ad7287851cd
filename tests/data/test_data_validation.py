"""Tests for mxrec_pipeline.data.validation: value checks and the bad-record policy."""

import pytest

from mxrec_pipeline.data import validation


@pytest.mark.parametrize(
    "value, message",
    [
        (float("nan"), "feature 'x' is nan"),
        (float("-inf"), "feature 'x' is -inf"),
        (3.5e38, r"feature 'x' is 3\.5e\+38"),  # Finite in float64, inf as float32.
    ])
def test_check_feature_refuses_non_finite_float32(value, message):
  with pytest.raises(validation.BadRecord, match=message) as raised:
    validation.check_feature("x", value)
  assert raised.value.reason == validation.NON_FINITE_FEATURE


def test_check_feature_and_label_pass_good_values_through():
  assert validation.check_feature("x", -3.4e38) == -3.4e38
  assert validation.check_label("y", 0.0, (0.0, 4.0)) == 0.0
  assert validation.check_label("y", 4.0, (0.0, 4.0)) == 4.0


@pytest.mark.parametrize("value, reason, message", [
    (float("nan"), validation.NON_FINITE_LABEL, r"label 'y' is nan$"),
    (4.5, validation.LABEL_OUT_OF_RANGE, r"label 'y' is 4\.5, outside \[0, 4\]$"),
    (-1.0, validation.LABEL_OUT_OF_RANGE, r"label 'y' is -1, outside \[0, 4\]$"),
])
def test_check_label(value, reason, message):
  with pytest.raises(validation.BadRecord, match=message) as raised:
    validation.check_label("y", value, (0.0, 4.0))
  assert raised.value.reason == reason


def test_error_policy_raises_naming_where_and_the_remedy():
  bad = validation.BadRecords("f.txt")
  with pytest.raises(
      validation.BadRecordError, match=r"^f\.txt:3: label 'y' is 7; fix the record or set "
      r"data\.on_bad_record: skip$"):
    bad.reject("f.txt:3", validation.BadRecord("label 'y' is 7", validation.LABEL_OUT_OF_RANGE))


def test_skip_policy_counts_by_reason_and_keeps_the_first():
  bad = validation.BadRecords("f.txt", "skip")
  bad.reject("f.txt:3", validation.BadRecord("label 'y' is 7", validation.LABEL_OUT_OF_RANGE))
  bad.reject("f.txt:5", validation.BadRecord("feature 'x' is nan", validation.NON_FINITE_FEATURE))
  bad.reject("f.txt:8", validation.BadRecord("label 'y' is 9", validation.LABEL_OUT_OF_RANGE))
  report = bad.report()
  assert report == {
      "source": "f.txt", "policy": "skip", "skipped": 3,
      "by_reason": {"label out of range": 2,
                    "non-finite feature": 1}, "first": "f.txt:3: label 'y' is 7"
  }
  assert validation.summary(report) == (
      "f.txt: skipped 3 bad record(s) (label out of range: 2, non-finite feature: 1); "
      "first: f.txt:3: label 'y' is 7")
  bad.check_not_empty(1)
  with pytest.raises(validation.BadRecordError, match="no records left after skipping 3"):
    bad.check_not_empty(0)


def test_unknown_policy_names_the_key():
  with pytest.raises(
      ValueError, match=r"data\.on_bad_record must be one of \['error', 'skip'\], "
      r"got 'drop'"):
    validation.BadRecords("f.txt", "drop")
