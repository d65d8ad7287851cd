"""A small sweep of the real MovieLens job end to end through the CLI, then a resume."""

import json
import os

import optuna
import pytest
import tensorflow as tf

import sweep_testlib as lib
from mxrec_pipeline import config as job_config
from mxrec_pipeline.sweep import reporting
from mxrec_pipeline.sweep import storage as storage_lib
from mxrec_pipeline.sweep import worker as worker_lib

# Sweeps the real MovieLens job through the CLI: subprocess trainings.
pytestmark = pytest.mark.slow

N_TRIALS = 3


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  """configs/sweep_movielens.yaml, tiny trials, median pruning from the second trial."""
  tmp = tmp_path_factory.mktemp("sweep")
  path = lib.write_config(
      tmp, "movielens",
      pruner={"name": "median", "options": {"n_startup_trials": 1, "n_warmup_steps": 0}})
  result = lib.run_sweep(path, "--n-trials", N_TRIALS)
  assert result.returncode == 0, result.stderr[-3000:]
  study = lib.load_study(lib.sqlite_url(path), "movielens")
  return path, result, study, tmp / "movielens"


def test_study_ends_with_n_trials_complete_or_pruned(sweep):
  _, _, study, sweep_dir = sweep
  trials = study.get_trials()
  assert len(trials) == N_TRIALS
  assert {t.state for t in trials
         } <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
  assert trials[0].state == optuna.trial.TrialState.COMPLETE  # No pruning before one finishes.
  for trial in trials:
    model_dir = trial.user_attrs[worker_lib.MODEL_DIR_ATTR]
    assert model_dir == str(sweep_dir / "trials" / f"{trial.number:04d}")
    with open(os.path.join(model_dir, "trial.json"), encoding="utf-8") as f:
      spec = json.load(f)
    assert spec["number"] == trial.number
    assert len(trial.intermediate_values) >= 1  # The pruner saw the epochs.
    if trial.state == optuna.trial.TrialState.COMPLETE:
      assert len(trial.intermediate_values) == 2
      with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
        assert json.load(f)["model"]["ndcg@10"] == pytest.approx(trial.value)
      assert trial.user_attrs[worker_lib.METRICS_ATTR]["ndcg@10"] == pytest.approx(trial.value)


def test_trial_table_is_printed(sweep):
  _, result, study, _ = sweep
  lines = result.stdout.splitlines()
  header = next(i for i, line in enumerate(lines) if line.startswith("trial"))
  assert lines[header].split()[:3] == ["trial", "state", "ndcg@10"]
  for trial, line in zip(study.get_trials(), lines[header + 1:header + 1 + N_TRIALS]):
    assert line.split()[:2] == [str(trial.number), trial.state.name]
  assert f"best: trial {study.best_trial.number}" in result.stdout


def test_best_config_trains_the_best_params_and_best_model_serves(sweep):
  _, _, study, sweep_dir = sweep
  best = study.best_trial
  config = job_config.load(str(sweep_dir / reporting.BEST_CONFIG))  # What `train` loads.
  assert config.pipeline.learning_rate == best.params["pipeline.learning_rate"]
  assert config.model.id_dim == best.params["model.id_dim"]
  assert config.pipeline.loss == best.params["pipeline.loss"]
  assert json.dumps(config.model.hidden_layer_dims,
                    separators=(", ", ": ")) == (best.params["model.hidden_layer_dims"])
  assert config.pipeline.num_train_steps == lib.TINY["pipeline.num_train_steps"]
  assert config.pipeline.model_dir == str(sweep_dir / reporting.RETRAIN_DIR)
  with open(sweep_dir / reporting.BEST_TRIAL, encoding="utf-8") as f:
    assert json.load(f)["number"] == best.number
  model = tf.saved_model.load(str(sweep_dir / reporting.BEST_MODEL))
  assert "serving_default" in model.signatures


def test_plots_are_written_as_html_and_png(sweep):
  sweep_dir = sweep[3]
  for name in ("optimization_history", "param_importances", "parallel_coordinate"):
    for ext in ("html", "png"):
      assert os.path.getsize(sweep_dir / reporting.PLOTS_DIR / f"{name}.{ext}") > 1000


def test_rerun_resumes_without_repeating_trials(sweep):
  path, _, study, _ = sweep
  before = {t.number: t.datetime_complete for t in study.get_trials()}
  result = lib.run_sweep(path, "--n-trials", N_TRIALS)
  assert result.returncode == 0, result.stderr[-3000:]
  after = {t.number: t.datetime_complete for t in study.get_trials()}
  assert after == before
  assert storage_lib.count_states(study)[optuna.trial.TrialState.RUNNING] == 0
