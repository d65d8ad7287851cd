"""SimplePipeline with N replicas (MirroredStrategy over logical CPUs) equals one replica.

replicas_worker.py trains the keras_testlib task in a fresh process (logical
devices must be set before TensorFlow starts) with N replicas and with one on
the same global batches; per-step and epoch losses, validation metrics, dense
weights and every table's rows by key must agree, over the same trained keys.
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


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory) -> dict:
  """2 replicas and one, with flat tables and with a tiered one (one process)."""
  return run_worker(tmp_path_factory.mktemp("two"), 2, "flat", "tiered")


def run_worker(tmp_path, num_replicas: int, *cases: str) -> dict:
  out = tmp_path / "states.npz"
  env = {
      **os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2",
      "PYTHONPATH": os.pathsep.join([str(WORKER.parent),
                                     os.environ.get("PYTHONPATH", "")])
  }
  result = subprocess.run(
      [sys.executable,
       str(WORKER), str(out),
       str(tmp_path),
       str(num_replicas), *cases], capture_output=True, text=True, timeout=300, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  return dict(np.load(out))


def assert_same_training(states: dict, case: str, num_replicas: int) -> None:
  """N replicas' results (keys "CASE_N_...") equal one replica's ("CASE_1_...")."""
  prefix = f"{case}_{num_replicas}_"
  names = sorted(key[len(prefix):] for key in states if key.startswith(prefix))
  assert {"step_losses", "epoch_losses", "metrics", "dense_0", "item_rows",
          "word_keys"} <= set(names)
  for name in names:
    many, one = states[prefix + name], states[f"{case}_1_{name}"]
    if name.endswith("_keys"):  # The same keys trained.
      np.testing.assert_array_equal(many, one, err_msg=prefix + name)
    else:
      np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-5, err_msg=prefix + name)
  assert len(states[prefix + "step_losses"]) == 6
  assert np.all(np.isfinite(states[prefix + "step_losses"]))


def test_two_replicas_equal_one_replica(two_replicas):
  assert_same_training(two_replicas, "flat", 2)


def test_two_replicas_equal_one_replica_with_a_tiered_table(two_replicas):
  assert_same_training(two_replicas, "tiered", 2)
  assert two_replicas["tiered_2_item_swap_ins"] > 0  # Rows moved between the tiers.


def test_four_replicas_equal_one_replica(tmp_path):
  assert_same_training(run_worker(tmp_path, 4, "flat"), "flat", 4)
