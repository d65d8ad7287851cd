"""The search space of a sweep: dotted job-config keys and their distributions.

A parameter is a dotted key of the job config (`pipeline.learning_rate`,
`model.id_dim`, `pipeline.loss`, `model.hidden_layer_dims`) with an Optuna
distribution:

  pipeline.learning_rate: {type: float, low: 1.0e-4, high: 0.03, log: true}
  model.id_dim: {type: int, low: 8, high: 32, step: 8}
  pipeline.loss: {type: categorical, choices: [softmax_loss, approx_ndcg_loss]}
  model.hidden_layer_dims: {type: categorical, choices: [[64, 32], [128, 64, 32]]}

Optuna stores categorical choices that are None, bool, int, float or str; any
other choice (a list, a mapping) is given to Optuna as its YAML flow text
("[64, 32]") and turned back into the value when the trial's config is built.
A trial's values become `--set`-style overrides of the base job config.

Nothing here imports TensorFlow: the sweep's worker processes load it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import yaml


class ParamType:
  """Values accepted as a parameter's `type`."""

  FLOAT = "float"
  INT = "int"
  CATEGORICAL = "categorical"


PARAM_TYPES = (ParamType.FLOAT, ParamType.INT, ParamType.CATEGORICAL)
_SCALARS = (type(None), bool, int, float, str)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  """One dimension of the search space.

  Attributes:
    key: Dotted job-config key the value goes to, e.g. "pipeline.learning_rate".
    type: "float", "int" or "categorical".
    low: Smallest value (float, int), inclusive.
    high: Largest value (float, int), inclusive.
    log: Sample on a log scale (float, int); needs low > 0 and no step.
    step: Distance between values (float, int); None: continuous floats, 1 for ints.
    choices: The values (categorical), distinct; scalars, lists or mappings.

  Raises:
    ValueError: naming the key and the bad value.
  """

  key: str
  type: str
  low: float | int | None = None
  high: float | int | None = None
  log: bool = False
  step: float | int | None = None
  choices: tuple | None = None

  def __post_init__(self):
    where = f"search_space.{self.key}"
    if not isinstance(self.key, str) or self.key.count(".") < 1 or "" in self.key.split("."):
      raise ValueError(f"search_space keys must be dotted job-config keys like "
                       f"'pipeline.learning_rate', got {self.key!r}")
    if self.type not in PARAM_TYPES:
      raise ValueError(f"{where}: `type` must be one of {list(PARAM_TYPES)}, got {self.type!r}")
    if self.type == ParamType.CATEGORICAL:
      self._check_categorical(where)
    else:
      self._check_range(where)

  def _check_categorical(self, where):
    for name in ("low", "high", "step"):
      if getattr(self, name) is not None:
        raise ValueError(f"{where}: `{name}` is for float and int parameters, not categorical")
    if self.log:
      raise ValueError(f"{where}: `log` is for float and int parameters, not categorical")
    if not isinstance(self.choices, (list, tuple)) or not self.choices:
      raise ValueError(f"{where}: `choices` must be a non-empty list, got {self.choices!r}")
    encoded = [encode_choice(c) for c in self.choices]
    if len(set(map(repr, encoded))) != len(encoded):
      raise ValueError(f"{where}: `choices` must be distinct, got {list(self.choices)}")
    object.__setattr__(self, "choices", tuple(self.choices))

  def _check_range(self, where):
    if self.choices is not None:
      raise ValueError(f"{where}: `choices` is for categorical parameters, not {self.type}")
    number = int if self.type == ParamType.INT else (int, float)
    for name in ("low", "high"):
      value = getattr(self, name)
      if not isinstance(value, number) or isinstance(value, bool):
        kind = "an int" if self.type == "int" else "a number"
        raise ValueError(f"{where}: `{name}` must be {kind}, got {value!r}")
    if not self.low <= self.high:
      raise ValueError(f"{where}: `low` must be <= `high`, got low={self.low}, high={self.high}")
    if not isinstance(self.log, bool):
      raise ValueError(f"{where}: `log` must be true or false, got {self.log!r}")
    if self.log and self.low <= 0:
      raise ValueError(f"{where}: `log` needs `low` > 0, got low={self.low}")
    if self.step is not None:
      if self.log:
        raise ValueError(f"{where}: `step` and `log` cannot be combined")
      if not isinstance(self.step, number) or isinstance(self.step, bool) or self.step <= 0:
        raise ValueError(f"{where}: `step` must be a positive "
                         f"{'int' if self.type == 'int' else 'number'}, got {self.step!r}")

  def suggest(self, trial: optuna.trial.Trial) -> Any:
    """Samples this parameter in `trial`; returns the job-config value."""
    if self.type == ParamType.FLOAT:
      return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
    if self.type == ParamType.INT:
      return trial.suggest_int(self.key, self.low, self.high, log=self.log, step=self.step or 1)
    encoded = trial.suggest_categorical(self.key, [encode_choice(c) for c in self.choices])
    return self.decode(encoded)

  def decode(self, stored: Any) -> Any:
    """The job-config value of a value Optuna stored for this parameter."""
    if self.type != ParamType.CATEGORICAL:
      return stored
    for choice in self.choices:
      if encode_choice(choice) == stored:
        return choice
    raise ValueError(f"search_space.{self.key}: stored value {stored!r} is not among the "
                     f"choices {list(self.choices)}")

  def to_dict(self) -> dict:
    """The YAML form of the spec (without `key`), loadable by `from_dict`."""
    out = {"type": self.type}
    if self.type == ParamType.CATEGORICAL:
      out["choices"] = list(self.choices)
    else:
      out.update(low=self.low, high=self.high, log=self.log)
      if self.step is not None:
        out["step"] = self.step
    return out


def encode_choice(choice: Any) -> Any:
  """A categorical choice as Optuna stores it: scalars as they are, others as YAML text."""
  return choice if isinstance(choice, _SCALARS) else flow_yaml(choice)


def flow_yaml(value: Any) -> str:
  """One-line YAML of a value: 0.003 -> "0.003", [64, 32] -> "[64, 32]"."""
  return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("\n...")


def from_dict(raw: dict) -> list[ParamSpec]:
  """Validates the `search_space` mapping (key -> spec mapping) into ParamSpecs.

  Raises:
    ValueError: not a mapping, an unknown field or a bad value, naming the key.
  """
  if not isinstance(raw, dict) or not raw:
    raise ValueError(f"search_space must be a non-empty mapping of dotted job-config keys to "
                     f"{{type: ..}} specs, got {raw!r}")
  fields = {f.name for f in dataclasses.fields(ParamSpec)} - {"key"}
  specs = []
  for key, spec in raw.items():
    if not isinstance(spec, dict):
      raise ValueError(f"search_space.{key} must be a mapping like {{type: float, low: .., "
                       f"high: ..}}, got {spec!r}")
    unknown = sorted(set(spec) - fields)
    if unknown:
      raise ValueError(f"search_space.{key}: unknown fields {unknown}; a parameter takes "
                       f"{sorted(fields)}")
    if "type" not in spec:
      raise ValueError(f"search_space.{key}: `type` is required, one of {list(PARAM_TYPES)}")
    spec = {
        name: _yaml_number(value) if name in ("low", "high", "step") else value
        for name, value in spec.items()
    }
    specs.append(ParamSpec(key=key, **spec))
  return specs


def _yaml_number(value):
  """PyYAML reads `1e-4` (no dot) as a string; such strings are taken as numbers."""
  if isinstance(value, str):
    try:
      return float(value)
    except ValueError:
      return value
  return value


def to_overrides(values: dict[str, Any]) -> list[str]:
  """`--set`-style overrides ("a.b=<YAML>") of dotted keys and values."""
  return [f"{key}={flow_yaml(value)}" for key, value in values.items()]
