"""Tests for mxrec_pipeline.data.split_by_day: interactions -> day partitions with markers."""

import pytest

from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import partitions
from mxrec_pipeline.data import split_by_day

_DAY = 86400
# (user, item, rating, timestamp): 1997-09-20 is day 0.
_START = 874713600  # 1997-09-20 00:00 UTC.
_INTER = [
    (1, 10, 4.0, _START + 50),
    (1, 11, 3.0, _START + 10),  # Listed out of time order.
    (2, 12, 5.0, _START + 20),
    (2, 10, 1.0, _START + _DAY + 5),
    (1, 12, 2.0, _START + 3 * _DAY + 7),
]
_USERS = ("user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
          "1\t24\tM\ttechnician\t85711\n"
          "2\t53\tF\tother\t94043\n")
_ITEMS = ("item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
          "10\tToy Story\t1995\tAnimation Comedy\n"
          "11\tHeat\t1995\tAction\n"
          "12\tFargo\t1996\tCrime Drama\n")


def write_interactions(data_dir, inter=_INTER):
  """RecBole atomic files of a tiny MovieLens whose ratings span days."""
  data_dir.mkdir(parents=True)
  (data_dir /
   "ml-100k.inter").write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n" +
                               "".join(f"{u}\t{i}\t{r:g}\t{t}\n" for u, i, r, t in inter))
  (data_dir / "ml-100k.user").write_text(_USERS)
  (data_dir / "ml-100k.item").write_text(_ITEMS)
  return data_dir


def _lists(path):
  out = []
  for proto in elwc.read_elwc_tfrecord(path):
    user = proto.context.features.feature["user_id"].int64_list.value[0]
    items = [(e.features.feature["item_id"].int64_list.value[0],
              e.features.feature["rating"].float_list.value[0]) for e in proto.examples]
    out.append((user, items))
  return out


def test_one_partition_per_day_with_its_marker_and_lists_in_time_order(tmp_path):
  report = split_by_day.split_by_day(write_interactions(tmp_path / "ml"), tmp_path / "days",
                                     log=lambda _: None)
  assert [(name, lists, ratings) for name, lists, ratings, _ in report.partitions
         ] == [("day=1997-09-20", 2, 3), ("day=1997-09-21", 1, 1), ("day=1997-09-23", 1, 1)]
  assert [p.name for p in partitions.arrived(str(tmp_path / "days"))
         ] == ["day=1997-09-20", "day=1997-09-21", "day=1997-09-23"]
  assert _lists(tmp_path / "days" / "day=1997-09-20" / "data.tfrecord") == [(1, [(11, 3.0),
                                                                                 (10, 4.0)]),
                                                                            (2, [(12, 5.0)])]
  assert _lists(tmp_path / "days" / "day=1997-09-23" / "data.tfrecord") == [(1, [(12, 2.0)])]


def test_periods_of_several_days_and_list_cuts(tmp_path):
  report = split_by_day.split_by_day(write_interactions(tmp_path / "ml"), tmp_path / "days",
                                     period_days=2, max_list_size=1, log=lambda _: None)
  assert [(name, lists, ratings) for name, lists, ratings, _ in report.partitions
         ] == [("day=1997-09-20", 4, 4), ("day=1997-09-22", 1, 1)]


def test_a_rerun_leaves_complete_partitions_alone(tmp_path):
  data_dir = write_interactions(tmp_path / "ml")
  split_by_day.split_by_day(data_dir, tmp_path / "days", log=lambda _: None)
  (tmp_path / "days" / "day=1997-09-21" / partitions.SUCCESS_MARKER).unlink()  # Killed writer.
  report = split_by_day.split_by_day(data_dir, tmp_path / "days", log=lambda _: None)
  assert [(name, written) for name, *_, written in report.partitions] == [("day=1997-09-20", False),
                                                                          ("day=1997-09-21", True),
                                                                          ("day=1997-09-23", False)]


def test_a_rating_of_an_unknown_item_is_named(tmp_path):
  data_dir = write_interactions(tmp_path / "ml", _INTER + [(2, 99, 3.0, _START)])
  with pytest.raises(ValueError, match="item 99 is rated by user 2"):
    split_by_day.split_by_day(data_dir, tmp_path / "days", log=lambda _: None)
  assert not (tmp_path / "days").exists()


@pytest.mark.parametrize("kwargs, match", [({"period_days": 0}, "period_days"),
                                           ({"max_list_size": 0}, "max_list_size"),
                                           ({"arrival_interval_s": -1}, "arrival_interval_s")])
def test_bad_arguments_are_named(tmp_path, kwargs, match):
  with pytest.raises(ValueError, match=match):
    split_by_day.split_by_day(tmp_path, tmp_path / "days", **kwargs)


def test_features_come_from_earlier_days_only(tmp_path):
  split_by_day.split_by_day(write_interactions(tmp_path / "ml"), tmp_path / "days",
                            log=lambda _: None)

  def examples(day):
    protos = list(elwc.read_elwc_tfrecord(tmp_path / "days" / day / "data.tfrecord"))
    return [(p.context.features.feature["history_item_ids"].int64_list.value[:],
             [(e.features.feature["item_id"].int64_list.value[0],
               e.features.feature["item_mean_rating"].float_list.value[0],
               e.features.feature["item_rating_count"].int64_list.value[0]) for e in p.examples])
            for p in protos]

  # Day 1: nothing earlier: no history, the prior mean 3 (middle of 1-5) and count 0.
  assert examples("day=1997-09-20") == [([], [(11, 3.0, 0), (10, 3.0, 0)]), ([], [(12, 3.0, 0)])]
  # Day 2: user 2's movie of day 1; movie 10's one earlier rating (4 by user 1).
  assert examples("day=1997-09-21") == [([12], [(10, 4.0, 1)])]
  # Day 4: user 1's movies of day 1 in time order; movie 12: rated 5 on day 1 only (the global
  # mean of days 1-2 would be (3 + 4 + 5 + 1) / 4 for a movie never rated).
  assert examples("day=1997-09-23") == [([11, 10], [(12, 5.0, 1)])]


def test_the_command_writes_the_partitions_and_names_a_missing_directory(tmp_path, capsys):
  from mxrec_pipeline import cli  # pylint: disable=import-outside-toplevel
  data_dir = write_interactions(tmp_path / "ml")
  assert cli.main(["data", "split-by-day", str(data_dir), str(tmp_path / "days")]) == 0
  assert "3 partitions (3 written now" in capsys.readouterr().out
  assert cli.main(["data", "split-by-day", str(tmp_path / "none"), str(tmp_path / "days")]) == 2
  assert str(tmp_path / "none") in capsys.readouterr().err
