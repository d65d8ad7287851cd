"""Config validation and the CLI's error reporting (no training here)."""

import pytest
import yaml

from mxrec_pipeline import cli
from mxrec_pipeline import config as config_lib

BASE = {"builder": "movielens_listwise", "pipeline": {"model_dir": "/tmp/x"}}


def _load(tmp_path, raw, overrides=()):
  path = tmp_path / "job.yaml"
  path.write_text(yaml.safe_dump(raw))
  return config_lib.load(str(path), overrides)


def test_defaults_and_overrides(tmp_path):
  config = _load(tmp_path, BASE, [
      "pipeline.learning_rate=0.5", "model.hidden_layer_dims=[8]", "dataset.list_size=20",
      "lambdamart.n_estimators=7"
  ])
  assert config.pipeline.learning_rate == 0.5
  assert config.model.hidden_layer_dims == [8]
  assert config.dataset.list_size == 20
  assert config.lambdamart.n_estimators == 7 and config.lambdamart.num_leaves == 31
  assert config_lib.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("raw, message", [
    ({**BASE, "pipeline": {"model_dir": "/x", "learnin_rate": 1}}, r"pipeline\.learnin_rate"),
    ({**BASE, "pipeline": {"model_dir": "/x", "num_epochs": "two"}
     }, r"pipeline\.num_epochs must be int"),
    ({**BASE, "pipeline": {"model_dir": "/x", "num_epochs": True}
     }, r"pipeline\.num_epochs must be int"),
    ({**BASE, "pipeline": {}}, r"pipeline\.model_dir is required"),
    ({**BASE, "model": {"hidden_layer_dims": [8, "x"]}}, r"model\.hidden_layer_dims\[1\]"),
    ({**BASE, "data": {"data_dir": "/no/such/dir"}}, r"data.*no such directory: /no/such/dir"),
    ({**BASE, "pipeline": {"model_dir": "/x", "loss": "nope"}}, r"`loss` must be a tfr loss key"),
    ({**BASE, "extra": {}}, r"unknown config sections \['extra'\]"),
    ({**BASE, "lambdamart": {"num_trees": 5}}, r"lambdamart\.num_trees"),
    ({**BASE, "lambdamart": {"num_leaves": 1}}, r"lambdamart\.num_leaves must be >= 2, got 1"),
    ({"builder": "nope", "pipeline": {"model_dir": "/x"}}, r"unknown 'nope'"),
])
def test_bad_configs_name_the_key(tmp_path, raw, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    _load(tmp_path, raw)


def test_bad_override_is_reported(tmp_path):
  with pytest.raises(config_lib.ConfigError, match="key=value"):
    _load(tmp_path, BASE, ["pipeline.learning_rate"])


def test_cli_exits_2_naming_the_key(tmp_path, capsys):
  path = tmp_path / "job.yaml"
  path.write_text(yaml.safe_dump({**BASE, "pipeline": {"model_dir": "/x", "optimzer": "sgd"}}))
  assert cli.main(["train", str(path)]) == 2
  assert "pipeline.optimzer" in capsys.readouterr().err
  assert cli.main(["train", str(tmp_path / "missing.yaml")]) == 2
  assert "cannot read config" in capsys.readouterr().err
