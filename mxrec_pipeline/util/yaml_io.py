"""Reading YAML config files (TensorFlow-free: sweep workers use it too).

`UniqueKeyLoader` is PyYAML's SafeLoader refusing a mapping that repeats a key
(SafeLoader silently keeps the last value); job configs, sweep configs and
`--set` values are all read with it.
"""

from __future__ import annotations

import yaml

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError):
  """A YAML mapping repeats a key; the message names it and both lines."""


class UniqueKeyLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
  """SafeLoader that raises DuplicateKeyError for a repeated mapping key.

  Keys merged in with `<<` may be overridden, as YAML's merge key allows;
  keys written twice in one mapping may not.
  """

  def construct_mapping(self, node, deep=False):
    if isinstance(node, yaml.MappingNode):
      first_line = {}
      for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
          continue
        key = self.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
          if key in first_line:
            where = (f"lines {first_line[key]} and {line}"
                     if first_line[key] != line else f"twice on line {line}")
            raise DuplicateKeyError(None, None,
                                    f"duplicate key {key!r} ({where}): remove one of them")
          first_line[key] = line
        except TypeError:
          continue  # An unhashable key: SafeLoader's own error names it.
    return super().construct_mapping(node, deep=deep)


def safe_load(text):
  """`yaml.safe_load`, refusing duplicate mapping keys (`UniqueKeyLoader`)."""
  return yaml.load(text, Loader=UniqueKeyLoader)  # nosec: a SafeLoader.


def load_yaml_mapping(path: str, error: type[Exception], what: str, expected: str) -> dict:
  """The YAML mapping in `path`.

  Raises:
    error: unreadable file, not UTF-8, bad YAML, a repeated key, or not a
      mapping (naming `what`, the path and `expected`).
  """
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise error(f"cannot read {what} {path}: {e.strerror or e}") from e
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise error(f"{what} {path} is not UTF-8 text: byte 0x{data[e.start]:02x} on line {line} "
                "(save it as UTF-8)") from e
  try:
    raw = safe_load(text)
  except yaml.YAMLError as e:
    raise error(f"{what} {path} is not valid YAML: {one_line(e)}") from e
  if not isinstance(raw, dict):
    raise error(f"{what} {path} must be {expected}")
  return raw


def one_line(e: yaml.YAMLError) -> str:
  """PyYAML's error on one line: the problem and where (line, column), no excerpt."""
  if not isinstance(e, yaml.MarkedYAMLError) or e.problem is None:
    return " ".join(str(e).split())
  where = "" if e.problem_mark is None else (
      f" at line {e.problem_mark.line + 1}, column {e.problem_mark.column + 1}")
  context = f"{e.context}: " if e.context else ""
  return f"{context}{e.problem}{where}"
