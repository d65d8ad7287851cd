"""Restarts of an mx_rec-API session script: a SIGKILLed run resumes to the uninterrupted state.

saver_resume_worker.py trains 24 steps, saving every 6, in a process of its own
so that it can SIGKILL itself; a second process restores the latest checkpoint,
skips the batches it holds (the global step, `skip` before the insert map) and
trains to step 24. Losses of the resumed steps, sorted key -> row, rows, lazy
Adam slots, pending admission counts and every other variable must equal the
uninterrupted run's exactly.
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
STEPS, SAVE_EVERY = 24, 6
WORKER_TIMEOUT_S = 300  # A guard against a hung worker; nothing asserts on time.


def run_worker(model_dir, out_json, *args) -> subprocess.CompletedProcess:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  # On a timeout subprocess.run kills the worker before raising.
  return subprocess.run([
      sys.executable,
      str(HERE / "saver_resume_worker.py"),
      str(model_dir),
      str(out_json), "--steps",
      str(STEPS), "--save-every",
      str(SAVE_EVERY), *map(str, args)
  ], cwd=HERE, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False)


def train(tmp_path, name, *args) -> dict:
  done = run_worker(tmp_path / name, tmp_path / f"{name}.json", *args)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads((tmp_path / f"{name}.json").read_text())


def kill_and_resume(tmp_path, kill_after, *args) -> dict:
  """Trains until SIGKILLed after step `kill_after`, then resumes to STEPS; the final state."""
  killed = run_worker(tmp_path / "model", tmp_path / "killed.json", "--kill-after", kill_after,
                      *args)
  assert killed.returncode == -9, killed.stderr[-3000:]
  assert not (tmp_path / "killed.json").exists()
  return train(tmp_path, "model", *args)


def max_abs_difference(a: dict, b: dict, counters: bool = True) -> float:
  """The largest |a - b| over losses, rows, slots and variables; asserts keys, rows, counts equal.

  `b` may have trained only the last steps: its losses are compared with a's
  of the same steps. counters=False skips the key indexes' statistics
  (admissions so far...), which the sparse Saver does not keep.
  """
  assert b["losses"] and set(b["losses"]) <= set(a["losses"])
  diffs = [abs(loss - a["losses"][step]) for step, loss in b["losses"].items()]
  assert a["tables"].keys() == b["tables"].keys()
  for name, table in a["tables"].items():
    other = b["tables"][name]
    for part in ("keys", "rows", "pending_keys", "pending_counts") + ("stats",) * counters:
      assert table[part] == other[part], f"{name} {part}"
    diffs.append(np.max(np.abs(np.subtract(table["values"], other["values"]))))
    for slot in ("m", "v"):
      diffs.append(np.max(np.abs(np.subtract(table["slots"][slot], other["slots"][slot]))))
  assert a["variables"].keys() == b["variables"].keys()
  for name, value in a["variables"].items():
    diffs.append(np.max(np.abs(np.subtract(value, b["variables"][name]))))
  return float(max(diffs))


def kill_step(seed: int) -> int:
  """A step after the first save that is not a save step, from a seeded RNG."""
  return random.Random(seed).choice([s for s in range(SAVE_EVERY + 1, STEPS) if s % SAVE_EVERY])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  return train(tmp_path_factory.mktemp("uninterrupted"), "model")


@pytest.mark.parametrize("seed", [0, 1])
def test_sigkilled_run_resumes_to_the_uninterrupted_state(uninterrupted, tmp_path, seed):
  kill_after = kill_step(seed)
  saved = kill_after // SAVE_EVERY * SAVE_EVERY
  resumed = kill_and_resume(tmp_path, kill_after)
  assert resumed["start"] == saved
  assert sorted(map(int, resumed["losses"])) == list(range(saved + 1, STEPS + 1))
  assert max_abs_difference(uninterrupted, resumed, counters=False) == 0.0


def test_resumed_run_prints_its_step_and_finished_run_trains_nothing(uninterrupted, tmp_path):
  first = run_worker(tmp_path / "model", tmp_path / "first.json", "--kill-after", SAVE_EVERY + 1)
  assert first.returncode == -9
  resumed = run_worker(tmp_path / "model", tmp_path / "resumed.json")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"model-{SAVE_EVERY} at step {SAVE_EVERY}" in resumed.stdout
  again = run_worker(tmp_path / "model", tmp_path / "again.json")
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"model-{STEPS} at step {STEPS}" in again.stdout
  assert json.loads((tmp_path / "again.json").read_text())["losses"] == {}


ADMISSION = ("--access-threshold", 3)


@pytest.fixture(scope="module")
def uninterrupted_with_admission(tmp_path_factory):
  return train(tmp_path_factory.mktemp("uninterrupted_admission"), "model", *ADMISSION,
               "--drained-saves", "--plain-saver")


def test_admission_resumes_exactly_from_drained_saves_with_the_counters(
    uninterrupted_with_admission, tmp_path):
  """The documented rule: bound the iterator at save steps and save the key indexes' counters.

  tf.compat.v1.train.Saver saves each key index's whole state (pending keys,
  their counts, counters); drained saves leave no batch inserted (counted) but
  not trained at the save, so re-inserting the skipped-to batches counts each
  sighting once.
  """
  stats = uninterrupted_with_admission["tables"]["item_table"]["stats"]
  assert stats["pending"] > 0 and stats["admissions"] > 0  # Admission is at work.
  resumed = kill_and_resume(tmp_path, kill_step(2), *ADMISSION, "--drained-saves", "--plain-saver")
  assert max_abs_difference(uninterrupted_with_admission, resumed) == 0.0


@pytest.mark.parametrize("mode", [["--plain-saver"], ["--drained-saves"]])
def test_admission_without_the_rule_counts_sightings_differently(uninterrupted_with_admission,
                                                                 tmp_path, mode):
  """What the rule avoids: read-ahead batches counted twice, or the counters not saved.

  Without drained saves, batches inserted ahead of the save (prefetch) count
  again after the restore; the sparse Saver keeps keys and rows only, so the
  pending counts restart from zero. Either way keys are admitted at other steps.
  """
  reference = train(tmp_path, "reference", *ADMISSION, *mode)
  # Uninterrupted, neither the iterator bounds nor the saver change anything.
  assert max_abs_difference(uninterrupted_with_admission, reference) == 0.0
  resumed = kill_and_resume(tmp_path, kill_step(2), *ADMISSION, *mode)
  with pytest.raises(AssertionError):
    max_abs_difference(reference, resumed)
