"""Scoring with an exported SavedModel, as a serving client would.

Uses only `tensorflow` and the ELWC writer: the SavedModel maps raw ids itself.

Bad input raises InputError (a ValueError) whose message names the file, the
list (its index), the feature and what was expected, never a TensorFlow
traceback: the JSON structure and values are checked here, and a feature the
SavedModel cannot parse (a float or string for an int64 feature, too many
values) is found by scoring the lists one at a time and named with the dtype or
shape the model expects.
"""

from __future__ import annotations

import json
import math
import re

import tensorflow as tf
from google.protobuf import message

from mxrec_pipeline.data import elwc

SIGNATURE = "serving_default"
# TensorFlow's ParseExample error: "... Key: user_id, Index: 0. <reason> [[{{node ...",
# and the two reasons reworded.
_PARSE_ERROR = re.compile(r"Key: (?P<key>[^,]+), Index: \d+\. (?P<reason>.*?)(?:\s*\[\[|\s*$)",
                          re.DOTALL)
_REASONS = ((re.compile(r"Data types don't match\. Data type: (\w+) but expected type: (\w+)"),
             r"got \1 values, the model expects \2"), (re.compile(
                 r"Number of (\w+) values != expected\. Values size: (\d+) but output shape: "
                 r"(\[[^\]]*\])"), r"got \2 \1 values, the model expects shape \3"))
# Graph noise in TensorFlow's messages: "{{function_node ...}}", "[Op:...]".
_TF_NOISE = re.compile(r"\{\{.*?\}\}|\[\[.*?\]\]|\[Op:.*$", re.DOTALL)


class InputError(ValueError):
  """Lists that cannot be scored; the message names the file, list and feature."""


def load_lists(path: str) -> list[bytes]:
  """Serialized ELWC protos from a JSON file of lists or an ELWC TFRecord file.

  JSON: `[{"context": {feature: value}, "examples": [{feature: value}, ...]}]`,
  values as make_elwc takes them (int, float, str or lists of them; no null).
  `[]` is no list, and a list may have no examples: both score nothing.

  Raises:
    InputError: naming the path and, for JSON, the list index, the example
      index and the feature of a bad value.
    FileNotFoundError: no such file.
  """
  if path.endswith(".json"):
    return [proto.SerializeToString() for proto in _lists_from_json(path)]
  try:
    return [record.SerializeToString() for record in elwc.read_elwc_tfrecord(path)]
  except tf.errors.NotFoundError as e:
    raise FileNotFoundError(f"no such input file: {path}") from e
  except (tf.errors.DataLossError, message.DecodeError) as e:
    raise InputError(f"{path}: not an ELWC TFRecord file ({_first_line(e)}); give a .json "
                     "file of lists or a TFRecord file of ExampleListWithContext") from e


def _lists_from_json(path: str):
  """ELWC protos of a JSON file of lists (see `load_lists`)."""
  with open(path, encoding="utf-8") as f:
    try:
      lists = json.load(f, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
      raise InputError(f"{path}: not valid JSON: {e}") from e
  if not isinstance(lists, list):
    raise InputError(f"{path}: expected a JSON array of lists "
                     f"[{{\"context\": {{...}}, \"examples\": [...]}}], got {_kind(lists)}")
  for i, item in enumerate(lists):
    where = f"{path}: list {i}"
    if not isinstance(item, dict):
      raise InputError(f"{where}: expected an object with \"examples\", got {_kind(item)}")
    unknown = sorted(set(item) - {"context", "examples"})
    if unknown:
      raise InputError(f"{where}: unknown keys {unknown}; a list has \"context\" and "
                       "\"examples\"")
    if "examples" not in item:
      raise InputError(f"{where}: has no \"examples\"")
    context, examples = item.get("context", {}), item["examples"]
    if not isinstance(examples, list):
      raise InputError(f"{where}: \"examples\" must be an array of objects, got "
                       f"{_kind(examples)}")
    _check_features(context, f"{where}, context")
    for j, features in enumerate(examples):
      _check_features(features, f"{where}, example {j}")
    yield elwc.make_elwc(context, examples)


def _check_features(features, where: str) -> None:
  """Raises InputError naming `where` and the feature unless make_example takes `features`."""
  if not isinstance(features, dict):
    raise InputError(f"{where}: expected an object of features, got {_kind(features)}")
  for name, value in features.items():
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, (bool, int, float, str)) for v in values):
      raise InputError(f"{where}, feature {name!r}: expected a number, a string or an array of "
                       f"them, got {json.dumps(value)}")
    try:
      elwc.make_feature(value)
    except (TypeError, ValueError) as e:
      shown = "" if str(value) in str(e) else f" (value {json.dumps(value)})"
      raise InputError(f"{where}, feature {name!r}: {e}{shown}") from e


def _refuse_constant(name: str):
  raise ValueError(f"{name} is not a JSON number (give finite numbers)")


def _kind(value) -> str:
  return {dict: "an object", list: "an array", str: "a string",
          type(None): "null"}.get(type(value), json.dumps(value))


def _first_line(e: Exception) -> str:
  """The error's message on one line, without TensorFlow's graph noise."""
  text = e.message if isinstance(e, tf.errors.OpError) else str(e)
  return " ".join(_TF_NOISE.sub("", text).split())


def load_model(model_dir: str):
  """The SavedModel's serving function (`serving_default`).

  Raises:
    InputError: `model_dir` holds no SavedModel, or one without it.
  """
  try:
    model = tf.saved_model.load(model_dir)
  except (OSError, tf.errors.OpError, ValueError) as e:
    raise InputError(f"{model_dir}: not a SavedModel directory ({_first_line(e)}); give an "
                     "export, e.g. runs/<job>/export/latest_model") from e
  if SIGNATURE not in model.signatures:
    raise InputError(f"{model_dir}: the SavedModel has no {SIGNATURE} signature "
                     f"(has {sorted(model.signatures)})")
  return model.signatures[SIGNATURE]


def score_lists(serve, serialized: list[bytes], path: str) -> list[list[float]]:
  """Scores of serialized ELWC protos, padding removed; non-finite scores stay as they are.

  Raises:
    InputError: a list the model cannot parse, naming `path`, the list index,
      the feature and the model's expected dtype or shape.
  """
  if not serialized:
    return []
  try:
    scores = serve(examples=tf.constant(serialized, tf.string))["scores"].numpy().tolist()
  except tf.errors.InvalidArgumentError as e:
    for i, one in enumerate(serialized):  # Find the first list the model refuses.
      try:
        serve(examples=tf.constant([one], tf.string))
      except tf.errors.InvalidArgumentError as single:
        raise InputError(f"{path}: list {i}: {_describe_parse_error(single)}") from single
    raise InputError(f"{path}: the model cannot score these lists: {_first_line(e)}") from e
  sizes = [len(elwc_proto.examples) for elwc_proto in map(_parse, serialized)]
  return [row[:n] for row, n in zip(scores, sizes)]


def _describe_parse_error(e: tf.errors.InvalidArgumentError) -> str:
  """"feature 'user_id': <TensorFlow's reason>" from a ParseExample error."""
  match = _PARSE_ERROR.search(e.message)
  if match is None:
    return _first_line(e)
  reason = " ".join(match["reason"].split())
  for pattern, replacement in _REASONS:
    reason = pattern.sub(replacement, reason)
  return f"feature {match['key']!r}: {reason}"


def predict_file(model_dir: str, path: str) -> list[list[float]]:
  """Scores every list of `path` with the SavedModel's serving_default.

  Returns:
    One list of scores per input list, its padding removed (NaN or infinite
    scores included as floats: see `to_json`).

  Raises:
    InputError: bad input or model dir (see `load_lists`, `score_lists`).
  """
  serialized = load_lists(path)
  return score_lists(load_model(model_dir), serialized, path)


def to_json(scores: list[list[float]]) -> tuple[str, list[str]]:
  """`{"scores": ...}` as strict JSON, NaN and infinite scores as null.

  Returns:
    The JSON text and one warning per non-finite score, naming its list and
    position.
  """
  warnings = []
  clean = []
  for i, row in enumerate(scores):
    clean.append([])
    for j, score in enumerate(row):
      if math.isfinite(score):
        clean[-1].append(score)
      else:
        clean[-1].append(None)
        warnings.append(f"list {i}, example {j}: the model's score is {score}; printed as null")
  return json.dumps({"scores": clean}, allow_nan=False), warnings


def _parse(serialized: bytes):
  from tensorflow_serving.apis import input_pb2  # pylint: disable=import-outside-toplevel
  proto = input_pb2.ExampleListWithContext()
  proto.ParseFromString(serialized)
  return proto
