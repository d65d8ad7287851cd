"""Restarts of a TPUEmbedding-style loop: a SIGKILLed run resumes to the uninterrupted state.

resume_worker.py trains 20 steps, saving tf.train.Checkpoint(model, embedding,
optimizer, step) every 5 through a CheckpointManager, in a process of its own
so that it can SIGKILL itself; a second process restores the latest checkpoint,
skips the trained batches and trains to step 20. Losses of the resumed steps,
sorted id -> row, rows, both tables' optimizer slots and the model's and
optimizer's variables must equal the uninterrupted run's exactly.
"""

import json
import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest

# Spawns subprocess trainings (killed and resumed).
pytestmark = pytest.mark.slow

HERE = pathlib.Path(__file__).parent
REPO = HERE.parents[1]
STEPS, SAVE_EVERY = 20, 5
WORKER_TIMEOUT_S = 300  # A guard against a hung worker; nothing asserts on time.


def run_worker(model_dir, out_json, *args) -> tuple[int, str]:
  """Runs resume_worker.py to the end (or its SIGKILL): (exit code, stdout + stderr's end)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
             PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  # On a timeout subprocess.run kills the worker before raising.
  done = subprocess.run([
      sys.executable,
      str(HERE / "resume_worker.py"),
      str(model_dir),
      str(out_json), "--steps",
      str(STEPS), "--save-every",
      str(SAVE_EVERY), *map(str, args)
  ], cwd=HERE, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False)
  return done.returncode, done.stdout + done.stderr[-3000:]


def test_sigkilled_run_resumes_to_the_uninterrupted_state(tmp_path):
  code, output = run_worker(tmp_path / "reference", tmp_path / "reference.json")
  assert code == 0, output
  reference = json.loads((tmp_path / "reference.json").read_text())
  kill_after = random.Random(0).choice([s for s in range(SAVE_EVERY + 1, STEPS) if s % SAVE_EVERY])
  saved = kill_after // SAVE_EVERY * SAVE_EVERY
  code, output = run_worker(tmp_path / "model", tmp_path / "killed.json", "--kill-after",
                            kill_after)
  assert code == -9 and not (tmp_path / "killed.json").exists(), output
  code, output = run_worker(tmp_path / "model", tmp_path / "resumed.json")
  assert code == 0 and f"ckpt-{saved} at step {saved}" in output, output
  resumed = json.loads((tmp_path / "resumed.json").read_text())

  assert resumed["start"] == saved
  assert sorted(map(int, resumed["losses"])) == list(range(saved + 1, STEPS + 1))
  diffs = [abs(loss - reference["losses"][step]) for step, loss in resumed["losses"].items()]
  assert reference["tables"].keys() == resumed["tables"].keys() == {"user", "item"}
  for name, table in reference["tables"].items():
    other = resumed["tables"][name]
    assert table.keys() == other.keys() and len(table) > 3, name  # Rows and slots.
    assert (table["keys"], table["rows"]) == (other["keys"], other["rows"]), name
    diffs += [
        np.max(np.abs(np.subtract(table[part], other[part]))) for part in table
        if part not in ("keys", "rows")
    ]
  assert reference["variables"].keys() == resumed["variables"].keys()
  diffs += [
      np.max(np.abs(np.subtract(value, resumed["variables"][name])))
      for name, value in reference["variables"].items()
  ]
  assert max(diffs) == 0.0


def test_finished_run_resumes_without_training(tmp_path):
  code, output = run_worker(tmp_path / "model", tmp_path / "first.json")
  assert code == 0, output
  code, output = run_worker(tmp_path / "model", tmp_path / "again.json")
  assert code == 0 and f"ckpt-{STEPS} at step {STEPS}" in output, output
  first, again = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("first", "again"))
  assert again["losses"] == {} and again["variables"] == first["variables"]
  # Table optimizer slots are restored when apply_gradients first creates them
  # (docs/tpu-embedding.md), so a run without steps has none to show.
  for name, table in first["tables"].items():
    assert {k: again["tables"][name][k] for k in ("keys", "rows", "values")
           } == {k: table[k] for k in ("keys", "rows", "values")}, name
