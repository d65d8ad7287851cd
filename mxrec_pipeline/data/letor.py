"""Reads LETOR / LibSVM ranking text (MSLR-WEB) and converts it to ELWC.

Format, one query-document pair per line, a query's lines consecutive:

    <label> qid:<int> <feature id>:<value> ... [# comment]

e.g. `2 qid:1 1:3 2:3 ... 136:0` in MSLR-WEB (136 features, ids 1-136,
graded labels 0-4), 46 in LETOR 4.0 (MQ2007/MQ2008), 700 in Yahoo! LTR set 1.
Feature ids are 1-based; a missing feature is 0. The width of a file (its
largest feature id) and its longest list come from one pass over it
(`scan_letor`). Source of the files: `fetch("mslr_5k")`, or MSLR-WEB10K/30K
from Microsoft (docs/data.md). Lines may end in CRLF, as in the MSLR files.

Every value is checked once, while reading (`mxrec_pipeline.data.validation`):
labels must be finite and in `label_range` (MSLR-WEB's grades 0-4 by default),
features finite float32. A bad line raises `BadRecordError` naming `file:line`,
the feature and its value, or is skipped and counted under
`data.on_bad_record: skip`.
"""

import dataclasses
import os
from typing import Iterator

import numpy as np

from mxrec_pipeline.data import validation

PathLike = str | os.PathLike

# Feature and label names of TF-Ranking's DNN example on MSLR-derived data
# (tensorflow_ranking/examples/keras/keras_dnn_tfrecord.py and
# examples/tf_ranking_canned_dnn.py): example features "custom_features_1" ..
# "custom_features_136", each a float32 of shape [1], and the label "utility"
# (float32 in the Keras example, padded with -1).
FEATURE_NAME_PREFIX = "custom_features_"
LABEL_FEATURE = "utility"
QID_FEATURE = "qid"
# MSLR-WEB's graded relevance: 0 (irrelevant) to 4 (perfectly relevant).
LABEL_RANGE = (0.0, 4.0)


@dataclasses.dataclass(frozen=True)
class LetorShape:
  """What one pass over a LETOR file found (`scan_letor`).

  Attributes:
    num_features: The largest feature id of the file (its width); 0 for a
      file without any feature.
    max_list_size: Lines of its longest query; 0 for a file without any.
    num_lists: Its queries.
    zero_features: Ids in [1, num_features] whose value is 0 (or missing) on
      every line, ascending.
  """

  num_features: int
  max_list_size: int
  num_lists: int
  zero_features: tuple[int, ...] = ()

  def to_dict(self) -> dict:
    return dataclasses.asdict(self) | {"zero_features": list(self.zero_features)}

  @classmethod
  def from_dict(cls, values: dict) -> "LetorShape":
    return cls(**(values | {"zero_features": tuple(values["zero_features"])}))


@dataclasses.dataclass(frozen=True)
class QueryList:
  """The documents of one query.

  Attributes:
    qid: query id from `qid:<int>`.
    labels: `[list_size] float32` relevance labels, in file order.
    features: `[list_size, num_features] float32`; column j holds feature
      id j + 1; missing features are 0.
  """

  qid: int
  labels: np.ndarray
  features: np.ndarray


def feature_names(num_features: int = 136) -> list[str]:
  """Returns ["custom_features_1", ..., f"custom_features_{num_features}"]."""
  return [f"{FEATURE_NAME_PREFIX}{i}" for i in range(1, num_features + 1)]


def scan_letor(path: PathLike) -> LetorShape:
  """One pass over a LETOR file: its width, longest list and all-zero features.

  Lenient: a token or line that does not parse is passed over here (reading
  the file with `iter_letor` reports it, naming file:line); a list is the run
  of consecutive lines of one qid.

  Args:
    path: the text file (ASCII / UTF-8).

  Returns:
    The file's `LetorShape` (all 0 for a file without lines).
  """
  nonzero: set[int] = set()
  max_id = max_list = num_lists = 0
  for run in query_runs(path):
    num_lists += 1
    max_list = max(max_list, len(run))
    for _, tokens in run:
      for token in tokens[2:]:
        fid_text, _, value_text = token.partition(":")
        try:
          fid, value = int(fid_text), float(value_text)
        except ValueError:
          continue
        if fid >= 1:
          max_id = max(max_id, fid)
          if value != 0.0:
            nonzero.add(fid)
  zero = tuple(i for i in range(1, max_id + 1) if i not in nonzero)
  return LetorShape(max_id, max_list, num_lists, zero)


def query_runs(path: PathLike) -> Iterator[list[tuple[str, list[str]]]]:
  """Yields each query of a LETOR file as its lines: [(line, tokens before any '#')].

  Lenient, without parsing: a query is a run of consecutive lines with the
  same `qid:` token (the second); lines of fewer than 2 tokens are passed
  over (`iter_letor` reports bad lines).
  """
  run: list[tuple[str, list[str]]] = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      tokens = line.split("#", 1)[0].split()
      if len(tokens) < 2:
        continue
      if run and tokens[1] != run[0][1][1]:
        yield run
        run = []
      run.append((line, tokens))
  if run:
    yield run


def iter_letor(path: PathLike, num_features: int = 136, label_range: tuple[float,
                                                                           float] = LABEL_RANGE,
               bad_records: validation.BadRecords | None = None) -> Iterator[QueryList]:
  """Yields one `QueryList` per query of a LETOR text file, in file order.

  Args:
    path: the text file (ASCII / UTF-8).
    num_features: the largest allowed feature id; also the width of
      `QueryList.features`.
    label_range: (low, high): the allowed labels, inclusive.
    bad_records: policy for bad lines and the counts of skipped ones; None:
      `BadRecords(path, "error")`.

  Raises:
    validation.BadRecordError (a ValueError), under the "error" policy: a
      malformed line (a bad label, missing or bad `qid:`, a token that is
      not `<int id>:<float value>`, a feature id outside [1, num_features]
      or repeated in a line), a label that is not finite or outside
      `label_range`, a feature value that is not a finite float32. The
      message names the file, the 1-based line number and the token, or
      the feature and its value. Under either policy: a file without any
      (valid) line.
    ValueError: a qid whose lines are not consecutive.
  """
  if num_features < 1:
    raise ValueError(f"`num_features` must be positive, got {num_features}")
  if bad_records is None:
    bad_records = validation.BadRecords(str(path))
  num_lists = 0
  qid: int | None = None
  labels: list[float] = []
  rows: list[np.ndarray] = []
  seen = set()
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      tokens = line.split("#", 1)[0].split()
      if not tokens:
        continue
      where = f"{path}:{lineno}"
      try:
        label, line_qid, row = _parse_line(tokens, num_features, label_range)
      except validation.BadRecord as e:
        bad_records.reject(where, e)
        continue
      if line_qid != qid:
        if line_qid in seen:
          raise ValueError(f"{where}: qid {line_qid} appears again after other "
                           "queries; a query's lines must be consecutive")
        if qid is not None:
          num_lists += 1
          yield _make_list(qid, labels, rows)
        qid, labels, rows = line_qid, [], []
        seen.add(line_qid)
      labels.append(label)
      rows.append(row)
  if qid is not None:
    num_lists += 1
    yield _make_list(qid, labels, rows)
  bad_records.check_not_empty(num_lists)


def read_letor(path: PathLike, num_features: int = 136, label_range: tuple[float,
                                                                           float] = LABEL_RANGE,
               bad_records: validation.BadRecords | None = None) -> list[QueryList]:
  """Returns `list(iter_letor(path, ...))`; see `iter_letor`."""
  return list(iter_letor(path, num_features, label_range, bad_records))


def letor_to_elwc(src: PathLike, dst: PathLike, num_features: int = 136,
                  label_range: tuple[float, float] = LABEL_RANGE,
                  bad_records: validation.BadRecords | None = None) -> int:
  """Converts a LETOR text file to an ELWC TFRecord file, one list a query.

  Names follow TF-Ranking's DNN example (see `FEATURE_NAME_PREFIX`), so its
  feature spec reads the output unchanged: each example has float features
  "custom_features_1" .. f"custom_features_{num_features}" (all of them,
  missing ones 0) and the float label "utility"; the context has the int64
  feature "qid". Writing is atomic (`elwc.write_elwc_tfrecord`).

  Args:
    src, num_features, label_range, bad_records: as `iter_letor`.
    dst: the ELWC TFRecord file; not written if `src` has a bad line (under
      the "error" policy) or no list.

  Returns:
    The number of lists (queries) written.

  Raises:
    ValueError: as `iter_letor`.
  """
  from mxrec_pipeline.data import elwc  # TensorFlow only when converting.

  names = feature_names(num_features)

  def lists():
    for query in iter_letor(src, num_features, label_range, bad_records):
      examples = []
      for label, row in zip(query.labels, query.features):
        example = dict(zip(names, row.tolist()))
        example[LABEL_FEATURE] = float(label)
        examples.append(example)
      yield elwc.make_elwc({QID_FEATURE: query.qid}, examples)

  return elwc.write_elwc_tfrecord(dst, lists())


def _parse_line(tokens: list[str], num_features: int, label_range: tuple[float, float]):
  """Returns (label, qid, [num_features] float32 row) of one line; raises `BadRecord`."""
  bad = validation.BadRecord
  try:
    label = float(tokens[0])
  except ValueError:
    raise bad(f"bad label {tokens[0]!r}") from None
  validation.check_label(LABEL_FEATURE, label, label_range)
  if len(tokens) < 2 or not tokens[1].startswith("qid:"):
    got = tokens[1] if len(tokens) > 1 else "end of line"
    raise bad(f"expected 'qid:<int>', got {got!r}")
  try:
    qid = int(tokens[1][len("qid:"):])
  except ValueError:
    raise bad(f"bad qid token {tokens[1]!r}") from None
  row = np.zeros([num_features], np.float32)
  seen = set()
  for token in tokens[2:]:
    fid_text, sep, value_text = token.partition(":")
    try:
      if not sep:
        raise ValueError
      fid, value = int(fid_text), float(value_text)
    except ValueError:
      raise bad(f"bad feature token {token!r}, expected '<int id>:<float value>'") from None
    if not 1 <= fid <= num_features:
      raise bad(f"feature id {fid} out of range [1, {num_features}] (the data's width, "
                f"data.num_features) in token {token!r}")
    if fid in seen:
      raise bad(f"repeated feature id in token {token!r}")
    seen.add(fid)
    row[fid - 1] = validation.check_feature(f"{FEATURE_NAME_PREFIX}{fid}", value)
  return label, qid, row


def _make_list(qid: int, labels: list[float], rows: list[np.ndarray]) -> QueryList:
  return QueryList(qid=qid, labels=np.asarray(labels, np.float32), features=np.stack(rows))
