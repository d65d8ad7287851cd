"""Pipelines, mirroring tfr.keras.pipeline: `SimplePipeline.train_and_validate`.

tfr's `AbstractPipeline`, `AbstractDatasetBuilder` and `DatasetHparams` are
reused as they are. On top of tfr's ModelFitPipeline the sparse core adds the
run's init(), the table optimizer, checkpoints holding tables and key indexes,
and a SavedModel export that maps raw ids with stock TF lookup tables. The
dataset builders (keras/datasets.py) and the strategy and table placement
(keras/strategies.py) live in their own modules and are re-exported here; the
export half of the pipeline (restore for export, the SavedModel, run_info) is
keras/exporting.py.

Example:

  ```python
  pipeline = SimplePipeline(model_builder, dataset_builder, PipelineHparams(
      model_dir="/tmp/model", num_epochs=2, num_train_steps=200, loss="softmax_loss",
      learning_rate=0.01))
  metrics = pipeline.train_and_validate(verbose=2)   # {"ndcg@10": ..., ...}
  ```
"""

from __future__ import annotations

import os
from typing import Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import replicas
# Re-exported: users import PipelineHparams and RANKING_METRICS from here.
from mxrec_pipeline.hparams import (MULTI_WORKER_MIRRORED, PARAMETER_SERVER, RANKING_METRICS,
                                    STRATEGIES, CheckpointSchedule, PipelineHparams, WarmStart)
from mxrec_pipeline.keras import callbacks as callbacks_lib
from mxrec_pipeline.keras import checkpoints as checkpoints_lib
# Re-exported: tfr users find the dataset builders in the pipeline module.
from mxrec_pipeline.keras.datasets import (BaseDatasetBuilder, DatasetHparams, SimpleDatasetBuilder,
                                           lists_with_relevant)
# Re-exported: epoch_seed and epoch_steps were defined here.
from mxrec_pipeline.keras.epochs import EpochGate, epoch_groups, epoch_seed, epoch_steps
from mxrec_pipeline.keras import exporting
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import placed_models
from mxrec_pipeline.keras import ps
from mxrec_pipeline.keras import restoring
from mxrec_pipeline.keras import table_checkpoints
# Re-exported: get_strategy was defined here.
from mxrec_pipeline.keras.strategies import (TablePlacement, get_strategy, placement_for,
                                             splits_batches)
from mxrec_pipeline.optimizers import factory
from mxrec_pipeline.util import faults as faults_lib
from mxrec_pipeline.util import initialize

# The module's API: tfr.keras.pipeline's names, plus what the sparse core adds.
__all__ = [
    "AbstractPipeline", "AbstractDatasetBuilder", "DatasetHparams", "BaseDatasetBuilder",
    "SimpleDatasetBuilder", "ModelFitPipeline", "SimplePipeline", "PipelineHparams", "WarmStart",
    "RANKING_METRICS", "STRATEGIES", "MULTI_WORKER_MIRRORED", "PARAMETER_SERVER", "get_strategy",
    "TablePlacement", "placement_for", "lists_with_relevant", "epoch_seed", "epoch_steps",
    "metric_name", "build_ranking_metrics"
]

AbstractPipeline = tfr.keras.pipeline.AbstractPipeline
AbstractDatasetBuilder = tfr.keras.pipeline.AbstractDatasetBuilder


def metric_name(key: str) -> str:
  """Keras name of a RANKING_METRICS key: "ndcg@10" -> "ndcg_10"."""
  return key.replace("@", "_")


def build_ranking_metrics() -> list[tf.keras.metrics.Metric]:
  """tfr metric objects for RANKING_METRICS, named by `metric_name`."""
  return [
      tfr.keras.metrics.get(key, topn=topn, name=metric_name(name))
      for name, (key, topn) in RANKING_METRICS.items()
  ]


class ModelFitPipeline(exporting.PipelineExport, AbstractPipeline):
  """Trains a ranking model with model.fit on the sparse core.

  Subclasses implement build_loss, build_metrics and build_weighted_metrics, as
  in tfr.keras.pipeline.ModelFitPipeline; `SimplePipeline` is the ready one.

  Args:
    model_builder: An mxrec_pipeline ModelBuilder (or any tfr
      AbstractModelBuilder whose model is a SparseRankingModel).
    dataset_builder: A BaseDatasetBuilder.
    hparams: PipelineHparams.
    strategy: The tf.distribute strategy to train under; None (default):
      `get_strategy(hparams.strategy)`. With N > 1 replicas of one host
      (MirroredStrategy), each global batch is inserted once and split into N
      per-replica batches (core/asc/replicas.py); see docs/distributed.md.
      Under MultiWorkerMirroredStrategy with N > 1 workers the tables are
      sharded by key over the workers (keras/sharded.py); under
      ParameterServerStrategy over the ps tasks (keras/ps.py).
    shard_checkpoint_dir: Where every worker saves its table shards with
      each checkpoint when tables are sharded over workers: a directory all
      workers write (jobs.train gives the chief's `model_dir/checkpoints`,
      as non-chief workers train in a temporary model_dir); None:
      `model_dir/checkpoints`.
    run_config: The job config (JSON-able dict) recorded in every checkpoint
      manifest and export (`run_info`); None records the hparams.

  Raises:
    ValueError: builders of the wrong type.
  """

  def __init__(self, model_builder: model_lib.AbstractModelBuilder,
               dataset_builder: BaseDatasetBuilder, hparams: PipelineHparams,
               strategy: tf.distribute.Strategy | None = None,
               shard_checkpoint_dir: str | None = None, run_config: dict | None = None):
    if not isinstance(model_builder, model_lib.AbstractModelBuilder):
      raise ValueError(f"`model_builder` must be an AbstractModelBuilder, got "
                       f"{type(model_builder).__name__}")
    if not isinstance(dataset_builder, AbstractDatasetBuilder):
      raise ValueError(f"`dataset_builder` must be an AbstractDatasetBuilder, got "
                       f"{type(dataset_builder).__name__}")
    self._model_builder = model_builder
    self._dataset_builder = dataset_builder
    self._hparams = hparams
    self.model = None
    self._strategy = strategy
    self._shard_checkpoint_dir = shard_checkpoint_dir
    self._exports = 0  # Exports so far: each stages its shards in its own directory.
    self._export_source = None  # The shards' directory of restore_for_export's checkpoint.
    self._export_scratch = None  # Its delta chain merged, removed after the export.
    self._run_config = run_config
    self._faults = faults_lib.FaultPoints()  # train_and_validate reads MXREC_FAULT.
    self.checkpoint = None
    self.history = None
    self._strategy_in_use = None
    self._placement = TablePlacement.ONE_HOST  # Decided by train_and_validate (placement_for).
    # The builder the batches come from: `dataset_builder`, or its raw-id copy
    # when the tables are sharded (the model then looks them up by raw ids).
    self._data = dataset_builder
    # Table name -> ShardedTable (sharded over workers) or PSShardedTable (over ps tasks).
    self._sharded_tables = None

  @property
  def model_builder(self) -> model_lib.AbstractModelBuilder:
    """The model builder this pipeline trains."""
    return self._model_builder

  @property
  def dataset_builder(self) -> BaseDatasetBuilder:
    """The dataset builder of its training and validation data."""
    return self._dataset_builder

  @property
  def hparams(self) -> PipelineHparams:
    """Its PipelineHparams."""
    return self._hparams

  def build_compiled_model(self) -> tf.keras.Model:
    """A new model from the model builder, compiled with the losses, metrics and optimizers.

    Build it in a strategy's scope to train under that strategy; or restore
    a checkpoint into it to export (as `mxrec_pipeline.jobs.export` does).
    """
    model = self._model_builder.build()
    self._compile(model, self._sparse_optimizer())
    return model

  def build_callbacks(self, model) -> list[tf.keras.callbacks.Callback]:
    """TensorBoard logs (table statistics too), checkpoints (tables included), best export.

    Call after `train_and_validate` has set up the run's checkpoint (it calls
    this); the checkpoint callback saves `self.checkpoint` each epoch.
    """
    hparams = self._hparams
    callbacks = [
        callbacks_lib.FaultCallback(self._faults),
        tf.keras.callbacks.TensorBoard(os.path.join(hparams.model_dir, "logs")),
    ]
    # The best-model export comes before the checkpoint, which then holds its BestMetric.
    if hparams.export_best_model:
      monitor = ("val_loss" if hparams.best_exporter_metric == "loss" else "val_" +
                 metric_name(hparams.best_exporter_metric))
      callbacks.append(
          callbacks_lib.BestModelExporter(
              lambda m, path: self.export_saved_model(m, path),
              os.path.join(hparams.model_dir, "export", "best_model_by_metric"), monitor,
              higher_is_better=hparams.best_exporter_metric_higher_better,
              best=self.checkpoint.best if self.checkpoint is not None else None))
    if self.checkpoint is not None:
      callbacks.append(callbacks_lib.SparseCheckpoint(self.checkpoint))
    sharded_tables = self._sharded_tables if self._placement.sharded else None
    callbacks.append(
        callbacks_lib.TableStatsLogger(os.path.join(hparams.model_dir, "logs"),
                                       tables=sharded_tables, strategy=self._strategy_in_use))
    return callbacks

  def _sparse_optimizer(self):
    hparams = self._hparams
    return factory.get_optimizer(hparams.sparse_optimizer, hparams.sparse_learning_rate or
                                 hparams.learning_rate)

  def _compile(self, model, sparse_optimizer):
    hparams = self._hparams
    model.compile(
        optimizer=tf.keras.optimizers.get({
            "class_name": hparams.optimizer, "config": {"learning_rate": hparams.learning_rate}
        }), sparse_optimizer=sparse_optimizer, loss=self.build_loss(), metrics=self.build_metrics(),
        weighted_metrics=self.build_weighted_metrics(),
        steps_per_execution=hparams.steps_per_execution)

  @property
  def placement(self) -> TablePlacement:
    """Where the run's tables live (decided by `prepare_run`)."""
    return self._placement

  @property
  def faults(self) -> faults_lib.FaultPoints:
    """The run's fault points (`MXREC_FAULT`, read by `prepare_run`)."""
    return self._faults

  def prepare_run(self) -> tf.keras.Model:
    """Sets a run up: returns its compiled model, with `self.checkpoint` ready to restore.

    Seeds the run (`hparams.seed`), calls init() when the process has no run
    yet, creates the strategy, places the tables (`placement_for`), builds
    and compiles the model there and the run's TrainingCheckpoint over
    `model_dir/checkpoints`; restores nothing. `train_and_validate` starts
    with it; so does a driver of its own (keras/continuous.py).
    """
    hparams = self._hparams
    self._faults = faults_lib.FaultPoints.from_environment()
    if hparams.seed is not None:
      tf.keras.utils.set_random_seed(hparams.seed)
    if not initialize.is_initialized():
      initialize.init()
    strategy = self._strategy or get_strategy(hparams.strategy, hparams.collective_timeout_s)
    self._strategy_in_use = strategy
    self._placement = placement_for(strategy, self._has_sparse_features())
    model = self._use(
        placed_models.build(self._placement, strategy, self._model_builder, self._dataset_builder,
                            hparams, self._compile, self._sparse_optimizer))
    # Every placement saves its tables by key in `shards-N`, which restores onto any
    # placement (tiered one-host tables are in `ckpt-N` too: the device cache's mapping).
    tables = (self._sharded_tables
              if self._placement.sharded else initialize.get_config_initializer().tables)
    shards = None
    if tables:
      shards = table_checkpoints.TableCheckpoints(strategy, self._shard_dir(), tables,
                                                  [model.sparse_optimizer])
    full_every = CheckpointSchedule.from_dict(hparams.checkpoint).full_every_epochs
    self.checkpoint = checkpoints_lib.TrainingCheckpoint(
        model, os.path.join(hparams.model_dir,
                            "checkpoints"), shards=shards, run_info=self.run_info(),
        faults=self._faults, sharded=self._placement.sharded, full_every=full_every)
    return model

  def distribute(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """A dataset of global batches as the run's replicas take them (after `prepare_run`)."""
    return self._distribute(self._strategy_in_use, dataset)

  def splits_batches(self) -> bool:
    """Whether `distribute` splits each global batch per replica (Keras then needs steps)."""
    return splits_batches(self._strategy_in_use, self._placement, self._has_sparse_features())

  def train_and_validate(
      self, verbose: int = 0,
      callbacks: Sequence[tf.keras.callbacks.Callback] = ()) -> dict[str, float]:
    """Trains (or resumes), validates each epoch, exports; returns the final metrics.

    Calls init() when the process has no run yet (mxRec semantics: the run,
    and its tables, stay until terminate_config_initializer()). When
    `model_dir/checkpoints` holds a checkpoint and `hparams.resume` is true,
    restores it (model, both optimizers, key indexes with their counters,
    tiers, the epoch) and trains the remaining epochs, printing where it
    resumed; see docs/restarts.md.

    Consecutive epochs with the same steps are one model.fit on one iterator
    (`build_train_epochs`: one dataset built and started for all of them);
    an `EpochGate` holds each epoch's insertion until Keras begins that
    epoch, so by an epoch's checkpoint every batch whose keys were inserted
    has been trained: checkpoints and the export hold only keys that were
    trained, and a resumed run continues exactly where the checkpoint left
    off. Callbacks see one run (`RunCallbacks`).

    Under a strategy of N > 1 replicas (one host), each global batch is
    inserted once and split into N per-replica batches with their own unique
    rows (core/asc/replicas.py); training, validation and evaluation then
    equal one replica's on the same global batches (docs/distributed.md),
    except for per-replica layers (batch normalization, dropout) and
    partial final batches. Under MultiWorkerMirroredStrategy with N > 1
    workers the tables are sharded by key over the workers
    (keras/sharded.py): the dataset keeps raw ids, each worker saves its
    shards with every checkpoint, the export gathers them. Under
    ParameterServerStrategy (this process the coordinator) the tables are
    sharded over the ps tasks (keras/ps.py): each epoch's steps run on the
    workers, each worker reading its part of the epoch's batches
    (ps.per_worker_dataset), asynchronously; validation runs on the
    coordinator (ps.CoordinatorValidation), which also saves the shards with
    every checkpoint and gathers them for the export.

    Args:
      verbose: Keras fit verbosity (0, 1, 2).
      callbacks: Extra Keras callbacks, run after those of `build_callbacks`
        (e.g. a sweep's per-epoch reporter; an exception it raises ends
        training).

    Returns:
      Validation metrics over the whole validation data, keyed as
      RANKING_METRICS ("ndcg@1", ..., "mrr") plus "loss".

    Raises:
      FileExistsError: `hparams.resume` is false and model_dir holds a
        checkpoint.
      checkpoints.CheckpointError (a ValueError): checkpoints exist but none is
        complete, or the newest was written with other tables or another
        placement, or holds another model (docs/restarts.md).
      ValueError: a bad `warm_start` (keras/warm_start.py).
      util.storage.StorageFullError: a checkpoint or export filled its disk;
        the previous one is intact.
    """
    hparams = self._hparams
    model = self.prepare_run()
    strategy = self._strategy_in_use
    on_ps = self._placement is TablePlacement.PARAMETER_SERVERS
    plan = epoch_steps(hparams.num_epochs, hparams.num_train_steps)
    if hparams.warm_start is not None and not self.checkpoint.exists():
      restoring.warm_start(hparams, self._placement.sharded, model)
    start_epoch = restoring.resume(self.checkpoint, hparams, model, len(plan))
    if on_ps:
      return self._train_on_ps(model, plan, start_epoch, callbacks, verbose)
    # One iterator per run of epochs with the same steps (Keras keeps a
    # dataset's iterator across the epochs of a fit when told its steps), the
    # gate releasing each epoch's insertion at its on_epoch_begin.
    streams = isinstance(self._data, BaseDatasetBuilder)
    gate = EpochGate(len(plan)) if streams else None
    run_callbacks = callbacks_lib.RunCallbacks(
        ([gate] if gate else []) + self.build_callbacks(model) + list(callbacks), model, verbose,
        epochs=len(plan))
    valid = self._distribute(
        strategy, self._data.build_valid_dataset(num_epochs=None if hparams.num_valid_steps else 1))
    split = splits_batches(strategy, self._placement, self._has_sparse_features())
    # Keras needs the steps of a distributed dataset.
    valid_steps = hparams.num_valid_steps or (self._data.count_batches(False) if split else None)
    # ... and of a dataset whose iterator it keeps over several epochs.
    one_pass = (self._data.count_batches(True) if
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
    self.export_saved_model(model, os.path.join(hparams.model_dir, "export", "latest_model"))
    results = model.evaluate(
        self._distribute(strategy, self._data.build_valid_dataset(num_epochs=1)),
        steps=valid_steps if split and not hparams.num_valid_steps else None, return_dict=True,
        verbose=0)
    return ranking_results(results)

  def _train_on_ps(self, model, plan: list[int | None], start_epoch: int,
                   callbacks: Sequence[tf.keras.callbacks.Callback],
                   verbose: int) -> dict[str, float]:
    """train_and_validate's epochs under ParameterServerStrategy (this process the coordinator).

    Each epoch is one model.fit over `ps.per_worker_dataset` of the epoch's
    batches, steps_per_epoch of them (the plan's, or one pass), with
    validation on the coordinator (`ps.CoordinatorValidation`, first among
    the callbacks so the others see its `val_*` logs).
    """
    hparams = self._hparams
    validation = ps.CoordinatorValidation(self._evaluate_on_coordinator)
    run_callbacks = callbacks_lib.RunCallbacks([validation, *self.build_callbacks(model)] +
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
    steps = self._hparams.num_valid_steps
    dataset = self._data.build_valid_dataset(num_epochs=None if steps else 1)
    if steps:
      dataset = dataset.take(steps)
    return ps.evaluate_on_coordinator(self.model, dataset, self.build_metrics())

  def _has_sparse_features(self) -> bool:
    """Whether the dataset builder has sparse id features (tables to place)."""
    return bool(getattr(self._dataset_builder, "sparse_features", None))

  def _use(self, placed: placed_models.PlacedModel) -> tf.keras.Model:
    """Takes `placed`'s model, the builder its batches come from and its sharded tables."""
    self.model, self._data, self._sharded_tables = placed.model, placed.data, placed.tables
    return placed.model

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


def ranking_results(results: dict) -> dict[str, float]:
  """RANKING_METRICS keys ("ndcg@10", ...) and "loss" from Keras-named results ("ndcg_10")."""
  return {key: float(results[metric_name(key)]) for key in RANKING_METRICS
         } | {"loss": float(results["loss"])}


class SimplePipeline(ModelFitPipeline):
  """Single-task pipeline: a tfr loss and NDCG@1/5/10 and MRR (tfr's SimplePipeline)."""

  def build_loss(self) -> tf.keras.losses.Loss:
    return tfr.keras.losses.get(self._hparams.loss, reduction=self._hparams.loss_reduction)

  def build_metrics(self) -> list[tf.keras.metrics.Metric]:
    return build_ranking_metrics()

  def build_weighted_metrics(self):
    return None
