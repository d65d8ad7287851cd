"""Checks of input records, run once when a reader converts them, and the bad-record policy.

Readers (letor, movielens) check every value while converting a file to ELWC
(`check_feature`, `check_label`, which raise `BadRecord`): a feature or label
that is not a finite float32, a label outside the declared range, a malformed
line. `BadRecords` applies the policy of `data.on_bad_record` to them:

- "error" (default): `BadRecordError` naming `file:line`, the feature and its
  value; the CLI exits with status 2.
- "skip": the record is dropped and counted; `BadRecords.report()` gives the
  counts by reason for the log and metrics.json.

TensorFlow-free. See docs/data.md#bad-records.
"""

import collections
import dataclasses
import math

ON_BAD_RECORD = ("error", "skip")
# Largest finite float32: ELWC float features are float32, so larger values become inf.
FLOAT32_MAX = 3.4028234663852886e38

NON_FINITE_FEATURE = "non-finite feature"
NON_FINITE_LABEL = "non-finite label"
LABEL_OUT_OF_RANGE = "label out of range"
MALFORMED = "malformed record"


class BadRecord(ValueError):
  """One record failed a check; `reason` is one of the reason constants above."""

  def __init__(self, message: str, reason: str = MALFORMED):
    super().__init__(message)
    self.reason = reason


class BadRecordError(ValueError):
  """A bad record under `on_bad_record: error`, or data with no list left."""


def check_on_bad_record(policy: str, key: str = "data.on_bad_record") -> None:
  """Raises ValueError naming `key` unless `policy` is one of ON_BAD_RECORD."""
  if policy not in ON_BAD_RECORD:
    raise ValueError(f"{key} must be one of {list(ON_BAD_RECORD)}, got {policy!r}")


def check_feature(name: str, value: float) -> float:
  """Returns `value` if it is a finite float32, else raises `BadRecord` naming the feature."""
  if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
    raise BadRecord(f"feature {name!r} is {_text(value)}", NON_FINITE_FEATURE)
  return value


def check_label(name: str, value: float, label_range: tuple[float, float]) -> float:
  """Returns `value` if it is finite and in the closed `label_range`, else raises `BadRecord`."""
  if not math.isfinite(value):
    raise BadRecord(f"label {name!r} is {_text(value)}", NON_FINITE_LABEL)
  low, high = label_range
  if not low <= value <= high:
    raise BadRecord(f"label {name!r} is {_text(value)}, outside [{_text(low)}, {_text(high)}]",
                    LABEL_OUT_OF_RANGE)
  return value


@dataclasses.dataclass
class BadRecords:
  """The bad-record policy of one source file, and what it skipped.

  Attributes:
    source: The file (for messages).
    policy: "error" or "skip" (ON_BAD_RECORD).
    by_reason: Skipped records per reason.
    first: Message of the first skipped record, None if none was skipped.

  Example:

    bad = BadRecords("train.txt", policy="skip")
    try:
      check_label("utility", 7.0, (0.0, 4.0))
    except BadRecord as e:
      bad.reject("train.txt:3", e)   # counted (raises BadRecordError under "error")
    bad.report()  # {"skipped": 1, "by_reason": {"label out of range": 1}, "first": ..., ...}
  """

  source: str
  policy: str = "error"
  by_reason: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  first: str | None = None

  def __post_init__(self):
    check_on_bad_record(self.policy)

  @property
  def skipped(self) -> int:
    return sum(self.by_reason.values())

  def reject(self, where: str, error: BadRecord) -> None:
    """Counts a bad record at `where` ("file:line"), or raises `BadRecordError` under "error"."""
    message = f"{where}: {error}"
    if self.policy == "error":
      raise BadRecordError(f"{message}; fix the record or set data.on_bad_record: skip") from None
    self.by_reason[error.reason] += 1
    if self.first is None:
      self.first = message

  def check_not_empty(self, num_records: int) -> None:
    """Raises `BadRecordError` if no record was kept (an empty file, or every record skipped)."""
    if num_records:
      return
    if self.skipped:
      raise BadRecordError(
          f"{self.source}: no records left after skipping {self.skipped} bad record(s) "
          f"(first: {self.first})")
    raise BadRecordError(f"{self.source}: no records (empty file)")

  def report(self) -> dict:
    """JSON-ready `{"source": file, "policy": .., "skipped": n, "by_reason": {reason: n},
    "first": message or None}`."""
    return {
        "source": self.source, "policy": self.policy, "skipped": self.skipped,
        "by_reason": dict(sorted(self.by_reason.items())), "first": self.first
    }


def summary(report: dict) -> str:
  """A `BadRecords.report()` as one line: "<source>: skipped n bad record(s) (...); first: .."."""
  reasons = ", ".join(f"{r}: {n}" for r, n in report["by_reason"].items())
  return (f"{report['source']}: skipped {report['skipped']} bad record(s) ({reasons}); "
          f"first: {report['first']}")


def _text(value: float) -> str:
  """5.0 -> "5", nan -> "nan", 1e300 -> "1e+300"."""
  return f"{value:g}"
