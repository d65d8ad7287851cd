"""SimplePipeline with N replicas (MirroredStrategy over logical CPUs) equals one replica.

replicas_worker.py trains the keras_testlib task in a fresh process (logical
devices must be set before TensorFlow starts) with N replicas and with one on
the same global batches; per-step and epoch losses, validation metrics, dense
weights and every table's rows by key must agree, and keys get the same rows.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

# Trains in subprocesses with several logical CPUs.
pytestmark = pytest.mark.slow

WORKER = pathlib.Path(__file__).with_name("replicas_worker.py")


def run_worker(tmp_path, num_replicas: int, *args: str) -> dict:
  out = tmp_path / "states.npz"
  env = {
      **os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2",
      "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")])
  }
  result = subprocess.run(
      [sys.executable, str(WORKER), str(num_replicas), str(out), str(tmp_path), *args],
      capture_output=True, text=True, timeout=300, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  return dict(np.load(out))


def assert_same_training(states: dict) -> None:
  names = sorted(key[len("many_"):] for key in states if key.startswith("many_"))
  assert {"step_losses", "epoch_losses", "metrics", "dense_0", "item_rows", "word_keys"} <= set(names)
  for name in names:
    many, one = states[f"many_{name}"], states[f"one_{name}"]
    if name.endswith("_keys"):  # Every key trained, in both runs.
      np.testing.assert_array_equal(many, one, err_msg=name)
    else:
      np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-5, err_msg=name)
  assert len(states["many_step_losses"]) == 6
  assert np.all(np.isfinite(states["many_step_losses"]))


@pytest.mark.parametrize("num_replicas", [2, 4])
def test_replicas_equal_one_replica(tmp_path, num_replicas):
  assert_same_training(run_worker(tmp_path, num_replicas))


def test_replicas_equal_one_replica_with_a_tiered_table(tmp_path):
  states = run_worker(tmp_path, 2, "tiered")
  assert_same_training(states)
  assert states["many_item_swap_ins"] > 0  # Rows moved between the tiers.
