"""LETOR jobs with early stopping on held-out training queries, through the CLI.

The held-out queries, the selection run and the retrain on every training
query (`then: retrain`), the best epoch served (`then: keep_best`), a rerun of
a finished job, LambdaMART stopped the same way, standardized features.
"""

import filecmp
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import builders_testlib as lib
from builders import mslr
from builders import mslr_config
from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import letor_prep
from mxrec_pipeline.evaluation import evaluate_scores
from mxrec_pipeline.util import faults

pytestmark = pytest.mark.slow

CONFIG = str(lib.CONFIG_DIR / "mslr_dnn.yaml")
MAX_EPOCHS = 6


@pytest.fixture
def data(tmp_path):
  train = lib.write_letor(tmp_path / "train.txt", 24, 6, first_qid=1, seed=1)
  valid = lib.write_letor(tmp_path / "vali.txt", 10, 6, first_qid=100, seed=2)
  return [
      f"data.train_path={train}", f"data.valid_path={valid}", f"data.elwc_dir={tmp_path / 'elwc'}",
      "data.holdout_min_queries=4", "pipeline.num_train_steps=null",
      f"pipeline.num_epochs={MAX_EPOCHS}", "pipeline.seed=3", "model.hidden_layer_dims=[8]",
      "dataset.list_size=6", "lambdamart.n_estimators=60", "lambdamart.early_stopping_rounds=5",
      "lambdamart.min_child_samples=2", lib.LETOR_BASELINE_SET
  ]


def _cli_run(overrides, model_dir, fault=None):
  """`mxrec-pipeline train CONFIG` in a child process (a fault kills it): (process, metrics)."""
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
  env.pop(faults.ENV, None)
  if fault is not None:
    env[faults.ENV] = fault
  args = ["--verbose", "0"]
  for override in overrides + [f"pipeline.model_dir={model_dir}"]:
    args += ["--set", override]
  done = subprocess.run([sys.executable, "-m", "mxrec_pipeline.cli", "train", CONFIG, *args],
                        capture_output=True, text=True, timeout=600, env=env, check=False)
  metrics = model_dir / "metrics.json"
  return done, json.loads(metrics.read_text()) if metrics.is_file() else None


def test_retrain_killed_rerun_and_rerun_again(tmp_path, data, capsys):
  """then: retrain through the CLI: what it trains, a kill in the selection, a finished rerun."""
  overrides = data + ["pipeline.early_stopping={patience: 2, then: retrain}"]
  done, metrics = _cli_run(overrides, tmp_path / "reference")
  assert done.returncode == 0, done.stderr[-3000:]
  stopping = metrics["early_stopping"]
  best, run = stopping["best_epoch"], stopping["epochs_run"]
  assert 1 <= best <= run == min(MAX_EPOCHS, best + 2)
  assert stopping["stopped_early"] == (run < MAX_EPOCHS)
  assert stopping["retrained_epochs"] == best and stopping["then"] == "retrain"
  assert sorted(stopping["holdout"]) == ["mrr", "ndcg@1", "ndcg@10", "ndcg@5"]
  # The selection stopped after `run` epochs; the model then trained `best` epochs on all.
  reference = tmp_path / "reference"
  assert (reference / "selection" / "checkpoints" / f"ckpt-{run}.index").is_file()
  assert (reference / "checkpoints" / f"ckpt-{best}.index").is_file()
  assert not (reference / "checkpoints" / f"ckpt-{best + 1}.index").exists()
  # 4 of the 24 queries held out (at least holdout_min_queries); 20 train the selection.
  info = metrics["lambdamart_info"]
  assert info["early_stopping"]["holdout_lists"] == 4 and info["early_stopping"]["refit"]
  assert info["train_lists"] == 24  # The refit's lists.
  # The served model is the retrained one: its export scores the metrics reported.
  valid = next((tmp_path / "elwc").glob("vali.*.tfrecord"))
  served = _served_metrics(reference / "export" / "latest_model", valid)
  assert served["ndcg@10"] == pytest.approx(metrics["model"]["ndcg@10"], abs=1e-5)

  # Killed in the selection's epoch 2 (5 steps an epoch), the same command ends as uninterrupted.
  model_dir = tmp_path / "model"
  killed, _ = _cli_run(overrides, model_dir, fault="train_batch:7")
  assert killed.returncode == -signal.SIGKILL
  assert not (model_dir / "checkpoints").exists()  # The retrain had not begun.
  again, resumed = _cli_run(overrides, model_dir)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "Resumed from" in again.stdout
  assert resumed["model"] == metrics["model"]
  assert resumed["early_stopping"] == metrics["early_stopping"]
  exports = [d / "export" / "latest_model" / "variables" for d in (reference, model_dir)]
  assert filecmp.cmp(*(e / "variables.data-00000-of-00001" for e in exports), shallow=False)

  # The finished job rerun (in this process: it trains nothing): the selection had stopped, the
  # retrain is done.
  rerun = lib.train_cli(capsys, CONFIG, overrides + [f"pipeline.model_dir={model_dir}"],
                        keep_output=True)
  assert "nothing left to train" in rerun.pop("stdout")
  assert rerun["model"] == metrics["model"]


def test_keep_best_serves_the_best_epoch_standardized_without_the_data(tmp_path, data, capsys):
  model_dir = tmp_path / "model"
  metrics = lib.train_cli(
      capsys, CONFIG, data + [
          f"pipeline.model_dir={model_dir}",
          "pipeline.early_stopping={patience: 2, then: keep_best}", "model.standardize=true"
      ])
  stopping = metrics["early_stopping"]
  assert stopping["epochs_run"] == min(MAX_EPOCHS, stopping["best_epoch"] + 2)
  assert "retrained_epochs" not in stopping and not (model_dir / "selection").exists()
  best = json.loads(
      (model_dir / "export" / "best_model_by_metric" / "best_metric.json").read_text())
  assert best["epoch"] == stopping["best_epoch"]
  # The held-out NDCG@10 of the best epoch is what the selection saw ...
  assert stopping["holdout"]["ndcg@10"] == pytest.approx(best["value"], abs=1e-5)
  # ... while the model's metrics are latest_model (the best epoch's) on the validation split,
  # scored with the data moved away: the standardization's moments are in the export.
  (tmp_path / "elwc").rename(tmp_path / "elsewhere")
  valid = next((tmp_path / "elsewhere").glob("vali.*.tfrecord"))
  served = _served_metrics(model_dir / "export" / "latest_model", valid)
  assert served == pytest.approx(metrics["model"], abs=1e-5)
  # LambdaMART kept its best round (no refit), trained on the 20 other queries.
  info = metrics["lambdamart_info"]
  assert info["train_lists"] == 20 and "refit" not in info["early_stopping"]


def test_standardizing_raw_features_is_refused():
  with pytest.raises(ValueError, match="model.standardize needs model.use_log1p"):
    mslr_config.MslrModelConfig(standardize=True, use_log1p=False)


def test_retrain_without_held_out_queries_is_refused(tmp_path, data, capsys):
  args = ["train", CONFIG, "--verbose", "0"]
  for override in data + [
      f"pipeline.model_dir={tmp_path / 'model'}", "data.holdout_fraction=0",
      "pipeline.early_stopping={patience: 2}"
  ]:
    args += ["--set", override]
  err = lib.cli_error(capsys, args)
  assert "then is 'retrain'" in err and "builder 'mslr_dnn' holds none out" in err


def test_holdout_split_and_moments_of_the_training_queries(tmp_path):
  train = lib.write_letor(tmp_path / "train.txt", 40, 6, first_qid=1, seed=1)
  valid = lib.write_letor(tmp_path / "vali.txt", 10, 6, first_qid=100, seed=2)
  data = mslr_config.MslrDataConfig(train_path=str(train), valid_path=str(valid),
                                    elwc_dir=str(tmp_path / "elwc"), holdout_min_queries=5,
                                    baseline_feature=lib.LETOR_BASELINE)
  ranker = mslr.MslrDnn()
  paths = ranker.prepare_data(data)
  qids = {
      name: [
          int(r.context.features.feature["qid"].int64_list.value[0])
          for r in elwc.read_elwc_tfrecord(getattr(paths, name))
      ] for name in ("train", "train_without_holdout", "holdout")
  }
  assert len(qids["holdout"]) == 5 and len(qids["train_without_holdout"]) == 35
  assert sorted(qids["holdout"] + qids["train_without_holdout"]) == sorted(qids["train"])
  mean, std = letor_prep.feature_moments([train], lib.LETOR_WIDTH, exclude_qids=qids["holdout"])
  np.testing.assert_allclose(ranker.moments[0], mean)
  np.testing.assert_allclose(ranker.moments[1], std)
  # Another seed, another holdout; the same seed, the same files (cached).
  other = mslr.MslrDnn().prepare_data(
      mslr_config.MslrDataConfig(**{**vars(data), "holdout_seed": 1}))
  assert other.holdout != paths.holdout
  assert mslr.MslrDnn().prepare_data(data) == paths


def _served_metrics(export_dir, valid_path) -> dict:
  """RANKING_METRICS of an export on an ELWC file, each list scored by serving_default."""
  serve = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
  records = lib.serialized_lists(str(valid_path))
  labels = [[e.features.feature["utility"].float_list.value[0] for e in r.examples]
            for r in elwc.read_elwc_tfrecord(str(valid_path))]
  width = max(len(row) for row in labels)
  dataset = tf.data.Dataset.from_tensors(
      ({"examples": records}, tf.constant([row + [-1.0] * (width - len(row)) for row in labels])))
  return evaluate_scores(dataset, lambda f: serve(examples=f["examples"])["scores"])
