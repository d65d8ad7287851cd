"""Tests for mxrec_pipeline.data.elwc: conversion, round trip, tfr parsing."""

import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.data import elwc


def _kind_and_values(feature):
  kind = feature.WhichOneof("kind")
  return kind, (list(getattr(feature, kind).value) if kind else [])


@pytest.mark.parametrize(
    "value, kind, values",
    [
        (3, "int64_list", [3]),
        (np.int32(-4), "int64_list", [-4]),
        (True, "int64_list", [1]),
        ([1, 2], "int64_list", [1, 2]),
        (np.array([5, 6], np.int64), "int64_list", [5, 6]),
        (0.5, "float_list", [0.5]),
        (np.float32(1.5), "float_list", [1.5]),
        ([1, 2.5], "float_list", [1.0, 2.5]),
        (np.array([0.25, 2.0], np.float32), "float_list", [0.25, 2.0]),
        ("é", "bytes_list", ["é".encode()]),
        (b"M", "bytes_list", [b"M"]),
        (["a", b"b"], "bytes_list", [b"a", b"b"]),
        (np.array(["x", "yz"]), "bytes_list", [b"x", b"yz"]),
        ([], None, []),
    ],
)
def test_make_feature_kinds(value, kind, values):
  assert _kind_and_values(elwc.make_feature(value)) == (kind, values)


def test_make_elwc_rejects_bad_values_naming_the_feature():
  with pytest.raises(TypeError, match=r"feature 'bad': .*\['int', 'str'\]"):
    elwc.make_elwc({"bad": [1, "a"]}, [])
  with pytest.raises(TypeError, match=r"feature 'none': .*NoneType"):
    elwc.make_elwc({}, [{"none": None}])
  with pytest.raises(ValueError, match=r"feature 'm': .*got shape \(2, 2\)"):
    elwc.make_elwc({}, [{"m": np.zeros([2, 2])}])


def test_make_elwc_builds_context_and_examples():
  proto = elwc.make_elwc({"user_id": 7, "gender": "F"},
                         [{"item_id": 1}, {"item_id": 2, "rating": 4.0}])
  ctx = proto.context.features.feature
  assert ctx["user_id"].int64_list.value == [7]
  assert ctx["gender"].bytes_list.value == [b"F"]
  assert [e.features.feature["item_id"].int64_list.value[0] for e in proto.examples] == [1, 2]
  assert "rating" not in proto.examples[0].features.feature


def _three_lists():
  return [
      elwc.make_elwc(
          {"qid": 1},
          [{"x": 1.0, "tok": ["a"], "label": 2.0}, {"x": 2.0, "tok": ["b", "c"], "label": 0.0}]),
      elwc.make_elwc({"qid": 2}, [{"x": 3.0, "tok": [], "label": 1.0}]),
      elwc.make_elwc({"qid": 3}, [{"x": float(i), "tok": ["d"], "label": 0.0} for i in range(5)]),
  ]


def test_write_read_round_trip_is_atomic(tmp_path):
  path = tmp_path / "lists.tfrecord"
  path.write_bytes(b"old contents")
  lists = _three_lists()

  assert elwc.write_elwc_tfrecord(path, lists) == 3

  assert list(elwc.read_elwc_tfrecord(path)) == lists
  assert [p.name for p in tmp_path.iterdir()] == ["lists.tfrecord"]


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path):
  path = tmp_path / "lists.tfrecord"
  elwc.write_elwc_tfrecord(path, _three_lists()[:1])

  def broken():
    yield _three_lists()[1]
    raise RuntimeError("generator failed")

  with pytest.raises(RuntimeError, match="generator failed"):
    elwc.write_elwc_tfrecord(path, broken())
  assert list(elwc.read_elwc_tfrecord(path)) == _three_lists()[:1]
  assert [p.name for p in tmp_path.iterdir()] == ["lists.tfrecord"]


_CONTEXT_SPEC = {"qid": tf.io.FixedLenFeature([1], tf.int64)}
_EXAMPLE_SPEC = {
    "x": tf.io.FixedLenFeature([1], tf.float32, default_value=0.0),
    "tok": tf.io.VarLenFeature(tf.string),
    "label": tf.io.FixedLenFeature([1], tf.float32, default_value=-1.0),
}


def test_tfr_build_ranking_dataset_pads_and_masks(tmp_path):
  path = tmp_path / "lists.tfrecord"
  elwc.write_elwc_tfrecord(path, _three_lists())

  dataset = tfr.data.build_ranking_dataset(file_pattern=str(path), data_format=tfr.data.ELWC,
                                           batch_size=3, context_feature_spec=_CONTEXT_SPEC,
                                           example_feature_spec=_EXAMPLE_SPEC, list_size=3,
                                           mask_feature_name="mask", num_epochs=1, shuffle=False)
  features = next(iter(dataset))

  np.testing.assert_array_equal(features["qid"], [[1], [2], [3]])
  # List 1 is padded by one, list 2 by two; list 3 (5 long) is cut to 3.
  np.testing.assert_array_equal(features["mask"],
                                [[True, True, False], [True, False, False], [True, True, True]])
  np.testing.assert_array_equal(features["label"][..., 0], [[2, 0, -1], [1, -1, -1], [0, 0, 0]])
  np.testing.assert_array_equal(features["x"][..., 0], [[1, 2, 0], [3, 0, 0], [0, 1, 2]])
  tok = tf.sparse.to_dense(features["tok"], default_value=b"")
  assert tok.shape == (3, 3, 2)
  assert tok[0].numpy().tolist() == [[b"a", b""], [b"b", b"c"], [b"", b""]]
  assert tok[1].numpy().tolist() == [[b"", b""]] * 3


def test_tfr_parse_from_example_list(tmp_path):
  path = tmp_path / "lists.tfrecord"
  elwc.write_elwc_tfrecord(path, _three_lists()[:2])
  serialized = [p.SerializeToString() for p in elwc.read_elwc_tfrecord(path)]

  features = tfr.data.parse_from_example_list(serialized, list_size=2,
                                              context_feature_spec=_CONTEXT_SPEC,
                                              example_feature_spec=_EXAMPLE_SPEC,
                                              mask_feature_name="mask")

  np.testing.assert_array_equal(features["mask"], [[True, True], [True, False]])
  np.testing.assert_array_equal(features["label"][..., 0], [[2, 0], [1, -1]])


def _framed_lists(tmp_path):
  """A TFRecord of 3 ELWCs; returns (path, [(offset, framed size)] of each record)."""
  path = tmp_path / "lists.tfrecord"
  lists = [elwc.make_elwc({"qid": q}, [{"utility": 1.0}] * q) for q in (1, 2, 3)]
  elwc.write_elwc_tfrecord(path, lists)
  sizes = [len(e.SerializeToString()) + 16 for e in lists]
  offsets = [0, sizes[0], sizes[0] + sizes[1]]
  return path, list(zip(offsets, sizes))


def test_check_tfrecord_counts_good_records(tmp_path):
  path, _ = _framed_lists(tmp_path)
  assert elwc.check_tfrecord(path) == 3
  (tmp_path / "empty").write_bytes(b"")
  assert elwc.check_tfrecord(tmp_path / "empty") == 0


@pytest.mark.parametrize("damage, match", [
    ("data", r"record 2 at byte offset {1} is corrupt \(corrupted record at"),
    ("length", r"record 2 at byte offset {1} is corrupt \(corrupted record at {1}\)"),
    ("cut data", r"record 3 at byte offset {2} is truncated \(truncated record at {2}\)"),
    ("cut header", r"record 3 at byte offset {2} is truncated \(the file ends after"),
    ("not ELWC", r"record 2 at byte offset {1} is not an ExampleListWithContext"),
])
def test_check_tfrecord_names_file_record_and_offset(tmp_path, damage, match):
  path, records = _framed_lists(tmp_path)
  data = bytearray(path.read_bytes())
  (o1, s1), (o2, _) = records[1], records[2]
  if damage == "data":
    data[o1 + 14] ^= 0xFF
  elif damage == "length":
    data[o1 + 1] ^= 0x01
  elif damage == "cut data":
    data = data[:-6]
  elif damage == "cut header":
    data = data[:o2 + 5]
  else:  # A well-framed record that is not an ELWC proto (wire type 7 does not exist).
    records_bytes = [bytes(data[o:o + s]) for o, s in records]
    with tf.io.TFRecordWriter(str(path)) as writer:
      for i, framed in enumerate(records_bytes):
        writer.write(b"\x0f\xff" * ((s1 - 16) // 2) if i == 1 else framed[12:-4])
    data = bytearray(path.read_bytes())
  path.write_bytes(bytes(data))
  with pytest.raises(ValueError,
                     match=re.escape(str(path)) + ": " + match.format(*[o for o, _ in records])):
    elwc.check_tfrecord(path)
