"""Tree models whose leaves feed a ranker as id features, fitted so no list sees its own trees.

He et al., "Practical Lessons from Predicting Clicks on Ads at Facebook"
(ADKDD 2014), feed each tree's leaf as a categorical feature to a second model.
The trees must not have been fitted on the lists whose leaves train that model,
or the leaves carry those lists' labels. Two ways, both here:

* cross-fitting (`num_folds` >= 2): the training lists are dealt to k folds
  at random (by list id, seeded) and fold j's model is fitted on the other
  folds; a training list gets the leaves of its fold's model. A list the
  trees never saw (validation, serving) gets all k models' leaves (the
  out-of-fold scheme of stacked generalization: Wolpert, Neural Networks 1992);
* a disjoint split (`num_folds` 1): one model fitted on lists the ranker
  does not train on (the caller splits them off).

LightGBM's LambdaMART (gbdt/lambdamart.py's parameters). `LeafModels.save`
and `load` keep the fitted models (LightGBM's text format) so a resumed run
reads the trees its tables were keyed by; gbdt/leaf_ids.py evaluates them in
TensorFlow.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Iterable

import numpy as np

from mxrec_pipeline.gbdt import lambdamart
from mxrec_pipeline.gbdt import tree_ops
from mxrec_pipeline.gbdt.config import LambdaMartConfig
from mxrec_pipeline.util import model_files

FOLDS_FILE = "folds.json"  # Written last: a directory without it holds no finished fit.


@dataclasses.dataclass
class LeafModels:
  """k fitted tree models and which training list each one did not see.

  Attributes:
    boosters: One `lightgbm.Booster` per fold, each of at most `num_trees`
      trees of at most `num_leaves` leaves.
    fold_of_list: Training list id (qid) -> the fold whose model was fitted
      without it; empty with one model (a disjoint split).
    num_trees: Trees per model (the config's; padded by `tree_arrays`).
    num_leaves: The most leaves of a tree.
    info: What was fitted (for metrics.json): folds, lists, documents, trees.
  """

  boosters: list
  fold_of_list: dict[int, int]
  num_trees: int
  num_leaves: int
  info: dict

  @property
  def num_folds(self) -> int:
    return len(self.boosters)

  def tree_arrays(self) -> tree_ops.TreeArrays:
    """Every model's trees as one TreeArrays: fold j's tree t is tree j * num_trees + t."""
    return tree_ops.stack_trees([tree_ops.TreeArrays.from_booster(b) for b in self.boosters],
                                self.num_trees)

  def save(self, directory: str) -> None:
    """Writes `fold_<j>.txt` (LightGBM's text model) per fold, then FOLDS_FILE, each atomically."""
    os.makedirs(directory, exist_ok=True)
    for j, booster in enumerate(self.boosters):
      model_files.write_text_atomically(os.path.join(directory, f"fold_{j}.txt"),
                                        booster.model_to_string())
    record = dict(fold_of_list={str(k): v for k, v in self.fold_of_list.items()},
                  num_trees=self.num_trees, num_leaves=self.num_leaves, info=self.info)
    model_files.write_text_atomically(os.path.join(directory, FOLDS_FILE), json.dumps(record))

  @classmethod
  def load(cls, directory: str) -> "LeafModels | None":
    """The models `save` wrote to `directory`, or None when it holds no finished save.

    Raises:
      LambdaMartUnavailable: lightgbm is not installed.
    """
    path = os.path.join(directory, FOLDS_FILE)
    if not os.path.isfile(path):
      return None
    lightgbm = lambdamart.import_lightgbm()
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
    boosters = [
        lightgbm.Booster(model_file=os.path.join(directory, f"fold_{j}.txt"))
        for j in range(record["info"]["folds"])
    ]
    return cls(boosters, {int(k): v for k, v in record["fold_of_list"].items()},
               record["num_trees"], record["num_leaves"], record["info"])


def assign_folds(list_ids: Iterable[int], num_folds: int, seed: int) -> dict[int, int]:
  """List id -> fold in [0, num_folds): the ids sorted, permuted by `seed`, dealt in turn.

  Raises:
    ValueError: fewer distinct ids than folds (a fold would be empty).
  """
  ids = sorted(set(int(i) for i in list_ids))
  if len(ids) < num_folds:
    raise ValueError(f"{num_folds} folds need at least {num_folds} training lists, got "
                     f"{len(ids)}")
  order = np.random.default_rng(seed).permutation(len(ids))
  return {ids[i]: position % num_folds for position, i in enumerate(order.tolist())}


def fit(batches: Iterable, example_spec, config: LambdaMartConfig, num_folds: int,
        seed: int) -> LeafModels:
  """Fits LambdaMART `num_folds` times (each without one fold), or once on every list.

  Args:
    batches: (features, labels) batches of the lists to fit on (raw features,
      whole lists), their context holding the list id
      `lambdamart.LIST_ID_FEATURE` ([batch_size, 1] int64).
    example_spec: The dense example features, in column order (the
      ranker's example feature spec); every one becomes a numeric column.
    config: The trees: n_estimators, num_leaves, learning_rate,
      min_child_samples, num_threads (lambdamart.lgbm_params).
    num_folds: >= 2 to cross-fit, 1 for one model on every list.
    seed: Seed of the folds and LightGBM's.

  Raises:
    ValueError: `num_folds` < 1, fewer lists than folds, or (folds > 1)
      lists sharing an id.
    LambdaMartUnavailable: lightgbm missing, no labeled document, labels
      that are not integer grades, or LightGBM's own error.
  """
  if num_folds < 1:
    raise ValueError(f"num_folds must be >= 1, got {num_folds}")
  lightgbm = lambdamart.import_lightgbm()
  layout = lambdamart.feature_layout({}, example_spec)
  list_ids: list = []
  matrix, labels, group = lambdamart.collect(batches, lambdamart.Encoder(layout), list_ids)
  if num_folds > 1 and len(set(list_ids)) < len(list_ids):
    shared = sorted(i for i, n in collections.Counter(list_ids).items() if n > 1)
    raise ValueError(f"{len(list_ids)} training lists have {len(set(list_ids))} distinct "
                     f"{lambdamart.LIST_ID_FEATURE}s (shared: {shared[:5]}; -1: missing): "
                     "cross-fitting deals lists to folds by their id, each list needs its own")
  params = lambdamart.lgbm_params(config, seed)
  fold_of_list = assign_folds(list_ids, num_folds, seed) if num_folds > 1 else {}
  list_fold = np.array([fold_of_list.get(i, -1) for i in list_ids])
  doc_fold = np.repeat(list_fold, group)
  boosters = []
  for j in range(num_folds):
    fitted_on = list_fold != j
    rows = doc_fold != j
    data = lightgbm.Dataset(matrix[rows], labels[rows], group=group[fitted_on],
                            params={"verbose": -1})
    try:
      boosters.append(lightgbm.train(params, data, num_boost_round=config.n_estimators))
    except lightgbm.basic.LightGBMError as e:
      raise lambdamart.LambdaMartUnavailable(f"LightGBM failed on fold {j}: {e}") from e
  info = dict(folds=num_folds, lists=int(group.size), documents=int(labels.size),
              trees=[b.num_trees() for b in boosters], seed=seed,
              lightgbm_version=lightgbm.__version__)
  return LeafModels(boosters, fold_of_list, config.n_estimators, config.num_leaves, info)
