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


def run_worker(tmp_path, case: str, *replica_counts: int) -> dict:
  out = tmp_path / "states.npz"
  env = {
      **os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2",
      "PYTHONPATH": os.pathsep.join([str(WORKER.parent),
                                     os.environ.get("PYTHONPATH", "")])
  }
  result = subprocess.run(
      [sys.executable,
       str(WORKER),
       str(out),
       str(tmp_path), case, *map(str, replica_counts)], capture_output=True, text=True, timeout=300,
      env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  return dict(np.load(out))


def assert_same_training(states: dict, num_replicas: int) -> None:
  """N replicas' results (keys "N_...") equal one replica's ("1_...")."""
  prefix = f"{num_replicas}_"
  names = sorted(key[len(prefix):] for key in states if key.startswith(prefix))
  assert {"step_losses", "epoch_losses", "metrics", "dense_0", "item_rows",
          "word_keys"} <= set(names)
  for name in names:
    many, one = states[prefix + name], states[f"1_{name}"]
    message = f"{num_replicas} replicas: {name}"
    if name.endswith("_keys"):  # The same keys trained.
      np.testing.assert_array_equal(many, one, err_msg=message)
    else:
      np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-5, err_msg=message)
  assert len(states[prefix + "step_losses"]) == 6
  assert np.all(np.isfinite(states[prefix + "step_losses"]))


def test_two_and_four_replicas_equal_one_replica(tmp_path):
  states = run_worker(tmp_path, "flat", 2, 4)
  assert_same_training(states, 2)
  assert_same_training(states, 4)


def test_two_replicas_equal_one_replica_with_a_tiered_table(tmp_path):
  states = run_worker(tmp_path, "tiered", 2)
  assert_same_training(states, 2)
  assert states["2_item_swap_ins"] > 0  # Rows moved between the tiers.
