"""Interactions with timestamps -> one partition per day, for continuous training.

`split_by_day(data_dir, out_dir)` reads interactions in RecBole's atomic form
(`<name>.inter` with user_id, item_id, rating, timestamp; `<name>.user` and
`<name>.item`, as `fetch("movielens_100k")` gives ml-100k) and writes one
partition per period of `period_days` UTC days: `out_dir/day=YYYY-MM-DD/`
(the period's first day) holding `data.tfrecord`, one ELWC list per user who
rated that period (the user's context, the movies in time order, cut at
`max_list_size`), then its `_SUCCESS` marker (data/partitions.py). Besides the
user and item files' features, each example has features from the earlier
periods only, so a partition depends on no later one: the movie's mean rating
and count (`item_mean_rating`, `item_rating_count`; the earlier global mean
when it has none) and the user's latest `history_size` movies with their
genres (`history_item_ids`, `history_genres`), as the main job computes them
from its training split (data/movielens.py); `neighbor_rating_deviation` is
0.0 (user-based CF is not recomputed per period). With
`arrival_interval_s` > 0 the markers are written that many seconds apart,
replaying the data as a stream (a continuous job polling the directory sees
partitions arrive). A partition that already has its marker is left as it is.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import time
from typing import Callable

from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import movielens
from mxrec_pipeline.data import partitions
from mxrec_pipeline.data import validation

DATA_FILE = "data.tfrecord"
_DAY_S = 86400


@dataclasses.dataclass(frozen=True)
class SplitReport:
  """What `split_by_day` wrote.

  Attributes:
    partitions: Per partition, in order: (name, lists, ratings, written now).
    bad_records: The ratings file's skipped rows (validation.BadRecords.report()).
  """

  partitions: list[tuple[str, int, int, bool]]
  bad_records: dict


def partition_name(timestamp_s: int, first_s: int, period_days: int) -> str:
  """`day=YYYY-MM-DD` of the UTC period holding `timestamp_s`; periods start at `first_s`'s day."""
  start = first_s - first_s % _DAY_S
  period = (timestamp_s - start) // (_DAY_S * period_days)
  day = datetime.datetime.fromtimestamp(start + period * period_days * _DAY_S,
                                        tz=datetime.timezone.utc)
  return f"day={day:%Y-%m-%d}"


def split_by_day(data_dir, out_dir, period_days: int = 1, max_list_size: int | None = 100,
                 rating_range: tuple[float,
                                     float] = movielens.RATING_RANGE, on_bad_record: str = "error",
                 arrival_interval_s: float = 0.0, history_size: int = movielens.HISTORY_SIZE,
                 log: Callable[[str], None] = print) -> SplitReport:
  """Writes the day partitions of an atomic-file data set; see the module docstring.

  Args:
    data_dir: Directory of `ml-100k.{inter,user,item}` (RecBole atomic files).
    out_dir: The partitions directory, created if missing.
    period_days: Days per partition, >= 1.
    max_list_size: A user's longer list of one period is cut into
      consecutive lists of at most this many movies; None: no cut.
    rating_range, on_bad_record: As movielens.read_ratings.
    arrival_interval_s: Seconds between two partitions' markers (>= 0).
    history_size: Latest earlier movies of a user in `history_item_ids`.
    log: Where each written partition is reported.

  Returns:
    A SplitReport.

  Raises:
    ValueError: `period_days` < 1, `max_list_size` < 1, a negative
      `arrival_interval_s`, a rating of a user or item the other files lack
      (naming it), a bad ratings row under on_bad_record "error" (naming
      file:line, column and value), or the files' format errors.
  """
  if period_days < 1:
    raise ValueError(f"period_days must be >= 1, got {period_days}")
  if max_list_size is not None and max_list_size < 1:
    raise ValueError(f"max_list_size must be >= 1, got {max_list_size}")
  if arrival_interval_s < 0:
    raise ValueError(f"arrival_interval_s must be >= 0, got {arrival_interval_s}")
  data_dir, out_dir = pathlib.Path(data_dir), pathlib.Path(out_dir)
  users, items = movielens.read_users(data_dir), movielens.read_items(data_dir)
  bad_records = validation.BadRecords(str(data_dir / movielens.INTER_FILE), on_bad_record)
  ratings = movielens.read_ratings(data_dir, rating_range, bad_records)
  first_s = min(r.timestamp_s for r in ratings)
  by_period: dict[str, dict[int, list[movielens.Rating]]] = {}
  for r in sorted(ratings, key=lambda r: (r.timestamp_s, r.user_id, r.item_id)):
    if r.user_id not in users:
      raise ValueError(f"user {r.user_id} has ratings but is not in {movielens.USER_FILE}")
    if r.item_id not in items:
      raise ValueError(f"item {r.item_id} is rated by user {r.user_id} but is not in "
                       f"{movielens.ITEM_FILE}")
    name = partition_name(r.timestamp_s, first_s, period_days)
    by_period.setdefault(name, {}).setdefault(r.user_id, []).append(r)
  out_dir.mkdir(parents=True, exist_ok=True)
  written, past = [], _Past(history_size, sum(rating_range) / 2)
  for i, name in enumerate(sorted(by_period, key=partitions.sort_key)):
    directory = out_dir / name
    num_ratings = sum(map(len, by_period[name].values()))
    if (directory / partitions.SUCCESS_MARKER).is_file():
      written.append((name, 0, num_ratings, False))
    else:
      if i and arrival_interval_s:
        time.sleep(arrival_interval_s)
      directory.mkdir(exist_ok=True)
      num_lists = elwc.write_elwc_tfrecord(
          directory / DATA_FILE, _lists(by_period[name], users, items, max_list_size, past))
      (directory / partitions.SUCCESS_MARKER).write_text("", encoding="utf-8")
      log(f"{directory}: {num_lists} lists, {num_ratings} ratings")
      written.append((name, num_lists, num_ratings, True))
    past.add(by_period[name])
  return SplitReport(written, bad_records.report())


class _Past:
  """What the periods before the current one tell: item rating totals, user histories."""

  def __init__(self, history_size: int, prior_mean: float):
    self._history_size = history_size
    self._prior_mean = prior_mean  # The global mean before any rating.
    self.item_totals: dict[int, tuple[float, int]] = {}
    self.histories: dict[int, list[int]] = {}

  def features(self) -> movielens.TrainingFeatures:
    """The features of the current period's examples (nothing of the period itself)."""
    count = sum(n for _, n in self.item_totals.values())
    mean = (sum(t for t, _ in self.item_totals.values()) / count if count else self._prior_mean)
    return movielens.TrainingFeatures(self.item_totals, mean, self.histories)

  def add(self, by_user: dict[int, list[movielens.Rating]]) -> None:
    """Adds a period's ratings, once its partition is written."""
    for user_id, ratings in by_user.items():
      for r in ratings:
        total, count = self.item_totals.get(r.item_id, (0.0, 0))
        self.item_totals[r.item_id] = (total + r.rating, count + 1)
      history = self.histories.get(user_id, []) + [r.item_id for r in ratings]
      self.histories[user_id] = history[-self._history_size:]


def _lists(by_user: dict[int, list[movielens.Rating]], users: dict, items: dict,
           max_list_size: int | None, past: _Past):
  """The ELWCs of one period: per user, the movies in time order, cut at max_list_size."""
  features = past.features()
  for user_id, ratings in by_user.items():
    examples = [{
        **items[r.item_id],
        **features.item_statistics(r.item_id),
        "neighbor_rating_deviation": 0.0,
        "timestamp": r.timestamp_s,
        movielens.LABEL_FEATURE: r.rating,
    } for r in ratings]
    context = {**users[user_id], **features.history(user_id, items)}
    size = max_list_size or len(examples)
    for start in range(0, len(examples), size):
      yield elwc.make_elwc(context, examples[start:start + size])
