"""Tests for mxrec_pipeline.data.movielens on a tiny RecBole-format dir."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import movielens
from mxrec_pipeline.data import validation

# User 1: 5 ratings (1 to validation), listed out of time order.
# User 2: 10 ratings (2 to validation), items 16 and 17 tied at t=160.
# User 3: a single rating (training only).
_INTER = [
    (1, 10, 4.0, 300),
    (1, 11, 3.0, 100),
    (1, 12, 5.0, 500),
    (1, 13, 1.0, 200),
    (1, 14, 2.0, 400),
] + [(2, 10 + i, 1.0 + i % 5, 100 + 10 * i) for i in range(7)] + [
    (2, 17, 3.0, 160),
    (2, 18, 4.0, 170),
    (2, 19, 5.0, 190),
] + [(3, 12, 2.0, 50)]

_USERS = ("user_id:token\tage:token\tgender:token\toccupation:token\t"
          "zip_code:token\n"
          "1\t24\tM\ttechnician\t85711\n"
          "2\t53\tF\tother\tT8H1N\n"
          "3\t7\tM\tstudent\t00000\n")

_ITEMS = ("item_id:token\tmovie_title:token_seq\trelease_year:token\t"
          "class:token_seq\n" +
          "".join(f"{i}\tMovie {i}\t{1990 + i}\tDrama\n" for i in range(13, 20)) +
          "10\tToy Story\t1995\tAnimation Children's Comedy\n"
          "11\tMisérables, Les\t1995\tDrama Musical\n"
          "12\tunkonwn\tunkonwn\tunknown\n")


def _write_dir(tmp_path, inter=_INTER):
  data_dir = tmp_path / "ml"
  data_dir.mkdir()
  (data_dir /
   "ml-100k.inter").write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n" +
                               "".join(f"{u}\t{i}\t{_text(r)}\t{t}\n" for u, i, r, t in inter))
  (data_dir / "ml-100k.user").write_text(_USERS)
  (data_dir / "ml-100k.item").write_text(_ITEMS, encoding="utf-8")
  return data_dir


def _text(value):
  return format(value, "g") if isinstance(value, float) else str(value)


def _decode(path):
  """Returns [(user_id, [(item_id, timestamp, rating), ...])] of a file."""
  out = []
  for proto in elwc.read_elwc_tfrecord(path):
    user = proto.context.features.feature["user_id"].int64_list.value[0]
    rows = [(e.features.feature["item_id"].int64_list.value[0],
             e.features.feature["timestamp"].int64_list.value[0],
             e.features.feature["rating"].float_list.value[0]) for e in proto.examples]
    out.append((user, rows))
  return out


def test_split_is_per_user_by_time_and_loses_nothing(tmp_path):
  result = movielens.build_movielens_elwc(_write_dir(tmp_path), tmp_path / "out")
  train, valid = _decode(result.train_path), _decode(result.valid_path)

  assert [u for u, _ in train] == [1, 2, 3]
  assert [u for u, _ in valid] == [1, 2]
  # floor(0.2 * 5) = 1 and floor(0.2 * 10) = 2 latest ratings validate.
  assert dict(valid)[1] == [(12, 500, 5.0)]
  assert [item for item, _, _ in dict(valid)[2]] == [18, 19]
  assert dict(train)[3] == [(12, 50, 2.0)]
  for user, valid_rows in valid:
    train_times = [t for _, t, _ in dict(train)[user]]
    assert train_times == sorted(train_times)
    assert max(train_times) <= min(t for _, t, _ in valid_rows)
  all_rows = sorted(
      (u, i, t, r) for split in (train, valid) for u, rows in split for i, t, r in rows)
  assert all_rows == sorted((u, i, t, r) for u, i, r, t in _INTER)
  assert (result.num_train_lists, result.num_valid_lists) == (3, 2)
  assert (result.num_train_ratings, result.num_valid_ratings) == (13, 3)
  assert result.num_train_ratings + result.num_valid_ratings == len(_INTER)


def test_features_of_users_and_items(tmp_path):
  result = movielens.build_movielens_elwc(_write_dir(tmp_path), tmp_path / "out")
  proto = next(elwc.read_elwc_tfrecord(result.train_path))
  ctx = proto.context.features.feature
  assert ctx["user_id"].int64_list.value == [1]
  assert ctx["age"].int64_list.value == [24]
  assert ctx["gender"].bytes_list.value == [b"M"]
  assert ctx["occupation"].bytes_list.value == [b"technician"]
  assert ctx["zip"].bytes_list.value == [b"85711"]
  # User 1's training list in time order: items 11, 13, 10, 14.
  first, _, third, _ = [e.features.feature for e in proto.examples]
  assert first["item_id"].int64_list.value == [11]
  assert first["title_tokens"].bytes_list.value == ["misérables".encode(), b"les"]
  assert first["genres"].bytes_list.value == [b"Drama", b"Musical"]
  assert first["year"].int64_list.value == [1995]
  assert third["genres"].bytes_list.value == [b"Animation", b"Children's", b"Comedy"]
  assert third["title_tokens"].bytes_list.value == [b"toy", b"story"]
  assert third["rating"].float_list.value == [4.0]

  unknown = movielens.read_items(tmp_path / "ml")[12]
  assert unknown == {"item_id": 12, "genres": [b"unknown"], "title_tokens": [], "year": 0}


def test_max_list_size_chunks_without_dropping(tmp_path):
  result = movielens.build_movielens_elwc(_write_dir(tmp_path), tmp_path / "out",
                                          valid_fraction=0.5, max_list_size=2)
  train = _decode(result.train_path)
  # Training sizes: user 1 has 3 (2 + 1), user 2 5 (2 + 2 + 1), user 3 1.
  assert [(u, len(rows)) for u, rows in train] == [(1, 2), (1, 1), (2, 2), (2, 2), (2, 1), (3, 1)]
  assert (result.num_train_lists, result.num_train_ratings) == (6, 9)
  assert (result.num_valid_lists, result.num_valid_ratings) == (4, 7)


def test_tfr_reads_the_lists(tmp_path):
  result = movielens.build_movielens_elwc(_write_dir(tmp_path), tmp_path / "out")
  dataset = tfr.data.build_ranking_dataset(
      file_pattern=str(result.valid_path), data_format=tfr.data.ELWC, batch_size=2,
      context_feature_spec={
          "user_id": tf.io.FixedLenFeature([1], tf.int64),
          "zip": tf.io.FixedLenFeature([1], tf.string),
      }, example_feature_spec={
          "item_id": tf.io.FixedLenFeature([1], tf.int64, default_value=0),
          "title_tokens": tf.io.VarLenFeature(tf.string),
          "rating": tf.io.FixedLenFeature([1], tf.float32, default_value=-1.0),
      }, list_size=2, mask_feature_name="mask", num_epochs=1, shuffle=False)
  features = next(iter(dataset))
  np.testing.assert_array_equal(features["zip"], [[b"85711"], [b"T8H1N"]])
  np.testing.assert_array_equal(features["item_id"][..., 0], [[12, 0], [18, 19]])
  np.testing.assert_array_equal(features["rating"][..., 0], [[5.0, -1.0], [4.0, 5.0]])
  np.testing.assert_array_equal(features["mask"], [[True, False], [True, True]])


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_bad_valid_fraction(fraction):
  with pytest.raises(ValueError, match="`valid_fraction` must be in"):
    movielens.split_by_time([], valid_fraction=fraction)


def test_unknown_item_raises(tmp_path):
  data_dir = _write_dir(tmp_path, inter=_INTER + [(1, 99, 1.0, 900)])
  with pytest.raises(ValueError, match="item 99 is rated by user 1"):
    movielens.build_movielens_elwc(data_dir, tmp_path / "out")


def test_malformed_atomic_file(tmp_path):
  path = tmp_path / "bad.inter"
  path.write_text("user_id:token\titem_id\n1\t2\n")
  with pytest.raises(ValueError, match=r"bad.inter:1: header field "
                     r"'item_id' is not 'name:type'"):
    movielens.read_atomic_file(path)
  path.write_text("user_id:token\titem_id:token\n1\t2\n3\n")
  with pytest.raises(ValueError, match=r"bad.inter:3: 1 fields, the "
                     r"header has 2"):
    movielens.read_atomic_file(path)


@pytest.mark.parametrize("index, column, value, match", [
    (1, 2, "nan", r"ml-100k\.inter:3: label 'rating' is nan"),
    (0, 2, "6", r"ml-100k\.inter:2: label 'rating' is 6, outside \[1, 5\]"),
    (0, 2, "0.5", r"ml-100k\.inter:2: label 'rating' is 0\.5, outside \[1, 5\]"),
    (2, 3, "inf", r"ml-100k\.inter:4: feature 'timestamp' is inf"),
    (2, 3, "soon", r"ml-100k\.inter:4: feature 'timestamp' is 'soon', expected a number"),
    (3, 1, "1.5", r"ml-100k\.inter:5: feature 'item_id' is '1\.5', expected an integer"),
    (3, 0, "", r"ml-100k\.inter:5: feature 'user_id' is '', expected an integer"),
])
def test_bad_rating_rows_name_file_line_column_and_value(tmp_path, index, column, value, match):
  rows = [[_text(v) for v in row] for row in _INTER]
  rows[index][column] = value
  data_dir = _write_dir(tmp_path, inter=[tuple(r) for r in rows])
  with pytest.raises(validation.BadRecordError, match=match):
    movielens.build_movielens_elwc(data_dir, tmp_path / "out")
  assert not (tmp_path / "out" / "train.tfrecord").exists()


def test_skip_drops_and_counts_bad_rating_rows(tmp_path):
  bad = [(1, 15, 7.0, 600), (2, 11, float("nan"), 95)]
  data_dir = _write_dir(tmp_path, inter=_INTER + bad)
  result = movielens.build_movielens_elwc(data_dir, tmp_path / "out", on_bad_record="skip")
  assert result.bad_records["skipped"] == 2
  assert result.bad_records["by_reason"] == {"label out of range": 1, "non-finite label": 1}
  assert result.num_train_ratings + result.num_valid_ratings == len(_INTER)
  (tmp_path / "clean").mkdir()
  clean = movielens.build_movielens_elwc(_write_dir(tmp_path / "clean"), tmp_path / "ok")
  assert _decode(result.train_path) == _decode(clean.train_path)
  assert _decode(result.valid_path) == _decode(clean.valid_path)


def test_rating_range_is_a_parameter(tmp_path):
  data_dir = _write_dir(tmp_path, inter=_INTER + [(1, 15, 10.0, 600)])
  result = movielens.build_movielens_elwc(data_dir, tmp_path / "out", rating_range=(0, 10))
  assert result.num_train_ratings + result.num_valid_ratings == len(_INTER) + 1


@pytest.mark.parametrize("inter, match", [
    ([], r"ml-100k\.inter: no records \(empty file\)"),
    ([(1, 10, 4.0, 300), (2, 11, 3.0, 100)
     ], r"ml-100k\.inter: no validation list: every user has fewer than 2 ratings"),
])
def test_no_lists_is_an_error(tmp_path, inter, match):
  with pytest.raises(validation.BadRecordError, match=match):
    movielens.build_movielens_elwc(_write_dir(tmp_path, inter=inter), tmp_path / "out")
