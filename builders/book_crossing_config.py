"""The book_crossing_listwise ranker's DataConfig and ModelConfig, TensorFlow-free.

See builders/book_crossing.py for the ranker and docs/configuration.md for the keys.
"""

from __future__ import annotations

import dataclasses
import pathlib

from builders.base_config import check_dnn_options
from mxrec_pipeline.data import validation

# The crosses of mxrec_pipeline/data/book_crossing_lists.py (CROSSES), kept here without its
# imports; tests/builders/test_builders_book_crossing.py checks that both agree.
CROSSES = ("user_author", "user_publisher", "location_isbn", "country_author", "age_author")
COMBINERS = ("mean", "sum", "sqrtn")


@dataclasses.dataclass
class BookCrossingDataConfig:
  """Where the Book-Crossing lists come from.

  Attributes:
    data_dir: Directory of BX-{Book-Ratings,Books,Users}.csv; None fetches the
      pinned copy (mxrec-pipeline data fetch book_crossing).
    elwc_dir: Where the ELWC files go; None: beside the data.
    valid_fraction: Share of each user's explicit ratings for validation, in (0, 1).
    min_ratings: Users with fewer explicit ratings (1-10) are left out, >= 2.
    max_list_size: Longer user lists are cut into consecutive lists of at most
      this many books (no rating dropped); None keeps them whole.
    split_seed: Seed of the random per-user split (the same seed, the same split).
    on_bad_record: "error" (a bad CSV record stops the job, naming file:line)
      or "skip" (such records are dropped and counted in the log and
      metrics.json); see mxrec_pipeline/data/book_crossing.py.
  """

  data_dir: str | None = None
  elwc_dir: str | None = None
  valid_fraction: float = 0.2
  min_ratings: int = 5
  max_list_size: int | None = 100
  split_seed: int = 0
  on_bad_record: str = "error"

  def __post_init__(self):
    validation.check_on_bad_record(self.on_bad_record)
    if not 0.0 < self.valid_fraction < 1.0:
      raise ValueError(f"data.valid_fraction must be in (0, 1), got {self.valid_fraction}")
    if self.min_ratings < 2:
      raise ValueError(f"data.min_ratings must be >= 2, got {self.min_ratings}")
    if self.max_list_size is not None and self.max_list_size < 1:
      raise ValueError(f"data.max_list_size must be positive, got {self.max_list_size}")
    if self.data_dir is not None and not pathlib.Path(self.data_dir).is_dir():
      raise ValueError(f"data.data_dir: no such directory: {self.data_dir}")


@dataclasses.dataclass
class BookCrossingModelConfig:
  """The ranker (a DNN plus a linear term plus user . ISBN) and its tables.

  Attributes:
    hidden_layer_dims: Units of the DNN's hidden layers.
    dropout: Dropout rate of the DNN, in [0, 1).
    use_batch_norm: Batch normalization in the DNN.
    id_dim: Embedding dim of user_id, isbn, author, publisher and location.
    attribute_dim: Embedding dim of country, age_bucket, year and title tokens.
    cross_dim: Embedding dim of each cross.
    id_vocabulary_size: Rows of each id table (the most distinct ids it holds).
    attribute_vocabulary_size: Rows of each attribute table.
    cross_vocabulary_size: Rows of each cross's table.
    device_fraction: Share of each table's rows on the device, in (0, 1]; below
      1 every table is tiered (docs/tiers.md): ceil(fraction x rows) device
      rows cache the rest, held in host memory and on SSD.
    host_fraction: Share of each table's rows in host memory when tiered, in
      (0, 1 - device_fraction]; the rows left over go to SSD.
    ssd_data_path: Directories of the tiered tables' SSD files ([]: the
      current directory, as mxRec).
    cache_policy: "lru" or "lfu": the tiered tables' device caches' policy.
    crosses: The crosses used, a subset of CROSSES (each its own string-key table).
    combiner: Combiner of the title tokens: mean, sum or sqrtn.
    dot_product: Add the user_id . isbn embedding dot product to the logit.
    id_l2: L2 penalty on the user_id and isbn embeddings, per occurrence, >= 0.
    rating_statistics: Use the training split's rating statistics (dense
      example features, also in the linear term; leave-one-out on training
      lists): the ISBN's and the author's mean rating and count, the user's
      deviation on the author's other books.
  """

  hidden_layer_dims: list[int] = dataclasses.field(default_factory=lambda: [64, 32])
  dropout: float = 0.3
  use_batch_norm: bool = False
  id_dim: int = 16
  attribute_dim: int = 8
  cross_dim: int = 8
  id_vocabulary_size: int = 200_000
  attribute_vocabulary_size: int = 100_000
  cross_vocabulary_size: int = 300_000
  device_fraction: float = 1.0
  host_fraction: float = 0.0
  ssd_data_path: list[str] = dataclasses.field(default_factory=list)
  cache_policy: str = "lru"
  crosses: list[str] = dataclasses.field(default_factory=lambda: list(CROSSES))
  combiner: str = "mean"
  dot_product: bool = True
  id_l2: float = 1.0
  rating_statistics: bool = True

  def __post_init__(self):
    check_dnn_options(self.hidden_layer_dims, self.dropout)
    for name in ("id_dim", "attribute_dim", "cross_dim", "id_vocabulary_size",
                 "attribute_vocabulary_size", "cross_vocabulary_size"):
      if getattr(self, name) <= 0:
        raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
    unknown = [c for c in self.crosses if c not in CROSSES]
    if unknown or len(set(self.crosses)) != len(self.crosses):
      raise ValueError(f"model.crosses must be distinct names of {list(CROSSES)}, "
                       f"got {self.crosses}")
    if not 0.0 < self.device_fraction <= 1.0:
      raise ValueError(f"model.device_fraction must be in (0, 1], got {self.device_fraction}")
    if self.device_fraction < 1.0 and not 0.0 < self.host_fraction <= 1.0 - self.device_fraction:
      raise ValueError(f"model.host_fraction must be in (0, 1 - device_fraction = "
                       f"{1.0 - self.device_fraction:g}] when model.device_fraction < 1 (tiered "
                       f"tables need host rows), got {self.host_fraction}")
    if self.cache_policy not in ("lru", "lfu"):
      raise ValueError(f"model.cache_policy must be 'lru' or 'lfu', got {self.cache_policy!r}")
    if self.combiner not in COMBINERS:
      raise ValueError(f"model.combiner must be one of {COMBINERS}, got {self.combiner!r}")
    if not self.id_l2 >= 0.0:
      raise ValueError(f"model.id_l2 must be >= 0, got {self.id_l2}")
