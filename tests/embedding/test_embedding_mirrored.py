"""MirroredStrategy, 2 replicas (logical CPUs), equals 1 replica on the same global batches.

The TPUEmbedding docs' training loop (mirrored_worker.py) runs in a fresh
process, since logical devices must be set before TensorFlow starts: dense,
ragged and weighted sparse features, a shared table, per-table SGD / Adagrad
and a global Adam. Rows must be handed out identically, and losses, rows,
slots and the dense weights agree to float tolerance.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

# Trains on two replicas (MirroredStrategy) in a subprocess.
pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WORKER = pathlib.Path(__file__).with_name("mirrored_worker.py")


def test_two_replicas_equal_one(tmp_path):
  out = tmp_path / "states.npz"
  result = subprocess.run(
      [sys.executable, str(WORKER), str(out)], capture_output=True, text=True, timeout=600,
      env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert result.returncode == 0, result.stderr[-3000:]
  states = np.load(out)
  names = sorted(key[len("two_"):] for key in states if key.startswith("two_"))
  assert {"losses", "kernel", "movie_table", "movie_momenta", "user_accumulators",
          "tag_table"} <= set(names)
  for name in names:
    two, one = states[f"two_{name}"], states[f"one_{name}"]
    if name.endswith(("_keys", "_rows")):  # The same id -> row assignment.
      np.testing.assert_array_equal(two, one, err_msg=name)
    else:
      np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6, err_msg=name)
  assert len(states["two_losses"]) == 6 and np.all(np.isfinite(states["two_losses"]))
  # Training moved exactly the shared table's looked-up rows (lazy Adam).
  initial = np.random.RandomState(1).uniform(-0.5, 0.5, [64, 4]).astype(np.float32)
  used = np.zeros(64, bool)
  used[states["two_movie_rows"]] = True
  moved = np.any(states["two_movie_table"] != initial, axis=1)
  np.testing.assert_array_equal(moved, used)
