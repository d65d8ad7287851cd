"""The mx_rec API inside `strategy.run` with 2 replicas equals one replica.

replicas_worker.py runs an mx_rec custom loop (FeatureSpecs, get_asc_insert_func,
sparse_lookup, a lazy Adam hash optimizer) in a fresh process, under a
MirroredStrategy over two logical CPUs and under no strategy.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

# Trains on two replicas (MirroredStrategy) in a subprocess.
pytestmark = pytest.mark.slow

WORKER = pathlib.Path(__file__).with_name("replicas_worker.py")


def test_strategy_run_with_two_replicas_equals_one(tmp_path):
  out = tmp_path / "states.npz"
  result = subprocess.run(
      [sys.executable, str(WORKER), str(out)], capture_output=True, text=True, timeout=300,
      env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert result.returncode == 0, result.stderr[-3000:]
  states = np.load(out)
  names = sorted(key[len("two_"):] for key in states if key.startswith("two_"))
  assert {"losses", "kernel", "item_rows", "item_m", "user_v", "user_keys"} <= set(names)
  for name in names:
    two, one = states[f"two_{name}"], states[f"one_{name}"]
    if name.endswith("_keys"):
      np.testing.assert_array_equal(two, one, err_msg=name)
    else:
      np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6, err_msg=name)
  assert len(states["two_losses"]) == 6 and np.all(np.isfinite(states["two_losses"]))
