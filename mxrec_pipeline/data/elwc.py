"""Builds, writes and reads ELWC (`ExampleListWithContext`) TFRecord files.

ELWC is TF-Ranking's list format: one context `tf.train.Example` (query or
user features) plus the list of example `tf.train.Example`s (documents or
items) it ranks. Parsing into padded tensors is TF-Ranking's job:
`tfr.data.build_ranking_dataset(..., data_format=tfr.data.ELWC, ...)` or
`tfr.data.parse_from_example_list` (see tests/data/test_data_elwc.py).

Example:

    elwc = make_elwc({"qid": 7}, [{"utility": 2.0, "tokens": ["a", "b"]}])
    write_elwc_tfrecord("/tmp/train.tfrecord", [elwc])
    assert list(read_elwc_tfrecord("/tmp/train.tfrecord")) == [elwc]
"""

import numbers
import os
import pathlib
import re
import tempfile
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import input_pb2

PathLike = str | os.PathLike


def make_feature(value: Any) -> tf.train.Feature:
  """Converts a Python/NumPy value to a `tf.train.Feature`.

  Args:
    value: a scalar or a 1-D list / tuple / `np.ndarray` of
      - ints (Python int or bool, NumPy integer or bool) -> `int64_list`,
      - floats (any mix of ints and at least one float) -> `float_list`
        (stored as float32),
      - `str` (UTF-8 encoded) or `bytes` -> `bytes_list`.
      An empty list gives a `Feature` with no kind set, which
      `tf.io.parse_example` reads as an empty `VarLenFeature` of any
      dtype (or the default of a `FixedLenFeature`).

  Raises:
    TypeError: a value of another type, or strings mixed with numbers.
    ValueError: an array with more than one dimension.
  """
  feature = tf.train.Feature()
  _fill_feature(feature, value)
  return feature


def make_example(features: Mapping[str, Any]) -> tf.train.Example:
  """Builds a `tf.train.Example` from `{name: value}`; see `make_feature`.

  Raises:
    TypeError, ValueError: as `make_feature`; the message names the
      feature.
  """
  example = tf.train.Example()
  feature_map = example.features.feature
  for name, value in features.items():
    try:
      _fill_feature(feature_map[name], value)
    except (TypeError, ValueError) as e:
      raise type(e)(f"feature {name!r}: {e}") from None
  return example


def make_elwc(
    context: Mapping[str, Any],
    examples: Sequence[Mapping[str, Any]],
) -> input_pb2.ExampleListWithContext:
  """Builds one ELWC: a context Example and a list of Examples.

  Args:
    context: `{feature name: value}` of the list (query / user).
    examples: one `{feature name: value}` per list entry, in list order.
      Values as in `make_feature`.

  Returns:
    An `input_pb2.ExampleListWithContext`.

  Raises:
    TypeError, ValueError: a value `make_feature` does not accept.
  """
  elwc = input_pb2.ExampleListWithContext()
  elwc.context.CopyFrom(make_example(context))
  for features in examples:
    elwc.examples.add().CopyFrom(make_example(features))
  return elwc


def write_elwc_tfrecord(path: PathLike, elwcs: Iterable[input_pb2.ExampleListWithContext]) -> int:
  """Writes ELWC protos to an uncompressed TFRecord file, atomically.

  Records go to a temporary file next to `path`, which then replaces `path`
  with `os.replace`: readers see the old file or the complete new one, never
  a partial one. The parent directory must exist and be a local path.

  Returns:
    The number of records written.
  """
  return write_records(path, (elwc.SerializeToString() for elwc in elwcs))


def write_records(path: PathLike, records: Iterable[bytes]) -> int:
  """Writes serialized records to an uncompressed TFRecord file, atomically (as above).

  Returns:
    The number of records written.
  """
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  os.close(fd)
  count = 0
  try:
    with tf.io.TFRecordWriter(tmp) as writer:
      for record in records:
        writer.write(record)
        count += 1
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise
  return count


def read_elwc_tfrecord(path: PathLike) -> Iterator[input_pb2.ExampleListWithContext]:
  """Yields the ELWC protos of an uncompressed TFRecord file, in order.

  Raises:
    tf.errors.NotFoundError: no such file.
    tf.errors.DataLossError: a corrupt record.
    google.protobuf.message.DecodeError: a record that is not an ELWC.
  """
  for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
    elwc = input_pb2.ExampleListWithContext()
    elwc.ParseFromString(record)
    yield elwc


def longest_list(pattern: str) -> int:
  """Examples in the longest ELWC record of the files matching `pattern` (0: no record).

  One pass over the records (tf.io.gfile.glob; each parsed); the list size that
  keeps every list of a split whole.

  Raises:
    ValueError: no file matches `pattern`.
    tf.errors.DataLossError, google.protobuf.message.DecodeError: as
      `read_elwc_tfrecord`.
  """
  files = sorted(tf.io.gfile.glob(pattern))
  if not files:
    raise ValueError(f"no file matches {pattern}")
  return max((len(proto.examples) for path in files for proto in read_elwc_tfrecord(path)),
             default=0)


def check_tfrecord(path: PathLike) -> int:
  """Checks every record of an ELWC TFRecord file; returns the number of records.

  One pass with TensorFlow's TFRecord reader, which checks each record's
  framing (length, masked CRC-32C of the length, data, masked CRC-32C of the
  data; tensorflow/core/lib/io/record_reader.cc), then parses the data as an
  `ExampleListWithContext`. Run before training, so a bad file fails at once
  with its name instead of as a `DataLossError` inside `IteratorGetNext`.

  Raises:
    ValueError: "<path>: record N at byte offset X is corrupt" (a CRC
      mismatch), "... is truncated" (the file ends inside the record) or
      "... is not an ExampleListWithContext"; N counts from 1, X is the
      record's first byte.
    tf.errors.NotFoundError: no such file.
  """
  from google.protobuf import message  # pylint: disable=import-outside-toplevel

  count, offset = 0, 0
  size = tf.io.gfile.stat(str(path)).length
  records = iter(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
  while True:
    where = f"{path}: record {count + 1} at byte offset {offset}"
    try:
      record = next(records)
    except StopIteration:
      if offset != size:  # TF's reader stops silently inside a record's length header.
        raise ValueError(f"{where} is truncated (the file ends after {size} bytes, inside the "
                         "record's header); write the file again") from None
      return count
    except tf.errors.DataLossError as e:
      what = "truncated" if "truncated" in e.message else "corrupt"
      detail = re.search(r"(corrupted|truncated) record at \d+", e.message)
      raise ValueError(f"{where} is {what} ({detail.group(0) if detail else e.message}); "
                       "write the file again") from None
    try:
      input_pb2.ExampleListWithContext().ParseFromString(record)
    except message.DecodeError:
      raise ValueError(f"{where} is not an ExampleListWithContext") from None
    count += 1
    offset += len(record) + _TFRECORD_FRAMING_BYTES


# Bytes around a TFRecord's data: uint64 length, uint32 CRC of the length, uint32 CRC of the data.
_TFRECORD_FRAMING_BYTES = 16


def _fill_feature(feature: tf.train.Feature, value: Any) -> None:
  """Writes `value` into the empty `feature` in place (see `make_feature`).

  In place, because building a `Feature` and copying it into an Example's
  map is about 4x slower on the 136-feature MSLR rows; plain Python
  scalars take a fast path for the same reason.
  """
  scalar_type = type(value)
  if scalar_type is float:
    feature.float_list.value.append(value)
    return
  if scalar_type is int:
    feature.int64_list.value.append(value)
    return
  if isinstance(value, np.ndarray):
    if value.ndim > 1:
      raise ValueError(f"feature values must be 1-D, got shape {value.shape}")
    values = value.reshape(-1).tolist()
  elif isinstance(value, (list, tuple)):
    values = value
  else:
    values = (value,)
  if not values:
    return
  if all(isinstance(v, (str, bytes)) for v in values):
    feature.bytes_list.value.extend(v.encode("utf-8") if isinstance(v, str) else v for v in values)
  elif all(isinstance(v, (numbers.Integral, np.bool_)) for v in values):
    feature.int64_list.value.extend(int(v) for v in values)
  elif all(isinstance(v, (numbers.Real, np.bool_)) for v in values):
    feature.float_list.value.extend(float(v) for v in values)
  else:
    kinds = sorted({type(v).__name__ for v in values})
    raise TypeError("feature values must all be int/float or all "
                    f"str/bytes, got types {kinds}")
