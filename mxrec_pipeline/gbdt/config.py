"""LambdaMartConfig: the `lambdamart:` section of a job config, TensorFlow-free.

A job's validation also scores LightGBM's LambdaMART (objective
"lambdarank", LGBMRanker's parameters) trained on the job's training file,
so metrics.json holds the strong classical baseline beside the model
(mxrec_pipeline/gbdt/lambdamart.py). The defaults are LightGBM 4's own
defaults of `lightgbm.LGBMRanker`
(https://lightgbm.readthedocs.io/en/stable/pythonapi/lightgbm.LGBMRanker.html):
100 trees of at most 31 leaves, learning rate 0.1, 20 documents per leaf;
but one thread by default (`num_threads`): LightGBM's OpenMP threads spin
while they wait, and on a machine whose cores are busy (TensorFlow's threads,
other jobs) 2 threads fitted 5,000 documents x 136 features in 25-33 s where
one thread took 1.2 s (2 cores, load 5).
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class LambdaMartConfig:
  """LightGBM LambdaMART trained and scored beside the job's model.

  Attributes:
    enabled: Train and score it (when LightGBM is installed); false: metrics.json
      says `"lambdamart": null` with the reason.
    n_estimators: Boosting rounds (trees), > 0.
    learning_rate: Shrinkage of each tree, > 0.
    num_leaves: Maximum leaves per tree, >= 2.
    min_child_samples: Minimum documents in a leaf, >= 1.
    seed: LightGBM's `seed` (`random_state`); None: the job's `pipeline.seed`
      (None too: LightGBM's default seeds). With the defaults (no bagging, no
      feature subsampling) the trees do not depend on it.
    num_threads: LightGBM's threads, >= 0; 0: OpenMP's default (one per core).
    early_stopping_rounds: None (default: `n_estimators` trees), or in a
      job whose data hold training lists out (`DataPaths.holdout`) with
      `pipeline.early_stopping`: the trees are fitted on the other lists,
      stopping once NDCG@10 on the held-out ones has not improved for this
      many rounds (`lightgbm.early_stopping`; `n_estimators` is the most);
      then, as the model, the best round's trees are kept, or with
      `then: retrain` that many trees are fitted on every training list.
  """

  enabled: bool = True
  n_estimators: int = 100
  learning_rate: float = 0.1
  num_leaves: int = 31
  min_child_samples: int = 20
  seed: int | None = None
  num_threads: int = 1
  early_stopping_rounds: int | None = None

  def __post_init__(self):
    if self.n_estimators <= 0:
      raise ValueError(f"lambdamart.n_estimators must be positive, got {self.n_estimators}")
    if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
      raise ValueError(f"lambdamart.learning_rate must be positive, got {self.learning_rate}")
    if self.num_leaves < 2:
      raise ValueError(f"lambdamart.num_leaves must be >= 2, got {self.num_leaves}")
    if self.num_threads < 0:
      raise ValueError(f"lambdamart.num_threads must be >= 0, got {self.num_threads}")
    if self.early_stopping_rounds is not None and self.early_stopping_rounds < 1:
      raise ValueError("lambdamart.early_stopping_rounds must be positive, got "
                       f"{self.early_stopping_rounds}")
    if self.min_child_samples < 1:
      raise ValueError(f"lambdamart.min_child_samples must be >= 1, got {self.min_child_samples}")
