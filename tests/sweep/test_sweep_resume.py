"""Crashes and kills: a trial process killed, then the whole sweep killed mid-trial, rerun."""

import os
import signal
import subprocess

import optuna
import pytest

import sweep_testlib as lib
from mxrec_pipeline.sweep import storage as storage_lib
from mxrec_pipeline.sweep import worker as worker_lib

# Kills and reruns sweep worker processes that train.
pytestmark = pytest.mark.slow

TrialState = optuna.trial.TrialState


def _running_pid(url, number, study_name="resume"):
  """Pid of trial `number`'s process while it is RUNNING, else None."""
  study = lib.study_if_created(url, study_name)
  trials = study.get_trials(deepcopy=False) if study else []
  if len(trials) > number and trials[number].state == TrialState.RUNNING:
    return trials[number].user_attrs.get(worker_lib.PID_ATTR)
  return None


def test_killed_trial_and_killed_sweep_end_with_the_right_count(tmp_path):
  path = lib.write_config(tmp_path, "resume", pruner={"name": "none"})
  url = lib.sqlite_url(path)
  sweep = subprocess.Popen(  # pylint: disable=consider-using-with
      lib.sweep_command(path, "--n-trials", 2), cwd=lib.REPO, start_new_session=True,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    # 1. Trial 0's process dies (as under the OOM killer): FAIL, the sweep goes on.
    pid = lib.wait_for(lambda: _running_pid(url, 0), "trial 0 running", sweep)
    os.kill(pid, signal.SIGKILL)
    lib.wait_for(lambda: lib.states(lib.load_study(url, "resume")).get(1) == "COMPLETE",
                 "trial 1 complete", sweep)
    # 2. The whole sweep is killed while trial 2 runs: it stays RUNNING for now.
    lib.wait_for(lambda: _running_pid(url, 2), "trial 2 running", sweep)
    os.killpg(sweep.pid, signal.SIGKILL)
    sweep.wait()
  finally:
    if sweep.poll() is None:
      os.killpg(sweep.pid, signal.SIGKILL)
      sweep.wait()
  study = lib.load_study(url, "resume")
  assert lib.states(study) == {0: "FAIL", 1: "COMPLETE", 2: "RUNNING"}
  assert "killed by SIGKILL" in study.trials[0].user_attrs[storage_lib.ERROR_ATTR]

  # 3. The same command again: trial 2 is failed, trial 1 kept, one new trial completes.
  result = lib.run_sweep(path, "--n-trials", 2)
  assert result.returncode == 0, result.stderr[-3000:]
  study = lib.load_study(url, "resume")
  assert lib.states(study) == {0: "FAIL", 1: "COMPLETE", 2: "FAIL", 3: "COMPLETE"}
  assert "died while the trial ran" in study.trials[2].user_attrs[storage_lib.ERROR_ATTR]
  counts = storage_lib.count_states(study)
  assert storage_lib.finished(counts) == 2 and counts[TrialState.RUNNING] == 0


def test_ctrl_c_stops_workers_and_leaves_no_running_trial(tmp_path):
  path = lib.write_config(tmp_path, "interrupted", pruner={"name": "none"})
  url = lib.sqlite_url(path)
  sweep = subprocess.Popen(  # pylint: disable=consider-using-with
      lib.sweep_command(path, "--n-trials", 2, "--n-jobs", 2), cwd=lib.REPO, start_new_session=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    lib.wait_for(lambda: _running_pid(url, 0, "interrupted"), "trial 0 running", sweep)
    os.killpg(sweep.pid, signal.SIGINT)  # What Ctrl-C in a terminal does.
    stdout, stderr = sweep.communicate(timeout=lib.HANG_GUARD_S)
  finally:
    if sweep.poll() is None:
      os.killpg(sweep.pid, signal.SIGKILL)
      sweep.wait()
  assert sweep.returncode == 130, stderr[-3000:]
  study = lib.load_study(url, "interrupted")
  counts = storage_lib.count_states(study)
  assert counts[TrialState.RUNNING] == 0 and counts[TrialState.WAITING] == 0
  for trial in study.trials:
    if trial.state == TrialState.FAIL:
      assert "interrupted" in trial.user_attrs[storage_lib.ERROR_ATTR]
  assert "trial" in stdout and "state" in stdout  # The report is printed anyway.
  for trial in study.trials:  # No trial process is left.
    pid = trial.user_attrs.get(worker_lib.PID_ATTR)
    assert pid is None or storage_lib.is_alive({"pid": pid}) is False
