"""The leaf of every tree of every fold as int64 ids: a feature derived before insertion.

`LeafIds` is a feature deriver (keras/datasets.BaseDatasetBuilder's
`feature_deriver`, the export's too): from a batch's dense example features it
computes, with stock TensorFlow ops (gbdt/tree_ops.py), the id of the leaf each
document reaches in each tree, key (fold, tree, leaf) packed as
`(fold * num_trees + tree) * num_leaves + leaf`, so the keys of k folds never
collide and a table of `num_folds * num_trees * num_leaves` rows holds them
all. Training batches get their list's fold only (gbdt/leaf_trees.py: the
model fitted without that list), as [batch, list, 1, trees]; validation and
serving get every fold's, [batch, list, folds, trees], which the ranker scores
once each and averages.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from mxrec_pipeline.gbdt import lambdamart
from mxrec_pipeline.gbdt import tree_ops

LEAF_IDS = "leaf_ids"


class LeafIds:
  """Derives the `LEAF_IDS` feature from the dense example features (see the module docstring).

  Args:
    trees: Every fold's trees, stacked (`LeafModels.tree_arrays()`): fold
      j's tree t at j * num_trees + t.
    num_folds: Folds (models), >= 1.
    num_trees: Trees per fold.
    num_leaves: The most leaves of a tree.
    feature_names: The example features the trees split on, in their column
      order; each [batch, list, 1] float32.
    fold_of_list: Training list id -> its fold (needed with num_folds > 1).
    mask_feature_name: The list mask, [batch, list] bool: padding documents
      are not walked (they get leaf 0 of every tree).
    name: The derived feature's name.

  Raises:
    ValueError: stacked trees that are not num_folds x num_trees, a tree of
      more than num_leaves leaves, or fewer columns than the trees split on.
  """

  def __init__(self, trees: tree_ops.TreeArrays, num_folds: int, num_trees: int, num_leaves: int,
               feature_names: Sequence[str], fold_of_list: Mapping[int, int] | None = None,
               mask_feature_name: str = "example_list_mask", name: str = LEAF_IDS):
    if trees.num_trees != num_folds * num_trees:
      raise ValueError(f"LeafIds: {trees.num_trees} trees are not {num_folds} folds x "
                       f"{num_trees} trees")
    if trees.num_leaves.size and int(trees.num_leaves.max()) > num_leaves:
      raise ValueError(f"LeafIds: a tree has {int(trees.num_leaves.max())} leaves, more than "
                       f"num_leaves {num_leaves} (keys of neighbouring trees would collide)")
    if trees.num_features > len(feature_names):
      raise ValueError(f"LeafIds: the trees split on {trees.num_features} columns, "
                       f"{len(feature_names)} features given")
    self._trees = trees
    self.num_folds, self.num_trees, self.num_leaves = num_folds, num_trees, num_leaves
    self._columns = list(feature_names)
    self._name = name
    self._mask = mask_feature_name
    folds = sorted((fold_of_list or {}).items())
    self._list_ids = np.array([k for k, _ in folds], np.int64)
    self._folds = np.array([v for _, v in folds], np.int64)
    if num_folds > 1 and not folds:
      raise ValueError("LeafIds: several folds need fold_of_list")

  @property
  def feature_names(self) -> tuple[str, ...]:
    """The features it adds."""
    return (self._name,)

  def _fold_of(self, list_ids: tf.Tensor) -> tf.Tensor:
    """[B] int64 folds of [B, 1] list ids; fails naming the ids no fold holds."""
    list_ids = tf.reshape(list_ids, [-1])
    known = tf.constant(self._list_ids)
    at = tf.minimum(tf.searchsorted(known, list_ids), len(self._list_ids) - 1)
    found = tf.gather(known, at) == list_ids
    with tf.control_dependencies([
        tf.debugging.Assert(tf.reduce_all(found), [
            f"{self._name}: training lists whose {lambdamart.LIST_ID_FEATURE} no fold of the "
            "trees holds (were the trees fitted on this training file?):",
            tf.boolean_mask(list_ids, ~found)
        ])
    ]):
      return tf.gather(tf.constant(self._folds), at)

  @property
  def num_ids(self) -> int:
    """Distinct keys: num_folds * num_trees * num_leaves (a table's rows to hold them all)."""
    return self.num_folds * self.num_trees * self.num_leaves

  def __call__(self, features: dict, training: bool) -> dict:
    """`features` plus {name: int64 keys}: [B, L, 1, T] training (its fold), [B, L, k, T] else.

    Training with several folds reads the list id, context feature
    `lambdamart.LIST_ID_FEATURE` [B, 1] int64; it is consumed (left out of
    the result: the ranker does not read it).

    Raises:
      tf.errors.InvalidArgumentError: (training) a list id no fold holds,
        naming it: a list the trees were not cross-fitted on.
    """
    x = tf.concat([tf.cast(features[name], tf.float32) for name in self._columns], axis=-1)
    shape = tf.shape(x)
    rows = tf.reshape(x, [-1, len(self._columns)])
    folds = 1 if training else self.num_folds
    if training and self.num_folds > 1:  # Only the list's fold's trees.
      fold = tf.repeat(self._fold_of(features[lambdamart.LIST_ID_FEATURE]), shape[1])
    else:
      fold = tf.zeros([tf.shape(rows)[0]], tf.int64)
    tree_ids = (fold[:, None] * self.num_trees +
                tf.range(folds * self.num_trees, dtype=tf.int64)[None, :])
    # Padding documents (mask False) are not walked: they get leaf 0 of every tree.
    real = tf.where(tf.reshape(features[self._mask], [-1]))
    leaves = tf.scatter_nd(
        real,
        tree_ops.leaf_indices(self._trees, tf.gather_nd(rows, real), tf.gather_nd(tree_ids, real)),
        tf.shape(tree_ids, out_type=tf.int64))
    keys = tree_ids * self.num_leaves + tf.cast(leaves, tf.int64)
    keys = tf.reshape(keys, tf.stack([shape[0], shape[1], folds, self.num_trees]))
    kept = {k: v for k, v in features.items() if k != lambdamart.LIST_ID_FEATURE}
    return {**kept, self._name: keys}
