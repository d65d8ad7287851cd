"""Pipelines and dataset builders, mirroring tfr.keras.pipeline.

tfr's `AbstractPipeline`, `AbstractDatasetBuilder` and `DatasetHparams` are
reused as they are. The sparse core adds, on top of tfr's dataset builders,
insertion of the sparse id features (get_asc_insert_func) followed by prefetch,
and, on top of tfr's ModelFitPipeline, the run's init(), the table optimizer,
checkpoints holding tables and key indexes, and a SavedModel export that maps
raw ids with stock TF lookup tables.

Example:

  ```python
  pipeline = SimplePipeline(model_builder, dataset_builder, PipelineHparams(
      model_dir="/tmp/model", num_epochs=2, num_train_steps=200, loss="softmax_loss",
      learning_rate=0.01))
  metrics = pipeline.train_and_validate(verbose=2)   # {"ndcg@10": ..., ...}
  ```
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import helper
# Re-exported: users import PipelineHparams and RANKING_METRICS from here.
from mxrec_pipeline.hparams import (  # pylint: disable=unused-import
    RANKING_METRICS, STRATEGIES, PipelineHparams)
from mxrec_pipeline.keras import callbacks as callbacks_lib
from mxrec_pipeline.keras import export as export_lib
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras.layers import SparseFeature
from mxrec_pipeline.optimizers import factory
from mxrec_pipeline.util import initialize

AbstractPipeline = tfr.keras.pipeline.AbstractPipeline
AbstractDatasetBuilder = tfr.keras.pipeline.AbstractDatasetBuilder
DatasetHparams = tfr.keras.pipeline.DatasetHparams

def metric_name(key: str) -> str:
  """Keras name of a RANKING_METRICS key: "ndcg@10" -> "ndcg_10"."""
  return key.replace("@", "_")


def build_ranking_metrics() -> list[tf.keras.metrics.Metric]:
  """tfr metric objects for RANKING_METRICS, named by `metric_name`."""
  return [tfr.keras.metrics.get(key, topn=topn, name=metric_name(name))
          for name, (key, topn) in RANKING_METRICS.items()]


class BaseDatasetBuilder(tfr.keras.pipeline.BaseDatasetBuilder):
  """tfr's BaseDatasetBuilder plus insertion of the sparse id features.

  Batches come from tfr's ELWC parsing (`tfr.data.build_ranking_dataset`),
  then `_features_and_labels`, then get_asc_insert_func for `sparse_features`
  (training: new ids get rows; validation: they read the default embedding),
  then prefetch, so insertion overlaps the training step.

  Subclasses implement `_features_and_labels`, as in tfr. See
  `tfr.keras.pipeline.BaseDatasetBuilder` for the other arguments.

  Args:
    sparse_features: The SparseFeatures to insert (name and table).
  """

  def __init__(self, context_feature_spec, example_feature_spec, training_only_example_spec,
               mask_feature_name, hparams: DatasetHparams,
               sparse_features: Sequence[SparseFeature] = (),
               training_only_context_spec=None):
    super().__init__(context_feature_spec, example_feature_spec, training_only_example_spec,
                     mask_feature_name, hparams, training_only_context_spec)
    self.sparse_features = list(sparse_features)
    known = {**context_feature_spec, **example_feature_spec}
    for feature in self.sparse_features:
      if feature.name not in known:
        raise ValueError(f"sparse feature '{feature.name}' is not in the context or example "
                         f"feature spec {sorted(known)}")

  def _insert(self, dataset: tf.data.Dataset, is_training: bool) -> tf.data.Dataset:
    if self.sparse_features:
      specs = [fs.FeatureSpec(f.name, table_name=f.table) for f in self.sparse_features]
      dataset = dataset.map(helper.get_asc_insert_func(specs, is_training=is_training))
      raw_ids = {f.name for f in self.sparse_features}
      # The model reads the insertion results, not the raw ids.
      dataset = dataset.map(lambda features, *rest: (
          {k: v for k, v in features.items() if k not in raw_ids}, *rest))
    return dataset.prefetch(tf.data.AUTOTUNE)

  def build_train_dataset(self, num_epochs: int | None = None) -> tf.data.Dataset:
    """See `AbstractDatasetBuilder`. Shuffled; new ids get rows.

    Args:
      num_epochs: Passes over the training data; None repeats forever.
    """
    dataset = self._build_dataset(
        file_pattern=self._hparams.train_input_pattern,
        batch_size=self._hparams.train_batch_size,
        list_size=self._hparams.list_size, num_epochs=num_epochs)
    return self._insert(dataset, is_training=True)

  def build_valid_dataset(self, num_epochs: int | None = None) -> tf.data.Dataset:
    """See `AbstractDatasetBuilder`. Unseen ids take no rows.

    Args:
      num_epochs: Passes over the validation data; None repeats forever.
    """
    dataset = self._build_dataset(
        file_pattern=self._hparams.valid_input_pattern,
        batch_size=self._hparams.valid_batch_size,
        list_size=self._hparams.valid_list_size or self._hparams.list_size,
        randomize_input=False, num_epochs=num_epochs)
    return self._insert(dataset, is_training=False)

  def build_raw_valid_dataset(self) -> tf.data.Dataset:
    """One pass over the validation batches without insertion: raw ids kept.

    For scorers that read raw features (baselines); same batches and order as
    `build_valid_dataset(num_epochs=1)`.
    """
    return self._build_dataset(
        file_pattern=self._hparams.valid_input_pattern,
        batch_size=self._hparams.valid_batch_size,
        list_size=self._hparams.valid_list_size or self._hparams.list_size,
        randomize_input=False, num_epochs=1)

  def build_signatures(self, model):
    """Not used: ModelFitPipeline exports with `export.export_serving_model`."""
    raise NotImplementedError("signatures are built by mxrec_pipeline.keras.export")


class SimpleDatasetBuilder(BaseDatasetBuilder):
  """tfr's SimpleDatasetBuilder (one label) with sparse id features.

  Args:
    context_feature_spec, example_feature_spec, mask_feature_name, label_spec,
    hparams, sample_weight_spec: As in tfr.keras.pipeline.SimpleDatasetBuilder.
    sparse_features: The SparseFeatures to insert.
  """

  def __init__(self, context_feature_spec, example_feature_spec, mask_feature_name: str,
               label_spec, hparams: DatasetHparams,
               sparse_features: Sequence[SparseFeature] = (), sample_weight_spec=None):
    super().__init__(
        context_feature_spec, example_feature_spec,
        dict([label_spec] + ([sample_weight_spec] if sample_weight_spec else [])),
        mask_feature_name, hparams, sparse_features)
    self._label_spec = label_spec
    self._sample_weight_spec = sample_weight_spec

  # tfr's SimpleDatasetBuilder._features_and_labels, reused unchanged.
  _features_and_labels = tfr.keras.pipeline.SimpleDatasetBuilder._features_and_labels


def get_strategy(name: str | None) -> tf.distribute.Strategy:
  """None -> the default strategy; "MirroredStrategy" -> every local GPU or the CPU."""
  if name is None:
    return tf.distribute.get_strategy()
  return tf.distribute.MirroredStrategy()


class ModelFitPipeline(AbstractPipeline):
  """Trains a ranking model with model.fit on the sparse core.

  Subclasses implement build_loss, build_metrics and build_weighted_metrics, as
  in tfr.keras.pipeline.ModelFitPipeline; `SimplePipeline` is the ready one.

  Args:
    model_builder: An mxrec_pipeline ModelBuilder (or any tfr
      AbstractModelBuilder whose model is a SparseRankingModel).
    dataset_builder: A BaseDatasetBuilder.
    hparams: PipelineHparams.

  Raises:
    ValueError: builders of the wrong type.
  """

  def __init__(self, model_builder: model_lib.AbstractModelBuilder,
               dataset_builder: BaseDatasetBuilder, hparams: PipelineHparams):
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
    self._compile(model)
    return model

  def build_callbacks(self, model) -> list[tf.keras.callbacks.Callback]:
    """TensorBoard logs (table statistics too), checkpoints (tables included), best export."""
    hparams = self._hparams
    callbacks = [
        tf.keras.callbacks.TensorBoard(os.path.join(hparams.model_dir, "logs")),
        callbacks_lib.SparseCheckpoint(os.path.join(hparams.model_dir, "checkpoints")),
        callbacks_lib.TableStatsLogger(os.path.join(hparams.model_dir, "logs")),
    ]
    if hparams.export_best_model:
      monitor = ("val_loss" if hparams.best_exporter_metric == "loss"
                 else "val_" + metric_name(hparams.best_exporter_metric))
      callbacks.append(callbacks_lib.BestModelExporter(
          lambda m, path: self.export_saved_model(m, path),
          os.path.join(hparams.model_dir, "export", "best_model_by_metric"), monitor,
          higher_is_better=hparams.best_exporter_metric_higher_better))
    return callbacks

  def export_saved_model(self, model, export_to: str) -> str:
    """Exports a SavedModel that scores raw ids; see export.export_serving_model."""
    builder = self._dataset_builder
    return export_lib.export_serving_model(
        model, export_to,
        context_feature_spec=builder._context_feature_spec,  # pylint: disable=protected-access
        example_feature_spec=builder._example_feature_spec,  # pylint: disable=protected-access
        mask_feature_name=builder._mask_feature_name,  # pylint: disable=protected-access
        sparse_features=builder.sparse_features)

  def _compile(self, model):
    hparams = self._hparams
    model.compile(
        optimizer=tf.keras.optimizers.get({"class_name": hparams.optimizer,
                                           "config": {"learning_rate": hparams.learning_rate}}),
        sparse_optimizer=factory.get_optimizer(
            hparams.sparse_optimizer, hparams.sparse_learning_rate or hparams.learning_rate),
        loss=self.build_loss(), metrics=self.build_metrics(),
        weighted_metrics=self.build_weighted_metrics(),
        steps_per_execution=hparams.steps_per_execution)

  def train_and_validate(self, verbose: int = 0,
                         callbacks: Sequence[tf.keras.callbacks.Callback] = ()
                         ) -> dict[str, float]:
    """Trains, validates each epoch, exports; returns the final validation metrics.

    Calls init() when the process has no run yet (mxRec semantics: the run,
    and its tables, stay until terminate_config_initializer()). Exports the
    final model to `model_dir/export/latest_model`.

    Args:
      verbose: Keras fit verbosity (0, 1, 2).
      callbacks: Extra Keras callbacks, run after those of `build_callbacks`
        (e.g. a sweep's per-epoch reporter; an exception it raises ends
        training).

    Returns:
      Validation metrics over the whole validation data, keyed as
      RANKING_METRICS ("ndcg@1", ..., "mrr") plus "loss".
    """
    hparams = self._hparams
    if hparams.seed is not None:
      tf.keras.utils.set_random_seed(hparams.seed)
    if not initialize.is_initialized():
      initialize.init()
    strategy = get_strategy(hparams.strategy)
    if strategy.num_replicas_in_sync > 1 and getattr(self._dataset_builder, "sparse_features",
                                                     None):
      # A batch's unique rows are one vector per global batch; splitting the
      # batch across replicas would split it too (per-replica insertion: future work).
      raise ValueError(
          f"{strategy.num_replicas_in_sync} replicas: the pipeline's sparse features need one "
          "replica (one GPU, or the CPU); use strategy=None with a single device, or the "
          "TPUEmbedding-style API (mxrec_pipeline.embedding), which inserts per global batch")
    with strategy.scope():
      model = self._model_builder.build()
      self._compile(model)
    self.model = model
    steps_per_epoch = (None if hparams.num_train_steps is None
                       else math.ceil(hparams.num_train_steps / hparams.num_epochs))
    # Without a step count an epoch is one pass, so the data must not repeat.
    train = self._dataset_builder.build_train_dataset(
        num_epochs=1 if steps_per_epoch is None else None)
    valid = self._dataset_builder.build_valid_dataset(
        num_epochs=None if hparams.num_valid_steps else 1)
    model.fit(train, epochs=hparams.num_epochs, steps_per_epoch=steps_per_epoch,
              validation_data=valid, validation_steps=hparams.num_valid_steps,
              callbacks=self.build_callbacks(model) + list(callbacks), verbose=verbose)
    self.export_saved_model(model, os.path.join(hparams.model_dir, "export", "latest_model"))
    results = model.evaluate(self._dataset_builder.build_valid_dataset(num_epochs=1),
                             return_dict=True, verbose=0)
    return {key: float(results[metric_name(key)]) for key in RANKING_METRICS} | {
        "loss": float(results["loss"])}


class SimplePipeline(ModelFitPipeline):
  """Single-task pipeline: a tfr loss and NDCG@1/5/10 and MRR (tfr's SimplePipeline)."""

  def build_loss(self) -> tf.keras.losses.Loss:
    return tfr.keras.losses.get(self._hparams.loss, reduction=self._hparams.loss_reduction)

  def build_metrics(self) -> list[tf.keras.metrics.Metric]:
    return build_ranking_metrics()

  def build_weighted_metrics(self):
    return None
