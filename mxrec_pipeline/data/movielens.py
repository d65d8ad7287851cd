"""MovieLens-100k as a ranking task: one list per user, split by time.

Reads GroupLens ml-100k in RecBole's atomic-file form (`fetch("movielens_100k")`:
`ml-100k.{inter,user,item}`, tab-separated UTF-8 with a `name:type` header) and
writes ELWC lists: the context is the user, the examples are the movies the
user rated, in time order, and the label is the rating. Each user's latest
ratings go to validation, the earlier ones to training, so no future rating
leaks into training (`split_by_time`).

`training_features` computes features from the training split only: the
user's history (the implicit feedback N(u) of Koren's SVD++, KDD 2008),
leave-one-out item means, user-based (Herlocker et al., SIGIR 1999) and
item-based (Sarwar et al., WWW 2001) collaborative filtering and biased matrix
factorization, the last two cross-fitted. Every rating is checked once, while
reading (`mxrec_pipeline.data.validation`).

Main names: `build_movielens_elwc`, `read_ratings`, `split_by_time`,
`training_features`. See docs/data.md#movielens-files-and-lists and
docs/data.md#movielens-features.
"""

import dataclasses
import math
import os
import pathlib
import string
from typing import Mapping, Sequence

import numpy as np

from mxrec_pipeline.data import cross_fitting
from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import item_knn as item_knn_lib
from mxrec_pipeline.data import matrix_factorization
from mxrec_pipeline.data import validation

PathLike = str | os.PathLike

INTER_FILE = "ml-100k.inter"
USER_FILE = "ml-100k.user"
ITEM_FILE = "ml-100k.item"

CONTEXT_FEATURES = ("user_id", "age", "gender", "occupation", "zip")
EXAMPLE_FEATURES = ("item_id", "genres", "title_tokens", "year", "timestamp")
HISTORY_FEATURES = ("history_item_ids", "history_genres")
RATING_STATISTICS_FEATURES = ("item_mean_rating", "item_rating_count", "neighbor_rating_deviation")
MF_FEATURES = ("mf_rating",)
ITEM_KNN_FEATURES = ("item_knn_deviation",)
LABEL_FEATURE = "rating"
# Default `history_size`: the latest training movies of a user in its history.
HISTORY_SIZE = 100
# Defaults of `training_features`: nearest users per user, and the shrinkage
# of their mean deviation (in units of their mean similarity).
NUM_NEIGHBORS = 100
NEIGHBOR_SHRINKAGE = 5.0
# Folds of the cross-fitted `mf_rating` and `item_knn_deviation` of training examples.
MF_NUM_FOLDS = 5

# Placeholders the real ml-100k.item uses for unknown values ("unkonwn" [sic]
# for item 267's title and year); item 1412 has release_year "V".
_MISSING_TITLES = ("unkonwn", "unknown")
# GroupLens ml-100k ratings: 1 to 5 stars.
RATING_RANGE = (1.0, 5.0)


@dataclasses.dataclass(frozen=True)
class Rating:
  """One row of the `.inter` file.

  Attributes:
    user_id: user token as int.
    item_id: item token as int.
    rating: the rating, 1-5 in ml-100k.
    timestamp_s: Unix time of the rating, in seconds.
  """

  user_id: int
  item_id: int
  rating: float
  timestamp_s: int


@dataclasses.dataclass(frozen=True)
class MovieLensElwc:
  """What `build_movielens_elwc` wrote.

  Attributes:
    train_path: ELWC TFRecord of the training lists.
    valid_path: ELWC TFRecord of the validation lists.
    num_train_lists: records in `train_path`.
    num_valid_lists: records in `valid_path`.
    num_train_ratings: examples in `train_path`.
    num_valid_ratings: examples in `valid_path`.
    bad_records: `validation.BadRecords.report()` of `ml-100k.inter`
      (records skipped under `on_bad_record="skip"`).
  """

  train_path: pathlib.Path
  valid_path: pathlib.Path
  num_train_lists: int
  num_valid_lists: int
  num_train_ratings: int
  num_valid_ratings: int
  bad_records: dict = dataclasses.field(default_factory=dict)


def read_atomic_file(path: PathLike) -> list[dict[str, str]]:
  """Reads a RecBole atomic file into one `{column name: text}` per row.

  The header's `name:type` fields give the keys (the type is dropped).

  Raises:
    ValueError: a header field without `:type`, or a row whose number of
      fields differs from the header's; the message names file and line.
  """
  return [row for _, row in iter_atomic_rows(path)]


def iter_atomic_rows(path: PathLike):
  """Yields (1-based line number, `{column name: text}`) per row; see `read_atomic_file`."""
  with open(path, encoding="utf-8") as f:
    header = f.readline().rstrip("\r\n").split("\t")
    names = []
    for field in header:
      name, sep, type_ = field.partition(":")
      if not sep or not name or not type_:
        raise ValueError(f"{path}:1: header field {field!r} is not "
                         "'name:type'")
      names.append(name)
    for lineno, line in enumerate(f, start=2):
      line = line.rstrip("\r\n")
      if not line:
        continue
      fields = line.split("\t")
      if len(fields) != len(names):
        raise ValueError(f"{path}:{lineno}: {len(fields)} fields, the "
                         f"header has {len(names)} ({names})")
      yield lineno, dict(zip(names, fields))


def read_ratings(data_dir: PathLike, rating_range: tuple[float, float] = RATING_RANGE,
                 bad_records: validation.BadRecords | None = None) -> list[Rating]:
  """Reads `ml-100k.inter` in file order, checking every row.

  Args:
    data_dir: directory of `ml-100k.inter`.
    rating_range: (low, high): the allowed ratings, inclusive.
    bad_records: policy for bad rows and the counts of skipped ones; None:
      `BadRecords(path, "error")`.

  Raises:
    validation.BadRecordError (a ValueError): under the "error" policy, a
      row whose user_id or item_id is not an integer, whose timestamp is
      not a finite number, or whose rating is not a finite number in
      `rating_range` (the message names `file:line`, the column and its
      value); under either policy, a file with no (valid) row.
    ValueError: a missing column; see `read_atomic_file` for format errors.
  """
  path = pathlib.Path(data_dir) / INTER_FILE
  if bad_records is None:
    bad_records = validation.BadRecords(str(path))
  rows = list(iter_atomic_rows(path))
  _require_columns(path, [row for _, row in rows[:1]],
                   ("user_id", "item_id", "rating", "timestamp"))
  ratings = []
  for lineno, row in rows:
    try:
      ratings.append(_rating(row, rating_range))
    except validation.BadRecord as e:
      bad_records.reject(f"{path}:{lineno}", e)
  bad_records.check_not_empty(len(ratings))
  return ratings


def _rating(row: Mapping[str, str], rating_range: tuple[float, float]) -> Rating:
  """The `Rating` of one `.inter` row; raises `validation.BadRecord` naming the bad column."""
  user_id, item_id = _integer(row, "user_id"), _integer(row, "item_id")
  rating = validation.check_label("rating", _number(row, "rating", "label"), rating_range)
  timestamp = validation.check_feature("timestamp", _number(row, "timestamp", "feature"))
  return Rating(user_id, item_id, rating, int(timestamp))


def _integer(row: Mapping[str, str], column: str) -> int:
  try:
    return int(row[column])
  except ValueError:
    raise validation.BadRecord(f"feature {column!r} is {row[column]!r}, expected an "
                               "integer") from None


def _number(row: Mapping[str, str], column: str, kind: str) -> float:
  try:
    return float(row[column])
  except ValueError:
    raise validation.BadRecord(f"{kind} {column!r} is {row[column]!r}, expected a "
                               "number") from None


def read_users(data_dir: PathLike) -> dict[int, dict[str, object]]:
  """Reads `ml-100k.user` into `{user_id: context features}`.

  Returns:
    Per user `{"user_id": int, "age": int, "gender": bytes,
    "occupation": bytes, "zip": bytes}`.

  Raises:
    ValueError: a missing column or a non-integer id / age.
  """
  path = pathlib.Path(data_dir) / USER_FILE
  rows = read_atomic_file(path)
  _require_columns(path, rows, ("user_id", "age", "gender", "occupation", "zip_code"))
  try:
    return {
        int(r["user_id"]): {
            "user_id": int(r["user_id"]),
            "age": int(r["age"]),
            "gender": r["gender"].encode(),
            "occupation": r["occupation"].encode(),
            "zip": r["zip_code"].encode(),
        } for r in rows
    }
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None


def read_items(data_dir: PathLike) -> dict[int, dict[str, object]]:
  """Reads `ml-100k.item` into `{item_id: example features}`.

  Returns:
    Per item `{"item_id": int, "genres": [bytes], "title_tokens": [bytes],
    "year": int}`. `year` is 0 unless `release_year` is all digits; the
    placeholder title "unkonwn" [sic] gives no tokens.

  Raises:
    ValueError: a missing column or a non-integer item id.
  """
  path = pathlib.Path(data_dir) / ITEM_FILE
  rows = read_atomic_file(path)
  _require_columns(path, rows, ("item_id", "movie_title", "release_year", "class"))
  try:
    return {
        int(r["item_id"]): {
            "item_id": int(r["item_id"]),
            "genres": [g.encode() for g in r["class"].split()],
            "title_tokens": title_tokens(r["movie_title"]),
            "year": int(r["release_year"]) if r["release_year"].isdigit() else 0,
        } for r in rows
    }
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None


def title_tokens(title: str) -> list[bytes]:
  """Lower-cases, splits on white space, strips punctuation off each end.

  "Misérables, Les" -> [b"mis\\xc3\\xa9rables", b"les"] (UTF-8); the
  placeholder "unkonwn" -> [].
  """
  if title.strip().lower() in _MISSING_TITLES:
    return []
  tokens = (t.strip(string.punctuation) for t in title.lower().split())
  return [t.encode() for t in tokens if t]


def split_by_time(
    ratings: Sequence[Rating],
    valid_fraction: float = 0.2,
) -> tuple[dict[int, list[Rating]], dict[int, list[Rating]]]:
  """Splits each user's ratings into earlier (train) and latest (valid).

  Per user, ratings are sorted by (timestamp, item_id). A user with n >= 2
  ratings puts the last `max(1, floor(valid_fraction * n))` of them, at most
  n - 1, into validation and the rest into training; a user with one rating
  is in training only. Hence every training rating of a user is no later
  than (ties possible) every validation rating of that user.

  Returns:
    `(train, valid)`, each `{user_id: time-ordered ratings}`; `valid` has
    no entry for users without validation ratings. Users are in order of
    first appearance.

  Raises:
    ValueError: `valid_fraction` not in (0, 1).
  """
  if not 0.0 < valid_fraction < 1.0:
    raise ValueError(f"`valid_fraction` must be in (0, 1), got {valid_fraction}")
  by_user: dict[int, list[Rating]] = {}
  for r in ratings:
    by_user.setdefault(r.user_id, []).append(r)
  train, valid = {}, {}
  for user_id, user_ratings in by_user.items():
    user_ratings = sorted(user_ratings, key=lambda r: (r.timestamp_s, r.item_id))
    n = len(user_ratings)
    # The epsilon keeps e.g. 0.29 * 100 = 28.999... at 29.
    num_valid = min(n - 1, max(1, math.floor(valid_fraction * n + 1e-9)))
    train[user_id] = user_ratings[:n - num_valid]
    if num_valid > 0:
      valid[user_id] = user_ratings[n - num_valid:]
  return train, valid


@dataclasses.dataclass(frozen=True)
class TrainingFeatures:
  """What the training split tells about items and users (`training_features`).

  Attributes:
    item_totals: item_id -> (sum of its training ratings, their count).
    global_mean: Mean of all training ratings.
    histories: user_id -> the user's latest `history_size` training
      item_ids, in time order.
    ratings: user_id -> {item_id: training rating}.
    user_means: user_id -> mean training rating.
    neighbors: user_id -> [(other user_id, Jaccard similarity > 0)], the
      most similar first (ties: lower user_id first).
    shrinkage: Weight of the prior 0 in `neighbor_rating_deviation`.
    mf: Biased MF fitted on every training rating (validation examples'
      `mf_rating`); None: no `mf_rating`.
    mf_out_of_fold: (user_id, item_id) -> the cross-fitted prediction of
      that training rating (training examples' `mf_rating`).
    item_knn: Item-based CF fitted on every training rating (validation
      examples' `item_knn_deviation`); None: no `item_knn_deviation`.
    item_knn_out_of_fold: As `mf_out_of_fold`, for `item_knn_deviation`.
  """

  item_totals: Mapping[int, tuple[float, int]]
  global_mean: float
  histories: Mapping[int, list[int]]
  ratings: Mapping[int, Mapping[int, float]] = dataclasses.field(default_factory=dict)
  user_means: Mapping[int, float] = dataclasses.field(default_factory=dict)
  neighbors: Mapping[int, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
  shrinkage: float = NEIGHBOR_SHRINKAGE
  mf: matrix_factorization.BiasedMF | None = None
  mf_out_of_fold: Mapping[tuple[int, int], float] = dataclasses.field(default_factory=dict)
  item_knn: item_knn_lib.ItemKNN | None = None
  item_knn_out_of_fold: Mapping[tuple[int, int], float] = dataclasses.field(default_factory=dict)

  def example_features(self, user_id: int, item_id: int,
                       own_rating: float | None = None) -> dict[str, object]:
    """The RATING_STATISTICS_FEATURES of one (user, movie) example.

    Args:
      user_id, item_id: The example.
      own_rating: Its rating when it is a training example (see
        `item_statistics`); None for a validation example.

    Returns:
      `item_statistics(item_id, own_rating)` plus
      `{"neighbor_rating_deviation": neighbor_rating_deviation(user_id, item_id)}`
      and, when `mf` / `item_knn` is set, `{"mf_rating": mf_rating(...)}` /
      `{"item_knn_deviation": item_knn_deviation(...)}`.
    """
    features = self.item_statistics(item_id, own_rating)
    features["neighbor_rating_deviation"] = self.neighbor_rating_deviation(user_id, item_id)
    if self.mf is not None:
      features["mf_rating"] = self.mf_rating(user_id, item_id, training=own_rating is not None)
    if self.item_knn is not None:
      features["item_knn_deviation"] = self.item_knn_deviation(user_id, item_id, training=own_rating
                                                               is not None)
    return features

  def mf_rating(self, user_id: int, item_id: int, training: bool) -> float:
    """The MF prediction of a rating: out-of-fold for a training example, else the full fit's.

    Raises:
      ValueError: no `mf`, or `training` for a (user, movie) with no training rating.
    """
    return _cross_fitted("mf_rating", self.mf, self.mf_out_of_fold, user_id, item_id, training)

  def item_knn_deviation(self, user_id: int, item_id: int, training: bool) -> float:
    """Item-based CF's deviation: out-of-fold for a training example, else the full fit's.

    Raises:
      ValueError: no `item_knn`, or `training` for a (user, movie) with no training rating.
    """
    return _cross_fitted("item_knn_deviation", self.item_knn, self.item_knn_out_of_fold, user_id,
                         item_id, training)

  def neighbor_rating_deviation(self, user_id: int, item_id: int) -> float:
    """How the user's neighbors rated the movie against their own means.

    `sum_v w_v (r_v - mean_v) / (sum_v w_v + shrinkage * mean_v w_v)` over
    the neighbors v of the user that rated the movie in training (w_v their
    Jaccard similarity, mean_v their mean training rating; the last mean is
    over all the user's neighbors); 0.0 when none did. The user's own rating
    never enters.
    """
    neighbors = self.neighbors.get(user_id, [])
    num = den = 0.0
    for other, weight in neighbors:
      rating = self.ratings[other].get(item_id)
      if rating is not None:
        num += weight * (rating - self.user_means[other])
        den += weight
    if not den:
      return 0.0
    return num / (den + self.shrinkage * sum(w for _, w in neighbors) / len(neighbors))

  def item_statistics(self, item_id: int, own_rating: float | None = None) -> dict[str, object]:
    """`{"item_mean_rating": float, "item_rating_count": int}` of a movie.

    Args:
      item_id: The movie.
      own_rating: The example's own rating when it is a training rating:
        left out of the mean and the count (leave-one-out); None for a
        validation example (its rating is in no training total).

    Returns:
      The mean and count of the movie's other training ratings; the mean is
      `global_mean` when there is none.
    """
    total, count = self.item_totals.get(item_id, (0.0, 0))
    if own_rating is not None:
      total, count = total - own_rating, count - 1
    mean = total / count if count else self.global_mean
    return {"item_mean_rating": mean, "item_rating_count": count}

  def history(self, user_id: int, items: Mapping[int, dict[str, object]]) -> dict[str, list]:
    """`{"history_item_ids": [int], "history_genres": [bytes]}` of a user.

    Args:
      user_id: The user (no training rating: empty lists).
      items: `read_items` output, for the movies' genres.
    """
    ids = self.histories.get(user_id, [])
    return {
        "history_item_ids": list(ids),
        "history_genres": [genre for item in ids for genre in items[item]["genres"]]
    }


def _cross_fitted(feature: str, model, out_of_fold: Mapping[tuple[int, int], float], user_id: int,
                  item_id: int, training: bool) -> float:
  """`model.predict` (validation) or the out-of-fold prediction (training) of one example."""
  if model is None:
    raise ValueError(f"{feature}: these TrainingFeatures were computed without it")
  if not training:
    return model.predict(user_id, item_id)
  try:
    return out_of_fold[(user_id, item_id)]
  except KeyError:
    raise ValueError(f"{feature}: user {user_id} has no training rating of movie "
                     f"{item_id}") from None


def training_features(train: Mapping[int, Sequence[Rating]], history_size: int = HISTORY_SIZE,
                      num_neighbors: int = NUM_NEIGHBORS, shrinkage: float = NEIGHBOR_SHRINKAGE,
                      mf_dim: int | None = matrix_factorization.DIM,
                      use_item_knn: bool = True) -> TrainingFeatures:
  """Item rating totals, user histories, user neighbors and MF of the training split.

  Args:
    train: `split_by_time`'s training split, {user_id: time-ordered ratings}.
    history_size: Keep each user's latest this many training movies, >= 1.
    num_neighbors: Nearest users kept per user, >= 1 (Jaccard similarity of
      the sets of training movies; users sharing no movie are no neighbors).
      Needs a [num_users, num_users] float64 matrix: fine for ml-100k's 943
      users, not meant for millions.
    shrinkage: See `TrainingFeatures.neighbor_rating_deviation`, >= 0.
    mf_dim: Factors of the biased MF (`matrix_factorization.fit_als` with its
      other defaults, seed 0; `MF_NUM_FOLDS`-fold cross-fitting for training
      examples); None: no MF (`mf_rating` is not computed). A user with the
      same movie twice in training gets the prediction of one of them.
    use_item_knn: Compute `item_knn_deviation` (`item_knn.fit_item_knn`
      with its defaults; cross-fitted on the same folds as the MF).

  Returns:
    The `TrainingFeatures`; nothing in it depends on a validation rating.

  Raises:
    ValueError: `history_size` or `num_neighbors` < 1, `shrinkage` < 0, or
      an empty split.
  """
  if history_size < 1:
    raise ValueError(f"`history_size` must be positive, got {history_size}")
  if num_neighbors < 1:
    raise ValueError(f"`num_neighbors` must be positive, got {num_neighbors}")
  if not shrinkage >= 0:
    raise ValueError(f"`shrinkage` must be >= 0, got {shrinkage}")
  totals: dict[int, tuple[float, int]] = {}
  for ratings in train.values():
    for r in ratings:
      total, count = totals.get(r.item_id, (0.0, 0))
      totals[r.item_id] = (total + r.rating, count + 1)
  num_ratings = sum(count for _, count in totals.values())
  if not num_ratings:
    raise ValueError("training_features: the training split has no rating")
  global_mean = sum(total for total, _ in totals.values()) / num_ratings
  histories = {user: [r.item_id for r in rs[-history_size:]] for user, rs in train.items()}
  ratings = {user: {r.item_id: r.rating for r in rs} for user, rs in train.items() if rs}
  user_means = {user: sum(rs.values()) / len(rs) for user, rs in ratings.items()}
  table = [(r.user_id, r.item_id, r.rating) for rs in train.values() for r in rs]
  users, items, values = (np.array(column) for column in zip(*table))

  def fitted(fit):
    """The fit on every training rating and {(user, item): out-of-fold prediction}."""
    predictions = cross_fitting.out_of_fold_predictions(fit, users, items, values, MF_NUM_FOLDS)
    return fit(users, items,
               values), {(int(u), int(i)): float(p) for u, i, p in zip(users, items, predictions)}

  mf, mf_out_of_fold = None, {}
  if mf_dim is not None:
    mf, mf_out_of_fold = fitted(lambda u, i, r: matrix_factorization.fit_als(u, i, r, dim=mf_dim))
  knn, knn_out_of_fold = fitted(item_knn_lib.fit_item_knn) if use_item_knn else (None, {})
  return TrainingFeatures(totals, global_mean, histories, ratings, user_means,
                          _jaccard_neighbors(ratings, num_neighbors), shrinkage, mf, mf_out_of_fold,
                          knn, knn_out_of_fold)


def _jaccard_neighbors(ratings: Mapping[int, Mapping[int, float]],
                       num_neighbors: int) -> dict[int, list[tuple[int, float]]]:
  """user -> its `num_neighbors` most similar other users by Jaccard index of their movie sets."""
  users = sorted(ratings)
  column = {item: k for k, item in enumerate(sorted({i for rs in ratings.values() for i in rs}))}
  rated = np.zeros((len(users), len(column)))
  for row, user in enumerate(users):
    rated[row, [column[item] for item in ratings[user]]] = 1.0
  shared = rated @ rated.T
  sizes = rated.sum(axis=1)
  similarity = shared / (sizes[:, None] + sizes[None, :] - shared)
  np.fill_diagonal(similarity, 0.0)
  out = {}
  for row, user in enumerate(users):
    nearest = np.argsort(-similarity[row], kind="stable")[:num_neighbors]
    out[user] = [(users[k], float(similarity[row, k])) for k in nearest if similarity[row, k] > 0]
  return out


def build_movielens_elwc(data_dir: PathLike, out_dir: PathLike, valid_fraction: float = 0.2,
                         max_list_size: int | None = None,
                         rating_range: tuple[float,
                                             float] = RATING_RANGE, on_bad_record: str = "error",
                         history_size: int = HISTORY_SIZE) -> MovieLensElwc:
  """Writes `train.tfrecord` and `valid.tfrecord` (ELWC) for ml-100k.

  One list per user and split (docs/data.md#movielens-files-and-lists for the
  features, `split_by_time` for the split), examples in time order. Files are
  written atomically.

  Args:
    data_dir: directory with `ml-100k.{inter,user,item}`.
    out_dir: output directory, created if missing.
    valid_fraction: share of each user's latest ratings for validation.
    max_list_size: if set, a longer list is cut into consecutive
      time-ordered chunks of at most this many examples, each with the
      user's context, so no rating is dropped.
    rating_range, on_bad_record: the allowed ratings and what a bad row of
      `ml-100k.inter` does (`read_ratings`, `validation.ON_BAD_RECORD`).
    history_size: Training movies per user in `history_item_ids`
      (`training_features`).

  Returns:
    A `MovieLensElwc` with the paths, the list and rating counts and the
    skipped rows.

  Raises:
    ValueError: bad `valid_fraction`, `max_list_size` or `history_size`, malformed files,
      a rating of a user or item the other files do not have, a bad rating
      row (`read_ratings`), or no validation list (no user with 2 ratings).
  """
  if max_list_size is not None and max_list_size < 1:
    raise ValueError(f"`max_list_size` must be positive, got {max_list_size}")
  data_dir, out_dir = pathlib.Path(data_dir), pathlib.Path(out_dir)
  users, items = read_users(data_dir), read_items(data_dir)
  bad_records = validation.BadRecords(str(data_dir / INTER_FILE), on_bad_record)
  train, valid = split_by_time(read_ratings(data_dir, rating_range, bad_records), valid_fraction)
  if not valid:
    raise validation.BadRecordError(f"{data_dir / INTER_FILE}: no validation list: every user has "
                                    "fewer than 2 ratings")
  out_dir.mkdir(parents=True, exist_ok=True)
  features = training_features(train, history_size)
  counts = []
  for name, split in (("train", train), ("valid", valid)):
    path = out_dir / f"{name}.tfrecord"
    lists = _user_lists(split, users, items, max_list_size, features, training=name == "train")
    num_lists = elwc.write_elwc_tfrecord(path, lists)
    counts.append((path, num_lists, sum(map(len, split.values()))))
  (train_path, n_train, r_train), (valid_path, n_valid, r_valid) = counts
  return MovieLensElwc(train_path, valid_path, n_train, n_valid, r_train, r_valid,
                       bad_records.report())


def _user_lists(split: Mapping[int, list[Rating]], users: Mapping[int, dict[str, object]],
                items: Mapping[int, dict[str, object]], max_list_size: int | None,
                features: TrainingFeatures, training: bool):
  """Yields the ELWCs of one split, user by user; `training`: leave-one-out item statistics."""
  for user_id, ratings in split.items():
    if user_id not in users:
      raise ValueError(f"user {user_id} has ratings but is not in "
                       f"{USER_FILE}")
    examples = []
    for r in ratings:
      if r.item_id not in items:
        raise ValueError(f"item {r.item_id} is rated by user "
                         f"{user_id} but is not in {ITEM_FILE}")
      examples.append({
          **items[r.item_id],
          **features.example_features(user_id, r.item_id, r.rating if training else None),
          "timestamp": r.timestamp_s,
          LABEL_FEATURE: r.rating,
      })
    context = {**users[user_id], **features.history(user_id, items)}
    size = max_list_size or len(examples)
    for start in range(0, len(examples), size):
      yield elwc.make_elwc(context, examples[start:start + size])


def _require_columns(path: pathlib.Path, rows: list[dict[str, str]],
                     columns: Sequence[str]) -> None:
  missing = [c for c in columns if rows and c not in rows[0]]
  if missing:
    raise ValueError(f"{path}: missing columns {missing}, has "
                     f"{sorted(rows[0])}")
