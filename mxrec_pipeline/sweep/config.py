"""Sweep configs: YAML validated into `SweepConfig` before any trial runs.

  base_config: movielens_listwise.yaml  # the job config every trial starts from
                                        # (relative to this file)
  study_name: movielens_listwise        # default: this file's name
  sweep_dir: runs/sweeps/movielens      # default: runs/sweeps/<study_name>
  storage: null                         # null: sqlite:///<sweep_dir>/study.db
  n_trials: 20                          # COMPLETE + PRUNED trials to end with
  objective: {metric: ndcg@10, direction: maximize}
  sampler: {name: tpe, seed: 1, options: {n_startup_trials: 5}}
  pruner: {name: median, options: {n_warmup_steps: 1}}
  overrides: {pipeline.num_epochs: 3}   # fixed, in every trial (like train's --set)
  search_space:                         # see mxrec_pipeline.sweep.space
    pipeline.learning_rate: {type: float, low: 1.0e-4, high: 0.03, log: true}

Errors name the key (`sampler.name`, `search_space.model.id_dim`); sections
and `--set` overrides are read as job configs' are (util/config_parsing.py).
That the search-space and override keys exist in the base config, and that the
metric is a pipeline metric, is checked by `runner.check_against_base`.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import typing
from typing import Any

import optuna

from mxrec_pipeline.sweep import space as space_lib
from mxrec_pipeline.util import config_parsing
from mxrec_pipeline.util import yaml_io

DEFAULT_SWEEPS_DIR = os.path.join("runs", "sweeps")
SQLITE_FILE = "study.db"


class SweepConfigError(ValueError):
  """A sweep config value is missing, unknown or invalid; the message names its key."""


class Direction:
  """Values of `objective.direction`."""

  MAXIMIZE = "maximize"
  MINIMIZE = "minimize"


class SamplerKey:
  """Names accepted by `build_sampler` (Optuna's samplers)."""

  TPE = "tpe"
  RANDOM = "random"


class PrunerKey:
  """Names accepted by `build_pruner` (Optuna's pruners)."""

  MEDIAN = "median"
  HYPERBAND = "hyperband"
  NONE = "none"


_SAMPLERS = {
    SamplerKey.TPE: optuna.samplers.TPESampler, SamplerKey.RANDOM: optuna.samplers.RandomSampler
}
_PRUNERS = {
    PrunerKey.MEDIAN: optuna.pruners.MedianPruner,
    PrunerKey.HYPERBAND: optuna.pruners.HyperbandPruner, PrunerKey.NONE: optuna.pruners.NopPruner
}


@dataclasses.dataclass
class ObjectiveConfig:
  """What a trial is scored by.

  Attributes:
    metric: A key of the job's metrics.json "model" metrics (ndcg@1, ndcg@5,
      ndcg@10, mrr): the trial's value on the whole validation split. Its
      per-epoch validation value goes to the pruner.
    direction: "maximize" or "minimize".
  """

  metric: str = "ndcg@10"
  direction: str = Direction.MAXIMIZE

  def __post_init__(self):
    if not isinstance(self.metric, str) or not self.metric:
      raise ValueError(f"`metric` must be a metric name like 'ndcg@10', got {self.metric!r}")
    if self.direction not in (Direction.MAXIMIZE, Direction.MINIMIZE):
      raise ValueError(f"`direction` must be 'maximize' or 'minimize', got {self.direction!r}")


@dataclasses.dataclass
class SamplerConfig:
  """The Optuna sampler.

  Attributes:
    name: "tpe" (optuna.samplers.TPESampler) or "random" (RandomSampler).
    seed: Base seed; None: unseeded. Each worker process seeds its sampler
      with (seed, worker index, trials in the study when it starts), so
      parallel and resumed workers do not draw the same values.
    options: Other keyword arguments of the sampler, e.g. n_startup_trials.
  """

  name: str = SamplerKey.TPE
  seed: int | None = None
  options: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
      raise ValueError(f"`seed` must be an int or null, got {self.seed!r}")
    build_sampler(self)  # Raises on an unknown name or option.


@dataclasses.dataclass
class PrunerConfig:
  """The Optuna pruner, fed each epoch's validation metric.

  Attributes:
    name: "median" (optuna.pruners.MedianPruner), "hyperband"
      (HyperbandPruner; its resource is the epoch) or "none".
    options: Keyword arguments of the pruner, e.g. n_warmup_steps (epochs
      before median pruning starts) or min_resource / reduction_factor.
  """

  name: str = PrunerKey.MEDIAN
  options: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    build_pruner(self)  # Raises on an unknown name or option.


def build_sampler(config: SamplerConfig, seed: int | None = None) -> optuna.samplers.BaseSampler:
  """The sampler of `config`, seeded with `seed` (default: config.seed).

  Raises:
    ValueError: an unsupported name (listing the supported ones) or option.
  """
  if config.name not in _SAMPLERS:
    raise ValueError(f"unsupported sampler '{config.name}'; supported: {sorted(_SAMPLERS)}")
  return _construct(_SAMPLERS[config.name], config.options, "sampler",
                    seed=config.seed if seed is None else seed)


def build_pruner(config: PrunerConfig) -> optuna.pruners.BasePruner:
  """The pruner of `config`.

  Raises:
    ValueError: an unsupported name (listing the supported ones) or option.
  """
  if config.name not in _PRUNERS:
    raise ValueError(f"unsupported pruner '{config.name}'; supported: {sorted(_PRUNERS)}")
  return _construct(_PRUNERS[config.name], config.options, "pruner")


def _construct(cls, options, where, **fixed):
  if not isinstance(options, dict):
    raise ValueError(f"{where}.options must be a mapping, got {options!r}")
  clash = sorted(set(options) & set(fixed))
  if clash:
    raise ValueError(f"{where}.options must not set {clash}: use {where}.{clash[0]}")
  try:
    return cls(**options, **fixed)
  except TypeError as e:
    raise ValueError(f"{where}.options {sorted(options)}: {cls.__name__}: {e}") from e


@dataclasses.dataclass
class SweepConfig:
  """A validated sweep config (see the module docstring).

  Attributes:
    base_config: Path of the job config trials start from (absolute once loaded).
    search_space: The parameters (mxrec_pipeline.sweep.space.ParamSpec).
    study_name: Optuna study name; workers on every machine use the same one.
    sweep_dir: Trials' model dirs, the SQLite study, best_config.yaml,
      best_model/ and plots/ (absolute once loaded).
    storage: SQLAlchemy URL of the study (postgresql://, mysql://, sqlite:///);
      None: an SQLite file in sweep_dir.
    n_trials: COMPLETE + PRUNED trials the study ends with, counting those of
      earlier runs and of other machines, > 0.
    objective: The metric and its direction.
    sampler: The Optuna sampler.
    pruner: The Optuna pruner.
    overrides: Dotted job-config key -> value, set in every trial before its
      parameters (e.g. pipeline.num_epochs).
    max_consecutive_failures: A worker stops after this many of its trials
      fail in a row (a broken config fails every trial), > 0.
    heartbeat_interval_s: Seconds between a running trial's heartbeats in the
      storage; a RUNNING trial without one for heartbeat_grace_period_s is
      marked FAIL by any worker (a machine that died). None: no heartbeat
      (trials of dead workers on this machine are still caught by pid).
    heartbeat_grace_period_s: See above; None: Optuna's default (2 intervals).
  """

  base_config: str
  search_space: list[space_lib.ParamSpec]
  study_name: str
  sweep_dir: str
  storage: str | None = None
  n_trials: int = 20
  objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
  sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
  pruner: PrunerConfig = dataclasses.field(default_factory=PrunerConfig)
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
  max_consecutive_failures: int = 5
  heartbeat_interval_s: int | None = 60
  heartbeat_grace_period_s: int | None = None

  def __post_init__(self):
    for name in ("base_config", "study_name", "sweep_dir"):
      if not isinstance(getattr(self, name), str) or not getattr(self, name):
        raise ValueError(f"`{name}` must be a non-empty string, got {getattr(self, name)!r}")
    for name in ("n_trials", "max_consecutive_failures"):
      _check_positive_int(name, getattr(self, name))
    for name in ("heartbeat_interval_s", "heartbeat_grace_period_s"):
      if getattr(self, name) is not None:
        _check_positive_int(name, getattr(self, name))
    if self.storage is not None:
      _check_storage_url(self.storage)
    if not isinstance(self.overrides, dict):
      raise ValueError(f"`overrides` must be a mapping of dotted keys to values, "
                       f"got {self.overrides!r}")
    keys = [p.key for p in self.search_space]
    for key in [*keys, *self.overrides]:
      if key == "pipeline.model_dir":
        raise ValueError("pipeline.model_dir is set by the sweep (sweep_dir/trials/NNNN): "
                         "take it out of `overrides` and `search_space`")
    both = sorted(set(keys) & set(self.overrides))
    if both:
      raise ValueError(f"{both} are both in `search_space` and `overrides`; keep one")

  @property
  def storage_url(self) -> str:
    """`storage`, or the SQLite file sweep_dir/study.db."""
    return self.storage or f"sqlite:///{os.path.join(self.sweep_dir, SQLITE_FILE)}"

  def param(self, key: str) -> space_lib.ParamSpec:
    """The search-space parameter of a dotted key (KeyError when absent)."""
    return {p.key: p for p in self.search_space}[key]

  def to_dict(self) -> dict:
    """Plain dict of the config, loadable again by `from_dict`."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out["search_space"] = {p.key: p.to_dict() for p in self.search_space}
    for name in ("objective", "sampler", "pruner"):
      out[name] = dataclasses.asdict(out[name])
    return out


def _check_positive_int(name, value):
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError(f"`{name}` must be a positive int, got {value!r}")


def _check_storage_url(url: str) -> None:
  import sqlalchemy  # pylint: disable=import-outside-toplevel
  try:
    parsed = sqlalchemy.engine.make_url(url)
  except sqlalchemy.exc.ArgumentError as e:
    raise ValueError(f"`storage` must be an SQLAlchemy URL like "
                     f"postgresql://user@host/db, got {url!r}") from e
  if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
    raise ValueError(f"`storage` {url!r} is an in-memory SQLite database, which worker "
                     "processes cannot share; give a file (sqlite:////path/study.db)")


_SECTIONS = {"objective": ObjectiveConfig, "sampler": SamplerConfig, "pruner": PrunerConfig}


def load(path: str, *, n_trials: int | None = None, storage: str | None = None,
         overrides: typing.Sequence[str] = ()) -> SweepConfig:
  """Reads a sweep config; the command line's values replace the file's.

  Args:
    path: The YAML file.
    n_trials: --n-trials, if given.
    storage: --storage, if given.
    overrides: --set "key=value" strings (value parsed as YAML), added to
      `overrides`.

  Raises:
    SweepConfigError: unreadable file, bad YAML or an invalid value, naming the key.
  """
  raw = dict(
      yaml_io.load_yaml_mapping(path, SweepConfigError, "sweep config",
                                "a mapping with base_config and search_space"))
  raw.setdefault("study_name", pathlib.Path(path).stem)
  if n_trials is not None:
    raw["n_trials"] = n_trials
  if storage is not None:
    raw["storage"] = storage
  raw["overrides"] = dict(raw.get("overrides") or {})
  for override in overrides:
    key, value = config_parsing.parse_override(override, SweepConfigError)
    raw["overrides"][key] = value
  if isinstance(raw.get("base_config"), str):
    raw["base_config"] = str((pathlib.Path(path).parent / raw["base_config"]).resolve())
  return from_dict(raw)


def from_dict(raw: dict) -> SweepConfig:
  """Validates a raw sweep config dict (paths made absolute against the working dir).

  Raises:
    SweepConfigError: naming the key.
  """
  fields = {f.name for f in dataclasses.fields(SweepConfig)}
  unknown = sorted(set(raw) - fields)
  if unknown:
    raise SweepConfigError(f"unknown sweep config keys {unknown}; known {sorted(fields)}")
  for name in ("base_config", "search_space", "study_name"):
    if name not in raw:
      raise SweepConfigError(f"sweep config needs `{name}`")
  values = dict(raw)
  values.setdefault("sweep_dir", os.path.join(DEFAULT_SWEEPS_DIR, str(raw["study_name"])))
  for name in ("base_config", "sweep_dir"):
    if isinstance(values[name], str):
      values[name] = os.path.abspath(values[name])
  try:
    values["search_space"] = space_lib.from_dict(raw["search_space"])
  except ValueError as e:
    raise SweepConfigError(str(e)) from e
  for name, cls in _SECTIONS.items():
    values[name] = config_parsing.build_dataclass(cls, raw.get(name) or {}, name, SweepConfigError)
  try:
    return SweepConfig(**values)
  except (TypeError, ValueError) as e:
    raise SweepConfigError(f"sweep config: {e}") from e
