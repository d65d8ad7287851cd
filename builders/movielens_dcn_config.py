"""The movielens_dcn ranker's ModelConfig, TensorFlow-free (see builders/movielens_dcn.py)."""

from __future__ import annotations

import dataclasses

from builders.base_config import check_dnn_options

# mxrec_pipeline.keras.layers.COMBINERS (a test keeps them equal).
COMBINERS = ("sum", "mean", "sqrtn")


@dataclasses.dataclass
class DcnModelConfig:
  """The DCN-v2 ranker and its tables.

  Attributes:
    num_cross_layers: Cross layers, >= 0 (0 leaves a plain DNN).
    projection_dim: Rank of each cross's W, > 0; None: full rank.
    hidden_layer_dims: Units of the DNN after the crosses, each > 0.
    dropout: Dropout after each hidden layer, in [0, 1).
    id_dim: Embedding dim of user_id and item_id.
    attribute_dim: Embedding dim of the other id features.
    device_vocabulary_size: Rows of every table (distinct ids it can hold).
    combiner: Combiner of genres and title tokens: mean, sum or sqrtn.
  """

  num_cross_layers: int = 2
  projection_dim: int | None = None
  hidden_layer_dims: list[int] = dataclasses.field(default_factory=lambda: [64, 32])
  dropout: float = 0.0
  id_dim: int = 16
  attribute_dim: int = 8
  device_vocabulary_size: int = 20_000
  combiner: str = "mean"

  def __post_init__(self):
    if self.num_cross_layers < 0:
      raise ValueError(f"model.num_cross_layers must be >= 0, got {self.num_cross_layers}")
    if self.projection_dim is not None and self.projection_dim <= 0:
      raise ValueError(f"model.projection_dim must be positive or null, "
                       f"got {self.projection_dim}")
    check_dnn_options(self.hidden_layer_dims, self.dropout)
    if self.combiner not in COMBINERS:
      raise ValueError(f"model.combiner must be one of {COMBINERS}, got {self.combiner!r}")
