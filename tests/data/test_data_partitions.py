"""Tests for mxrec_pipeline.data.partitions: arrival, order, the cursor and late partitions."""

import pytest

from mxrec_pipeline.data import partitions


def _make(root, *names, marker=True):
  for name in names:
    (root / name).mkdir(parents=True)
    (root / name / "data.tfrecord").write_bytes(b"")
    if marker:
      (root / name / partitions.SUCCESS_MARKER).write_text("")


def _names(found):
  return [p.name for p in found]


def test_only_partitions_with_their_marker_have_arrived_in_numeric_order(tmp_path):
  _make(tmp_path, "part-10", "part-9", "part-100")
  _make(tmp_path, "part-11", marker=False)  # Still being written.
  _make(tmp_path, ".part-12.tmp", "_temporary")  # Writers' scratch directories.
  (tmp_path / "notes.txt").write_text("a file, not a partition")
  found = partitions.arrived(str(tmp_path))
  assert _names(found) == ["part-9", "part-10", "part-100"]
  assert found[0].data_pattern == str(tmp_path / "part-9" / "*.tfrecord")
  assert found[0].arrived_s > 0


def test_dates_sort_as_they_read():
  names = ["day=1998-01-02", "day=1997-12-31", "day=1998-01-10"]
  assert sorted(names,
                key=partitions.sort_key) == ["day=1997-12-31", "day=1998-01-02", "day=1998-01-10"]


def test_a_missing_directory_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere"):
    partitions.arrived(str(tmp_path / "nowhere"))


def test_next_partition_follows_the_cursor(tmp_path):
  _make(tmp_path, "p1", "p2", "p3")
  found = partitions.arrived(str(tmp_path))
  cursor = partitions.Cursor()
  order = []
  while True:
    partition, skipped = partitions.next_partition(found, cursor)
    assert skipped == []
    if partition is None:
      break
    order.append(partition.name)
    cursor.trained.append(partition.name)
  assert order == ["p1", "p2", "p3"]
  assert cursor.newest == "p3"


@pytest.mark.parametrize("policy, expected_next, expected_skipped", [("train", "p2", []),
                                                                     ("skip", "p5", ["p2"])])
def test_a_late_partition_is_trained_next_or_skipped(tmp_path, policy, expected_next,
                                                     expected_skipped):
  _make(tmp_path, "p1", "p2", "p3", "p5")
  cursor = partitions.Cursor(trained=["p1", "p3"])  # p2 arrived after p3 was trained.
  partition, skipped = partitions.next_partition(partitions.arrived(str(tmp_path)), cursor, policy)
  assert partition.name == expected_next
  assert _names(skipped) == expected_skipped


def test_skipped_partitions_stay_skipped(tmp_path):
  _make(tmp_path, "p1", "p2", "p3")
  cursor = partitions.Cursor(trained=["p1", "p3"], skipped=["p2"])
  assert partitions.next_partition(partitions.arrived(str(tmp_path)), cursor, "train") == (None, [])


def test_cursor_round_trips_and_starts_empty():
  cursor = partitions.Cursor(trained=["b", "a"], skipped=["c"])
  assert partitions.Cursor.from_dict(cursor.to_dict()) == cursor
  assert partitions.Cursor.from_dict(None) == partitions.Cursor()
  assert partitions.Cursor().newest is None


def test_an_unknown_late_policy_is_named():
  with pytest.raises(ValueError, match="'later'"):
    partitions.next_partition([], partitions.Cursor(), "later")
