"""Tests for mxrec_pipeline.data.movielens on a tiny RecBole-format dir."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.data import cross_fitting
from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import item_knn
from mxrec_pipeline.data import matrix_factorization
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


# Training ratings of _INTER by item (user 1's item 12 and user 2's 18, 19 validate):
#   10: 4 (u1), 1 (u2)   11: 3, 2   12: 3 (u2), 2 (u3)   13: 1, 4   14: 2, 5
#   15: 1 (u2)   16: 2 (u2)   17: 3 (u2)   -> 13 ratings summing to 33.
_GLOBAL_MEAN = 33 / 13
_VALID_ROWS = {(1, 12), (2, 18), (2, 19)}


def _lists(path):
  """[(context features, [example features])] of a file, as Python values."""

  def values(feature):
    kind = feature.WhichOneof("kind")
    return list(getattr(feature, kind).value) if kind else []

  return [({k: values(v) for k, v in p.context.features.feature.items()},
           [{k: values(v) for k, v in e.features.feature.items()} for e in p.examples])
          for p in elwc.read_elwc_tfrecord(path)]


def test_training_features_by_hand():
  train, _ = movielens.split_by_time([movielens.Rating(*row) for row in _INTER])
  features = movielens.training_features(train, history_size=2)
  assert features.item_totals[14] == (7.0, 2)
  assert features.item_totals[17] == (3.0, 1)
  assert 18 not in features.item_totals and 19 not in features.item_totals
  assert features.global_mean == pytest.approx(_GLOBAL_MEAN)
  # Latest 2 training movies in time order; user 2's 16 and 17 tie at t=160 (item order).
  assert features.histories == {1: [10, 14], 2: [16, 17], 3: [12]}
  # A validation example: the mean of every training rating of the movie.
  assert features.item_statistics(12) == {"item_mean_rating": 2.5, "item_rating_count": 2}
  # A training example: its own rating left out (user 1 gave 10 a 4, user 2 a 1).
  assert features.item_statistics(
      10, own_rating=4.0) == {"item_mean_rating": 1.0, "item_rating_count": 1}
  # No other rating: the global training mean.
  assert features.item_statistics(
      15, own_rating=1.0) == {"item_mean_rating": _GLOBAL_MEAN, "item_rating_count": 0}
  assert features.item_statistics(18) == {"item_mean_rating": _GLOBAL_MEAN, "item_rating_count": 0}


def test_neighbors_by_hand():
  train, _ = movielens.split_by_time([movielens.Rating(*row) for row in _INTER])
  features = movielens.training_features(train)
  # Training movie sets: user 1 {10, 11, 13, 14}, user 2 {10, ..., 17}, user 3 {12}.
  # Jaccard: (1, 2) 4 / 8, (2, 3) 1 / 8, (1, 3) 0 (no neighbor).
  assert features.neighbors == {1: [(2, 0.5)], 2: [(1, 0.5), (3, 0.125)], 3: [(2, 0.125)]}
  assert features.user_means == {1: 2.5, 2: 2.625, 3: 2.0}
  # User 1, movie 12 (validation): user 2 gave it 3, 0.375 above its mean;
  # 0.5 * 0.375 / (0.5 + 5 * 0.5).
  assert features.neighbor_rating_deviation(1, 12) == pytest.approx(0.0625)
  # User 1, movie 11 (training): user 2 gave it 2: 0.5 * -0.625 / 3.
  assert features.neighbor_rating_deviation(1, 11) == pytest.approx(-0.3125 / 3)
  # User 2, movie 10: only user 1 rated it (4, 1.5 above its mean); the shrinkage
  # uses the mean similarity of both neighbors, (0.5 + 0.125) / 2.
  assert features.neighbor_rating_deviation(2, 10) == pytest.approx(0.75 / (0.5 + 5 * 0.3125))
  # No neighbor rated it, or no neighbor at all: 0.
  assert features.neighbor_rating_deviation(2, 18) == 0.0
  assert features.neighbor_rating_deviation(4, 10) == 0.0
  unshrunk = movielens.training_features(train, shrinkage=0.0, num_neighbors=1)
  assert unshrunk.neighbors[2] == [(1, 0.5)]
  assert unshrunk.neighbor_rating_deviation(2, 10) == pytest.approx(1.5)
  assert features.example_features(1, 12) == {
      "item_mean_rating": 2.5, "item_rating_count": 2,
      "neighbor_rating_deviation": pytest.approx(0.0625), "mf_rating": features.mf.predict(1, 12),
      "item_knn_deviation": features.item_knn.predict(1, 12)
  }


def test_mf_rating_by_hand():
  train, _ = movielens.split_by_time([movielens.Rating(*row) for row in _INTER])
  features = movielens.training_features(train, mf_dim=2)
  # The training ratings user by user, in time order (the folds are dealt in this order).
  table = [(r.user_id, r.item_id, r.rating) for rs in train.values() for r in rs]
  assert {(u, i) for u, i, _ in table} == {(u, i) for u, i, _, _ in _INTER} - _VALID_ROWS
  users, items, ratings = (np.array(column) for column in zip(*table))
  # Validation examples: the fit on every training rating.
  full = matrix_factorization.fit_als(users, items, ratings, dim=2)
  np.testing.assert_array_equal(features.mf.item_factors, full.item_factors)
  assert features.example_features(2, 18)["mf_rating"] == full.predict(2, 18)
  # Training examples: the prediction of the fit without the rating's fold.
  out_of_fold = matrix_factorization.cross_fitted_predictions(users, items, ratings,
                                                              movielens.MF_NUM_FOLDS, dim=2)
  for u, i, r, prediction in zip(users, items, ratings, out_of_fold):
    assert features.example_features(u, i, own_rating=r)["mf_rating"] == prediction
  assert features.mf_rating(2, 18, training=False) == full.predict(2, 18)
  with pytest.raises(ValueError, match="user 2 has no training rating of movie 18"):
    features.mf_rating(2, 18, training=True)
  plain = movielens.training_features(train, mf_dim=None, use_item_knn=False)
  assert plain.mf is None and plain.item_knn is None
  assert set(plain.example_features(
      1, 12)) == {"item_mean_rating", "item_rating_count", "neighbor_rating_deviation"}
  with pytest.raises(ValueError, match="mf_rating: these TrainingFeatures were computed without"):
    plain.mf_rating(1, 12, training=False)
  with pytest.raises(ValueError, match="item_knn_deviation: these TrainingFeatures were computed"):
    plain.item_knn_deviation(1, 12, training=False)


def test_item_knn_deviation_by_hand():
  train, _ = movielens.split_by_time([movielens.Rating(*row) for row in _INTER])
  features = movielens.training_features(train)
  table = [(r.user_id, r.item_id, r.rating) for rs in train.values() for r in rs]
  users, items, ratings = (np.array(column) for column in zip(*table))
  full = item_knn.fit_item_knn(users, items, ratings)
  np.testing.assert_array_equal(features.item_knn.similarity, full.similarity)
  assert features.example_features(1, 12)["item_knn_deviation"] == full.predict(1, 12)
  # Training examples: the same folds as mf_rating.
  out_of_fold = cross_fitting.out_of_fold_predictions(item_knn.fit_item_knn, users, items, ratings,
                                                      movielens.MF_NUM_FOLDS)
  for u, i, r, prediction in zip(users, items, ratings, out_of_fold):
    assert features.example_features(u, i, own_rating=r)["item_knn_deviation"] == prediction
  with pytest.raises(ValueError, match="user 1 has no training rating of movie 12"):
    features.item_knn_deviation(1, 12, training=True)


def test_training_features_errors():
  with pytest.raises(ValueError, match="`history_size` must be positive, got 0"):
    movielens.training_features({}, history_size=0)
  with pytest.raises(ValueError, match="`num_neighbors` must be positive, got 0"):
    movielens.training_features({}, num_neighbors=0)
  with pytest.raises(ValueError, match="`shrinkage` must be >= 0, got -1"):
    movielens.training_features({}, shrinkage=-1.0)
  with pytest.raises(ValueError, match="the training split has no rating"):
    movielens.training_features({})


def test_history_and_item_statistics_in_the_lists(tmp_path):
  result = movielens.build_movielens_elwc(_write_dir(tmp_path), tmp_path / "out")
  train, valid = _lists(result.train_path), _lists(result.valid_path)
  # User 1 trains on 11, 13, 10, 14 (time order) and validates on 12.
  (context, examples), = [lst for lst in train if lst[0]["user_id"] == [1]]
  assert context["history_item_ids"] == [11, 13, 10, 14]
  assert context["history_genres"] == [
      b"Drama", b"Musical", b"Drama", b"Animation", b"Children's", b"Comedy", b"Drama"
  ]
  # Leave-one-out: item 11's other training rating is user 2's 2; 13's is 4; 10's 1; 14's 5.
  assert [(e["item_id"], e["item_mean_rating"], e["item_rating_count"]) for e in examples
         ] == [([11], [2.0], [1]), ([13], [4.0], [1]), ([10], [1.0], [1]), ([14], [5.0], [1])]
  (context, examples), = [lst for lst in valid if lst[0]["user_id"] == [1]]
  assert context["history_item_ids"] == [11, 13, 10, 14]
  assert [(e["item_id"], e["item_mean_rating"], e["item_rating_count"]) for e in examples
         ] == [([12], [2.5], [2])]
  assert examples[0]["neighbor_rating_deviation"] == [0.0625]  # see test_neighbors_by_hand
  (context, examples), = [lst for lst in valid if lst[0]["user_id"] == [2]]
  assert context["history_item_ids"] == list(range(10, 18))
  assert [e["item_rating_count"] for e in examples] == [[0], [0]]
  assert [e["item_mean_rating"] for e in examples] == [[pytest.approx(_GLOBAL_MEAN)]] * 2
  # Nobody else rated 18 and 19.
  assert [e["neighbor_rating_deviation"] for e in examples] == [[0.0], [0.0]]
  # mf_rating: the full fit's for validation, out-of-fold for training (test_mf_rating_by_hand).
  train_split, _ = movielens.split_by_time([movielens.Rating(*row) for row in _INTER])
  features = movielens.training_features(train_split)
  assert [e["mf_rating"] for e in examples
         ] == [[pytest.approx(features.mf.predict(2, i), rel=1e-6)] for i in (18, 19)]
  assert [
      e["item_knn_deviation"] for e in examples
  ] == [[pytest.approx(features.item_knn.predict(2, i), rel=1e-6, abs=1e-7)] for i in (18, 19)]
  (_, examples), = [lst for lst in train if lst[0]["user_id"] == [3]]
  assert examples[0]["mf_rating"] == [pytest.approx(features.mf_out_of_fold[(3, 12)], rel=1e-6)]
  assert examples[0]["item_knn_deviation"] == [
      pytest.approx(features.item_knn_out_of_fold[(3, 12)], rel=1e-6, abs=1e-7)
  ]


def test_no_validation_rating_reaches_a_feature(tmp_path):
  """Changing every validation rating changes the labels of the lists and nothing else."""
  clean = movielens.build_movielens_elwc(_write_dir(tmp_path), tmp_path / "out")
  valid_rows = {(u, i) for u, rows in _decode(clean.valid_path) for i, _, _ in rows}
  assert valid_rows == _VALID_ROWS
  flipped = [(u, i, 6.0 - r if (u, i) in valid_rows else r, t) for u, i, r, t in _INTER]
  (tmp_path / "flipped").mkdir()
  result = movielens.build_movielens_elwc(_write_dir(tmp_path / "flipped", inter=flipped),
                                          tmp_path / "flipped_out")

  def without_labels(path):
    return [(context, [{k: v for k, v in e.items() if k != "rating"} for e in examples])
            for context, examples in _lists(path)]

  for split in ("train_path", "valid_path"):
    assert without_labels(getattr(result, split)) == without_labels(getattr(clean, split))
  assert [e["rating"] for _, examples in _lists(result.valid_path) for e in examples
         ] != [e["rating"] for _, examples in _lists(clean.valid_path) for e in examples]
  # And no validation movie is in its user's history.
  for context, examples in _lists(clean.valid_path):
    assert not {e["item_id"][0] for e in examples} & set(context["history_item_ids"])
