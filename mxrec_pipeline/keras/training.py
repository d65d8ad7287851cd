"""The training half of a Keras pipeline: `train_and_validate`'s epoch loops.

`EpochLoops` is a base of keras/pipeline.ModelFitPipeline, as
keras/exporting.PipelineExport is: once `prepare_run` has built and placed
the model and `restoring.resume` has chosen the first epoch, `_fit_epochs`
trains one host's or the workers' epochs (consecutive epochs with the same
steps as one model.fit on one iterator, an `EpochGate` holding each epoch's
insertion until Keras begins it; an early-stopped run keeping its best epoch
reports its best export's metrics) and `_fit_epochs_on_ps` trains under
ParameterServerStrategy (one model.fit per epoch over each worker's part,
validation on the coordinator: keras/ps.py). Both export `latest_model` and
return the final validation metrics keyed as RANKING_METRICS
(`ranking_results`). It uses the pipeline's builders, hparams, strategy,
placement and callbacks; it holds no state of its own beyond `history`.
"""

from __future__ import annotations

import os
from typing import Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import replicas
from mxrec_pipeline.hparams import RANKING_METRICS
from mxrec_pipeline.keras import callbacks as callbacks_lib
from mxrec_pipeline.keras import ps
from mxrec_pipeline.keras import datasets
from mxrec_pipeline.keras.datasets import BaseDatasetBuilder
from mxrec_pipeline.keras.epochs import EpochGate, epoch_groups
from mxrec_pipeline.keras.strategies import splits_batches


def metric_name(key: str) -> str:
  """Keras name of a RANKING_METRICS key: "ndcg@10" -> "ndcg_10"."""
  return key.replace("@", "_")


def build_ranking_metrics() -> list[tf.keras.metrics.Metric]:
  """tfr metric objects for RANKING_METRICS, named by `metric_name`."""
  return [
      tfr.keras.metrics.get(key, topn=topn, name=metric_name(name))
      for name, (key, topn) in RANKING_METRICS.items()
  ]


def ranking_results(results: dict) -> dict[str, float]:
  """RANKING_METRICS keys ("ndcg@10", ...) and "loss" from Keras-named results ("ndcg_10")."""
  return {key: float(results[metric_name(key)]) for key in RANKING_METRICS
         } | {"loss": float(results["loss"])}


class EpochLoops:
  """`train_and_validate`'s epochs on one host or workers, and under ParameterServerStrategy."""

  def _fit_epochs(self, model: tf.keras.Model, plan: list[int | None], start_epoch: int,
                  callbacks: Sequence[tf.keras.callbacks.Callback],
                  verbose: int) -> dict[str, float]:
    """Epochs `start_epoch`.. of `plan` on one host or on workers; see `train_and_validate`.

    One iterator per run of epochs with the same steps (Keras keeps a
    dataset's iterator across the epochs of a fit when told its steps), the
    gate releasing each epoch's insertion at its on_epoch_begin.
    """
    hparams, data, strategy = self._hparams, self._data, self._strategy_in_use
    streams = isinstance(data, BaseDatasetBuilder)
    gate = EpochGate(len(plan)) if streams else None
    run_callbacks = callbacks_lib.RunCallbacks(
        ([gate] if gate else []) + self.build_callbacks(model) + list(callbacks), model, verbose,
        epochs=len(plan))
    valid = self._distribute(
        strategy, data.build_valid_dataset(num_epochs=None if hparams.num_valid_steps else 1))
    split = splits_batches(strategy, self._placement, self._has_sparse_features())
    # Keras needs the steps of a distributed dataset.
    valid_steps = hparams.num_valid_steps or (data.count_batches(False) if split else None)
    # ... and of a dataset whose iterator it keeps over several epochs.
    one_pass = (data.count_batches(True) if
                (split or streams) and None in plan[start_epoch:] else None)
    groups = (epoch_groups(plan, start_epoch)
              if streams else [(e, e + 1) for e in range(start_epoch, len(plan))])
    run_callbacks.begin_run()
    try:
      for first, end in groups:
        run_callbacks.set_epoch_steps(plan[first] or one_pass)
        model.fit(
            self._distribute(strategy, self._train_epochs(range(first, end), plan[first],
                                                          gate)), initial_epoch=first, epochs=end,
            steps_per_epoch=plan[first] or one_pass, validation_data=valid,
            validation_steps=valid_steps, callbacks=run_callbacks, verbose=verbose)
        if model.stop_training:  # e.g. EarlyStopping.
          break
    finally:
      if gate:
        gate.close()
    run_callbacks.end_run()
    self.history = run_callbacks.history
    latest = self.export_latest(model, run_callbacks.callbacks)
    if self._keeps_best and self._best_exporter(run_callbacks.callbacks) is not None:
      return self.evaluate_export(latest)  # The best epoch's model, which latest_model serves.
    results = model.evaluate(self._distribute(strategy, data.build_valid_dataset(num_epochs=1)),
                             steps=valid_steps if split and not hparams.num_valid_steps else None,
                             return_dict=True, verbose=0)
    return ranking_results(results)

  def _fit_epochs_on_ps(self, model: tf.keras.Model, plan: list[int | None], start_epoch: int,
                        callbacks: Sequence[tf.keras.callbacks.Callback],
                        verbose: int) -> dict[str, float]:
    """train_and_validate's epochs under ParameterServerStrategy (this process the coordinator).

    Each epoch is one model.fit over `ps.per_worker_dataset` of the epoch's
    batches, steps_per_epoch of them (the plan's, or one pass), with
    validation on the coordinator (`ps.CoordinatorValidation`, first among
    the callbacks so the others see its `val_*` logs), or none with
    `hparams.sidecar_evaluator` (an evaluator task validates the
    checkpoints: mxrec_pipeline/sidecar.py).
    """
    hparams = self._hparams
    validation = ([] if hparams.sidecar_evaluator else
                  [ps.CoordinatorValidation(self._evaluate_on_coordinator)])
    run_callbacks = callbacks_lib.RunCallbacks([*validation, *self.build_callbacks(model)] +
                                               list(callbacks), model, verbose, epochs=len(plan))
    one_pass = (self._data.count_batches(True) if None in plan[start_epoch:] else None)
    run_callbacks.begin_run()
    for epoch in range(start_epoch, len(plan)):
      run_callbacks.set_epoch_steps(plan[epoch] or one_pass)
      dataset = ps.per_worker_dataset(lambda epoch=epoch: self._train_epochs([epoch], plan[epoch]))
      model.fit(dataset, initial_epoch=epoch, epochs=epoch + 1, steps_per_epoch=plan[epoch] or
                one_pass, callbacks=run_callbacks, verbose=verbose)
      if model.stop_training:
        break
    run_callbacks.end_run()
    self.history = run_callbacks.history
    self.export_saved_model(model, os.path.join(hparams.model_dir, "export", "latest_model"))
    return ranking_results(self._evaluate_on_coordinator())

  def _evaluate_on_coordinator(self) -> dict[str, float]:
    """ps.evaluate_on_coordinator over the validation data (`num_valid_steps` batches or all)."""
    dataset = datasets.validation_batches(self._data, self._hparams.num_valid_steps)
    return ps.evaluate_on_coordinator(self.model, dataset, self.build_metrics())

  def _has_sparse_features(self) -> bool:
    """Whether the dataset builder has sparse id features (tables to place)."""
    return bool(getattr(self._dataset_builder, "sparse_features", None))

  def _distribute(self, strategy: tf.distribute.Strategy, dataset: tf.data.Dataset):
    """Global batches as the strategy's replicas take them.

    With N > 1 replicas and sparse features, each replica gets its part of the
    inserted global batch with its own unique rows (core/asc/replicas.py);
    otherwise `dataset` as it is (Keras distributes it).
    """
    if not splits_batches(strategy, self._placement, self._has_sparse_features()):
      return dataset
    return replicas.distribute_dataset(
        strategy, dataset,
        [fs.FeatureSpec(f.name, table_name=f.table) for f in self._data.sparse_features])

  def _train_epochs(self, epochs: Sequence[int], num_steps: int | None,
                    gate: EpochGate | None = None) -> tf.data.Dataset:
    """The training batches of `epochs` (consecutive) on one iterator; see `build_train_epochs`."""
    builder = self._data
    if isinstance(builder, BaseDatasetBuilder):
      return builder.build_train_epochs(epochs, num_steps, self._hparams.seed, gate)
    # Another AbstractDatasetBuilder (one epoch at a time): its data, bounded to the epoch.
    if len(epochs) != 1:
      raise ValueError(f"{type(builder).__name__} builds one epoch per dataset, got {list(epochs)}")
    dataset = builder.build_train_dataset(num_epochs=1 if num_steps is None else None)
    return dataset if num_steps is None else dataset.take(num_steps)
