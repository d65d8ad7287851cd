"""util.config_parsing: overrides and dataclasses from raw YAML values."""

import dataclasses

import pytest

import builders
from builders import registry as registry_lib
from mxrec_pipeline import hparams as hparams_lib
from mxrec_pipeline.util import config_parsing


class Error(ValueError):
  pass


@dataclasses.dataclass
class Section:
  name: str
  rate: float = 0.5
  dims: list[int] = dataclasses.field(default_factory=list)
  seed: int | None = None
  options: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.rate <= 0:
      raise ValueError(f"`rate` must be positive, got {self.rate}")


def test_overrides_set_nested_yaml_values():
  raw = {"a": {"x": 1}}
  for override in ("a.b.c=[1, 2]", " a.x =null", "d=on"):
    config_parsing.apply_override(raw, override, Error)
  assert raw == {"a": {"x": None, "b": {"c": [1, 2]}}, "d": True}
  assert config_parsing.parse_override("k=a=b", Error) == ("k", "a=b")


@pytest.mark.parametrize("override, message", [
    ("a.b", r"--set expects key=value, got 'a\.b'"),
    ("a..b=1", r"dotted names"),
    ("=1", r"dotted names"),
    ("a=[1", r"--set a: the value is not valid YAML"),
    ("a.x.y=1", r"--set a\.x\.y: 'x' is not a section"),
])
def test_bad_overrides_raise_the_given_error(override, message):
  with pytest.raises(Error, match=message):
    config_parsing.apply_override({"a": {"x": 1}}, override, Error)


def test_build_dataclass_checks_and_widens():
  section = config_parsing.build_dataclass(Section,
                                           {"name": "n", "rate": 2, "dims": [1], "seed": None}, "s",
                                           Error)
  assert section == Section("n", 2.0, [1])
  assert isinstance(section.rate, float)


@pytest.mark.parametrize("values, message", [
    ({"name": "n", "rte": 1}, r"unknown keys \['s\.rte'\]; s takes \['dims', 'name'"),
    ({}, r"s\.name is required"),
    ({"name": "n", "dims": [1, "x"]}, r"s\.dims\[1\] must be int, got 'x'"),
    ({"name": "n", "seed": True}, r"s\.seed must be int, got True"),
    ({"name": "n", "options": [1]}, r"s\.options must be a mapping"),
    ({"name": "n", "rate": -1}, r"s: `rate` must be positive, got -1"),
    ([1], r"s must be a mapping, got list"),
])
def test_build_dataclass_errors_name_the_key(values, message):
  with pytest.raises(Error, match=message):
    config_parsing.build_dataclass(Section, values, "s", Error)


def test_registry_imports_nothing_for_names_and_accepts_classes():
  registry = registry_lib.RankerRegistry({
      "lazy": registry_lib.RankerEntry("no_such_module:Ranker", f"{__name__}:Section",
                                       f"{__name__}:Section")
  })
  assert "lazy" in registry and sorted(registry) == ["lazy"] and len(registry) == 1
  assert registry.config_classes("lazy") == (Section, Section)
  with pytest.raises(ImportError):
    registry["lazy"]  # pylint: disable=pointless-statement

  class Ranker:
    DataConfig = ModelConfig = Section

  registry["eager"] = Ranker
  assert registry["eager"] is Ranker and registry.config_classes("eager") == (Section, Section)
  with pytest.raises(ValueError, match="unknown builder 'nope'; known: .*mslr_dnn"):
    builders.get_config_classes("nope")


@pytest.mark.parametrize("raw, message", [
    ("x", r"`checkpoint` must be a mapping"),
    ({"full_every": 2}, r"`checkpoint`: unknown keys \['full_every'\]; known: full_every_epochs"),
    ({"full_every_epochs": 0}, r"`checkpoint.full_every_epochs` must be a positive int, got 0"),
])
def test_checkpoint_schedule_errors_name_the_key(raw, message):
  with pytest.raises(ValueError, match=message):
    hparams_lib.PipelineHparams(model_dir="m", checkpoint=raw)


def test_checkpoint_schedule_defaults_to_full_saves():
  assert hparams_lib.CheckpointSchedule.from_dict(None).full_every_epochs == 1
  assert hparams_lib.CheckpointSchedule.from_dict({"full_every_epochs": 4}).full_every_epochs == 4
