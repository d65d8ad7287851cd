"""Every registered ranker has a job config that validates, and the other way round."""

import pytest
import yaml

import builders
import builders_testlib as lib
from mxrec_pipeline import config as config_lib

# Job configs name a builder (configs/ also holds other kinds, e.g. sweeps).
JOB_CONFIGS = sorted(
    p for p in lib.CONFIG_DIR.glob("*.yaml") if "builder" in (yaml.safe_load(p.read_text()) or {}))


def test_new_rankers_are_registered():
  assert {"mslr_dnn", "movielens_dcn", "movielens_listwise"} <= set(builders.REGISTRY)
  for name, ranker in builders.REGISTRY.items():
    assert ranker.name == name


@pytest.mark.parametrize("path", JOB_CONFIGS, ids=[p.name for p in JOB_CONFIGS])
def test_job_config_validates(path):
  config = config_lib.load(str(path))
  assert config.builder in builders.REGISTRY


@pytest.mark.parametrize("name",
                         ["mslr_dnn", "movielens_dcn", "letor_dasalc", "book_crossing_listwise"])
def test_ranker_has_a_config(name):
  assert name in {config_lib.load(str(path)).builder for path in JOB_CONFIGS}


def test_unknown_builder_lists_the_known_ones():
  with pytest.raises(ValueError, match="unknown builder 'nope'; known: .*mslr_dnn"):
    builders.get_builder("nope")
