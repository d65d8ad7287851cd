"""Dataset builders of the Keras pipeline: tfr's, plus insertion of the sparse ids.

`BaseDatasetBuilder` / `SimpleDatasetBuilder` mirror
`tfr.keras.pipeline.BaseDatasetBuilder` / `SimpleDatasetBuilder`: ELWC batches
from `tfr.data.build_ranking_dataset`, then a `FeatureDeriver`'s features if
any, then get_asc_insert_func for the sparse id features (training: new ids get
rows), then prefetch, so insertion overlaps the training step.
`build_train_epochs` streams several epochs on one iterator with per-epoch
seeds (keras/epochs.py). Re-exported by keras/pipeline.py, where
tfr users look for them.
"""

from __future__ import annotations

import copy
from typing import Protocol, Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import helper
from mxrec_pipeline.keras.epochs import EpochGate, epoch_seed
from mxrec_pipeline.keras.layers import SparseFeature

DatasetHparams = tfr.keras.pipeline.DatasetHparams


class FeatureDeriver(Protocol):
  """Features computed from a parsed batch before insertion, the same way when serving.

  E.g. gbdt/leaf_ids.LeafIds: tree leaves as id features. The dataset
  builder calls it on every batch (`training` True for training batches) and
  the export on every request (False), with stock TF ops only, so the
  SavedModel computes them too.

  Attributes:
    feature_names: The features it adds (they may be sparse features).
  """

  feature_names: Sequence[str]

  def __call__(self, features: dict, training: bool) -> dict:
    """`features` plus the derived ones."""


def lists_with_relevant(features: dict, labels: tf.Tensor, *weights: tf.Tensor):
  """(features, labels[, weights]) of the lists of a batch with a relevant document (label > 0).

  Args:
    features: name -> [batch_size, ...] tensors, batch first (dense, or
      ragged for multi-valued features).
    labels: [batch_size, list_size] float32, padding < 0.
    *weights: [batch_size, ...] sample weights, if the dataset has them.

  Returns:
    The same structure with the batch cut to its k lists that have a label
    > 0, in order: [k, ...] tensors (k may be 0).
  """
  keep = tf.reduce_any(labels > 0, axis=1)

  def mask(value):
    if isinstance(value, tf.RaggedTensor):  # Multi-valued features.
      return tf.ragged.boolean_mask(value, keep)
    return tf.boolean_mask(value, keep)

  return ({name: mask(value) for name, value in features.items()},
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
    feature_deriver: None, or a FeatureDeriver whose features are added to
      every batch before insertion (they may be sparse features).
  """

  def __init__(self, context_feature_spec, example_feature_spec, training_only_example_spec,
               mask_feature_name, hparams: DatasetHparams,
               sparse_features: Sequence[SparseFeature] = (), training_only_context_spec=None,
               feature_deriver: FeatureDeriver | None = None):
    super().__init__(context_feature_spec, example_feature_spec, training_only_example_spec,
                     mask_feature_name, hparams, training_only_context_spec)
    self.sparse_features = list(sparse_features)
    self.feature_deriver = feature_deriver
    # True when the model looks its tables up by raw ids (tables sharded over
    # workers or ps tasks): no insertion in tf.data. See `with_raw_ids`.
    self.keep_raw_ids = False
    # True: validation batches keep only their lists with a relevant document
    # (`lists_with_relevant`; MetricsConfig.skip_queries_without_relevant).
    self.skip_lists_without_relevant = False
    known = [*context_feature_spec, *example_feature_spec]
    known += list(feature_deriver.feature_names) if feature_deriver else []
    for feature in self.sparse_features:
      if feature.name not in known:
        raise ValueError(f"sparse feature '{feature.name}' is not in the context or example "
                         f"feature spec or the derived features {sorted(known)}")

  def with_raw_ids(self) -> "BaseDatasetBuilder":
    """A copy of this builder whose batches keep raw ids (no insertion in tf.data).

    For models that look their tables up by raw ids (tables sharded over
    workers or ps tasks: keras/sharded.py, keras/ps.py); the pipeline uses
    the copy and leaves the builder it was given as it was.
    """
    raw = copy.copy(self)
    raw.keep_raw_ids = True
    return raw

  def _inserts(self) -> bool:
    """Whether the batches get their ids inserted in tf.data (not when the model takes raw ids)."""
    return bool(self.sparse_features) and not self.keep_raw_ids

  def _insert(self, dataset: tf.data.Dataset, is_training: bool,
              gate: EpochGate | None = None) -> tf.data.Dataset:
    """`dataset` with its derived features added (a parallel map), ids inserted, prefetched.

    Insertion is one sequential map (rows are given in batch order).

    With `gate` (only when inserting), `dataset` holds (epoch, index in the
    epoch, batch) and the map first holds each epoch's first batch until the
    gate releases it (`EpochGate.hold`), in the same function as the
    insertion.
    """
    derive = self.feature_deriver
    if derive is not None:

      def add_derived(features, *rest):
        return (derive(features, is_training), *rest)

      dataset = dataset.map(
          add_derived if gate is None else lambda epoch, index, batch:
          (epoch, index, add_derived(*batch)), num_parallel_calls=tf.data.AUTOTUNE,
          deterministic=True)
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

  def build_raw_valid_dataset(self, all_lists: bool = False,
                              num_epochs: int | None = 1) -> tf.data.Dataset:
    """The validation batches without insertion: raw ids kept.

    For scorers that read raw features (baselines, the serving scorer); the
    same batches in the same order as `build_valid_dataset(num_epochs)`.

    Args:
      all_lists: Keep every list, even under `skip_lists_without_relevant`
        (e.g. to count them).
      num_epochs: Passes over the validation data (default one); None
        repeats forever.
    """
    return self._valid_batches(num_epochs, all_lists)

  def build_serialized_valid_dataset(self) -> tf.data.Dataset:
    """One pass of [valid_batch_size] serialized ELWC protos: what an export serves.

    The lists of `build_raw_valid_dataset(all_lists=True)`, batch for batch
    (files in name order, records in file order), unparsed: for scoring an
    export (`export.evaluate_export`).
    """
    # tfr's reading (build_ranking_dataset, deterministic), so several files interleave alike.
    files = tf.data.Dataset.list_files(self._hparams.valid_input_pattern, shuffle=False)
    records = files.interleave(self._hparams.dataset_reader, num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=True)
    return records.batch(self._hparams.valid_batch_size)

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
    training_only_context_spec: Context features parsed but not served
      (e.g. a list id a FeatureDeriver reads at training).
    feature_deriver: As BaseDatasetBuilder's.
  """

  def __init__(self, context_feature_spec, example_feature_spec, mask_feature_name: str, label_spec,
               hparams: DatasetHparams, sparse_features: Sequence[SparseFeature] = (),
               sample_weight_spec=None, training_only_context_spec=None,
               feature_deriver: FeatureDeriver | None = None):
    super().__init__(context_feature_spec, example_feature_spec,
                     dict([label_spec] + ([sample_weight_spec] if sample_weight_spec else [])),
                     mask_feature_name, hparams, sparse_features, training_only_context_spec,
                     feature_deriver)
    self._label_spec = label_spec
    self._sample_weight_spec = sample_weight_spec

  # tfr's SimpleDatasetBuilder._features_and_labels, reused unchanged.
  _features_and_labels = tfr.keras.pipeline.SimpleDatasetBuilder._features_and_labels


def validation_batches(builder, num_steps: int | None, raw: bool = False) -> tf.data.Dataset:
  """The validation batches a run scores: `num_steps` of them, or one pass when None.

  As Keras' `validation_steps` reads them: with `num_steps`, the data
  repeats when it has fewer batches. The coordinator's validation under
  ParameterServerStrategy and the sidecar evaluator both score these.

  Args:
    builder: The run's dataset builder (`raw` needs `build_raw_valid_dataset`,
      a BaseDatasetBuilder's).
    num_steps: Batches (PipelineHparams.num_valid_steps), or None: one pass.
    raw: Raw ids, not inserted (for a scorer that maps ids itself: the export's).
  """
  epochs = None if num_steps else 1
  dataset = (builder.build_raw_valid_dataset(
      num_epochs=epochs) if raw else builder.build_valid_dataset(num_epochs=epochs))
  return dataset.take(num_steps) if num_steps else dataset
