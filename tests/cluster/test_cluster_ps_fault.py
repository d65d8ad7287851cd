"""A worker SIGKILLed mid-epoch under `model.fit` on ParameterServerStrategy: the job finishes.

`train --local-cluster workers=2,ps=1` on tiny MovieLens, EPOCHS epochs of
STEPS steps; as soon as the chief prints the start of epoch 2 (Keras refuses
a per-step progress bar under ParameterServerStrategy), worker 1's process
is SIGKILLed, before epoch 2 ends. The launcher starts it again at the same address
(cluster/local.py), TF's ClusterCoordinator retries its in-flight closure on
the other worker and reconnects it, and the job ends with every step trained
(a retried step may have applied its update before the worker died: EPOCHS x
STEPS or one more optimizer steps), its checkpoint, metrics and export written.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import cluster_testlib as lib
from mxrec_pipeline.evaluation import METRICS_FILE

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

EPOCHS = 3
STEPS = 40  # Per epoch: seconds of training here, time to kill a worker mid-epoch.
EPOCH_END = re.compile(rf"^{STEPS}/{STEPS} - ", re.MULTILINE)  # Keras' verbose=2 line.


def _wait(condition, timeout_s: float, launcher: subprocess.Popen, what: str):
  """Polls `condition()` until it returns a true value; fails after `timeout_s` or at exit."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    value = condition()
    if value:
      return value
    assert launcher.poll() is None, f"the launcher ended ({launcher.returncode}) before {what}"
    time.sleep(0.1)
  raise AssertionError(f"no {what} within {timeout_s} s")


def _optimizer_steps(checkpoint: str) -> int:
  (name,) = [n for n, _ in tf.train.list_variables(checkpoint) if n.startswith("optimizer/iter")]
  return int(tf.train.load_variable(checkpoint, name))


def test_worker_killed_mid_epoch_is_retried_and_the_job_finishes(tmp_path):
  data_dir = lib.write_tiny_movielens(tmp_path / "ml")
  model_dir = tmp_path / "run"
  stdout, stderr = tmp_path / "launcher.out", tmp_path / "launcher.err"
  env, marker = lib.marked_env()
  try:
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
      launcher = subprocess.Popen([
          sys.executable, "-m", "mxrec_pipeline.cli", "train", lib.MOVIELENS_CONFIG, "--verbose=2",
          "--local-cluster", "workers=2,ps=1", *lib.movielens_overrides(
              tmp_path, data_dir, model_dir, num_epochs=EPOCHS, num_train_steps=EPOCHS * STEPS)
      ], env=env, stdout=out, stderr=err)
    worker = int(
        _wait(lambda: re.search(r"worker 1 \(pid (\d+)\)", stderr.read_text()), 60, launcher,
              "pid of worker 1").group(1))
    _wait(lambda: "Epoch 2/" in stdout.read_text(errors="replace"), 180, launcher, "epoch 2")
    os.kill(worker, signal.SIGKILL)
    epochs_ended = len(EPOCH_END.findall(stdout.read_text(errors="replace")))
    launcher.wait(timeout=lib.TIMEOUT_S)
    assert lib.marked_pids(marker) == []
  finally:
    lib.kill_marked(marker)
  err = stderr.read_text(errors="replace")
  assert launcher.returncode == 0, err[-4000:]
  assert epochs_ended == 1, "the kill came after epoch 2's last step"
  assert "worker 1 exited with status -9 (SIGKILL); started again" in err
  assert "Worker /job:worker/replica:0/task:1 failed" in err  # TF's coordinator saw it.
  assert len(EPOCH_END.findall(stdout.read_text(errors="replace"))) == EPOCHS
  checkpoint = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  assert checkpoint.endswith(f"ckpt-{EPOCHS}")
  assert EPOCHS * STEPS <= _optimizer_steps(checkpoint) <= EPOCHS * STEPS + 1
  assert 0.0 < json.loads((model_dir / METRICS_FILE).read_text())["model"]["ndcg@10"] <= 1.0
  assert (model_dir / "export" / "latest_model" / "saved_model.pb").exists()
