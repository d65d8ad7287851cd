"""gbdt/tree_ops.py: LightGBM's leaves computed with stock TF ops equal predict(pred_leaf=True)."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.gbdt import tree_ops

lightgbm = pytest.importorskip("lightgbm")


def _ranker_data(seed, rows=600, cols=6, missing=True):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(rows, cols)).astype(np.float32)
  x[rng.random((rows, cols)) < 0.25] = 0.0
  if missing:
    x[rng.random((rows, cols)) < 0.1] = np.nan
  y = (x[:, 0] > 0).astype(int) + (np.nan_to_num(x[:, 1]) > 0.5).astype(int)
  return x, y, [10] * (rows // 10)


@pytest.mark.parametrize(
    "params",
    [
        {},  # Missing type NaN where NaNs were seen.
        {"zero_as_missing": True},  # Missing type Zero.
        {"use_missing": False},  # Missing type None: NaN as 0.
        {"num_leaves": 2},  # Stumps.
        {"num_leaves": 63, "min_child_samples": 2},  # Deep trees.
    ])
def test_leaves_equal_lightgbm(params):
  x, y, group = _ranker_data(1)
  booster = lightgbm.train(
      {
          "objective": "lambdarank", "verbose": -1, "min_child_samples": 5, "deterministic": True,
          **params
      }, lightgbm.Dataset(x, y, group=group), num_boost_round=20)
  trees = tree_ops.TreeArrays.from_booster(booster)
  assert trees.num_trees == 20 and trees.num_features == 6
  test, _, _ = _ranker_data(2)
  test[:5] = [np.nan, 0.0, -0.0, 1e-36, -1e-36, 3.0][:6]  # Edge values in every column.
  expected = booster.predict(test, pred_leaf=True)
  np.testing.assert_array_equal(tree_ops.leaf_indices(trees, tf.constant(test)).numpy(), expected)
  # At the thresholds themselves (x <= threshold goes left), in float64.
  at = np.tile(np.nan_to_num(test[:1]), (trees.num_trees, 1)).astype(np.float64)
  for t in range(trees.num_trees):
    at[t, trees.feature[t, 0]] = trees.threshold[t, 0]
  np.testing.assert_array_equal(
      tree_ops.leaf_indices(trees, tf.constant(at)).numpy(), booster.predict(at, pred_leaf=True))


def test_a_tree_of_one_leaf():
  x = np.zeros((40, 2), np.float32)  # Nothing to split on: every tree is one leaf.
  booster = lightgbm.train({"objective": "regression", "verbose": -1},
                           lightgbm.Dataset(x, np.arange(40.0)), num_boost_round=3)
  trees = tree_ops.TreeArrays.from_booster(booster)
  # LightGBM stops once a tree cannot split.
  assert trees.depth == 0 and trees.num_trees >= 1 and set(trees.root) == {~0}
  np.testing.assert_array_equal(
      tree_ops.leaf_indices(trees, tf.constant(x)).numpy(), booster.predict(x, pred_leaf=True))


def test_categorical_splits_are_refused():
  rng = np.random.default_rng(0)
  x = rng.integers(0, 8, size=(400, 1)).astype(np.float32)
  booster = lightgbm.train(
      {"objective": "regression", "verbose": -1, "min_data_per_group": 5, "cat_smooth": 1},
      lightgbm.Dataset(x, (x[:, 0] % 3 == 0) * 1.0, categorical_feature=[0]), num_boost_round=2)
  with pytest.raises(ValueError, match="categorical split"):
    tree_ops.TreeArrays.from_booster(booster)


def test_the_leaves_serve_from_a_saved_model(tmp_path):
  x, y, group = _ranker_data(3)
  booster = lightgbm.train({"objective": "lambdarank", "verbose": -1},
                           lightgbm.Dataset(x, y, group=group), num_boost_round=5)
  trees = tree_ops.TreeArrays.from_booster(booster)
  module = tf.Module()
  module.leaves = tf.function(lambda x: tree_ops.leaf_indices(trees, x),
                              input_signature=[tf.TensorSpec([None, 6], tf.float32)])
  tf.saved_model.save(module, str(tmp_path / "leaves"))
  loaded = tf.saved_model.load(str(tmp_path / "leaves"))
  np.testing.assert_array_equal(
      loaded.leaves(tf.constant(x)).numpy(), booster.predict(x, pred_leaf=True))
