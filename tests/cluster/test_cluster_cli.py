"""`mxrec-pipeline train` and the ps server refuse a bad cluster setup: exit 2, naming it."""

import os
import pathlib
import socket
import subprocess
import sys

import pytest

from mxrec_pipeline import cli
from mxrec_pipeline.cluster import local
from mxrec_pipeline.cluster import tf_config

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
      "pipeline.early_stopping=null", *sets
  ]:
    args += ["--set", override]
  assert cli.main(args) == 2
  assert message in capsys.readouterr().err
  assert not (tmp_path / "run").exists()  # Refused before anything ran.


@pytest.mark.parametrize("override, message", [
    ("pipeline.collective_timeout_s=0", "`collective_timeout_s` must be a finite positive number"),
    ("pipeline.strategy=MultiWorker", "'MultiWorkerMirroredStrategy', 'ParameterServerStrategy'), "
     "got 'MultiWorker'"),
    ("pipeline.sharding.routing=ring", "`sharding.routing` must be one of ['all_gather', "
     "'all_to_all', 'auto'], got 'ring'"),
    ("pipeline.sharding.route=all_gather", "`sharding`: unknown keys ['route']; known: routing"),
    ("pipeline.sharding=all_gather", "pipeline.sharding must be a mapping, got 'all_gather'"),
])
def test_bad_strategy_keys_exit_2(tmp_path, capsys, override, message):
  args = ["train", CONFIG, "--set", f"pipeline.model_dir={tmp_path / 'run'}", "--set", override]
  assert cli.main(args) == 2
  assert message in capsys.readouterr().err


@pytest.fixture(name="taken_port")
def _taken_port():
  """A localhost port another process (this one) listens on."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    s.listen()
    yield s.getsockname()[1]


@pytest.mark.parametrize("program", ["train", "ps_server"])
def test_a_task_whose_port_is_taken_exits_2_naming_task_and_address(tmp_path, taken_port, program):
  if program == "train":
    cluster = {"worker": [f"localhost:{local.free_ports(1)[0]}", f"localhost:{taken_port}"]}
    task = ("worker", 1)
    args = [
        "-m", "mxrec_pipeline.cli", "train", CONFIG, "--set",
        f"pipeline.model_dir={tmp_path / 'run'}", "--set",
        "pipeline.strategy=MultiWorkerMirroredStrategy", "--set", "pipeline.seed=1", "--set",
        "pipeline.early_stopping=null"
    ]
  else:
    cluster = {"chief": ["localhost:1"], "ps": [f"localhost:{taken_port}"]}
    task = ("ps", 0)
    args = ["-m", "mxrec_pipeline.cluster.ps_server"]
  env = dict(os.environ, TF_CONFIG=tf_config.dumps(cluster, *task), TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                        timeout=120, check=False)
  assert done.returncode == 2, done.stderr[-3000:]
  assert (f"{task[0]} {task[1]} could not start its TensorFlow server at localhost:{taken_port} "
          "(its TF_CONFIG address; is the port used by another process?)") in done.stderr
