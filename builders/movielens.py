"""Listwise ranker with sparse id features on MovieLens-100k (the main job).

`MovieLensListwise`: one list per user, split by time (mxrec_pipeline.data.movielens).
The context is the user (user_id, age, gender, occupation, zip), the examples
are the movies the user rated (item_id, genres, title tokens, year). Every id
feature goes through the sparse core: user_id and item_id have their own
tables, gender and occupation share one, genres and title tokens are
multi-valued (ragged) and mean-combined. Features from the training ratings
only (docs/data.md#movielens-features): the user's history, pooled through the
"history_item" and "genre" tables, and dense rating statistics, matrix
factorization's and item-kNN's predictions (the baseline's own signal among them).

`MovieLensScorer` adds two terms per movie: a DNN over every feature of the
(user, movie) pair and the dot product of the user_id and item_id embeddings,
collaborative filtering's matrix-factorization term. Labels
(`MovieLensDataConfig.relevance`): "graded", `rating - 1` (default), or "liked",
`max(rating - 3, 0)`. The baseline ranks each movie by its mean training rating
(the global mean for movies never rated in training), on the same labels.
See docs/configuration.md for the keys.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

from builders.base import (DataPaths, ItemMeans, RankerBuilder, MASK_FEATURE, item_mean_baseline)
from builders.ensemble import EnsembleMean
from builders.movielens_config import (RELEVANCES, MovieLensDataConfig, MovieLensModelConfig,
                                       MovieLensTablesConfig)
from mxrec_pipeline.data import fetch as fetch_lib
from mxrec_pipeline.data import item_knn
from mxrec_pipeline.data import matrix_factorization
from mxrec_pipeline.data import movielens
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.keras.layers import SparseFeature, TableSpec

_F = tf.io.FixedLenFeature
CONTEXT_SPEC = {
    "user_id": _F([1], tf.int64, default_value=0),
    "age": _F([1], tf.int64, default_value=0),
    "gender": _F([1], tf.string, default_value=""),
    "occupation": _F([1], tf.string, default_value=""),
    "zip": _F([1], tf.string, default_value=""),
    "history_item_ids": tf.io.RaggedFeature(tf.int64),
    "history_genres": tf.io.RaggedFeature(tf.string),
}
EXAMPLE_SPEC = {
    "item_id": _F([1], tf.int64, default_value=0),
    "year": _F([1], tf.int64, default_value=0),
    "genres": tf.io.RaggedFeature(tf.string),
    "title_tokens": tf.io.RaggedFeature(tf.string),
    "item_mean_rating": _F([1], tf.float32, default_value=0.0),
    "item_rating_count": _F([1], tf.int64, default_value=0),
    "neighbor_rating_deviation": _F([1], tf.float32, default_value=0.0),
    "mf_rating": _F([1], tf.float32, default_value=0.0),
    "item_knn_deviation": _F([1], tf.float32, default_value=0.0),
}
LABEL_SPEC = ("rating", _F([1], tf.float32, default_value=-1.0))
LIKED_RATING = 4.0
USER_FEATURE, ITEM_FEATURE = "user_id", "item_id"
# The self-attention output's name among the scorer's example features.
ATTENTION_FEATURE = "list_attention"

# The dense (non-id) features, scaled to about [0, 1]; applied after the
# sparse features became embeddings.
PREPROCESS_SPEC = {
    "age": lambda t: tf.cast(t, tf.float32) / 100.0,
    "year": lambda t: (tf.cast(t, tf.float32) - 1900.0) / 100.0,
    "item_mean_rating": lambda t: (t - 3.0) / 2.0,
    "item_rating_count": lambda t: tf.math.log1p(tf.cast(t, tf.float32)) / 6.0,
    "neighbor_rating_deviation": lambda t: t / 2.0,
    "mf_rating": lambda t: (t - 3.0) / 2.0,
    "item_knn_deviation": lambda t: t / 2.0,
}


def relevance_labels(rating: tf.Tensor, relevance: str) -> tf.Tensor:
  """Labels from ratings; padding (rating < 0) stays negative.

  Args:
    rating: [batch_size, list_size] float32 ratings 1-5, -1 for padding.
    relevance: "graded" (`rating - 1`) or "liked" (`max(rating - 3, 0)`).

  Returns:
    [batch_size, list_size] float32 labels.

  Raises:
    ValueError: an unknown `relevance`.
  """
  if relevance == "graded":
    label = rating - 1.0
  elif relevance == "liked":
    label = tf.maximum(rating - (LIKED_RATING - 1.0), 0.0)
  else:
    raise ValueError(f"relevance must be one of {RELEVANCES}, got {relevance!r}")
  return tf.where(rating < 0, rating, label)


@dataclasses.dataclass(frozen=True)
class MovieLensPaths(DataPaths):
  """DataPaths plus the label definition the dataset builder applies."""

  relevance: str = "graded"


class MovieLensScorer(tfr.keras.model.UnivariateScorer):
  """DNN over all features plus the user . item dot product, per movie.

  `logit = dnn(concat(features)) + w . concat(linear_features) + <e_user, e_item>`.
  The dot product is collaborative filtering's matrix-factorization term
  (Koren, Bell and Volinsky, "Matrix Factorization Techniques for Recommender
  Systems", IEEE Computer 2009), which a DNN over concatenated ids learns
  poorly (Rendle et al., "Neural Collaborative Filtering vs. Matrix
  Factorization Revisited", RecSys 2020). `id_l2` puts an L2 penalty on e_user
  and e_item per occurrence, as MF's regularized SGD does: the tables otherwise
  overfit the ~80k training ratings within a few epochs. The linear term is
  the wide part of Wide & Deep (Cheng et al., "Wide & Deep Learning for
  Recommender Systems", DLRS 2016) over the rating statistics: the DNN alone
  was slow to rank by them. Used by both the sparse-core ranker and its dense
  twin (builders/movielens_dense.py).

  Args:
    hidden_layer_dims, dropout, use_batch_norm: The DNN (tfr.keras.layers.create_tower).
    dot_product: Add `<e_user, e_item>`; user and item embeddings must then
      have the same dim.
    id_l2: L2 penalty weight on the user and item embeddings, >= 0.
    user_feature, item_feature: Names of the two id features.
    linear_features: Dense features, [batch_size, list_size, 1] float32 each
      after preprocessing, also added to the logit linearly; () for none.
    num_attention_heads: > 0: multi-head self-attention across the movies of
      a list (`tfr.keras.layers.DocumentInteractionAttention`, Pasumarthi et
      al., "Permutation Equivariant Document Interaction Network for Neural
      Learning-to-Rank", ICTIR 2020; as builders/letor_dasalc.py) over the
      concatenated example features, [batch_size, list_size, head_size]
      float32, joins the DNN's input per movie; 0: none.
    attention_head_size: Units per attention head.
    ensemble_size: k >= 1 DNN towers over the same features and tables, their
      logits averaged (`builders.ensemble.EnsembleMean`: at training, list b
      trains tower b mod k); the linear and dot-product terms are shared.
  """

  def __init__(self, hidden_layer_dims, dropout: float = 0.0, use_batch_norm: bool = False,
               dot_product: bool = True, id_l2: float = 0.0, user_feature: str = USER_FEATURE,
               item_feature: str = ITEM_FEATURE, linear_features: Sequence[str] = (),
               num_attention_heads: int = 0, attention_head_size: int = 16, ensemble_size: int = 1):
    self._dnn_kwargs = dict(hidden_layer_dims=list(hidden_layer_dims), output_units=1,
                            dropout=dropout, use_batch_norm=use_batch_norm)
    self._dot_product = dot_product
    self._id_l2 = id_l2
    self._ids = (user_feature, item_feature)
    self._linear_features = tuple(linear_features)
    self._attention = dict(num_heads=num_attention_heads, head_size=attention_head_size,
                           dropout=dropout)
    self._ensemble_size = ensemble_size

  def __call__(self, context_features, example_features, mask):
    """[batch_size, list_size] float32 scores; see `tfr.keras.model.UnivariateScorer`."""
    if self._attention["num_heads"]:
      x = tf.keras.layers.Concatenate()([example_features[k] for k in sorted(example_features)])
      attention = tfr.keras.layers.DocumentInteractionAttention(**self._attention,
                                                                name="list_attention")((x, mask))
      example_features = {**example_features, ATTENTION_FEATURE: attention}
    if self._ensemble_size == 1:
      return super().__call__(context_features, example_features, mask)
    flat_context, flat_example = tfr.keras.layers.FlattenList()(inputs=(context_features,
                                                                        example_features, mask))
    logits = self._score_flattened(flat_context, flat_example)  # [batch_size * list_size, k]
    members = [
        tfr.keras.layers.RestoreList(name=f"member_{i}_restore")(inputs=(logits[:, i:i + 1], mask))
        for i in range(self._ensemble_size)
    ]
    return EnsembleMean(name="ensemble_mean")(tf.stack(members, axis=-1))

  def _score_flattened(self, context_features, example_features):
    """[batch_size * list_size, ensemble_size] logits; see `tfr.keras.model.UnivariateScorer`."""
    features = {**context_features, **example_features}
    if self._id_l2 > 0:
      for name in self._ids:
        features[name] = tf.keras.layers.ActivityRegularization(l2=self._id_l2,
                                                                name=f"{name}_l2")(features[name])
    flat = [tf.keras.layers.Flatten()(features[name]) for name in sorted(features)]
    x = tf.keras.layers.Concatenate()(flat)
    towers = [
        tfr.keras.layers.create_tower(**self._dnn_kwargs)(x) for _ in range(self._ensemble_size)
    ]
    logits = towers[0] if len(towers) == 1 else tf.keras.layers.Concatenate()(towers)
    linear = [tf.keras.layers.Flatten()(features[name]) for name in self._linear_features]
    if linear:
      # The wide part: one weight per statistic, summed into the logit.
      wide = tf.keras.layers.Concatenate()(linear) if len(linear) > 1 else linear[0]
      logits = tf.keras.layers.Add()(
          [logits, tf.keras.layers.Dense(1, use_bias=False, name="linear")(wide)])
    if self._dot_product:
      user, item = self._ids
      logits = tf.keras.layers.Add()(
          [logits, tf.keras.layers.Dot(axes=-1)([features[user], features[item]])])
    return logits


def build_scorer(model: MovieLensModelConfig) -> MovieLensScorer:
  """The scorer of a model config (shared by the sparse and dense builders)."""
  linear = movielens.RATING_STATISTICS_FEATURES if model.rating_statistics else ()
  if model.mf_rating:
    linear += movielens.MF_FEATURES
  if model.item_knn:
    linear += movielens.ITEM_KNN_FEATURES
  return MovieLensScorer(model.hidden_layer_dims, dropout=model.dropout,
                         use_batch_norm=model.use_batch_norm, dot_product=model.dot_product,
                         id_l2=model.id_l2, linear_features=linear,
                         num_attention_heads=model.num_attention_heads,
                         attention_head_size=model.attention_head_size,
                         ensemble_size=model.ensemble_size)


class RelevanceDatasetBuilder(pipeline_lib.SimpleDatasetBuilder):
  """SimpleDatasetBuilder whose labels are `relevance_labels(rating, relevance)`.

  Args:
    relevance: "graded" or "liked"; the rest as SimpleDatasetBuilder.
  """

  def __init__(self, *args, relevance: str = "graded", **kwargs):
    super().__init__(*args, **kwargs)
    if relevance not in RELEVANCES:
      raise ValueError(f"relevance must be one of {RELEVANCES}, got {relevance!r}")
    self.relevance = relevance

  def _features_and_labels(self, features):
    features, rating = super()._features_and_labels(features)
    return features, relevance_labels(rating, self.relevance)


class MovieLensListwise(RankerBuilder):
  """The main job: see the module docstring."""

  name = "movielens_listwise"
  DataConfig = MovieLensDataConfig
  ModelConfig = MovieLensModelConfig

  def prepare_data(self, data: MovieLensDataConfig) -> MovieLensPaths:
    """See `RankerBuilder`. ELWC files already in the output directory are used as they are."""
    data_dir = pathlib.Path(data.data_dir) if data.data_dir else fetch_lib.fetch("movielens_100k")
    checks = "" if (data.rating_range, data.on_bad_record) == ([1.0, 5.0], "error") else (
        f"_r{data.rating_range[0]:g}-{data.rating_range[1]:g}_{data.on_bad_record}")
    # The history and neighbor sizes name the features' version too.
    features = (f"_h{movielens.HISTORY_SIZE}_n{movielens.NUM_NEIGHBORS}"
                f"_mf{matrix_factorization.DIM}x{movielens.MF_NUM_FOLDS}"
                f"_iknn{item_knn.NUM_NEIGHBORS}")
    out = pathlib.Path(data.elwc_dir) if data.elwc_dir else data_dir / (
        f"elwc_v{data.valid_fraction}_l{data.max_list_size}{checks}{features}")
    train, valid = out / "train.tfrecord", out / "valid.tfrecord"
    report = out / "bad_records.json"
    if not (train.exists() and valid.exists()):
      written = movielens.build_movielens_elwc(data_dir, out,
                                               data.valid_fraction, data.max_list_size,
                                               tuple(data.rating_range), data.on_bad_record)
      report.write_text(json.dumps(written.bad_records), encoding="utf-8")
    # The ratings file's skipped rows, reported with the training split.
    skipped = {"train": json.loads(report.read_text(encoding="utf-8"))} if report.is_file() else {}
    return MovieLensPaths(str(train), str(valid), bad_records=skipped, relevance=data.relevance)

  def partition_paths(self, pattern: str, data: MovieLensDataConfig) -> MovieLensPaths:
    """See `RankerBuilder`; the labels per `data.relevance`."""
    return MovieLensPaths(pattern, pattern, relevance=data.relevance)

  def feature_specs(self):
    return dict(CONTEXT_SPEC), dict(EXAMPLE_SPEC), LABEL_SPEC

  def model_feature_specs(self, model: MovieLensTablesConfig) -> tuple[dict, dict]:
    """(context, example) specs of the features `model` uses.

    Per `user_history`, `rating_statistics`, `mf_rating` and `item_knn`.
    """
    context, example, _ = self.feature_specs()
    if not model.user_history:
      context = {k: v for k, v in context.items() if k not in movielens.HISTORY_FEATURES}
    if not model.rating_statistics:
      example = {k: v for k, v in example.items() if k not in movielens.RATING_STATISTICS_FEATURES}
    if not model.mf_rating:
      example = {k: v for k, v in example.items() if k not in movielens.MF_FEATURES}
    if not model.item_knn:
      example = {k: v for k, v in example.items() if k not in movielens.ITEM_KNN_FEATURES}
    return context, example

  def sparse_features(self, model: MovieLensTablesConfig):
    rows = model.device_vocabulary_size
    features = [
        SparseFeature("user_id", "user"),
        SparseFeature("item_id", "item"),
        SparseFeature("gender", "user_attribute"),
        SparseFeature("occupation", "user_attribute"),
        SparseFeature("zip", "zip"),
        SparseFeature("genres", "genre", combiner=model.combiner),
        SparseFeature("title_tokens", "title_token", combiner=model.combiner),
    ]
    if model.user_history:
      features += [
          SparseFeature("history_item_ids", "history_item", combiner=model.combiner),
          SparseFeature("history_genres", "genre", combiner=model.combiner),
      ]
    id_tiers = dict(host_vocabulary_size=model.host_vocabulary_size,
                    ssd_vocabulary_size=model.ssd_vocabulary_size,
                    ssd_data_path=tuple(model.ssd_data_path), cache_policy=model.cache_policy)
    initializer = model.table_initializer
    id_rows = model.id_device_vocabulary_size or rows
    tables = [
        TableSpec("user", model.id_dim, id_rows, initializer=initializer, **id_tiers),
        TableSpec("item", model.id_dim, id_rows, initializer=initializer, **id_tiers),
        TableSpec("user_attribute", model.attribute_dim, rows, key_dtype="string",
                  initializer=initializer),
        TableSpec("zip", model.attribute_dim, rows, key_dtype="string", initializer=initializer),
        TableSpec("genre", model.attribute_dim, rows, key_dtype="string", initializer=initializer),
        TableSpec("title_token", model.attribute_dim, rows, key_dtype="string",
                  initializer=initializer),
    ]
    if model.user_history:
      tables.append(TableSpec("history_item", model.id_dim, rows, initializer=initializer))
    return features, tables

  def build_model_builder(self, model: MovieLensModelConfig, seed):
    features, tables = self.sparse_features(model)
    return model_lib.ModelBuilder(
        input_creator=model_lib.FeatureSpecInputCreator(*self.model_feature_specs(model)),
        preprocessor=dict(PREPROCESS_SPEC), scorer=build_scorer(model),
        mask_feature_name=MASK_FEATURE, sparse_features=features, tables=tables, seed=seed,
        name="movielens_listwise")

  def build_dataset_builder(self, paths: MovieLensPaths, dataset, model):
    """See `RankerBuilder`; labels per `paths.relevance`.

    Raises:
      TypeError: `paths` is not a MovieLensPaths (it carries the label
        definition: `prepare_data` and `partition_paths` return one).
    """
    if not isinstance(paths, MovieLensPaths):
      raise TypeError(
          f"{self.name} reads its labels' definition from MovieLensPaths.relevance; got "
          f"{type(paths).__name__} (build it with MovieLensPaths(train, valid, "
          "relevance=...) or prepare_data)")
    builder = super().build_dataset_builder(paths, dataset, model)
    builder.relevance = paths.relevance
    return builder

  def dataset_builder_class(self):
    return RelevanceDatasetBuilder

  def build_baseline(self, paths: DataPaths, data: MovieLensDataConfig):
    """Mean training rating of each movie (from the training ELWC file)."""
    return item_mean_baseline(paths.train, "item_id", EXAMPLE_SPEC["item_id"], LABEL_SPEC)[0]

  def baseline_means(self, data) -> ItemMeans:
    """See `RankerBuilder`: the mean rating of each movie, partition by partition."""
    del data
    return ItemMeans("item_id", EXAMPLE_SPEC["item_id"], LABEL_SPEC)
