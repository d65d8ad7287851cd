"""The movielens_listwise ranker's DataConfig and ModelConfig, TensorFlow-free.

See builders/movielens.py for the ranker and docs/configuration.md for the keys.
"""

from __future__ import annotations

import dataclasses
import pathlib

from builders.base_config import check_bad_record_options, check_dnn_options

RELEVANCES = ("graded", "liked")


@dataclasses.dataclass
class MovieLensDataConfig:
  """Where the MovieLens lists come from and what their labels mean.

  Attributes:
    data_dir: Directory of ml-100k.{inter,user,item} (RecBole atomic files);
      None fetches the pinned copy (mxrec-pipeline data fetch movielens_100k).
    elwc_dir: Where the ELWC files go; None: beside the fetched data.
    valid_fraction: Share of each user's latest ratings for validation, in (0, 1).
    max_list_size: Longer user lists are cut into consecutive lists of at
      most this many movies (no rating dropped); None keeps them whole.
    relevance: "graded" (rating - 1) or "liked" (max(rating - 3, 0)); see
      docs/configuration.md. Model and baseline are scored on the same labels.
    rating_range: [low, high]: the allowed ratings, inclusive (ml-100k: 1-5).
    on_bad_record: "error" (a rating row with a non-integer id, a
      non-finite timestamp or a rating that is not finite or outside
      rating_range stops the job, naming file:line) or "skip" (such rows
      are dropped and counted in the log and metrics.json).
  """

  data_dir: str | None = None
  elwc_dir: str | None = None
  valid_fraction: float = 0.2
  max_list_size: int | None = 100
  relevance: str = "graded"
  rating_range: list[float] = dataclasses.field(default_factory=lambda: [1.0, 5.0])
  on_bad_record: str = "error"

  def __post_init__(self):
    check_bad_record_options(self.on_bad_record, self.rating_range, "data.rating_range")
    if not 0.0 < self.valid_fraction < 1.0:
      raise ValueError(f"data.valid_fraction must be in (0, 1), got {self.valid_fraction}")
    if self.data_dir is not None and not pathlib.Path(self.data_dir).is_dir():
      raise ValueError(f"data.data_dir: no such directory: {self.data_dir}")
    if self.relevance not in RELEVANCES:
      raise ValueError(f"data.relevance must be one of {RELEVANCES}, got {self.relevance!r}")


# mxrec_pipeline.keras.layers.COMBINERS (a test keeps them equal).
COMBINERS = ("sum", "mean", "sqrtn")


@dataclasses.dataclass
class MovieLensTablesConfig:
  """The MovieLens features a ranker uses and the tables of its id features.

  Shared by every MovieLens ranker's ModelConfig (movielens_listwise's,
  movielens_dcn's), so builders/movielens.py reads typed fields only.

  Attributes:
    id_dim: Embedding dim of user_id and item_id.
    attribute_dim: Embedding dim of the other id features.
    device_vocabulary_size: Rows of every table (distinct ids it can hold).
    id_device_vocabulary_size: Device rows of the user_id and item_id tables
      (their device cache when tiered); None: device_vocabulary_size.
    host_vocabulary_size: Host-memory rows of the user_id and item_id tables;
      > 0 makes them tiered (docs/tiers.md).
    ssd_vocabulary_size: SSD rows of those tables (needs host rows).
    ssd_data_path: Directories of their SSD files.
    cache_policy: "lru" or "lfu": the device caches' policy.
    combiner: Combiner of genres and title tokens: mean, sum or sqrtn.
    table_initializer: Initial rows of every table: "truncated_normal" (the
      default) or "zeros" (TableSpec.initializer).
    user_history: Use the user's training movies and their genres
      (history_item_ids -> table "history_item", history_genres -> table
      "genre", both `combiner`-pooled; mxrec_pipeline/data/movielens.py).
    rating_statistics: Use each movie's leave-one-out mean training rating,
      its rating count and the user's neighbors' rating deviation (dense
      example features; mxrec_pipeline/data/movielens.py).
    mf_rating: Use biased matrix factorization's predicted rating of each
      (user, movie), fitted by ALS on the training ratings (cross-fitted for
      training examples; a dense example feature, also in the linear term of
      movielens_listwise's scorer; mxrec_pipeline/data/movielens.py).
    item_knn: Use item-based collaborative filtering's deviation of each
      (user, movie) (the user's ratings of the most similar training movies;
      cross-fitted as mf_rating; dense, also in that linear term).
  """

  id_dim: int = 16
  attribute_dim: int = 8
  device_vocabulary_size: int = 20_000
  id_device_vocabulary_size: int | None = None
  host_vocabulary_size: int = 0
  ssd_vocabulary_size: int = 0
  ssd_data_path: list[str] = dataclasses.field(default_factory=list)
  cache_policy: str = "lru"
  combiner: str = "mean"
  table_initializer: str = "truncated_normal"
  user_history: bool = True
  rating_statistics: bool = True
  mf_rating: bool = True
  item_knn: bool = True

  def __post_init__(self):
    if self.combiner not in COMBINERS:
      raise ValueError(f"model.combiner must be one of {COMBINERS}, got {self.combiner!r}")


@dataclasses.dataclass
class MovieLensModelConfig(MovieLensTablesConfig):
  """The ranker (MovieLensScorer); its features and tables as MovieLensTablesConfig.

  Attributes:
    hidden_layer_dims: Units of the DNN's hidden layers.
    dropout: Dropout rate of the DNN, in [0, 1).
    use_batch_norm: Batch normalization in the DNN.
    dot_product: Add the user_id . item_id embedding dot product to the logit.
    id_l2: L2 penalty on the user_id and item_id embeddings, per occurrence:
      `id_l2 * ||e||^2` averaged over the batch's (padded) examples, >= 0.
    num_attention_heads: > 0: self-attention across the movies of each list
      (tfr.keras.layers.DocumentInteractionAttention, `dropout` as the DNN's)
      over the concatenated example features, its output joining the DNN's
      input (builders/movielens.py `MovieLensScorer`); 0 (default): none.
    attention_head_size: Units per attention head, > 0.
    ensemble_size: Independently initialized DNN towers over the same
      features and tables, >= 1; their logits are averaged
      (builders/ensemble.py `EnsembleMean`), the linear and dot-product terms
      shared. 1 (default): one DNN.
    (the rest): MovieLensTablesConfig's.
  """

  hidden_layer_dims: list[int] = dataclasses.field(default_factory=lambda: [64, 32])
  dropout: float = 0.0
  use_batch_norm: bool = False
  dot_product: bool = True
  id_l2: float = 4.0
  num_attention_heads: int = 0
  attention_head_size: int = 16
  ensemble_size: int = 1

  def __post_init__(self):
    super().__post_init__()
    check_dnn_options(self.hidden_layer_dims, self.dropout)
    if self.num_attention_heads < 0 or self.attention_head_size <= 0:
      raise ValueError(f"model.num_attention_heads must be >= 0 and model.attention_head_size "
                       f"> 0, got {self.num_attention_heads}, {self.attention_head_size}")
    if self.ensemble_size < 1:
      raise ValueError(f"model.ensemble_size must be >= 1, got {self.ensemble_size}")
    if not self.id_l2 >= 0.0:
      raise ValueError(f"model.id_l2 must be >= 0, got {self.id_l2}")
