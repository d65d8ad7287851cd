"""Interactions with timestamps -> one partition per day, for continuous training.

`split_by_day(data_dir, out_dir)` reads interactions in RecBole's atomic form
(`<name>.inter` with user_id, item_id, rating, timestamp; `<name>.user` and
`<name>.item`, as `fetch("movielens_100k")` gives ml-100k) and writes one
partition per period of `period_days` UTC days: `out_dir/day=YYYY-MM-DD/`
(the period's first day) holding `data.tfrecord`, one ELWC list per user who
rated that period (the user's context, the movies in time order, cut at
`max_list_size`), then its `_SUCCESS` marker (data/partitions.py). The
features are the raw ones of the user and item files: nothing computed from
other ratings, so a partition depends on no later one. With
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
                 arrival_interval_s: float = 0.0, log: Callable[[str],
                                                                None] = print) -> SplitReport:
  """Writes the day partitions of an atomic-file data set; see the module docstring.

  Args:
    data_dir: Directory of `ml-100k.{inter,user,item}` (RecBole atomic files).
    out_dir: The partitions directory, created if missing.
    period_days: Days per partition, >= 1.
    max_list_size: A user's longer list of one period is cut into
      consecutive lists of at most this many movies; None: no cut.
    rating_range, on_bad_record: As movielens.read_ratings.
    arrival_interval_s: Seconds between two partitions' markers (>= 0).
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
  written = []
  for i, name in enumerate(sorted(by_period, key=partitions.sort_key)):
    directory = out_dir / name
    num_ratings = sum(map(len, by_period[name].values()))
    if (directory / partitions.SUCCESS_MARKER).is_file():
      written.append((name, 0, num_ratings, False))
      continue
    if i and arrival_interval_s:
      time.sleep(arrival_interval_s)
    directory.mkdir(exist_ok=True)
    num_lists = elwc.write_elwc_tfrecord(directory / DATA_FILE,
                                         _lists(by_period[name], users, items, max_list_size))
    (directory / partitions.SUCCESS_MARKER).write_text("", encoding="utf-8")
    log(f"{directory}: {num_lists} lists, {num_ratings} ratings")
    written.append((name, num_lists, num_ratings, True))
  return SplitReport(written, bad_records.report())


def _lists(by_user: dict[int, list[movielens.Rating]], users: dict, items: dict,
           max_list_size: int | None):
  """The ELWCs of one period: per user, the movies in time order, cut at max_list_size."""
  for user_id, ratings in by_user.items():
    examples = [{**items[r.item_id], "timestamp": r.timestamp_s, movielens.LABEL_FEATURE: r.rating}
                for r in ratings]
    size = max_list_size or len(examples)
    for start in range(0, len(examples), size):
      yield elwc.make_elwc(users[user_id], examples[start:start + size])
