"""The movielens_dcn ranker's ModelConfig, TensorFlow-free (see builders/movielens_dcn.py)."""

from __future__ import annotations

import dataclasses

from builders.base_config import check_dnn_options
from builders.movielens_config import MovieLensTablesConfig


@dataclasses.dataclass
class DcnModelConfig(MovieLensTablesConfig):
  """The DCN-v2 ranker; its features and tables as MovieLensTablesConfig.

  Attributes:
    num_cross_layers: Cross layers, >= 0 (0 leaves a plain DNN).
    projection_dim: Rank of each cross's W, > 0; None: full rank.
    hidden_layer_dims: Units of the DNN after the crosses, each > 0.
    dropout: Dropout after each hidden layer, in [0, 1).
    (the rest): MovieLensTablesConfig's (tables, tiers, feature switches).
  """

  num_cross_layers: int = 2
  projection_dim: int | None = None
  hidden_layer_dims: list[int] = dataclasses.field(default_factory=lambda: [64, 32])
  dropout: float = 0.0

  def __post_init__(self):
    super().__post_init__()
    if self.num_cross_layers < 0:
      raise ValueError(f"model.num_cross_layers must be >= 0, got {self.num_cross_layers}")
    if self.projection_dim is not None and self.projection_dim <= 0:
      raise ValueError(f"model.projection_dim must be positive or null, "
                       f"got {self.projection_dim}")
    check_dnn_options(self.hidden_layer_dims, self.dropout)
