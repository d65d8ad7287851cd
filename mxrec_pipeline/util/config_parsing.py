"""Raw YAML values into dataclasses, and `--set key=value` overrides.

Shared by job configs (mxrec_pipeline.config) and sweep configs
(mxrec_pipeline.sweep.config), so both report a bad value the same way,
naming its dotted key (`pipeline.learning_rate`). TensorFlow-free: the command
line validates a config before anything imports TensorFlow.

Each function takes the exception class to raise (`ConfigError`,
`SweepConfigError`); it must accept one message argument.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

import yaml

from mxrec_pipeline.util import yaml_io


def parse_override(override: str, error: type[Exception]) -> tuple[str, Any]:
  """Splits `a.b.c=value` into the dotted key and the value parsed as YAML.

  Raises:
    error: no `=`, an empty key or key part, or a value that is not YAML.
  """
  if "=" not in override:
    raise error(f"--set expects key=value, got {override!r}")
  key, value = override.split("=", 1)
  key = key.strip()
  if not all(key.split(".")):
    raise error(f"--set {override!r}: the key must be dotted names like pipeline.num_epochs")
  try:
    return key, yaml_io.safe_load(value)
  except yaml.YAMLError as e:
    raise error(f"--set {key}: the value is not valid YAML "
                f"({value!r}: {yaml_io.one_line(e)})") from e


def apply_override(raw: dict, override: str, error: type[Exception]) -> None:
  """Sets `a.b.c=value` (see `parse_override`) in a nested raw config dict, in place.

  Raises:
    error: a bad override, or a path through a value that is not a mapping.
  """
  key, value = parse_override(override, error)
  *sections, name = key.split(".")
  node = raw
  for part in sections:
    node = node.setdefault(part, {})
    if not isinstance(node, dict):
      raise error(f"--set {key}: '{part}' is not a section")
  node[name] = value


def check_keys(values, known, where: str, error: type[Exception]) -> None:
  """Raises `error` naming `where.key` for keys of `values` not in `known`.

  Raises:
    error: `values` is not a mapping, or has unknown keys (all named, with
      the known ones).
  """
  if not isinstance(values, dict):
    raise error(f"{where} must be a mapping, got {type(values).__name__}")
  unknown = sorted(set(values) - set(known))
  if unknown:
    raise error(f"unknown keys {[f'{where}.{k}' for k in unknown]}; "
                f"{where} takes {sorted(known)}")


def build_dataclass(cls, values, where: str, error: type[Exception]):
  """`cls(**values)` with unknown keys, missing fields and value types checked.

  Ints are widened to float where a float is expected; bools are not ints;
  floats must be finite (YAML's `.inf`, `.nan` and `1.0e999` are refused).
  Errors of `cls.__post_init__` (TypeError, ValueError) are re-raised as
  `error`, prefixed with `where`.

  Args:
    cls: A dataclass.
    values: Raw values (from YAML) by field name.
    where: Dotted name of the section, e.g. "pipeline".
    error: The exception class to raise.

  Raises:
    error: naming `where.key` and the problem.
  """
  fields = {f.name: f for f in dataclasses.fields(cls)}
  check_keys(values, fields, where, error)
  hints = typing.get_type_hints(cls)
  for name, field in fields.items():
    required = (field.default is dataclasses.MISSING and
                field.default_factory is dataclasses.MISSING)
    if required and name not in values:
      raise error(f"{where}.{name} is required")
    if name in values:
      values = {**values, name: check_type(values[name], hints[name], f"{where}.{name}", error)}
  try:
    return cls(**values)
  except (TypeError, ValueError) as e:
    raise error(f"{where}: {e}") from e


def check_type(value, hint, key: str, error: type[Exception]):
  """Returns `value` (an int widened to float where a float is expected).

  Floats must be finite.

  Checks unions (`int | None`), `list[T]` items, `dict`, plain classes;
  anything else (`Any`, other generics) passes.

  Raises:
    error: naming `key`, the expected type and the value.
  """
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    options = typing.get_args(hint)
    if value is None and type(None) in options:
      return None
    errors = []
    for option in options:
      if option is type(None):
        continue
      try:
        return check_type(value, option, key, error)
      except error as e:
        errors.append(str(e))
    raise error(errors[0] if errors else f"{key} must not be null")
  if origin is list:
    if not isinstance(value, list):
      raise error(f"{key} must be a list, got {value!r}")
    (item,) = typing.get_args(hint) or (Any,)
    return [check_type(v, item, f"{key}[{i}]", error) for i, v in enumerate(value)]
  if origin is dict or hint is dict:
    if not isinstance(value, dict):
      raise error(f"{key} must be a mapping, got {value!r}")
    return value
  if hint is Any or origin is not None:
    return value
  if hint is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if hint is float and isinstance(value, float) and not math.isfinite(value):
    raise error(f"{key} must be a finite number, got {value}")
  if hint in (int, float) and isinstance(value, bool):
    raise error(f"{key} must be {hint.__name__}, got {value!r}")
  if isinstance(hint, type) and not isinstance(value, hint):
    raise error(f"{key} must be {hint.__name__}, got {value!r}")
  return value
