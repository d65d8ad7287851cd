"""YAML job configs, validated into dataclasses before anything runs.

A job config has five sections, and three optional ones:

  builder: movielens_listwise     # a name in builders.REGISTRY
  data: {...}                     # the builder's DataConfig
  model: {...}                    # the builder's ModelConfig
  dataset: {...}                  # builders.DatasetConfig (batching)
  pipeline: {...}                 # mxrec_pipeline.keras.pipeline.PipelineHparams
  metrics: {...}                  # mxrec_pipeline.hparams.MetricsConfig (optional)
  lambdamart: {...}               # mxrec_pipeline.gbdt.config.LambdaMartConfig (optional)
  continuous: {...}               # mxrec_pipeline.hparams.ContinuousConfig (optional)

Unknown keys, values of the wrong type and missing required values raise
ConfigError naming the dotted key (e.g. `pipeline.learning_rate`), as do the
dataclasses' own checks. `--set key=value` overrides take YAML values.

Nothing here imports TensorFlow (the rankers' config dataclasses and
PipelineHparams live in TensorFlow-free modules), so the command line rejects
a bad config at once.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import builders
from builders.base_config import DatasetConfig
from mxrec_pipeline.gbdt.config import LambdaMartConfig
from mxrec_pipeline.hparams import ContinuousConfig, MetricsConfig, PipelineHparams
from mxrec_pipeline.util import config_parsing
from mxrec_pipeline.util import yaml_io

SECTIONS = ("builder", "data", "model", "dataset", "pipeline", "metrics", "lambdamart",
            "continuous")


class ConfigError(ValueError):
  """A config value is missing, unknown or invalid; the message names its key."""


@dataclasses.dataclass
class JobConfig:
  """A validated job config.

  Attributes:
    builder: The ranker's name (builders.REGISTRY).
    data: The ranker's DataConfig.
    model: The ranker's ModelConfig.
    dataset: Batching.
    pipeline: Pipeline hyperparameters.
    metrics: How the validation metrics count queries without a relevant
      document.
    lambdamart: The LambdaMART baseline scored beside the model.
    continuous: Training on partitions as they arrive (`train --continuous`).
  """

  builder: str
  data: Any
  model: Any
  dataset: DatasetConfig
  pipeline: PipelineHparams
  metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
  lambdamart: LambdaMartConfig = dataclasses.field(default_factory=LambdaMartConfig)
  continuous: ContinuousConfig = dataclasses.field(default_factory=ContinuousConfig)

  def to_dict(self) -> dict:
    """Plain dict of the config, loadable again by `from_dict`."""
    sections = ("data", "model", "dataset", "pipeline", "metrics", "lambdamart", "continuous")
    return {
        "builder": self.builder,
        **{name: dataclasses.asdict(getattr(self, name)) for name in sections}
    }


def load(path: str, overrides: typing.Sequence[str] = ()) -> JobConfig:
  """Reads a YAML job config and applies `key.path=value` overrides.

  Raises:
    ConfigError: unreadable file, bad YAML, bad override, invalid config.
  """
  raw = yaml_io.load_yaml_mapping(path, ConfigError, "config", f"a mapping of sections {SECTIONS}")
  for override in overrides:
    apply_override(raw, override)
  return from_dict(raw)


def apply_override(raw: dict, override: str) -> None:
  """Sets `a.b.c=value` (value parsed as YAML) in a raw config dict, in place.

  Raises:
    ConfigError: no `=`, an empty key, bad YAML, or a path through a non-mapping.
  """
  config_parsing.apply_override(raw, override, ConfigError)


def from_dict(raw: dict) -> JobConfig:
  """Validates a raw config dict into a JobConfig (see the module docstring)."""
  unknown = sorted(set(raw) - set(SECTIONS))
  if unknown:
    raise ConfigError(f"unknown config sections {unknown}; expected {list(SECTIONS)}")
  if "builder" not in raw:
    raise ConfigError("config needs `builder`, one of " + str(sorted(builders.REGISTRY)))
  if raw["builder"] not in builders.REGISTRY:
    raise ConfigError(f"builder: unknown '{raw['builder']}'; known {sorted(builders.REGISTRY)}")
  data_config, model_config = builders.get_config_classes(raw["builder"])
  if "pipeline" not in raw:
    raise ConfigError("config needs a `pipeline` section (with at least model_dir)")
  return JobConfig(
      builder=raw["builder"], data=build_dataclass(data_config,
                                                   raw.get("data") or {}, "data"),
      model=build_dataclass(model_config,
                            raw.get("model") or {},
                            "model"), dataset=build_dataclass(DatasetConfig,
                                                              raw.get("dataset") or {}, "dataset"),
      pipeline=build_dataclass(PipelineHparams, raw["pipeline"] or {}, "pipeline"),
      metrics=build_dataclass(MetricsConfig,
                              raw.get("metrics") or {},
                              "metrics"), lambdamart=build_dataclass(LambdaMartConfig,
                                                                     raw.get("lambdamart") or {},
                                                                     "lambdamart"),
      continuous=build_dataclass(ContinuousConfig,
                                 raw.get("continuous") or {}, "continuous"))


def build_dataclass(cls, values: dict, where: str):
  """`cls(**values)` with unknown keys, missing fields and types checked.

  Raises:
    ConfigError: naming `where.key` and the problem.
  """
  return config_parsing.build_dataclass(cls, values, where, ConfigError)
