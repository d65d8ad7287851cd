"""Listwise ranker with string-key sparse features on Book-Crossing (book_crossing_listwise).

`BookCrossingListwise`: one list per user of the books the user rated
explicitly, labels the ratings 1-10 as graded relevance, each user's ratings
split at random (mxrec_pipeline/data/book_crossing_lists.py). Every id feature
goes through the sparse core: user_id, age_bucket and year as int64 keys, the
others (ISBN, author, publisher, location, country, title tokens and the
crosses "<user_id>|<author>", ...) as strings, through the core's string-key
tables (`TableSpec(key_dtype="string")`, hashed to int64 keys by the core),
each feature in a table of its own. The scorer is movielens_listwise's
(`MovieLensScorer`: a DNN, a linear term over the rating statistics and the
user_id . isbn dot product). The baseline ranks each book by its mean training
rating (the global mean for books never rated in training).
See docs/configuration.md for the keys.
"""

from __future__ import annotations

import json
import math
import pathlib

import tensorflow as tf

from builders.base import (DataPaths, ItemMeans, RankerBuilder, MASK_FEATURE, item_mean_baseline)
from builders.book_crossing_config import BookCrossingDataConfig, BookCrossingModelConfig
from builders.movielens import MovieLensScorer
from mxrec_pipeline.data import book_crossing_lists as lists_lib
from mxrec_pipeline.data import fetch as fetch_lib
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras.layers import SparseFeature, TableSpec

_F = tf.io.FixedLenFeature
CONTEXT_SPEC = {
    "user_id": _F([1], tf.int64, default_value=0),
    "location": _F([1], tf.string, default_value=""),
    "country": _F([1], tf.string, default_value=""),
    "age_bucket": _F([1], tf.int64, default_value=-1),
}
EXAMPLE_SPEC = {
    "isbn": _F([1], tf.string, default_value=""),
    "author": _F([1], tf.string, default_value=""),
    "publisher": _F([1], tf.string, default_value=""),
    "year": _F([1], tf.int64, default_value=-1),
    "title_tokens": tf.io.RaggedFeature(tf.string),
    **{name: _F([1], tf.string, default_value="") for name in lists_lib.CROSSES},
    "isbn_mean_rating": _F([1], tf.float32, default_value=0.0),
    "isbn_rating_count": _F([1], tf.int64, default_value=0),
    "author_mean_rating": _F([1], tf.float32, default_value=0.0),
    "author_rating_count": _F([1], tf.int64, default_value=0),
    "user_author_deviation": _F([1], tf.float32, default_value=0.0),
    "user_author_rating_count": _F([1], tf.int64, default_value=0),
}
LABEL_SPEC = (lists_lib.LABEL_FEATURE, _F([1], tf.float32, default_value=-1.0))
# Version of the lists' features: part of the ELWC directory's name.
FEATURES_VERSION = "f2"

# Scaled to about [-1, 1]; applied after the sparse features became embeddings.
_MEAN_RATING, _RATING_SCALE = 7.5, 2.0
PREPROCESS_SPEC = {
    "isbn_mean_rating": lambda t: (t - _MEAN_RATING) / _RATING_SCALE,
    "isbn_rating_count": lambda t: tf.math.log1p(tf.cast(t, tf.float32)) / 5.0,
    "author_mean_rating": lambda t: (t - _MEAN_RATING) / _RATING_SCALE,
    "author_rating_count": lambda t: tf.math.log1p(tf.cast(t, tf.float32)) / 5.0,
    "user_author_deviation": lambda t: t / _RATING_SCALE,
    "user_author_rating_count": lambda t: tf.math.log1p(tf.cast(t, tf.float32)) / 5.0,
}
# Id feature -> (table, kind): "id", "attribute" or "cross" (its dim and rows).
_TABLES = {
    "user_id": ("user", "id"),
    "location": ("location", "id"),
    "country": ("country", "attribute"),
    "age_bucket": ("age_bucket", "attribute"),
    "isbn": ("isbn", "id"),
    "author": ("author", "id"),
    "publisher": ("publisher", "id"),
    "year": ("year", "attribute"),
    "title_tokens": ("title_token", "attribute"),
}


class BookCrossingListwise(RankerBuilder):
  """See the module docstring."""

  name = "book_crossing_listwise"
  DataConfig = BookCrossingDataConfig
  ModelConfig = BookCrossingModelConfig

  def prepare_data(self, data: BookCrossingDataConfig) -> DataPaths:
    """See `RankerBuilder`. ELWC files already in the output directory are used as they are."""
    data_dir = pathlib.Path(data.data_dir) if data.data_dir else fetch_lib.fetch("book_crossing")
    out = pathlib.Path(data.elwc_dir) if data.elwc_dir else data_dir / (
        f"elwc_v{data.valid_fraction}_m{data.min_ratings}_l{data.max_list_size}"
        f"_s{data.split_seed}_{data.on_bad_record}_{FEATURES_VERSION}")
    train, valid = out / "train.tfrecord", out / "valid.tfrecord"
    stats_path = out / lists_lib.STATS_FILE
    if not (train.exists() and valid.exists() and stats_path.exists()):
      lists_lib.build_book_crossing_elwc(data_dir, out, data.valid_fraction, data.min_ratings,
                                         data.max_list_size, data.split_seed, data.on_bad_record)
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    # The CSVs' skipped records, reported with the training split.
    return DataPaths(str(train), str(valid), bad_records={"train": stats["bad_records"]},
                     valid_list_size=stats["valid"]["longest_list"])

  def feature_specs(self):
    return dict(CONTEXT_SPEC), dict(EXAMPLE_SPEC), LABEL_SPEC

  def model_feature_specs(self, model: BookCrossingModelConfig) -> tuple[dict, dict]:
    """(context, example) specs of the features `model` uses (its crosses and statistics)."""
    unused = {c for c in lists_lib.CROSSES if c not in model.crosses}
    if not model.rating_statistics:
      unused |= set(lists_lib.STATISTICS_FEATURES)
    return dict(CONTEXT_SPEC), {k: v for k, v in EXAMPLE_SPEC.items() if k not in unused}

  def sparse_features(self, model: BookCrossingModelConfig):
    dims = {"id": model.id_dim, "attribute": model.attribute_dim, "cross": model.cross_dim}
    rows = {
        "id": model.id_vocabulary_size, "attribute": model.attribute_vocabulary_size,
        "cross": model.cross_vocabulary_size
    }
    tables_of = {**_TABLES, **{name: (name, "cross") for name in model.crosses}}
    features, tables = [], []
    for feature, (table, kind) in tables_of.items():
      spec = CONTEXT_SPEC.get(feature, EXAMPLE_SPEC.get(feature))
      combiner = model.combiner if feature == "title_tokens" else "mean"
      features.append(SparseFeature(feature, table, combiner=combiner))
      key_dtype = "string" if spec.dtype == tf.string else "int64"
      tables.append(TableSpec(table, dims[kind], key_dtype=key_dtype, **_tiers(model, rows[kind])))
    return features, tables

  def build_model_builder(self, model: BookCrossingModelConfig, seed):
    features, tables = self.sparse_features(model)
    statistics = lists_lib.STATISTICS_FEATURES if model.rating_statistics else ()
    scorer = MovieLensScorer(model.hidden_layer_dims, dropout=model.dropout,
                             use_batch_norm=model.use_batch_norm, dot_product=model.dot_product,
                             id_l2=model.id_l2, user_feature="user_id", item_feature="isbn",
                             linear_features=statistics)
    return model_lib.ModelBuilder(
        input_creator=model_lib.FeatureSpecInputCreator(*self.model_feature_specs(model)),
        preprocessor={k: PREPROCESS_SPEC[k] for k in statistics}, scorer=scorer,
        mask_feature_name=MASK_FEATURE, sparse_features=features, tables=tables, seed=seed,
        name="book_crossing_listwise")

  def build_baseline(self, paths: DataPaths, data: BookCrossingDataConfig):
    """Mean training rating of each ISBN (from the training ELWC file)."""
    return item_mean_baseline(paths.train, "isbn", EXAMPLE_SPEC["isbn"], LABEL_SPEC)[0]

  def baseline_means(self, data) -> ItemMeans:
    """See `RankerBuilder`: the mean rating of each ISBN, partition by partition."""
    del data
    return ItemMeans("isbn", EXAMPLE_SPEC["isbn"], LABEL_SPEC)


def isbn_means(train_pattern: str) -> tuple[dict[bytes, float], float]:
  """({ISBN: mean rating}, global mean) of the training lists (padding left out).

  Raises:
    ValueError: no rated book in the files.
  """
  _, means, global_mean = item_mean_baseline(train_pattern, "isbn", EXAMPLE_SPEC["isbn"],
                                             LABEL_SPEC)
  return means, global_mean


def _tiers(model: BookCrossingModelConfig, rows: int) -> dict:
  """TableSpec row fields of a table of `rows` rows: all on the device, or tiered by fraction."""
  if model.device_fraction >= 1.0:
    return {"device_vocabulary_size": rows}
  device = math.ceil(model.device_fraction * rows)
  host = math.ceil(model.host_fraction * rows)
  return {
      "device_vocabulary_size": device, "host_vocabulary_size": host,
      "ssd_vocabulary_size": max(0, rows - device - host),
      "ssd_data_path": tuple(model.ssd_data_path), "cache_policy": model.cache_policy
  }
