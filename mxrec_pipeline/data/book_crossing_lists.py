"""Book-Crossing as a ranking task: ELWC lists of each user's explicitly rated books.

One list per user (`book_crossing.split_users`: users with >= 5 explicit
ratings, each user's ratings split at random, seeded, about 80/20), the label
the rating 1-10. Context: the user (id, location, its country, age bucket);
examples: the book (ISBN, author, publisher, year, title tokens), crosses of
real fields as string keys ("<user_id>|<author>", ...; `cross_key`), and rating
statistics of the training split (leave-one-out on training examples, as
data/movielens.py does). A rated ISBN with no row in BX-Books.csv keeps its
ISBN and gets empty attributes. `IdCounter` counts the distinct ids.

Main names: `build_book_crossing_elwc`, `TrainingStatistics`, `cross_key`.
See docs/data.md#book-crossing.
"""

import dataclasses
import json
import os
import pathlib
from typing import Iterator, Mapping, Sequence

from mxrec_pipeline.data import book_crossing
from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import movielens
from mxrec_pipeline.data import validation

PathLike = str | os.PathLike

CONTEXT_FEATURES = ("user_id", "location", "country", "age_bucket")
EXAMPLE_FEATURES = ("isbn", "author", "publisher", "year", "title_tokens")
# Cross name -> the two real fields it joins (`cross_key` of their values).
CROSSES = {
    "user_author": ("user_id", "author"),
    "user_publisher": ("user_id", "publisher"),
    "location_isbn": ("location", "isbn"),
    "country_author": ("country", "author"),
    "age_author": ("age_bucket", "author"),
}
STATISTICS_FEATURES = ("isbn_mean_rating", "isbn_rating_count", "author_mean_rating",
                       "author_rating_count", "user_author_deviation", "user_author_rating_count")
LABEL_FEATURE = "rating"
MAX_LIST_SIZE = 100
STATS_FILE = "stats.json"


def cross_key(a, b) -> str:
  """The string key of a cross: `cross_key(276725, "john grisham")` -> "276725|john grisham"."""
  return f"{a}|{b}"


@dataclasses.dataclass(frozen=True)
class BookCrossingElwc:
  """What `build_book_crossing_elwc` wrote.

  Attributes:
    train_path: ELWC TFRecord of the training lists.
    valid_path: ELWC TFRecord of the validation lists.
    stats: JSON-ready counts: rows read, users, lists and examples per
      split, distinct ids per feature (`IdCounter`); also in
      `out_dir/stats.json`.
    bad_records: `validation.BadRecords.report()` of the three CSVs.
  """

  train_path: pathlib.Path
  valid_path: pathlib.Path
  stats: dict
  bad_records: dict


@dataclasses.dataclass(frozen=True)
class TrainingStatistics:
  """Rating statistics of the training split (`from_split`).

  Attributes:
    isbn_totals: ISBN -> (sum of its training ratings, count).
    author_totals: Author -> (sum, count) over the training ratings of its books.
    user_author: (user_id, author) -> (sum of the user's rating - user mean, count).
    user_means: user_id -> mean training rating.
    global_mean: Mean training rating.
  """

  isbn_totals: Mapping[str, tuple[float, int]]
  author_totals: Mapping[str, tuple[float, int]]
  user_author: Mapping[tuple[int, str], tuple[float, int]]
  user_means: Mapping[int, float]
  global_mean: float

  @classmethod
  def from_split(cls, train: Mapping[int, Sequence[book_crossing.Rating]],
                 books: Mapping[str, book_crossing.Book]) -> "TrainingStatistics":
    """The statistics of `split_users`' training split.

    Raises:
      ValueError: the split has no rating.
    """
    isbn_totals, author_totals, user_author = ({}, {}, {})
    user_means = {user: sum(r.rating for r in rs) / len(rs) for user, rs in train.items() if rs}
    if not user_means:
      raise ValueError("TrainingStatistics: the training split has no rating")
    for user, ratings in train.items():
      for r in ratings:
        _add(isbn_totals, r.isbn, r.rating)
        author = _book(books, r.isbn).author
        if author:
          _add(author_totals, author, r.rating)
          _add(user_author, (user, author), r.rating - user_means[user])
    num = sum(count for _, count in isbn_totals.values())
    global_mean = sum(total for total, _ in isbn_totals.values()) / num
    return cls(isbn_totals, author_totals, user_author, user_means, global_mean)

  def features(self, user_id: int, book: book_crossing.Book,
               own_rating: int | None = None) -> dict[str, object]:
    """The STATISTICS_FEATURES of one (user, book) example.

    Args:
      user_id: The user.
      book: The book.
      own_rating: The example's rating when it is a training example: left out
        of every total (leave-one-out); None for a validation example.

    Returns:
      {"isbn_mean_rating": float (the global mean when no other training
      rating), "isbn_rating_count": int, "author_mean_rating",
      "author_rating_count" (the same over the author's books; no author:
      global mean, 0), "user_author_deviation": float (the user's mean rating
      - own mean over the author's other books, 0.0 when none),
      "user_author_rating_count": int}.
    """
    own = own_rating is not None
    isbn_mean, isbn_count = self._mean(self.isbn_totals, book.isbn, own_rating)
    author_mean, author_count = self._mean(self.author_totals, book.author, own_rating)
    total, count = self.user_author.get((user_id, book.author), (0.0, 0))
    if own and count:
      total, count = total - (own_rating - self.user_means[user_id]), count - 1
    return {
        "isbn_mean_rating": isbn_mean, "isbn_rating_count": isbn_count,
        "author_mean_rating": author_mean, "author_rating_count": author_count,
        "user_author_deviation": total / count if count else 0.0, "user_author_rating_count": count
    }

  def _mean(self, totals: Mapping, key, own_rating: int | None) -> tuple[float, int]:
    total, count = totals.get(key, (0.0, 0)) if key else (0.0, 0)
    if own_rating is not None and count:
      total, count = total - own_rating, count - 1
    return (total / count if count else self.global_mean), count


def _add(totals: dict, key, value: float) -> None:
  total, count = totals.get(key, (0.0, 0))
  totals[key] = (total + value, count + 1)


def _book(books: Mapping[str, book_crossing.Book], isbn: str) -> book_crossing.Book:
  """The book of an ISBN; one without a row in BX-Books.csv has empty attributes."""
  book = books.get(isbn)
  return book if book is not None else book_crossing.Book(isbn, "", "", "", book_crossing.UNKNOWN)


def context_features(user_id: int, users: Mapping[int, book_crossing.User]) -> dict[str, object]:
  """{"user_id": int, "location": str, "country": str, "age_bucket": int} of a user.

  A user without a row in BX-Users.csv has location "" and age bucket UNKNOWN.
  """
  user = users.get(user_id) or book_crossing.User(user_id, "", book_crossing.UNKNOWN)
  return {
      "user_id": user_id, "location": user.location, "country": user.country,
      "age_bucket": user.age_bucket
  }


def example_features(context: Mapping[str, object], book: book_crossing.Book) -> dict[str, object]:
  """The EXAMPLE_FEATURES and CROSSES of one book in a list of `context`.

  Returns:
    {"isbn": str, "author": str, "publisher": str, "year": int,
    "title_tokens": [bytes] (movielens.title_tokens: lower-cased, split on
    white space, punctuation stripped off each end), and each cross name:
    `cross_key` of its two fields}.
  """
  features = {
      "isbn": book.isbn, "author": book.author, "publisher": book.publisher, "year": book.year,
      "title_tokens": movielens.title_tokens(book.title)
  }
  fields = {**context, **features}
  for name, (a, b) in CROSSES.items():
    features[name] = cross_key(fields[a], fields[b])
  return features


def user_lists(split: Mapping[int, Sequence[book_crossing.Rating]],
               users: Mapping[int, book_crossing.User], books: Mapping[str, book_crossing.Book],
               statistics: TrainingStatistics, training: bool,
               max_list_size: int | None = MAX_LIST_SIZE) -> Iterator[tuple[dict, list[dict]]]:
  """Yields (context, examples) of one split's lists, user by user, as `make_elwc` takes them.

  Args:
    split: {user_id: ratings}, in list order.
    users, books: `read_users`, `read_books`.
    statistics: Of the training split.
    training: The split is the training split (leave-one-out statistics).
    max_list_size: A longer list is cut into consecutive lists of at most
      this many books, each with the user's context; None: whole lists.
  """
  for user_id, ratings in split.items():
    context = context_features(user_id, users)
    examples = []
    for r in ratings:
      book = _book(books, r.isbn)
      examples.append({
          **example_features(context, book),
          **statistics.features(user_id, book, r.rating if training else None),
          LABEL_FEATURE: float(r.rating),
      })
    size = max_list_size or len(examples)
    for start in range(0, len(examples), size):
      yield context, examples[start:start + size]


class IdCounter:
  """Distinct ids per id feature of the lists it sees (`add`), per split.

  Id features: CONTEXT_FEATURES, EXAMPLE_FEATURES (title tokens one by one)
  and CROSSES.
  """

  NAMES = (*CONTEXT_FEATURES, *EXAMPLE_FEATURES, *CROSSES)

  def __init__(self):
    self._ids = {split: {name: set() for name in self.NAMES} for split in ("train", "valid")}

  def add(self, split: str, context: Mapping[str, object], examples: Sequence[dict]) -> None:
    """Counts the ids of one list of `split` ("train" or "valid")."""
    ids = self._ids[split]
    for name in CONTEXT_FEATURES:
      ids[name].add(context[name])
    for example in examples:
      for name in (*EXAMPLE_FEATURES, *CROSSES):
        value = example[name]
        if isinstance(value, list):
          ids[name].update(value)
        else:
          ids[name].add(value)

  def report(self) -> dict[str, dict[str, int]]:
    """{feature: {"train": n, "all": n, "valid_unseen": n}}, plus "total" and "total_with_crosses".

    "valid_unseen": validation ids no training list has; "total" sums over the
    features without the crosses, "total_with_crosses" over all.
    """
    out = {}
    for name in self.NAMES:
      train, valid = self._ids["train"][name], self._ids["valid"][name]
      out[name] = {
          "train": len(train), "all": len(train | valid), "valid_unseen": len(valid - train)
      }
    totals = {"total": self.NAMES[:-len(CROSSES)], "total_with_crosses": self.NAMES}
    for total, names in totals.items():
      out[total] = {k: sum(out[n][k] for n in names) for k in ("train", "all", "valid_unseen")}
    return out


def build_book_crossing_elwc(data_dir: PathLike, out_dir: PathLike, valid_fraction: float = 0.2,
                             min_ratings: int = book_crossing.MIN_RATINGS,
                             max_list_size: int | None = MAX_LIST_SIZE, seed: int = 0,
                             on_bad_record: str = "error") -> BookCrossingElwc:
  """Writes `train.tfrecord`, `valid.tfrecord` (ELWC) and `stats.json` for Book-Crossing.

  Args:
    data_dir: Directory of BX-{Book-Ratings,Books,Users}.csv.
    out_dir: Output directory, created if missing; files are written atomically,
      `stats.json` last.
    valid_fraction, min_ratings, seed: As `book_crossing.split_users`.
    max_list_size: As `user_lists`.
    on_bad_record: "error" or "skip" (`book_crossing.read_all`).

  Returns:
    A `BookCrossingElwc`.

  Raises:
    ValueError: bad arguments, a bad record under "error" or a file left
      without records (`book_crossing.read_ratings`), or no user with
      `min_ratings` explicit ratings.
  """
  if max_list_size is not None and max_list_size < 1:
    raise ValueError(f"`max_list_size` must be positive, got {max_list_size}")
  data_dir, out_dir = pathlib.Path(data_dir), pathlib.Path(out_dir)
  bad_records = validation.BadRecords(str(data_dir / "BX-*.csv"), on_bad_record)
  ratings, books, users = book_crossing.read_all(data_dir, bad_records=bad_records)
  train, valid = book_crossing.split_users(ratings.explicit, min_ratings, valid_fraction, seed)
  if not train:
    raise validation.BadRecordError(
        f"{data_dir / book_crossing.RATINGS_FILE}: no list: no user has {min_ratings} explicit "
        "ratings")
  statistics = TrainingStatistics.from_split(train, books)
  out_dir.mkdir(parents=True, exist_ok=True)
  stats = {
      "rows": {
          "ratings": ratings.num_rows, "implicit": ratings.num_implicit,
          "explicit": len(ratings.explicit), "duplicates": ratings.num_duplicates,
          "books": len(books), "users": len(users)
      },
      "users": len(train),
      "explicit_without_book_row": sum(
          r.isbn not in books for rs in (train, valid) for v in rs.values() for r in v),
  }
  paths, ids = {}, IdCounter()
  for name, split in (("train", train), ("valid", valid)):
    paths[name] = out_dir / f"{name}.tfrecord"
    sizes = []

    def counted(lists, name=name, sizes=sizes):
      for context, examples in lists:
        ids.add(name, context, examples)
        sizes.append(len(examples))
        yield elwc.make_elwc(context, examples)

    elwc.write_elwc_tfrecord(
        paths[name],
        counted(user_lists(split, users, books, statistics, name == "train", max_list_size)))
    stats[name] = {"lists": len(sizes), "examples": sum(sizes), "longest_list": max(sizes)}
  stats["distinct_ids"] = ids.report()
  stats["bad_records"] = bad_records.report()
  staged = out_dir / f".{STATS_FILE}.tmp"  # Written last, atomically: the conversion is done.
  staged.write_text(json.dumps(stats, indent=2), encoding="utf-8")
  os.replace(staged, out_dir / STATS_FILE)
  return BookCrossingElwc(paths["train"], paths["valid"], stats, bad_records.report())
