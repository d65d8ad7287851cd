"""Real 2-worker MultiWorkerMirroredStrategy trainings of a dense ranker on localhost.

`mxrec-pipeline train --local-cluster workers=2` on tiny LETOR files (the
mslr_dnn builder: a few dense features, no table) against one process on the same
global batch; a worker killed mid-run, with and without the launcher.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import cluster_testlib as lib
from mxrec_pipeline import cli
from mxrec_pipeline.cluster import local
from mxrec_pipeline.evaluation import METRICS_FILE

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "mslr_dnn.yaml")
sys.path.insert(0, str(REPO / "tests" / "builders"))
import builders_testlib  # pylint: disable=wrong-import-position  # noqa: E402

TIMEOUT_S = 240  # A guard against a hung cluster only.


@pytest.fixture(name="letor")
def _letor(tmp_path):
  # 16 training lists: batches of 4 lists split 2 + 2 over the workers; 8
  # validation lists in one batch, 4 + 4.
  return (builders_testlib.write_letor(tmp_path / "train.txt", 16, 6, first_qid=1, seed=1),
          builders_testlib.write_letor(tmp_path / "vali.txt", 8, 6, first_qid=100, seed=2))


def _overrides(tmp_path, letor, model_dir, **pipeline):
  train, valid = letor
  # No dropout and no batch normalization: per-replica batch statistics would differ from
  # one process's (the comparison is on the same global batch, not the same model).
  sets = [
      f"data.train_path={train}", f"data.valid_path={valid}", f"data.elwc_dir={tmp_path / 'elwc'}",
      f"pipeline.model_dir={model_dir}", "model.hidden_layer_dims=[8]", "model.dropout=0.0",
      "model.use_batch_norm=false", "dataset.train_batch_size=4", "dataset.list_size=8",
      "pipeline.num_epochs=2", "pipeline.num_train_steps=6", "pipeline.collective_timeout_s=60",
      "pipeline.early_stopping=null", builders_testlib.LETOR_BASELINE_SET
  ] + [f"pipeline.{k}={v}" for k, v in pipeline.items()]
  return [a for s in sets for a in ("--set", s)]


def _cli(*args):
  return [sys.executable, "-m", "mxrec_pipeline.cli", *args]


def _scores(export_dir, valid_elwc):
  lists = builders_testlib.serialized_lists(valid_elwc)
  return tf.saved_model.load(
      str(export_dir)).signatures["serving_default"](examples=lists)["scores"].numpy()


def _launch(tmp_path, letor, model_dir, env, **pipeline):
  """Runs `train --local-cluster workers=2` to its end; returns its CompletedProcess."""
  marker = env[lib.MARKER_VAR]
  try:
    launcher = subprocess.run(
        _cli("train", CONFIG, "--verbose=0", "--local-cluster", "workers=2",
             *_overrides(tmp_path, letor, model_dir, **pipeline)), env=env, capture_output=True,
        text=True, timeout=TIMEOUT_S, check=False)
    assert lib.marked_pids(marker) == []
  finally:
    lib.kill_marked(marker)
  assert launcher.returncode == 0, launcher.stderr[-3000:]
  return launcher


def test_two_workers_train_as_one_process_and_only_the_chief_writes(tmp_path, letor, capsys):
  env, _ = lib.marked_env(TMPDIR=str(tmp_path / "tmp"))
  (tmp_path / "tmp").mkdir()
  model_dir = tmp_path / "run2"
  # Epoch 1 of 2, then the same job again: both workers resume from the chief's checkpoint.
  first = _launch(tmp_path, letor, model_dir, env, num_epochs=1, num_train_steps=3)
  launcher = _launch(tmp_path, letor, model_dir, env)
  chief_pids = {_pid(run.stderr, 0) for run in (first, launcher)}
  assert "worker 1 (pid" in launcher.stderr and "validation metrics" in launcher.stdout
  for output in (launcher.stdout, (model_dir / "local_cluster" / "worker-1.log").read_text()):
    assert "1 epoch(s) and 3 step(s) done, continuing at epoch 2 of 2" in output

  # One process, the same global batch.
  assert cli.main(["train", CONFIG, "--verbose=0"] +
                  _overrides(tmp_path, letor, tmp_path / "run1", strategy="null")) == 0
  capsys.readouterr()
  metrics = [json.loads((d / METRICS_FILE).read_text()) for d in (model_dir, tmp_path / "run1")]
  assert metrics[0]["model"] == pytest.approx(metrics[1]["model"], abs=1e-5)
  (valid_elwc,) = (tmp_path / "elwc").glob("vali.*.tfrecord")
  np.testing.assert_allclose(_scores(model_dir / "export" / "latest_model", valid_elwc),
                             _scores(tmp_path / "run1" / "export" / "latest_model", valid_elwc),
                             rtol=1e-5, atol=1e-5)

  # The chief's outputs only: TensorBoard files of the chiefs (their names hold the pid),
  # the worker's temp model_dir gone, and the launcher's log of worker 1.
  assert sorted(os.listdir(model_dir)) == [
      "checkpoints", "config.yaml", "export", "local_cluster", "logs", METRICS_FILE
  ]
  assert os.listdir(model_dir / "local_cluster") == ["worker-1.log"]
  for logs in ("train", "validation", "tables"):
    # events.out.tfevents.<time>.<host>.<pid>.<n>.v2
    writers = {int(name.split(".")[-3]) for name in os.listdir(model_dir / "logs" / logs)}
    assert writers == chief_pids, logs
  assert sorted(os.listdir(model_dir / "checkpoints"))[0] == "checkpoint"
  assert os.listdir(tmp_path / "tmp") == []


def _pid(launcher_output: str, worker: int) -> int:
  """The pid of a worker, from the launcher's "worker <i> (pid <pid>)" line."""
  return int(launcher_output.split(f"worker {worker} (pid ", 1)[1].split(")", 1)[0])


def _start_cluster_run(tmp_path, letor, model_dir, env, **pipeline):
  """A launcher of 2 workers on a long run, its output in tmp_path/launcher.txt."""
  out = open(tmp_path / "launcher.txt", "w", encoding="utf-8")  # pylint: disable=consider-using-with
  args = _cli(
      "train", CONFIG, "--verbose=2", "--local-cluster", "workers=2",
      *_overrides(tmp_path, letor, model_dir, num_epochs=500, num_train_steps=1000, **pipeline))
  return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT), out


def test_a_hung_worker_ends_the_job_within_the_stuck_worker_timeout_naming_it(tmp_path, letor):
  """Worker 1 hangs after a batch, alive (its gRPC threads still answer health checks): within
  pipeline.stuck_worker_timeout_s a watchdog (worker 0's, or worker 1's own: both see no progress)
  ends the job naming worker 1; the launcher stops the other. (A killed worker:
  test_cluster_sharded.py.)"""
  env, marker = lib.marked_env(TMPDIR=str(tmp_path / "tmp"),
                               MXREC_FAULT="hang:train_batch:4@worker:1")
  (tmp_path / "tmp").mkdir()
  model_dir = tmp_path / "run"
  launcher, out = _start_cluster_run(tmp_path, letor, model_dir, env, stuck_worker_timeout_s=20)
  try:
    log = model_dir / "local_cluster" / "worker-1.log"
    lib.wait_for_text(log, "MXREC_FAULT: hanging the process at train_batch:4", TIMEOUT_S, launcher)
    hung_at = time.monotonic()
    status = launcher.wait(timeout=90)
    text = (tmp_path / "launcher.txt").read_text() + log.read_text()
    assert status == 1, text[-3000:]
    assert 15 <= time.monotonic() - hung_at < 90  # The timeout counts from the last batch.
    assert re.search(
        r"mxrec-pipeline train: error: worker [01] of a 2-worker cluster stopped: no progress for "
        r"2[0-9] s \(pipeline.stuck_worker_timeout_s 20\): worker 1 stuck behind the others "
        r"\(worker 0: [^;]+; worker 1: began train batch \d+\)", text), text[-3000:]
    assert re.search(r"local cluster: error: worker [01] exited with status 1; .*stopping worker",
                     text), text[-3000:]
    assert lib.marked_pids(marker) == []
  finally:
    launcher.kill()
    launcher.wait()
    out.close()
    lib.kill_marked(marker)


def test_a_killed_peer_ends_a_worker_within_the_collective_timeout(tmp_path, letor):
  """Without the launcher (workers on other machines): the survivor fails naming its peer."""
  env, marker = lib.marked_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
  configs = local.cluster_tf_configs(local.LocalClusterSpec(workers=2))
  args = _cli(
      "train", CONFIG, "--verbose=2",
      *_overrides(tmp_path, letor, tmp_path / "run", num_epochs=500, num_train_steps=1000,
                  strategy="MultiWorkerMirroredStrategy", collective_timeout_s=30))
  logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
  workers = []
  try:
    for config, log in zip(configs, logs):
      with open(log, "w", encoding="utf-8") as f:
        workers.append(
            subprocess.Popen(args, env={**env, "TF_CONFIG": config}, stdout=f,
                             stderr=subprocess.STDOUT))
    lib.wait_for_text(logs[1], "Epoch 2/", TIMEOUT_S, workers[1])
    workers[1].kill()
    # Within the collective timeout (30 s), with a margin for the process to end.
    assert workers[0].wait(timeout=60) == 1
    text = logs[0].read_text()
    assert ("mxrec-pipeline train: error: worker 0 of a 2-worker cluster stopped: worker 1 "
            "failed or could not be reached (collective timeout 30 s)") in text, text[-3000:]
  finally:
    for worker in workers:
      worker.kill()
      worker.wait()
    lib.kill_marked(marker)
