"""Early stopping (pipeline.early_stopping): the rule, a stopped run's rerun, keep_best's export."""

import filecmp
import os

import numpy as np
import pytest
import tensorflow as tf

import keras_testlib as lib
from mxrec_pipeline.hparams import EarlyStopping
from mxrec_pipeline.keras import callbacks as callbacks_lib
from mxrec_pipeline.keras import checkpoints as checkpoints_lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import initialize


class _Model:
  stop_training = False


def _run_rule(values, patience, higher_is_better=True):
  """Epochs (1-based) run before the stopper stops, fed `values` as val_ndcg_10."""
  best = checkpoints_lib.BestMetric()
  stopper = callbacks_lib.EarlyStopper("val_ndcg_10", higher_is_better, patience, best, track=True)
  stopper.set_model(_Model())
  for epoch, value in enumerate(values):
    stopper.on_epoch_end(epoch, {"val_ndcg_10": value})
    if stopper.model.stop_training:
      return epoch + 1, int(best.epoch.numpy())
  return len(values), int(best.epoch.numpy())


def test_the_rule_stops_patience_epochs_after_the_best():
  # Best 0.5 at epoch 2; epochs 3 and 4 do not beat it (a tie is no improvement).
  assert _run_rule([0.3, 0.5, 0.5, 0.4, 0.9], patience=2) == (4, 2)
  assert _run_rule([0.3, 0.5, 0.5, 0.4, 0.9], patience=3) == (5, 5)
  assert _run_rule([0.1, 0.2, 0.3], patience=1) == (3, 3)
  # A NaN is no improvement (it would otherwise be a best nothing beats).
  assert _run_rule([float("nan"), 0.2, 0.3, 0.1, 0.1], patience=2) == (5, 3)
  assert _run_rule([float("nan")] * 4, patience=2) == (4, 0)
  # Lower is better (the loss).
  assert _run_rule([3.0, 2.0, 2.5, 2.1], patience=2, higher_is_better=False) == (4, 2)


def test_a_missing_monitor_is_named():
  stopper = callbacks_lib.EarlyStopper("val_ndcg_10", True, 2, checkpoints_lib.BestMetric(), True)
  stopper.set_model(_Model())
  with pytest.raises(KeyError, match="val_ndcg_10"):
    stopper.on_epoch_end(0, {"val_loss": 1.0})


@pytest.mark.parametrize("raw, message", [
    ({"patience": 0}, "early_stopping.patience"),
    ({"patience": 2, "then": "best"}, "early_stopping.then"),
    ({"wait": 2}, "unknown keys"),
    ([2], "must be a mapping"),
])
def test_bad_configs_are_named(raw, message):
  with pytest.raises(ValueError, match=message):
    EarlyStopping.from_dict(raw)


def test_cluster_strategies_are_refused():
  with pytest.raises(ValueError, match="early_stopping.*one host"):
    pipeline_lib.PipelineHparams(model_dir="m", early_stopping={"patience": 2},
                                 strategy="MultiWorkerMirroredStrategy")


@pytest.mark.slow
def test_keep_best_serves_and_reports_the_best_epoch_and_a_rerun_trains_nothing(tmp_path, capsys):
  hparams = dict(num_epochs=10, num_train_steps=30, learning_rate=0.3, seed=5,
                 early_stopping={"patience": 2, "then": "keep_best"})
  run = lib.train_task(tmp_path, **hparams)
  values = run["pipeline"].history.history["val_ndcg_10"]
  best_epoch = int(np.argmax(values)) + 1  # The first of equal maxima, as the rule keeps it.
  assert len(values) == best_epoch + 2 < 10  # Seeded: it stops (at epoch 5, the best 3).
  model_dir = tmp_path / "model"
  best = model_dir / "export" / "best_model_by_metric"
  latest = model_dir / "export" / "latest_model"
  assert filecmp.cmp(best / "saved_model.pb", latest / "saved_model.pb", shallow=False)
  assert not (latest / callbacks_lib.BestModelExporter.STATE_FILE).exists()
  # The reported metrics are the best export's, scored on the whole validation data.
  assert run["metrics"]["ndcg@10"] == pytest.approx(max(values), abs=1e-5)

  # The same command again: the run had stopped; nothing is trained, the same is reported.
  initialize.terminate_config_initializer()
  tf.keras.backend.clear_session()
  train, valid = str(tmp_path / "train.tfrecord"), str(tmp_path / "valid.tfrecord")
  again = pipeline_lib.SimplePipeline(
      lib.model_builder(), lib.dataset_builder(train, valid),
      pipeline_lib.PipelineHparams(model_dir=str(model_dir), **hparams))
  metrics = again.train_and_validate()
  out = capsys.readouterr().out
  assert "Early stopping had ended this run" in out
  assert again.model.optimizer.iterations.numpy() == 3 * len(values)
  assert metrics["ndcg@10"] == pytest.approx(run["metrics"]["ndcg@10"], abs=1e-6)
  assert os.path.isdir(latest)
