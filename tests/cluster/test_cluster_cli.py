"""`mxrec-pipeline train` under MultiWorkerMirroredStrategy refuses a bad cluster setup: exit 2."""

import pathlib

import pytest

from mxrec_pipeline import cli

CONFIG = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "mslr_dnn.yaml")
TWO_WORKERS = ('{"cluster": {"worker": ["localhost:1", "localhost:2"]}, '
               '"task": {"type": "worker", "index": 1}}')


@pytest.mark.parametrize("tf_config, sets, message", [
    ("{", [], "TF_CONFIG is not valid JSON"),
    ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 1}}', [],
     "TF_CONFIG['task'] is worker 1, but the cluster has 1 'worker' task(s)"),
    (TWO_WORKERS, ["pipeline.seed=null"], "pipeline.seed is required with "
     "MultiWorkerMirroredStrategy on 2 workers"),
])
def test_bad_cluster_setup_exits_2_naming_it(tmp_path, monkeypatch, capsys, tf_config, sets,
                                             message):
  monkeypatch.setenv("TF_CONFIG", tf_config)
  args = ["train", CONFIG]
  for override in [
      f"pipeline.model_dir={tmp_path / 'run'}", "pipeline.strategy=MultiWorkerMirroredStrategy",
      *sets
  ]:
    args += ["--set", override]
  assert cli.main(args) == 2
  assert message in capsys.readouterr().err
  assert not (tmp_path / "run").exists()  # Refused before anything ran.


@pytest.mark.parametrize("override, message", [
    ("pipeline.collective_timeout_s=0", "`collective_timeout_s` must be a finite positive number"),
    ("pipeline.strategy=MultiWorker", "'MultiWorkerMirroredStrategy', 'ParameterServerStrategy'), "
     "got 'MultiWorker'"),
])
def test_bad_strategy_keys_exit_2(tmp_path, capsys, override, message):
  args = ["train", CONFIG, "--set", f"pipeline.model_dir={tmp_path / 'run'}", "--set", override]
  assert cli.main(args) == 2
  assert message in capsys.readouterr().err
