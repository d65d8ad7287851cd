"""Training a job with `pipeline.early_stopping`: epochs chosen on held-out training lists.

Without held-out lists (`DataPaths.holdout` None) the pipeline validates on the
validation split each epoch and stops there (as Keras' EarlyStopping on
validation data; the figure it reports is then optimistic). With them:

* keep_best / keep_last: the pipeline trains on the other training lists and
  validates on the held-out ones; the model it serves (latest_model) is then
  scored on the validation split, which no decision has seen.
* retrain: a selection run (in `model_dir/selection`, resumable) trains as
  above and stops; its best epoch E is the training length. The model is then
  trained on every training list for E epochs (E times the selection's steps
  per epoch with `num_train_steps`) in model_dir, as a job without early
  stopping. The choice of the number of boosting rounds before a refit on all
  data, as gradient-boosted trees are tuned.

Every run here is one host's (PipelineHparams refuses cluster strategies).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

import tensorflow as tf

from mxrec_pipeline import config as config_lib
from mxrec_pipeline.hparams import KEEP_LAST, RETRAIN, EarlyStopping
from mxrec_pipeline.keras.epochs import epoch_steps
from mxrec_pipeline.util import initialize

SELECTION_DIR = "selection"


def train(
    config: config_lib.JobConfig, paths, make_pipeline: Callable, verbose: int,
    callbacks: Sequence[tf.keras.callbacks.Callback],
    retrain_callbacks: Sequence[tf.keras.callbacks.Callback] = ()
) -> tuple[dict[str, float], dict]:
  """Trains `config` (its `pipeline.early_stopping` set); see the module docstring.

  Args:
    config: The job.
    paths: Its builders.base.DataPaths.
    make_pipeline: (config, paths) -> a SimplePipeline of that job on those
      data (jobs.setup's).
    verbose, callbacks: As `SimplePipeline.train_and_validate`; with
      `then: retrain`, `callbacks` (e.g. a sweep's per-epoch reporter) see
      the selection run only, whose epochs the early stopping decides on.
    retrain_callbacks: The callbacks of the retrain (e.g. a watchdog's).

  Returns:
    (the served model's metrics on the validation split, keyed as
    RANKING_METRICS plus "loss"; the run's record for metrics.json:
    {"then", "patience", "best_epoch", "epochs_run", "stopped_early",
    "holdout": metrics on the held-out lists or None, "retrained_epochs"}).

  Raises:
    ValueError: `then: retrain` and the data hold no list out (naming the
      builder and what to set).
  """
  rule = EarlyStopping.from_dict(config.pipeline.early_stopping)
  record = {"then": rule.then, "patience": rule.patience}
  if paths.holdout is None:
    if rule.then == RETRAIN:
      raise ValueError(f"pipeline.early_stopping.then is 'retrain', which needs training lists "
                       f"held out to choose the epochs on, and builder '{config.builder}' holds "
                       "none out (LETOR builders: data.holdout_fraction > 0 or "
                       "data.holdout_path); or set then: keep_best")
    pipeline = make_pipeline(config, paths)
    metrics = pipeline.train_and_validate(verbose=verbose, callbacks=callbacks)
    return metrics, record | _stopping(pipeline) | {"holdout": None}
  selection_paths = paths.for_selection()
  if rule.then != RETRAIN:
    pipeline = make_pipeline(config, selection_paths)
    holdout = pipeline.train_and_validate(verbose=verbose, callbacks=callbacks)
    final = make_pipeline(config, paths)  # Scores the export on the validation split.
    latest = os.path.join(config.pipeline.model_dir, "export", "latest_model")
    metrics = final.evaluate_export(latest)
    return metrics, record | _stopping(pipeline) | {"holdout": _ranking(holdout)}
  selection = _replace_pipeline(config, model_dir=os.path.join(config.pipeline.model_dir,
                                                               SELECTION_DIR),
                                early_stopping={"patience": rule.patience, "then": KEEP_LAST})
  pipeline = make_pipeline(selection, selection_paths)
  holdout = pipeline.train_and_validate(verbose=verbose, callbacks=callbacks)
  record |= _stopping(pipeline) | {"holdout": _ranking(holdout)}
  epochs = max(record["best_epoch"], 1)
  plan = epoch_steps(config.pipeline.num_epochs, config.pipeline.num_train_steps)
  steps = None if config.pipeline.num_train_steps is None else sum(plan[:epochs])
  print(
      f"early stopping: the selection's best epoch is {epochs} of {record['epochs_run']}; "
      f"training on every training list for {epochs} epoch(s)", flush=True)
  initialize.terminate_config_initializer()  # The next run creates its own tables.
  tf.keras.backend.clear_session()
  retrain = _replace_pipeline(config, num_epochs=epochs, num_train_steps=steps, early_stopping=None)
  metrics = make_pipeline(retrain, paths).train_and_validate(verbose=verbose,
                                                             callbacks=retrain_callbacks)
  return metrics, record | {"retrained_epochs": epochs}


def _replace_pipeline(config: config_lib.JobConfig, **changes) -> config_lib.JobConfig:
  return dataclasses.replace(config, pipeline=dataclasses.replace(config.pipeline, **changes))


def _stopping(pipeline) -> dict:
  """{"best_epoch", "epochs_run", "stopped_early"} of a trained pipeline's run."""
  epochs_run = int(pipeline.checkpoint.epoch.numpy())
  return {
      "best_epoch": int(pipeline.checkpoint.best.epoch.numpy()),
      "epochs_run": epochs_run,
      # False: num_epochs ended the run first (the best epoch may be that cap).
      "stopped_early": epochs_run < pipeline.hparams.num_epochs
  }


def _ranking(metrics: dict) -> dict:
  return {k: v for k, v in metrics.items() if k != "loss"}
