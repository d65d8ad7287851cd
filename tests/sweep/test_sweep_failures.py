"""A failing trial is recorded FAIL with its error and the sweep goes on, up to a limit."""

import optuna
import pytest

import sweep_testlib as lib
from mxrec_pipeline.sweep import storage as storage_lib

# Runs a sweep worker whose trials run in processes of their own.
pytestmark = pytest.mark.slow

NO_SUCH_OPTIMIZER = "no_such_package>NoSuchOptimizer"


def test_failing_trials_are_recorded_and_the_worker_stops_after_a_run_of_them(tmp_path):
  # A valid config whose every trial fails when the model compiles: PipelineHparams
  # leaves registered custom optimizer names ("package>Name") to Keras.
  path = lib.write_config(
      tmp_path, "failing", max_consecutive_failures=2, pruner={"name": "none"},
      search_space={"pipeline.optimizer": {"type": "categorical", "choices": [NO_SUCH_OPTIMIZER]}})
  result = lib.run_sweep(path, "--n-trials", 3)
  assert result.returncode == 1, result.stderr[-3000:]
  assert "stopping after 2 failed trials in a row" in result.stderr
  study = lib.load_study(lib.sqlite_url(path), "failing")
  trials = study.get_trials()
  assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 2  # The second ran.
  for trial in trials:
    assert f"Unknown optimizer: '{NO_SUCH_OPTIMIZER}'" in trial.user_attrs[storage_lib.ERROR_ATTR]
  assert "no trial completed" in result.stdout
  assert "Unknown optimizer" in result.stdout  # The table's error column.
