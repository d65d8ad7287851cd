"""The letor_leaves ranker's ModelConfig, TensorFlow-free (see builders/letor_leaves.py).

Its data section is mslr_dnn's (`MslrDataConfig`): any LETOR files.
"""

from __future__ import annotations

import dataclasses

from builders.mslr_config import MslrModelConfig

CROSS_FIT, DISJOINT = "cross_fit", "disjoint"
ENCODINGS = (CROSS_FIT, DISJOINT)
COMBINERS = ("sum", "mean", "sqrtn")  # core/combiner.py's, without importing TensorFlow.


@dataclasses.dataclass
class LeavesModelConfig(MslrModelConfig):
  """mslr_dnn's DNN with each document's LambdaMART leaves as id features.

  Attributes (besides MslrModelConfig's):
    encoding: How the trees are kept from the lists whose leaves train the
      DNN: "cross_fit" (`num_folds` models, each fitted without one fold of
      the training lists; a list trains with its fold's leaves; validation
      and the export score every fold's leaves and average) or "disjoint"
      (one model fitted on `tree_fraction` of the training lists; the DNN
      trains on the others).
    num_folds: Folds of "cross_fit", >= 2.
    tree_fraction: Share of the training lists the trees of "disjoint" are
      fitted on, in (0, 0.5] (at least one list, at most half).
    num_trees: Trees per model (LightGBM's n_estimators), > 0.
    num_leaves: The most leaves of a tree, >= 2.
    tree_learning_rate: LightGBM's learning_rate, > 0.
    min_child_samples: Documents in a leaf at least, >= 1.
    tree_seed: Seed of the folds (or split) and of LightGBM.
    leaf_dim: Dimension of a leaf's embedding, > 0.
    leaf_combiner: How a document's leaves (one per tree) are combined:
      "mean", "sum" or "sqrtn" (a combiner of TPUEmbedding's; "sum" of
      1-dimensional embeddings is He et al.'s linear model over the leaves).
      The table trains with the pipeline's sparse optimizer and
      `pipeline.sparse_learning_rate`.
  """

  encoding: str = CROSS_FIT
  num_folds: int = 5
  tree_fraction: float = 0.5
  num_trees: int = 100
  num_leaves: int = 31
  tree_learning_rate: float = 0.1
  min_child_samples: int = 20
  tree_seed: int = 0
  leaf_dim: int = 8
  leaf_combiner: str = "mean"

  def __post_init__(self):
    super().__post_init__()
    if self.encoding not in ENCODINGS:
      raise ValueError(f"model.encoding must be one of {ENCODINGS}, got {self.encoding!r}")
    for name, low in (("num_folds", 2), ("num_trees", 1), ("num_leaves", 2), ("min_child_samples",
                                                                              1), ("leaf_dim", 1)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"model.{name} must be an int >= {low}, got {value!r}")
    if not 0.0 < self.tree_fraction <= 0.5:
      raise ValueError(f"model.tree_fraction must be in (0, 0.5], got {self.tree_fraction!r}")
    if not self.tree_learning_rate > 0:
      raise ValueError(f"model.tree_learning_rate must be positive, got "
                       f"{self.tree_learning_rate!r}")
    if self.leaf_combiner not in COMBINERS:
      raise ValueError(f"model.leaf_combiner must be one of {COMBINERS}, got "
                       f"{self.leaf_combiner!r}")

  @property
  def num_models(self) -> int:
    """Tree models: `num_folds` cross-fitted, or one."""
    return self.num_folds if self.encoding == CROSS_FIT else 1
