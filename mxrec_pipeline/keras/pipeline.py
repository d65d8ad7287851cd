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

import contextlib
import dataclasses
import json
import os
import re
from typing import Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import helper
from mxrec_pipeline.core.asc import replicas
# Re-exported: users import PipelineHparams and RANKING_METRICS from here.
from mxrec_pipeline.hparams import (  # pylint: disable=unused-import
    MULTI_WORKER_MIRRORED, PARAMETER_SERVER, RANKING_METRICS, STRATEGIES, PipelineHparams,
    WarmStart)
from mxrec_pipeline.keras import callbacks as callbacks_lib
# Re-exported: epoch_seed and epoch_steps were defined here.
from mxrec_pipeline.keras.epochs import (  # pylint: disable=unused-import
    EpochGate, epoch_groups, epoch_seed, epoch_steps)
from mxrec_pipeline.keras import export as export_lib
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import ps
from mxrec_pipeline.keras import sharded
from mxrec_pipeline.keras import warm_start as warm_start_lib
from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.keras.layers import SparseFeature, TableSpec
from mxrec_pipeline.optimizers import factory
from mxrec_pipeline.util import faults as faults_lib
from mxrec_pipeline.util import initialize

AbstractPipeline = tfr.keras.pipeline.AbstractPipeline
AbstractDatasetBuilder = tfr.keras.pipeline.AbstractDatasetBuilder
DatasetHparams = tfr.keras.pipeline.DatasetHparams
# TableSpec fields that shape a table's saved state; a checkpoint restores only onto the same.
_SAVED_TABLE_FIELDS = ("dim", "key_dtype", "device_vocabulary_size", "host_vocabulary_size",
                       "ssd_vocabulary_size")


def metric_name(key: str) -> str:
  """Keras name of a RANKING_METRICS key: "ndcg@10" -> "ndcg_10"."""
  return key.replace("@", "_")


def build_ranking_metrics() -> list[tf.keras.metrics.Metric]:
  """tfr metric objects for RANKING_METRICS, named by `metric_name`."""
  return [
      tfr.keras.metrics.get(key, topn=topn, name=metric_name(name))
      for name, (key, topn) in RANKING_METRICS.items()
  ]


@contextlib.contextmanager
def _generator_rng(enabled: bool):
  """Keras layers built inside draw from tf.random.Generator (when `enabled`).

  A dropout layer's generator state is then a variable, which the training
  checkpoint saves (callbacks.random_generators), so a resumed run draws the
  masks an uninterrupted one would. Keras' process-wide choice is restored on
  exit; layers keep the kind of generator they were built with.
  """
  before = tf.keras.backend.experimental.is_tf_random_generator_enabled()
  if enabled:
    tf.keras.backend.experimental.enable_tf_random_generator()
  try:
    yield
  finally:
    if not before:
      tf.keras.backend.experimental.disable_tf_random_generator()


def lists_with_relevant(features: dict, labels: tf.Tensor, *weights: tf.Tensor):
  """(features, labels[, weights]) of the lists of a batch with a relevant document (label > 0).

  Args:
    features: name -> [batch_size, ...] tensors (dense, batch first).
    labels: [batch_size, list_size] float32, padding < 0.
    *weights: [batch_size, ...] sample weights, if the dataset has them.

  Returns:
    The same structure with the batch cut to its k lists that have a label
    > 0, in order: [k, ...] tensors (k may be 0).
  """
  keep = tf.reduce_any(labels > 0, axis=1)
  return ({name: tf.boolean_mask(value, keep) for name, value in features.items()},
          *(tf.boolean_mask(t, keep) for t in (labels, *weights)))


def _data_sharded(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with tf.data's DATA auto-sharding: each worker keeps its part of every batch."""
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
  return dataset.with_options(options)


def _allow_tensor_op_seeds() -> None:
  """Lets the graph being built take tensor op seeds under a global seed of 0.

  TF 2.15's `random_seed.get_seed` compares (graph seed, op seed) with (0, 0)
  in Python, so an op seed that is a graph tensor (a stream's per-epoch
  shuffle seed) raises OperatorNotAllowedInGraphError when the graph-level
  seed truncates to 0 (`tf.keras.utils.set_random_seed(0)`, e.g. from
  `hparams.seed=0`). Called inside the stream's own function graph, this
  clears that graph's seed in that case only: its ops then pair their seeds
  with TF's default graph seed, as without a global seed. Other seeds and
  other graphs are untouched.
  """
  graph = tf.compat.v1.get_default_graph()
  if graph.seed is not None and graph.seed % (2**31 - 1) == 0:
    graph.seed = None


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
               sparse_features: Sequence[SparseFeature] = (), training_only_context_spec=None):
    super().__init__(context_feature_spec, example_feature_spec, training_only_example_spec,
                     mask_feature_name, hparams, training_only_context_spec)
    self.sparse_features = list(sparse_features)
    # True when the model looks its tables up by raw ids (tables sharded over
    # workers, keras/sharded.py): no insertion in tf.data. Set by the pipeline.
    self.keep_raw_ids = False
    # True: validation batches keep only their lists with a relevant document
    # (`lists_with_relevant`; MetricsConfig.skip_queries_without_relevant).
    self.skip_lists_without_relevant = False
    known = {**context_feature_spec, **example_feature_spec}
    for feature in self.sparse_features:
      if feature.name not in known:
        raise ValueError(f"sparse feature '{feature.name}' is not in the context or example "
                         f"feature spec {sorted(known)}")

  def _inserts(self) -> bool:
    """Whether the batches get their ids inserted in tf.data (not when the model takes raw ids)."""
    return bool(self.sparse_features) and not self.keep_raw_ids

  def _insert(self, dataset: tf.data.Dataset, is_training: bool,
              gate: EpochGate | None = None) -> tf.data.Dataset:
    """`dataset` with its ids inserted (one sequential map), then prefetched.

    With `gate` (only when inserting), `dataset` holds (epoch, index in the
    epoch, batch) and the map first holds each epoch's first batch until the
    gate releases it (`EpochGate.hold`), in the same function as the
    insertion.
    """
    if self._inserts():
      specs = [fs.FeatureSpec(f.name, table_name=f.table) for f in self.sparse_features]
      insert_ids = helper.get_asc_insert_func(specs, is_training=is_training)
      raw_ids = {f.name for f in self.sparse_features}

      def insert(features, *rest):
        inserted = insert_ids(features, *rest)
        features = inserted[0] if rest else inserted
        # The model reads the insertion results, not the raw ids.
        return ({k: v for k, v in features.items() if k not in raw_ids}, *rest)

      if gate is None:
        dataset = dataset.map(insert)
      else:
        dataset = dataset.map(lambda epoch, index, batch: insert(*gate.hold(epoch, index, batch)))
    # `build_train_epochs` wraps `_build_dataset` in flat_map, whose options
    # do not reach the outer dataset: set DATA sharding again (see there).
    return _data_sharded(dataset.prefetch(tf.data.AUTOTUNE))

  def _build_dataset(self, file_pattern: str, batch_size: int, list_size: int | None = None,
                     randomize_input: bool = True, num_epochs: int | None = None,
                     shuffle_seed: int | None = None) -> tf.data.Dataset:
    """tfr's `_build_dataset`, in a deterministic order.

    tfr reads with sloppy ordering (batches in the order parallel readers
    finish), which makes the key -> row assignment of insertion depend on
    thread timing. Here files, records and batches keep their order; with
    `shuffle_seed` the shuffles of files and lists are seeded too, so the
    batch sequence is a function of the data and the seed.

    Under MultiWorkerMirroredStrategy every worker builds this whole dataset
    and keeps its part of each global batch (tf.data's DATA auto-sharding,
    after the strategy splits every batch into one per replica): N workers
    train on the batches one process would, with the same shuffles when
    seeded. TF's default (AUTO: FILE sharding) would give the workers other
    files, hence other batches, and fails with fewer files than workers.
    """
    dataset = tfr.data.build_ranking_dataset(
        file_pattern=file_pattern, data_format=tfr.data.ELWC, batch_size=batch_size,
        list_size=list_size,
        context_feature_spec={**self._context_feature_spec, **self._training_only_context_spec},
        example_feature_spec={**self._example_feature_spec, **self._training_only_example_spec
                             }, mask_feature_name=self._mask_feature_name,
        reader=self._hparams.dataset_reader, num_epochs=num_epochs, shuffle=randomize_input,
        shuffle_buffer_size=1000, shuffle_seed=shuffle_seed, sloppy_ordering=False,
        drop_final_batch=False, shuffle_examples=False)
    return _data_sharded(dataset.map(self._features_and_labels,
                                     num_parallel_calls=tf.data.AUTOTUNE))

  def build_train_dataset(self, num_epochs: int | None = None) -> tf.data.Dataset:
    """See `AbstractDatasetBuilder`. Shuffled; new ids get rows.

    The pipeline trains on `build_train_epochs` instead, which bounds what
    insertion runs ahead to the epoch being trained.

    Args:
      num_epochs: Passes over the training data; None repeats forever.
    """
    dataset = self._build_dataset(file_pattern=self._hparams.train_input_pattern,
                                  batch_size=self._hparams.train_batch_size,
                                  list_size=self._hparams.list_size, num_epochs=num_epochs)
    return self._insert(dataset, is_training=True)

  def build_train_epoch(self, epoch: int, num_steps: int | None = None,
                        seed: int | None = None) -> tf.data.Dataset:
    """The finite training data of epoch `epoch` (0-based), with insertion.

    `build_train_epochs([epoch], num_steps, seed)`: one pass over the training
    files (or the first `num_steps` batches of a stream of passes), shuffled
    by `epoch_seed(seed, epoch)`; the dataset ends with the epoch, so
    insertion, which runs ahead with prefetch, inserts only keys of batches
    the epoch trains.
    """
    return self.build_train_epochs([epoch], num_steps, seed)

  def build_train_epochs(self, epochs: Sequence[int], num_steps: int | None = None,
                         seed: int | None = None, gate: EpochGate | None = None) -> tf.data.Dataset:
    """The training data of `epochs` (0-based) in order, on one iterator, with insertion.

    Epoch `e` is one pass over the training files without `num_steps`, or
    with it the first `num_steps` batches of an endless stream of passes
    (tfr's repeat-then-shuffle; every batch full). Its shuffles are seeded by
    `epoch_seed(seed, e)`, so with a seed epoch `e` holds the same batches in
    the same order in every run, whichever epochs share its dataset and
    whether or not the run resumed from a checkpoint.

    One dataset for several epochs is built, traced and started once (about a
    second of CPU per epoch on the MovieLens job when each epoch had its own).
    With `gate`, the stream holds each epoch's first batch before its
    insertion until the gate releases that epoch (`EpochGate.on_epoch_begin`),
    so insertion, which runs ahead with prefetch, never inserts keys of an
    epoch before the previous one has been trained, validated and
    checkpointed. Without a gate, give one epoch (or accept that insertion
    runs ahead across epochs).

    Args:
      epochs: Epoch numbers, >= 0, usually consecutive.
      num_steps: Batches per epoch, > 0, or None for one pass.
      seed: The run's seed, or None for unseeded shuffles.
      gate: The run's EpochGate, or None.

    Returns:
      A dataset of (features, labels) batches as `build_train_dataset`'s: the
      batches of `epochs[0]`, then of `epochs[1]`, ...

    Raises:
      ValueError: `epochs` is empty.
    """
    epochs = [int(e) for e in epochs]
    if not epochs:
      raise ValueError("build_train_epochs: no epochs given")
    hparams = self._hparams

    # The epoch's dataset is built inside the stream (flat_map), once per
    # epoch and iterator, so that every iterator reads the same batches:
    # tfr's seeded shuffles reshuffle on each new iterator of one dataset
    # object, and Keras 2.15's DataHandler makes an iterator twice when it
    # recreates them per epoch.
    def epoch_batches(epoch, shuffle_seed):
      _allow_tensor_op_seeds()
      dataset = self._build_dataset(file_pattern=hparams.train_input_pattern,
                                    batch_size=hparams.train_batch_size,
                                    list_size=hparams.list_size,
                                    num_epochs=1 if num_steps is None else None,
                                    shuffle_seed=None if seed is None else shuffle_seed)
      if num_steps is not None:
        dataset = dataset.take(num_steps)
      if gate is not None:  # (epoch, index, batch) for the gate.
        dataset = tf.data.Dataset.zip((tf.data.Dataset.from_tensors(epoch).repeat(),
                                       tf.data.Dataset.range(tf.int64.max), dataset))
      return dataset

    if not self._inserts():
      gate = None  # Nothing to hold: the model inserts (or takes raw ids) itself.
    seeds = [epoch_seed(seed, e) or 0 for e in epochs]
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.constant(epochs, tf.int64), tf.constant(seeds, tf.int64)))
    return self._insert(dataset.flat_map(epoch_batches), is_training=True, gate=gate)

  def build_valid_dataset(self, num_epochs: int | None = None) -> tf.data.Dataset:
    """See `AbstractDatasetBuilder`. Unseen ids take no rows.

    Lists are cut or padded to `valid_list_size`; None pads each batch to
    its longest list (whole lists). With `skip_lists_without_relevant`, each
    batch keeps only its lists with a relevant document.

    Args:
      num_epochs: Passes over the validation data; None repeats forever.
    """
    return self._insert(self._valid_batches(num_epochs, all_lists=False), is_training=False)

  def build_raw_valid_dataset(self, all_lists: bool = False) -> tf.data.Dataset:
    """One pass over the validation batches without insertion: raw ids kept.

    For scorers that read raw features (baselines); same batches and order as
    `build_valid_dataset(num_epochs=1)`.

    Args:
      all_lists: Keep every list, even under `skip_lists_without_relevant`
        (e.g. to count them).
    """
    return self._valid_batches(1, all_lists)

  def _valid_batches(self, num_epochs: int | None, all_lists: bool) -> tf.data.Dataset:
    dataset = self._build_dataset(file_pattern=self._hparams.valid_input_pattern,
                                  batch_size=self._hparams.valid_batch_size,
                                  list_size=self._hparams.valid_list_size, randomize_input=False,
                                  num_epochs=num_epochs)
    if self.skip_lists_without_relevant and not all_lists:
      dataset = _data_sharded(dataset.map(lists_with_relevant))
    return dataset

  def count_batches(self, is_training: bool) -> int:
    """Batches in one pass over the training (or validation) files, > 0.

    ceil(records / batch size), as `_build_dataset` batches records keeping
    the final partial batch. Reads the records without parsing them. Keras
    needs the number of steps of a distributed dataset (N > 1 replicas).

    Raises:
      ValueError: the files hold no record (names the pattern).
    """
    hparams = self._hparams
    pattern = hparams.train_input_pattern if is_training else hparams.valid_input_pattern
    batch_size = hparams.train_batch_size if is_training else hparams.valid_batch_size
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    records = files.flat_map(hparams.dataset_reader)
    count = int(records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    if count == 0:
      raise ValueError(f"no records in '{pattern}'")
    return -(-count // batch_size)

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

  def __init__(self, context_feature_spec, example_feature_spec, mask_feature_name: str, label_spec,
               hparams: DatasetHparams, sparse_features: Sequence[SparseFeature] = (),
               sample_weight_spec=None):
    super().__init__(context_feature_spec, example_feature_spec,
                     dict([label_spec] + ([sample_weight_spec] if sample_weight_spec else [])),
                     mask_feature_name, hparams, sparse_features)
    self._label_spec = label_spec
    self._sample_weight_spec = sample_weight_spec

  # tfr's SimpleDatasetBuilder._features_and_labels, reused unchanged.
  _features_and_labels = tfr.keras.pipeline.SimpleDatasetBuilder._features_and_labels


def get_strategy(name: str | None,
                 collective_timeout_s: float | None = None) -> tf.distribute.Strategy:
  """The strategy of PipelineHparams.strategy (hparams.STRATEGIES).

  None -> the default strategy; "MirroredStrategy" -> every local GPU, else
  every logical CPU (one unless the process split the CPU with
  `tf.config.set_logical_device_configuration` before TensorFlow started, as
  the replica tests do); "MultiWorkerMirroredStrategy" ->
  tf.distribute.MultiWorkerMirroredStrategy over the cluster of the TF_CONFIG
  environment variable (jobs.train checks it first with
  mxrec_pipeline.cluster.tf_config), its collective ops failing after
  `collective_timeout_s` seconds without their peers
  (CommunicationOptions.timeout_seconds; None: no timeout);
  "ParameterServerStrategy" -> tf.distribute.experimental.ParameterServerStrategy
  over the TF_CONFIG cluster (this process is its chief, the coordinator;
  jobs.train first waits until every ps and worker task is reachable).

  Raises:
    ValueError: an unknown name.
  """
  if name is None:
    return tf.distribute.get_strategy()
  if name == "MirroredStrategy":
    devices = (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU"))
    return tf.distribute.MirroredStrategy([d.name for d in devices])
  if name == MULTI_WORKER_MIRRORED:
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout_s)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
  if name == PARAMETER_SERVER:
    return tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
  raise ValueError(f"unknown strategy {name!r}; supported: {list(STRATEGIES)}")


class ModelFitPipeline(AbstractPipeline):
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
    self._run_config = run_config
    self._faults = faults_lib.FaultPoints()  # train_and_validate reads MXREC_FAULT.
    self.checkpoint = None
    self.history = None
    self._strategy_in_use = None
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
    self._compile(model)
    return model

  def restore_for_export(self, checkpoint: str) -> tf.keras.Model:
    """The model of training checkpoint `checkpoint` (a `ckpt-<N>` prefix), in this process.

    For `export_saved_model` (jobs.export), with no cluster. A single-process
    run's checkpoint restores into `build_compiled_model()`. A sharded run's
    (MultiWorkerMirroredStrategy workers or ParameterServerStrategy ps
    tasks: its tables in `shards-<N>` beside `ckpt-<N>`) restores the dense
    model into the raw-id model those runs train (ShardedLookup layers) and
    every table's shards, whatever their number, into one ShardedTable each
    (distributed/checkpoint.restore_shard onto one shard; as many rows as
    the checkpoint's keys, at least the spec's; a tiered table's rows of
    every tier all on that flat shard). `export_saved_model` then
    gathers them as the run's own export does (sharded.gathered_snapshots),
    so it writes the same SavedModel.

    Call after init(). Every table's shards are checked before anything is
    built from them.

    Raises:
      FileNotFoundError: a table's shards are missing or unreadable (e.g. a
        shard file or its data file), naming the table and the file.
      ValueError: shards of jobs of different sizes in one table's
        directory; a model builder that is not a ModelBuilder (sharded runs
        only); table rows of another dim; a variable of another shape than
        the checkpoint's (TF's restore); in a single-process run's
        checkpoint, a variable it lacks (e.g. a config with more hidden
        layers than the run's), named. (A sharded run's dense variables that
        its checkpoint lacks are not detected.)
    """
    number = int(checkpoint.rsplit("-", 1)[1])
    shards_dir = sharded.shards_path(os.path.dirname(checkpoint), number)
    if not os.path.isdir(shards_dir):
      model = self.build_compiled_model()
      _restore_every_variable(callbacks_lib.training_checkpoint(model), checkpoint)
      return model
    if not isinstance(self._model_builder, model_lib.ModelBuilder):
      raise ValueError(f"{checkpoint} is a sharded run's checkpoint ({shards_dir}): its tables "
                       "export through an mxrec_pipeline ModelBuilder; got "
                       f"{type(self._model_builder).__name__}")
    specs = [
        # Tiered tables' shards hold every tier's rows (checkpoint.py): one flat shard here.
        dataclasses.replace(
            spec, device_vocabulary_size=max(spec.device_vocabulary_size,
                                             checkpoint_lib.saved_key_count(shards_dir, spec.name)),
            host_vocabulary_size=0, ssd_vocabulary_size=0, ssd_data_path=())
        for spec in self._model_builder.tables.values()
    ]
    strategy = tf.distribute.get_strategy()  # One replica: one shard holding every key.
    model = self._build_sharded_model(strategy, specs, build_slots=False)
    # The tables' rows and slots come from the shard files below, not this
    # checkpoint, so unmatched variables cannot be told from missing ones here.
    callbacks_lib.training_checkpoint(model, sharded=True).restore(checkpoint).expect_partial()
    for table in self._sharded_tables.values():
      checkpoint_lib.restore_shard(shards_dir, table)
    self._strategy_in_use = strategy
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
    callbacks.append(callbacks_lib.TableStatsLogger(os.path.join(hparams.model_dir, "logs")))
    return callbacks

  def export_saved_model(self, model, export_to: str) -> str:
    """Exports a SavedModel that scores raw ids; see export.export_serving_model."""
    builder = self._dataset_builder
    snapshots = None
    if self._uses_ps(self._strategy_in_use):  # The coordinator reads every shard.
      snapshots = ps.ps_snapshots(self._sharded_tables)
    elif self._sharded_tables:  # Every worker gathers; only the chief's export_to is kept.
      snapshots = sharded.gathered_snapshots(self._strategy_in_use, self._sharded_tables)
    return export_lib.export_serving_model(
        model,
        export_to,
        context_feature_spec=builder._context_feature_spec,  # pylint: disable=protected-access
        example_feature_spec=builder._example_feature_spec,  # pylint: disable=protected-access
        mask_feature_name=builder._mask_feature_name,  # pylint: disable=protected-access
        sparse_features=builder.sparse_features,
        before_rename=lambda _: self._faults.reach("export"),
        snapshots=snapshots,
        run_info=self.run_info())

  def run_info(self) -> dict:
    """What every checkpoint manifest and export records of this run: tables and config.

    {"tables": table name -> the TableSpec fields that shape its saved state
    (None for a model builder that declares no tables), "config": the job
    config the pipeline was given (`run_config`), else the PipelineHparams,
    "table_rows": table name -> the checkpoint key of its rows (one-process
    models; keras/warm_start.py reads it), "placement": {"tables":
    "one_host", "workers" or "parameter_servers", "replicas"}}.
    """
    tables = getattr(self._model_builder, "tables", None)
    strategy = self._strategy_in_use
    return {
        "placement": {
            "tables": ("parameter_servers" if self._uses_ps(strategy) else
                       "workers" if self._sharded_tables else "one_host"),
            "replicas": strategy.num_replicas_in_sync if strategy is not None else 1
        },
        "table_rows": (warm_start_lib.row_keys(self.model)
                       if self.model is not None and not self._sharded_tables else {}),
        "tables": None if tables is None else {
            name: {field: getattr(spec, field) for field in _SAVED_TABLE_FIELDS}
            for name, spec in tables.items()
        },
        "config": self._run_config if self._run_config is not None else json.loads(
            json.dumps(dataclasses.asdict(self._hparams), default=str)),
    }

  def _sparse_optimizer(self):
    hparams = self._hparams
    return factory.get_optimizer(hparams.sparse_optimizer, hparams.sparse_learning_rate or
                                 hparams.learning_rate)

  def _compile(self, model, sparse_optimizer=None):
    hparams = self._hparams
    model.compile(
        optimizer=tf.keras.optimizers.get({
            "class_name": hparams.optimizer, "config": {"learning_rate": hparams.learning_rate}
        }), sparse_optimizer=sparse_optimizer or self._sparse_optimizer(), loss=self.build_loss(),
        metrics=self.build_metrics(), weighted_metrics=self.build_weighted_metrics(),
        steps_per_execution=hparams.steps_per_execution)

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
      callbacks.CheckpointError (a ValueError): checkpoints exist but none is
        complete, or the newest was written with other tables or another
        placement, or holds another model (docs/restarts.md).
      ValueError: a bad `warm_start` (keras/warm_start.py).
      util.storage.StorageFullError: a checkpoint or export filled its disk;
        the previous one is intact.
    """
    hparams = self._hparams
    self._faults = faults_lib.FaultPoints.from_environment()
    if hparams.seed is not None:
      tf.keras.utils.set_random_seed(hparams.seed)
    if not initialize.is_initialized():
      initialize.init()
    strategy = self._strategy or get_strategy(hparams.strategy, hparams.collective_timeout_s)
    self._strategy_in_use = strategy
    on_ps = self._uses_ps(strategy)
    if on_ps:
      model = self._build_ps_model(strategy)
    elif self._shards_tables(strategy):
      model = self._build_sharded_model(strategy)
    else:
      with strategy.scope(), _generator_rng(hparams.seed is not None):
        model = self.build_compiled_model()
    self.model = model
    shards = None
    if on_ps:
      shards = ps.PSShardCheckpoints(os.path.join(hparams.model_dir, "checkpoints"),
                                     self._sharded_tables)
    elif self._sharded_tables:
      shards = sharded.ShardCheckpoints(
          strategy, self._shard_checkpoint_dir or os.path.join(hparams.model_dir, "checkpoints"),
          self._sharded_tables, model.sparse_optimizer)
    self.checkpoint = callbacks_lib.TrainingCheckpoint(
        model, os.path.join(hparams.model_dir, "checkpoints"), shards=shards,
        run_info=self.run_info(), faults=self._faults)
    plan = epoch_steps(hparams.num_epochs, hparams.num_train_steps)
    if hparams.warm_start is not None and not self.checkpoint.exists():
      self._warm_start(model)
    start_epoch = self._restore(self.checkpoint, len(plan))
    if on_ps:
      return self._train_on_ps(model, plan, start_epoch, callbacks, verbose)
    # One iterator per run of epochs with the same steps (Keras keeps a
    # dataset's iterator across the epochs of a fit when told its steps), the
    # gate releasing each epoch's insertion at its on_epoch_begin.
    streams = isinstance(self._dataset_builder, BaseDatasetBuilder)
    gate = EpochGate(len(plan)) if streams else None
    run_callbacks = callbacks_lib.RunCallbacks(
        ([gate] if gate else []) + self.build_callbacks(model) + list(callbacks), model, verbose,
        epochs=len(plan))
    valid = self._distribute(
        strategy,
        self._dataset_builder.build_valid_dataset(
            num_epochs=None if hparams.num_valid_steps else 1))
    split = self._splits_batches(strategy)
    # Keras needs the steps of a distributed dataset.
    valid_steps = hparams.num_valid_steps or (self._dataset_builder.count_batches(False)
                                              if split else None)
    # ... and of a dataset whose iterator it keeps over several epochs.
    one_pass = (self._dataset_builder.count_batches(True) if
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
        self._distribute(strategy, self._dataset_builder.build_valid_dataset(num_epochs=1)),
        steps=valid_steps if split and not hparams.num_valid_steps else None, return_dict=True,
        verbose=0)
    return _ranking_results(results)

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
    one_pass = (self._dataset_builder.count_batches(True) if None in plan[start_epoch:] else None)
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
    return _ranking_results(self._evaluate_on_coordinator())

  def _evaluate_on_coordinator(self) -> dict[str, float]:
    """ps.evaluate_on_coordinator over the validation data (`num_valid_steps` batches or all)."""
    steps = self._hparams.num_valid_steps
    dataset = self._dataset_builder.build_valid_dataset(num_epochs=None if steps else 1)
    if steps:
      dataset = dataset.take(steps)
    return ps.evaluate_on_coordinator(self.model, dataset, self.build_metrics())

  def _uses_ps(self, strategy: tf.distribute.Strategy | None) -> bool:
    """Whether training runs under ParameterServerStrategy (tables sharded over the ps tasks)."""
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)

  def _build_ps_model(self, strategy: tf.distribute.Strategy) -> tf.keras.Model:
    """The compiled model with its tables sharded over the ps tasks (keras/ps.py).

    The PSShardedTables (rows, key indexes, hash-optimizer slots) are created
    outside the strategy's scope, shard i on ps task i; the dense model and
    its optimizer inside it (TF places them on the ps tasks). The dataset then
    keeps raw ids.

    Raises:
      ValueError: a model builder that is not a ModelBuilder (its tables
        unknown; the pipeline trains only those under the strategy), or bad
        tier arguments of a table.
    """
    if not isinstance(self._model_builder, model_lib.ModelBuilder):
      raise ValueError(f"{PARAMETER_SERVER} shards the tables of an mxrec_pipeline ModelBuilder; "
                       f"got {type(self._model_builder).__name__}")
    sparse_optimizer = self._sparse_optimizer()
    tables = ps.create_ps_tables(strategy, self._model_builder.tables.values(), sparse_optimizer,
                                 self._model_builder.seed)
    self._dataset_builder.keep_raw_ids = True
    self._sharded_tables = tables
    with strategy.scope(), _generator_rng(self._hparams.seed is not None):
      model = self._model_builder.build(sharded_tables=tables)
      self._compile(model, sparse_optimizer)
    return model

  def _shards_tables(self, strategy: tf.distribute.Strategy) -> bool:
    """Whether the tables are sharded over workers (MultiWorkerMirroredStrategy, N > 1)."""
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and
            strategy.num_replicas_in_sync > 1 and
            bool(getattr(self._dataset_builder, "sparse_features", None)))

  def _build_sharded_model(self, strategy: tf.distribute.Strategy,
                           specs: Sequence[TableSpec] | None = None,
                           build_slots: bool = True) -> tf.keras.Model:
    """The compiled model with its tables sharded by key over the workers (keras/sharded.py).

    The ShardedTables of `specs` (default: the model builder's) and the hash
    optimizer (with its slots unless not `build_slots`: a model restored to
    export only) are created outside the strategy's scope, as each worker's
    own variables; the dense model and its optimizer inside
    it, mirrored. The dataset then keeps raw ids (no insertion in tf.data).

    Raises:
      ValueError: a model builder that is not a ModelBuilder (its tables
        unknown), or a tiered table.
    """
    hparams = self._hparams
    if not isinstance(self._model_builder, model_lib.ModelBuilder):
      raise ValueError(
          f"{MULTI_WORKER_MIRRORED} with {strategy.num_replicas_in_sync} workers shards the "
          f"tables of an mxrec_pipeline ModelBuilder; got {type(self._model_builder).__name__}")
    tables = sharded.create_sharded_tables(strategy, specs or self._model_builder.tables.values(),
                                           self._model_builder.seed, hparams.collective_timeout_s or
                                           0.0)
    sparse_optimizer = self._sparse_optimizer()
    if build_slots:
      sparse_optimizer.build([table.variable for table in tables.values()])
    self._dataset_builder.keep_raw_ids = True
    self._sharded_tables = tables
    with strategy.scope(), _generator_rng(hparams.seed is not None):
      model = self._model_builder.build(sharded_tables=tables)
      self._compile(model, sparse_optimizer)
    return model

  def _restore(self, checkpoint: callbacks_lib.TrainingCheckpoint, num_epochs: int) -> int:
    """Restores the run's latest checkpoint as `hparams.resume` says; returns the start epoch."""
    if not checkpoint.exists():
      return 0
    if not self._hparams.resume:
      newest = os.path.basename(checkpoint.latest or checkpoint.newest())
      raise FileExistsError(
          f"{checkpoint.directory} holds checkpoint {newest} and `resume` is false: set "
          "pipeline.resume: true to continue it, or start over with `mxrec-pipeline train --fresh` "
          "(which clears the run's outputs) or another model_dir")
    epochs_done = checkpoint.restore()
    rest = (f"continuing at epoch {epochs_done + 1} of {num_epochs}" if epochs_done < num_epochs
            else f"nothing left to train ({num_epochs} epoch(s) planned)")
    print(
        f"Resumed from {checkpoint.restored}: {epochs_done} epoch(s) and "
        f"{int(self.model.optimizer.iterations.numpy())} step(s) done, {rest}", flush=True)
    return epochs_done

  def _warm_start(self, model) -> None:
    """Applies `hparams.warm_start` to a new run's tables (keras/warm_start.py), printing each.

    Raises:
      ValueError: tables sharded over workers or ps tasks; see warm_start.apply.
    """
    if self._sharded_tables:
      raise ValueError("pipeline.warm_start fills the tables of a one-host run; this run shards "
                       f"them ({self._hparams.strategy}): warm start a one-host run first, then "
                       "resume it on the cluster")
    spec = WarmStart.from_dict(self._hparams.warm_start)
    lines = warm_start_lib.apply(spec,
                                 initialize.get_config_initializer().tables, model.sparse_optimizer)
    for line in lines:
      print(line, flush=True)

  def _distribute(self, strategy: tf.distribute.Strategy, dataset: tf.data.Dataset):
    """Global batches as the strategy's replicas take them.

    With N > 1 replicas and sparse features, each replica gets its part of the
    inserted global batch with its own unique rows (core/asc/replicas.py);
    otherwise `dataset` as it is (Keras distributes it).
    """
    if not self._splits_batches(strategy):
      return dataset
    return replicas.distribute_dataset(
        strategy, dataset,
        [fs.FeatureSpec(f.name, table_name=f.table) for f in self._dataset_builder.sparse_features])

  def _splits_batches(self, strategy: tf.distribute.Strategy) -> bool:
    """Whether global batches are split per replica (one host, N > 1, sparse features)."""
    return (not self._shards_tables(strategy) and strategy.num_replicas_in_sync > 1 and
            bool(getattr(self._dataset_builder, "sparse_features", None)))

  def _train_epochs(self, epochs: Sequence[int], num_steps: int | None,
                    gate: EpochGate | None = None) -> tf.data.Dataset:
    """The training batches of `epochs` (consecutive) on one iterator; see `build_train_epochs`."""
    builder = self._dataset_builder
    if isinstance(builder, BaseDatasetBuilder):
      return builder.build_train_epochs(epochs, num_steps, self._hparams.seed, gate)
    # Another AbstractDatasetBuilder (one epoch at a time): its data, bounded to the epoch.
    if len(epochs) != 1:
      raise ValueError(f"{type(builder).__name__} builds one epoch per dataset, got {list(epochs)}")
    dataset = builder.build_train_dataset(num_epochs=1 if num_steps is None else None)
    return dataset if num_steps is None else dataset.take(num_steps)


def _restore_every_variable(checkpoint: tf.train.Checkpoint, path: str) -> None:
  """Restores `checkpoint` from `path`; every variable built so far must get a value.

  Values the checkpoint holds that nothing built here uses (e.g. the dense
  optimizer's slots, created only by a first training step) are fine.

  Raises:
    ValueError: a variable has no value in `path` (TF names the unbound
      objects), e.g. an export with a config of more hidden layers than the
      run's: it would otherwise serve its random initial weights.
  """
  status = checkpoint.restore(path).expect_partial()
  try:
    status.assert_existing_objects_matched()
  except AssertionError as e:
    # TF's message lists each unbound object with its values: keep the names.
    names = re.findall(r"<tf\.Variable '([^']+)'", str(e))
    found = re.search(r"Found (\d+) Python objects", str(e))
    detail = (f"{found.group(1) if found else len(names)} unbound, e.g. {', '.join(names)}"
              if names else str(e))
    raise ValueError(f"{path}: the model built from this config has variables the checkpoint "
                     f"lacks (is it the config the run trained with?): {detail}") from None


def _ranking_results(results: dict) -> dict[str, float]:
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
