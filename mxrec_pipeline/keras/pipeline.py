"""Pipelines, mirroring tfr.keras.pipeline: `SimplePipeline.train_and_validate`.

tfr's `AbstractPipeline`, `AbstractDatasetBuilder` and `DatasetHparams` are
reused as they are. On top of tfr's ModelFitPipeline the sparse core adds the
run's init(), the table optimizer, checkpoints holding tables and key indexes,
and a SavedModel export that maps raw ids with stock TF lookup tables. The
dataset builders (keras/datasets.py) and the strategy and table placement
(keras/strategies.py) live in their own modules and are re-exported here.
ModelFitPipeline sets a run up (`prepare_run`: init, strategy, placement,
model, checkpoint) and chooses its epoch loop; the loops themselves are
keras/training.py (`EpochLoops`) and the export half (restore for export, the
SavedModel, run_info) is keras/exporting.py (`PipelineExport`).

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

# Re-exported: users import PipelineHparams and RANKING_METRICS from here.
from mxrec_pipeline.hparams import (KEEP_BEST, MULTI_WORKER_MIRRORED, PARAMETER_SERVER,
                                    RANKING_METRICS, STRATEGIES, CheckpointSchedule, EarlyStopping,
                                    PipelineHparams, WarmStart)
from mxrec_pipeline.keras import callbacks as callbacks_lib
from mxrec_pipeline.keras import checkpoints as checkpoints_lib
# Re-exported: tfr users find the dataset builders in the pipeline module.
from mxrec_pipeline.keras.datasets import (BaseDatasetBuilder, DatasetHparams, SimpleDatasetBuilder,
                                           lists_with_relevant)
# Re-exported: epoch_seed and epoch_steps were defined here.
from mxrec_pipeline.keras.epochs import epoch_seed, epoch_steps
from mxrec_pipeline.keras import exporting
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import placed_models
from mxrec_pipeline.keras import restoring
from mxrec_pipeline.keras import save_schedule
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.keras import training
# Re-exported: the metric names and results were defined here.
from mxrec_pipeline.keras.training import build_ranking_metrics, metric_name, ranking_results
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
    "metric_name", "build_ranking_metrics", "ranking_results"
]

AbstractPipeline = tfr.keras.pipeline.AbstractPipeline
AbstractDatasetBuilder = tfr.keras.pipeline.AbstractDatasetBuilder


class ModelFitPipeline(training.EpochLoops, exporting.PipelineExport, AbstractPipeline):
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
    self._export_snapshots = None  # Its tables' serving snapshots, read once.
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
    # With a sidecar evaluator, that task exports the best model (mxrec_pipeline/sidecar.py).
    best = self.checkpoint.best if self.checkpoint is not None else None
    exports_best = ((hparams.export_best_model or self._keeps_best) and
                    not hparams.sidecar_evaluator)
    if exports_best:
      callbacks.append(
          callbacks_lib.BestModelExporter(
              lambda m, path: self.export_saved_model(m, path),
              os.path.join(hparams.model_dir, "export", "best_model_by_metric"), self._monitor,
              higher_is_better=hparams.best_exporter_metric_higher_better, best=best))
    stopper = self.early_stopper(best)
    if stopper is not None:
      stopper.track = not exports_best
      callbacks.append(stopper)
    if self.checkpoint is not None:
      callbacks.append(callbacks_lib.SparseCheckpoint(self.checkpoint))
    sharded_tables = self._sharded_tables if self._placement.sharded else None
    callbacks.append(
        callbacks_lib.TableStatsLogger(os.path.join(hparams.model_dir, "logs"),
                                       tables=sharded_tables, strategy=self._strategy_in_use))
    return callbacks

  @property
  def _monitor(self) -> str:
    """The Keras log key of `best_exporter_metric` at validation ("val_ndcg_10")."""
    metric = self._hparams.best_exporter_metric
    return "val_loss" if metric == "loss" else "val_" + metric_name(metric)

  @property
  def _keeps_best(self) -> bool:
    """Whether the run serves its best validation epoch (early_stopping then: keep_best)."""
    rule = EarlyStopping.from_dict(self._hparams.early_stopping)
    return rule is not None and rule.then == KEEP_BEST

  def early_stopper(self, best) -> callbacks_lib.EarlyStopper | None:
    """The run's EarlyStopper over BestMetric `best` (None: no `early_stopping`)."""
    rule = EarlyStopping.from_dict(self._hparams.early_stopping)
    if rule is None:
      return None
    return callbacks_lib.EarlyStopper(self._monitor,
                                      self._hparams.best_exporter_metric_higher_better,
                                      rule.patience,
                                      best if best is not None else checkpoints_lib.BestMetric(),
                                      track=True)

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
    # Seconds of the schedule read on one clock: the workers' mean, or the PS coordinator's own.
    clock = save_schedule.agreed_clock(None if self._placement is
                                       TablePlacement.PARAMETER_SERVERS else strategy)
    self.checkpoint = checkpoints_lib.TrainingCheckpoint(
        model, os.path.join(hparams.model_dir, "checkpoints"), shards=shards,
        run_info=self.run_info(), faults=self._faults, sharded=self._placement.sharded,
        schedule=save_schedule.SaveSchedule(CheckpointSchedule.from_dict(hparams.checkpoint),
                                            clock))
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
    plan = epoch_steps(hparams.num_epochs, hparams.num_train_steps)
    if hparams.warm_start is not None and not self.checkpoint.exists():
      restoring.warm_start(hparams, self._placement.sharded, model)
    start_epoch = restoring.resume(self.checkpoint, hparams, model, len(plan))
    stopper = self.early_stopper(self.checkpoint.best)
    if stopper is not None and start_epoch < len(plan) and stopper.stopped(start_epoch):
      print(
          f"Early stopping had ended this run after epoch {start_epoch} (the best, epoch "
          f"{int(self.checkpoint.best.epoch.numpy())}, was {stopper.patience} or more epochs "
          "before): nothing left to train", flush=True)
      start_epoch = len(plan)
    if self._placement is TablePlacement.PARAMETER_SERVERS:
      return self._fit_epochs_on_ps(model, plan, start_epoch, callbacks, verbose)
    return self._fit_epochs(model, plan, start_epoch, callbacks, verbose)

  def _use(self, placed: placed_models.PlacedModel) -> tf.keras.Model:
    """Takes `placed`'s model, the builder its batches come from and its sharded tables."""
    self.model, self._data, self._sharded_tables = placed.model, placed.data, placed.tables
    return placed.model


class SimplePipeline(ModelFitPipeline):
  """Single-task pipeline: a tfr loss and NDCG@1/5/10 and MRR (tfr's SimplePipeline)."""

  def build_loss(self) -> tf.keras.losses.Loss:
    return tfr.keras.losses.get(self._hparams.loss, reduction=self._hparams.loss_reduction)

  def build_metrics(self) -> list[tf.keras.metrics.Metric]:
    return build_ranking_metrics()

  def build_weighted_metrics(self):
    return None
