"""Data partitions that arrive over time, and which one a continuous job trains next.

A partition is a subdirectory of a partitions directory (`day=2026-11-27/`,
`part-00012/`, ...) holding ELWC TFRecord files (`*.tfrecord`). It has
arrived once its `_SUCCESS` marker exists (the convention of Hadoop and Spark
writers: the marker is written after every data file). Partitions are
ordered by name, with runs of digits compared as numbers (`part-9` before
`part-10`; ISO dates sort as they read).

`next_partition` picks what a continuous job trains next from the arrived
partitions and its cursor (`Cursor`: what it trained, what it skipped, the
newest name trained). A partition older than the newest trained one that
arrives late is trained next (`LATE_TRAIN`) or skipped for good
(`LATE_SKIP`). No TensorFlow: used by the CLI before anything is built.
"""

from __future__ import annotations

import dataclasses
import os
import re

SUCCESS_MARKER = "_SUCCESS"
DATA_GLOB = "*.tfrecord"
LATE_TRAIN, LATE_SKIP = "train", "skip"
LATE_POLICIES = (LATE_TRAIN, LATE_SKIP)


def sort_key(name: str) -> tuple:
  """Order of partition names: digit runs as numbers, the rest as text."""
  return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
               for part in re.split(r"(\d+)", name) if part)


@dataclasses.dataclass(frozen=True)
class Partition:
  """One arrived partition.

  Attributes:
    name: Its directory name (e.g. "day=1997-09-20").
    path: Its directory.
    arrived_s: Modification time of its `_SUCCESS` marker (Unix seconds).
  """

  name: str
  path: str
  arrived_s: float

  @property
  def data_pattern(self) -> str:
    """The glob of its ELWC files."""
    return os.path.join(self.path, DATA_GLOB)


def arrived(root: str) -> list[Partition]:
  """The partitions under `root` whose `_SUCCESS` marker exists, in `sort_key` order.

  Raises:
    FileNotFoundError: `root` is not a directory.
  """
  if not os.path.isdir(root):
    raise FileNotFoundError(f"partitions directory {root} does not exist")
  out = []
  for name in os.listdir(root):
    marker = os.path.join(root, name, SUCCESS_MARKER)
    if not name.startswith((".", "_")) and os.path.isfile(marker):
      out.append(Partition(name, os.path.join(root, name), os.path.getmtime(marker)))
  return sorted(out, key=lambda p: sort_key(p.name))


@dataclasses.dataclass
class Cursor:
  """What a continuous job has consumed: saved with every checkpoint.

  Attributes:
    trained: Names of the partitions trained, in training order.
    skipped: Names of late partitions skipped (`LATE_SKIP`).
  """

  trained: list[str] = dataclasses.field(default_factory=list)
  skipped: list[str] = dataclasses.field(default_factory=list)

  @property
  def newest(self) -> str | None:
    """The newest (by `sort_key`) partition trained, or None."""
    return max(self.trained, key=sort_key, default=None)

  def to_dict(self) -> dict:
    return {"trained": list(self.trained), "skipped": list(self.skipped)}

  @classmethod
  def from_dict(cls, saved: dict | None) -> "Cursor":
    """The cursor a checkpoint recorded (None: a checkpoint of a run that was not continuous)."""
    saved = saved or {}
    return cls(list(saved.get("trained", [])), list(saved.get("skipped", [])))


def next_partition(partitions: list[Partition], cursor: Cursor,
                   late: str = LATE_TRAIN) -> tuple[Partition | None, list[Partition]]:
  """(the partition to train next or None, late partitions to skip now).

  Args:
    partitions: `arrived(root)`.
    cursor: The job's cursor.
    late: What a partition older than `cursor.newest` that was neither
      trained nor skipped gets: `LATE_TRAIN`, trained before any newer one
      (oldest first); `LATE_SKIP`, never trained (returned to be recorded).

  Raises:
    ValueError: an unknown `late` policy.
  """
  if late not in LATE_POLICIES:
    raise ValueError(f"late partitions policy must be one of {LATE_POLICIES}, got {late!r}")
  done = set(cursor.trained) | set(cursor.skipped)
  pending = [p for p in partitions if p.name not in done]
  newest = cursor.newest
  if newest is None:
    return (pending[0] if pending else None), []
  late_ones = [p for p in pending if sort_key(p.name) < sort_key(newest)]
  if late_ones and late == LATE_SKIP:
    return next((p for p in pending if p not in late_ones), None), late_ones
  return (pending[0] if pending else None), []
