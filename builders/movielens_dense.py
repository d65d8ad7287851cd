"""The movielens_listwise ranker with dense Keras tables, on stock TF-Ranking.

The reference the sparse core is measured against (benchmarks/bench_pipeline.py):
the same features, scorer, labels and batching as builders/movielens.py, but
every table is a `tf.keras.layers.Embedding` whose rows are indexed by a stock
`tf.keras.layers.IntegerLookup` / `StringLookup` over the training vocabulary,
trained by one Keras Adam (dense slots; every row's m and v decay each step)
inside `tfr.keras.pipeline.SimplePipeline`, with no project op on the path.

Like the sparse core's unseen ids, ids outside the vocabulary read a zero
embedding. Tables shared by several features (gender and occupation) are one
Embedding over the union of their vocabularies. Main names:
`DenseModelBuilder` (an example there), `table_vocabularies`,
`build_dataset_builder`; `HashedTable`, the hashing trick's table, for
benchmarks/bench_book_crossing.py.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_ranking as tfr

from builders import movielens
from builders.base import MASK_FEATURE, DataPaths, DatasetConfig
from mxrec_pipeline.keras.layers import SparseFeature, TableSpec, combine


@tf.keras.utils.register_keras_serializable(package="mxrec_pipeline_builders")
class DenseTable(tf.keras.layers.Layer):
  """A table as stock Keras layers: vocabulary lookup, then Embedding.

  Call with ids [batch_size, ..., num_ids] (int64 or string; dense or ragged)
  and a combiner; returns [batch_size, ..., dim] float32 combined over num_ids
  (or [..., num_ids, dim] with combiner None), as `SparseLookup` does. Ids
  outside the vocabulary read zeros.

  Args:
    spec: The TableSpec (dim, key_dtype, initializer_stddev; the row count is
      len(vocabulary) + 1, row 0 for out-of-vocabulary ids).
    vocabulary: The table's distinct ids (ints, or bytes/str for string keys).
    seed: Seed of the initial rows (mixed with the table name, as the sparse
      core's tables are).
  """

  def __init__(self, spec: TableSpec, vocabulary: Sequence, seed: int | None = None, **kwargs):
    super().__init__(**kwargs)
    self.spec = spec if isinstance(spec, TableSpec) else TableSpec(**spec)
    self.vocabulary = vocabulary
    self.seed = seed
    if self.spec.key_dtype == "string":
      self.lookup = tf.keras.layers.StringLookup(vocabulary=list(vocabulary), num_oov_indices=1)
    else:
      self.lookup = tf.keras.layers.IntegerLookup(vocabulary=np.asarray(vocabulary, np.int64),
                                                  num_oov_indices=1)
    table_seed = None if seed is None else (seed + zlib.crc32(self.spec.name.encode())) % 2**31
    self.embedding = tf.keras.layers.Embedding(
        len(vocabulary) + 1, self.spec.dim, name=f"{self.spec.name}_embedding",
        embeddings_initializer=tf.keras.initializers.TruncatedNormal(
            stddev=self.spec.initializer_stddev, seed=table_seed))

  def _embed(self, ids: tf.Tensor) -> tf.Tensor:
    rows = self.lookup(ids)
    found = tf.cast(tf.expand_dims(rows > 0, -1), tf.float32)
    return self.embedding(rows) * found

  def call(self, ids, combiner: str | None = "mean"):
    if isinstance(ids, tf.RaggedTensor):
      per_id = tf.ragged.map_flat_values(self._embed, ids)
    else:
      per_id = self._embed(ids)
    return combine(per_id, combiner)

  def get_config(self):
    config = super().get_config()
    vocabulary = [v.decode() if isinstance(v, bytes) else v for v in self.vocabulary]
    if self.spec.key_dtype != "string":
      vocabulary = [int(v) for v in vocabulary]
    config.update(spec=dataclasses.asdict(self.spec), vocabulary=vocabulary, seed=self.seed)
    return config


@tf.keras.utils.register_keras_serializable(package="mxrec_pipeline_builders")
class HashedTable(tf.keras.layers.Layer):
  """A table as stock Keras layers without a vocabulary: `Hashing` into bins, then Embedding.

  The hashing trick (tf.keras.layers.Hashing, FarmHash64 of the id mod
  `num_bins`): every id reads a row, colliding ids share one. Call as
  DenseTable.

  Args:
    spec: The TableSpec (dim, initializer_stddev).
    num_bins: Rows of the Embedding, >= 1.
    seed: Seed of the initial rows (mixed with the table name).
  """

  def __init__(self, spec: TableSpec, num_bins: int, seed: int | None = None, **kwargs):
    super().__init__(**kwargs)
    self.spec = spec if isinstance(spec, TableSpec) else TableSpec(**spec)
    self.num_bins = int(num_bins)
    self.seed = seed
    self.hashing = tf.keras.layers.Hashing(self.num_bins)
    table_seed = None if seed is None else (seed + zlib.crc32(self.spec.name.encode())) % 2**31
    self.embedding = tf.keras.layers.Embedding(
        self.num_bins, self.spec.dim, name=f"{self.spec.name}_embedding",
        embeddings_initializer=tf.keras.initializers.TruncatedNormal(
            stddev=self.spec.initializer_stddev, seed=table_seed))

  def call(self, ids, combiner: str | None = "mean"):
    if isinstance(ids, tf.RaggedTensor):
      per_id = tf.ragged.map_flat_values(lambda v: self.embedding(self.hashing(v)), ids)
    else:
      per_id = self.embedding(self.hashing(ids))
    return combine(per_id, combiner)

  def get_config(self):
    config = super().get_config()
    config.update(spec=dataclasses.asdict(self.spec), num_bins=self.num_bins, seed=self.seed)
    return config


def table_vocabularies(train_path: str, features: Sequence[SparseFeature],
                       tables: Sequence[TableSpec],
                       feature_specs: tuple[dict, dict] | None = None) -> dict[str, list]:
  """Distinct ids of each table in the training ELWC file, sorted.

  Args:
    train_path: Training ELWC TFRecord file (pattern).
    features: The SparseFeatures (name -> table).
    tables: Their TableSpecs.
    feature_specs: (context, example) feature specs of the file; default
      MovieLens's.

  Returns:
    Table name -> sorted ids (ints, or bytes for string tables).
  """
  if feature_specs is None:
    feature_specs = movielens.MovieLensListwise().feature_specs()[:2]
  context, example = feature_specs
  by_name = {f.name: f.table for f in features}
  vocab: dict[str, set] = {t.name: set() for t in tables}
  dataset = tf.data.TFRecordDataset(
      tf.io.gfile.glob(train_path)).batch(256).map(lambda s: tfr.data.parse_from_example_list(
          s, context_feature_spec={k: v for k, v in context.items() if k in by_name},
          example_feature_spec={k: v for k, v in example.items() if k in by_name}))
  for batch in dataset:
    for name, ids in batch.items():
      values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
      vocab[by_name[name]].update(values.numpy().ravel().tolist())
  return {name: sorted(ids) for name, ids in vocab.items()}


class DenseModelBuilder(tfr.keras.model.ModelBuilder):
  """tfr's ModelBuilder of the MovieLens ranker with DenseTable embeddings.

  Args:
    model: The MovieLensModelConfig (the scorer and table dims).
    vocabularies: Table name -> ids (see `table_vocabularies`).
    features, tables: The SparseFeatures and TableSpecs to embed densely
      (default: MovieLensListwise().sparse_features(model)).
    seed: Seed of the initial rows.

  Example (benchmarks/bench_pipeline.py runs it against the sparse pipeline):

    ```python
    ranker = movielens.MovieLensListwise()
    paths = ranker.prepare_data(movielens.MovieLensDataConfig())
    model = movielens.MovieLensModelConfig()
    vocabularies = table_vocabularies(paths.train, *ranker.sparse_features(model))
    pipeline = tfr.keras.pipeline.SimplePipeline(
        DenseModelBuilder(model, vocabularies, seed=1),
        build_dataset_builder(paths, DatasetConfig()),
        tfr.keras.pipeline.PipelineHparams(
            model_dir="/tmp/dense", num_epochs=20, steps_per_epoch=43, validation_steps=30,
            learning_rate=0.01, loss="softmax_loss", strategy="MirroredStrategy"))
    pipeline.train_and_validate(verbose=2)
    ```
  """

  def __init__(self, model: movielens.MovieLensModelConfig, vocabularies: Mapping[str, Sequence],
               features: Sequence[SparseFeature] | None = None,
               tables: Sequence[TableSpec] | None = None, seed: int | None = None):
    if features is None or tables is None:
      features, tables = movielens.MovieLensListwise().sparse_features(model)
    layers = {
        t.name: DenseTable(t, vocabularies[t.name], seed, name=f"dense_{t.name}") for t in tables
    }

    def embed(feature):
      return lambda ids: layers[feature.table](ids, combiner=feature.combiner)

    spec = {f.name: embed(f) for f in features}
    spec.update(movielens.PREPROCESS_SPEC)
    super().__init__(
        input_creator=tfr.keras.model.FeatureSpecInputCreator(
            *movielens.MovieLensListwise().model_feature_specs(model)),
        preprocessor=tfr.keras.model.PreprocessorWithSpec(spec),
        scorer=movielens.build_scorer(model), mask_feature_name=MASK_FEATURE,
        name="movielens_listwise_dense")


class DenseDatasetBuilder(tfr.keras.pipeline.SimpleDatasetBuilder):
  """tfr's SimpleDatasetBuilder with `movielens.relevance_labels`.

  Args:
    relevance: "graded" or "liked"; the rest as tfr's SimpleDatasetBuilder.
  """

  def __init__(self, *args, relevance: str = "graded", **kwargs):
    super().__init__(*args, **kwargs)
    self.relevance = relevance

  def _features_and_labels(self, features):
    features, rating = super()._features_and_labels(features)
    return features, movielens.relevance_labels(rating, self.relevance)


def build_dataset_builder(paths: DataPaths, dataset: DatasetConfig,
                          relevance: str = "graded") -> DenseDatasetBuilder:
  """The stock-tfr dataset builder of the MovieLens ELWC files (same batching).

  Args:
    paths: The ELWC files (`MovieLensListwise.prepare_data`).
    dataset: Batch and list sizes.
    relevance: The labels: "graded" or "liked" (`movielens.relevance_labels`).
  """
  context, example, label = movielens.MovieLensListwise().feature_specs()
  hparams = tfr.keras.pipeline.DatasetHparams(train_input_pattern=paths.train,
                                              valid_input_pattern=paths.valid,
                                              train_batch_size=dataset.train_batch_size,
                                              valid_batch_size=dataset.valid_batch_size,
                                              list_size=dataset.list_size,
                                              valid_list_size=dataset.valid_list_size)
  return DenseDatasetBuilder(context, example, MASK_FEATURE, label, hparams, relevance=relevance)
