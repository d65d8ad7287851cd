"""LightGBM trees as stock TensorFlow ops: the leaf each row reaches in each tree.

`TreeArrays.from_booster` flattens a trained `lightgbm.Booster`'s trees (its
`dump_model()`) into padded node arrays; `leaf_indices` walks them for a
batch with gathers and `tf.where` only, so a SavedModel that holds them
serves with TensorFlow alone. Equal to `booster.predict(x, pred_leaf=True)`:
LightGBM's numerical decision (`Tree::NumericalDecision`, LightGBM 4
src/io/tree.h): a NaN counts as 0 unless the node's missing type is NaN; a
missing value (|x| <= 1e-35 for missing type Zero, NaN for NaN) goes to the
node's default side; otherwise x <= threshold goes left, in double precision.
Categorical splits are refused. For trees whose leaves feed a ranker as id
features (He et al., "Practical Lessons from Predicting Clicks on Ads at
Facebook", ADKDD 2014).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf

MISSING_TYPES = {"None": 0, "Zero": 1, "NaN": 2}
# LightGBM's kZeroThreshold (float 1e-35): |x| at most this is zero.
ZERO_THRESHOLD = float(np.float32(1e-35))
_NODE_ARRAYS = ("feature", "threshold", "default_left", "missing_type", "left", "right")
_PAD = {name: -1 if name in ("left", "right") else 0 for name in _NODE_ARRAYS}


@dataclasses.dataclass(frozen=True)
class TreeArrays:
  """A LightGBM model's trees as arrays, [num_trees, max_nodes] each (nodes padded).

  A child is an internal node's index (>= 0, LightGBM's `split_index`) or
  ~leaf_index (< 0), as LightGBM stores them.

  Attributes:
    feature: int32 feature column of each internal node.
    threshold: float64 threshold (x <= threshold goes left).
    default_left: bool, where a missing value goes.
    missing_type: int8, MISSING_TYPES (0 None, 1 Zero, 2 NaN).
    left, right: int32 children.
    root: [num_trees] int32: 0, or ~0 for a tree of one leaf.
    depth: The most internal nodes on a path from a root to a leaf.
    num_leaves: [num_trees] int32 leaves of each tree.
    num_features: Columns of the model's input.
  """

  feature: np.ndarray
  threshold: np.ndarray
  default_left: np.ndarray
  missing_type: np.ndarray
  left: np.ndarray
  right: np.ndarray
  root: np.ndarray
  depth: int
  num_leaves: np.ndarray
  num_features: int

  @property
  def num_trees(self) -> int:
    return int(self.root.shape[0])

  @classmethod
  def from_booster(cls, booster) -> "TreeArrays":
    """The trees of a trained `lightgbm.Booster` (one model per iteration: ranking, regression).

    Raises:
      ValueError: a categorical split, or a multiclass model (naming it).
    """
    dump = booster.dump_model()
    if dump.get("num_tree_per_iteration", 1) != 1:
      raise ValueError(f"{dump['num_tree_per_iteration']} trees per iteration (multiclass): "
                       "only one tree per iteration is supported")
    trees = dump["tree_info"]
    max_nodes = max(1, max(t["num_leaves"] - 1 for t in trees)) if trees else 1
    shape = (len(trees), max_nodes)
    arrays = dict(feature=np.zeros(shape, np.int32), threshold=np.zeros(shape, np.float64),
                  default_left=np.zeros(shape, bool), missing_type=np.zeros(shape, np.int8),
                  left=np.full(shape, -1, np.int32), right=np.full(shape, -1, np.int32))
    root = np.zeros(len(trees), np.int32)
    depth = 0
    for t, tree in enumerate(trees):
      structure = tree["tree_structure"]
      if "split_index" not in structure:
        root[t] = ~0
        continue
      stack = [(structure, 1)]
      while stack:
        node, level = stack.pop()
        depth = max(depth, level)
        if node.get("decision_type", "<=") != "<=":
          raise ValueError(f"tree {t}: a categorical split (decision_type "
                           f"{node['decision_type']!r}) is not supported")
        i = node["split_index"]
        arrays["feature"][t, i] = node["split_feature"]
        arrays["threshold"][t, i] = node["threshold"]
        arrays["default_left"][t, i] = node["default_left"]
        arrays["missing_type"][t, i] = MISSING_TYPES[node["missing_type"]]
        for side in ("left", "right"):
          child = node[f"{side}_child"]
          if "split_index" in child:
            arrays[side][t, i] = child["split_index"]
            stack.append((child, level + 1))
          else:
            arrays[side][t, i] = ~child["leaf_index"]
    return cls(**arrays, root=root, depth=depth,
               num_leaves=np.array([t["num_leaves"] for t in trees],
                                   np.int32), num_features=int(dump["max_feature_idx"]) + 1)


def stack_trees(models: Sequence[TreeArrays], num_trees: int) -> TreeArrays:
  """Several models' trees as one TreeArrays: model m's tree t is tree m * num_trees + t.

  A model of fewer trees (LightGBM stops adding trees once no split gains) is
  padded with one-leaf trees, whose every row reaches leaf 0.

  Args:
    models: The models, each of at most `num_trees` trees.
    num_trees: Trees per model in the result, > 0.

  Raises:
    ValueError: no model, or one of more than `num_trees` trees (naming it).
  """
  if not models:
    raise ValueError("stack_trees: no model given")
  max_nodes = max(m.feature.shape[1] for m in models)
  parts = {name: [] for name in _NODE_ARRAYS}
  roots, leaves = [], []
  for index, model in enumerate(models):
    if model.num_trees > num_trees:
      raise ValueError(f"stack_trees: model {index} has {model.num_trees} trees, more than "
                       f"{num_trees}")
    pad = ((0, num_trees - model.num_trees), (0, max_nodes - model.feature.shape[1]))
    for name in _NODE_ARRAYS:
      parts[name].append(np.pad(getattr(model, name), pad, constant_values=_PAD[name]))
    roots.append(np.pad(model.root, pad[0], constant_values=~0))
    leaves.append(np.pad(model.num_leaves, pad[0], constant_values=1))
  return TreeArrays(**{name: np.concatenate(arrays) for name, arrays in parts.items()},
                    root=np.concatenate(roots), depth=max(m.depth for m in models),
                    num_leaves=np.concatenate(leaves),
                    num_features=max(m.num_features for m in models))


def leaf_indices(trees: TreeArrays, x: tf.Tensor, tree_ids: tf.Tensor | None = None) -> tf.Tensor:
  """The leaf each row of `x` reaches in each tree, as `predict(x, pred_leaf=True)`.

  Args:
    trees: The model's TreeArrays (constants of the graph).
    x: [num_rows, num_features] float (float32 or float64; compared in
      float64, as LightGBM does), columns in the model's feature order.
    tree_ids: None (every tree), or [num_rows, n] int32: the trees to walk
      for each row (e.g. one fold's of stacked models), in [0, num_trees).

  Returns:
    [num_rows, num_trees] (or [num_rows, n]) int32 leaf indices.
  """
  x = tf.cast(x, tf.float64)
  max_nodes = trees.feature.shape[1]
  # One gather a level: the node's feature, children and missing-value rule packed in a row.
  rule = trees.default_left.astype(np.int32) | (trees.missing_type.astype(np.int32) << 1)
  packed = tf.constant(
      np.stack([trees.feature, trees.left, trees.right, rule], -1).reshape(-1, 4).astype(np.int32))
  thresholds = tf.constant(trees.threshold.reshape(-1))
  if tree_ids is None:
    tree_ids = tf.broadcast_to(
        tf.range(trees.num_trees, dtype=tf.int32)[None, :], [tf.shape(x)[0], trees.num_trees])
  tree_ids = tf.cast(tree_ids, tf.int32)
  node = tf.gather(tf.constant(trees.root), tree_ids)
  first_node = tree_ids * max_nodes
  for _ in range(trees.depth):
    at = first_node + tf.maximum(node, 0)
    feature, left, right, rule = tf.unstack(tf.gather(packed, at), axis=-1)
    missing_type = tf.bitwise.right_shift(rule, 1)
    value = tf.gather(x, feature, batch_dims=1)
    is_nan = tf.math.is_nan(value)
    value = tf.where(is_nan & (missing_type != MISSING_TYPES["NaN"]), tf.zeros_like(value), value)
    missing = ((missing_type == MISSING_TYPES["Zero"]) & (tf.abs(value) <= ZERO_THRESHOLD)) | (
        (missing_type == MISSING_TYPES["NaN"]) & is_nan)
    go_left = tf.where(missing,
                       tf.bitwise.bitwise_and(rule, 1) == 1, value <= tf.gather(thresholds, at))
    node = tf.where(node >= 0, tf.where(go_left, left, right), node)
  return tf.bitwise.invert(node)
