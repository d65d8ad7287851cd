"""gbdt/leaf_trees.py and gbdt/leaf_ids.py: cross-fitted trees, their leaves as int64 keys."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.gbdt import lambdamart
from mxrec_pipeline.gbdt import leaf_trees
from mxrec_pipeline.gbdt import tree_ops
from mxrec_pipeline.gbdt.config import LambdaMartConfig
from mxrec_pipeline.gbdt.leaf_ids import LEAF_IDS, LeafIds

lightgbm = pytest.importorskip("lightgbm")

WIDTH, DOCS = 4, 8
NAMES = [f"custom_features_{i}" for i in range(1, WIDTH + 1)]
SPEC = {name: tf.io.FixedLenFeature([1], tf.float32, default_value=0.0) for name in NAMES}
CONFIG = LambdaMartConfig(n_estimators=5, num_leaves=4, min_child_samples=3)


def _lists(num_lists=12, seed=0, first_qid=10):
  """One batch of whole lists as tfr parses them: (features with qid, labels), and x."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num_lists, DOCS, WIDTH)).astype(np.float32)
  labels = ((x[..., 0] > 0).astype(int) + (x[..., 1] > 0.5)).astype(np.float32)
  features = {name: tf.constant(x[..., i:i + 1]) for i, name in enumerate(NAMES)}
  features["qid"] = tf.constant(np.arange(first_qid, first_qid + num_lists)[:, None], tf.int64)
  mask = np.ones([num_lists, DOCS], bool)
  mask[1, 5:] = False  # Padding documents of list 1, labeled -1.
  labels[~mask] = -1.0
  features["example_list_mask"] = tf.constant(mask)
  return features, tf.constant(labels), x


def _deriver(fitted):
  return LeafIds(fitted.tree_arrays(), fitted.num_folds, CONFIG.n_estimators, CONFIG.num_leaves,
                 NAMES, fitted.fold_of_list)


def test_each_fold_model_is_lightgbm_fitted_without_that_fold():
  features, labels, x = _lists()
  fitted = leaf_trees.fit([(features, labels)], SPEC, CONFIG, num_folds=3, seed=7)
  assert fitted.num_folds == 3 and sorted(fitted.fold_of_list) == list(range(10, 22))
  assert sorted(np.bincount(list(fitted.fold_of_list.values()))) == [4, 4, 4]
  qids = features["qid"].numpy().ravel()
  for j, booster in enumerate(fitted.boosters):
    outside = np.array([fitted.fold_of_list[q] != j for q in qids])
    real = features["example_list_mask"].numpy()[outside]
    direct = lightgbm.train(
        lambdamart.lgbm_params(CONFIG, 7),
        lightgbm.Dataset(x[outside][real],
                         labels.numpy()[outside][real], group=real.sum(1)),
        num_boost_round=CONFIG.n_estimators)
    assert booster.model_to_string() == direct.model_to_string()
  assert fitted.info["lists"] == 12 and fitted.info["documents"] == 12 * DOCS - 3


def test_training_lists_get_their_folds_leaves_and_others_every_folds():
  features, labels, x = _lists()
  fitted = leaf_trees.fit([(features, labels)], SPEC, CONFIG, num_folds=3, seed=7)
  derive = _deriver(fitted)
  assert derive.num_ids == 3 * 5 * 4
  trained = derive(features, training=True)
  assert "qid" not in trained and trained[LEAF_IDS].shape == [12, DOCS, 1, 5]
  served = derive({k: v for k, v in features.items() if k != "qid"}, training=False)[LEAF_IDS]
  assert served.shape == [12, DOCS, 3, 5] and served.dtype == tf.int64
  tree = np.arange(5)
  for b, qid in enumerate(features["qid"].numpy().ravel()):
    fold = fitted.fold_of_list[qid]
    for j, booster in enumerate(fitted.boosters):
      expected = booster.predict(x[b], pred_leaf=True) + (j * 5 + tree) * 4
      if b == 1:  # Padding documents: leaf 0 of every tree.
        expected[5:] = (j * 5 + tree) * 4
      np.testing.assert_array_equal(served[b, :, j], expected)
    np.testing.assert_array_equal(trained[LEAF_IDS][b, :, 0], served[b, :, fold])
  # (fold, tree, leaf) keys of different folds or trees never meet.
  keys = served.numpy()
  for j in range(3):
    assert set(np.unique(keys[:, :, j])) <= set(range(j * 20, (j + 1) * 20))


def test_a_training_list_no_fold_holds_is_named():
  features, labels, _ = _lists()
  derive = _deriver(leaf_trees.fit([(features, labels)], SPEC, CONFIG, num_folds=2, seed=0))
  other, _, _ = _lists(num_lists=3, first_qid=500)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"(?s)no fold of the trees holds.*500, 501, 502"):
    derive(other, training=True)


def test_one_model_of_every_list_needs_no_list_id():
  features, labels, x = _lists()
  fitted = leaf_trees.fit([(features, labels)], SPEC, CONFIG, num_folds=1, seed=0)
  assert fitted.fold_of_list == {} and fitted.info["lists"] == 12
  no_qid = {k: v for k, v in features.items() if k != "qid"}
  keys = _deriver(fitted)(no_qid, training=True)[LEAF_IDS]
  assert keys.shape == [12, DOCS, 1, 5]
  np.testing.assert_array_equal(keys[2, :, 0],
                                fitted.boosters[0].predict(x[2], pred_leaf=True) + np.arange(5) * 4)


def test_saved_models_load_as_they_were(tmp_path):
  features, labels, _ = _lists()
  fitted = leaf_trees.fit([(features, labels)], SPEC, CONFIG, num_folds=3, seed=1)
  assert leaf_trees.LeafModels.load(str(tmp_path / "leaves")) is None
  fitted.save(str(tmp_path / "leaves"))
  loaded = leaf_trees.LeafModels.load(str(tmp_path / "leaves"))
  assert loaded.fold_of_list == fitted.fold_of_list and loaded.info == fitted.info
  for name in ("feature", "threshold", "left", "right", "root", "num_leaves"):
    np.testing.assert_array_equal(getattr(loaded.tree_arrays(), name),
                                  getattr(fitted.tree_arrays(), name))
  (tmp_path / "leaves" / leaf_trees.FOLDS_FILE).unlink()  # A save killed before its last file.
  assert leaf_trees.LeafModels.load(str(tmp_path / "leaves")) is None


def test_stacked_models_pad_short_ones_with_one_leaf_trees():
  _, labels, x = _lists()
  flat, group = x.reshape(-1, WIDTH), [DOCS] * 12

  def booster(rounds, leaves):
    return lightgbm.train(
        {"objective": "lambdarank", "verbose": -1, "num_leaves": leaves, "min_child_samples": 3},
        lightgbm.Dataset(flat,
                         np.maximum(labels.numpy(), 0).ravel(), group=group),
        num_boost_round=rounds)

  short, deep = booster(2, 3), booster(3, 8)
  models = [tree_ops.TreeArrays.from_booster(b) for b in (short, deep)]
  stacked = tree_ops.stack_trees(models, num_trees=3)
  assert stacked.num_trees == 6
  leaves = tree_ops.leaf_indices(stacked, tf.constant(flat)).numpy()
  np.testing.assert_array_equal(leaves[:, :2], short.predict(flat, pred_leaf=True))
  np.testing.assert_array_equal(leaves[:, 2], 0)  # The padding tree.
  np.testing.assert_array_equal(leaves[:, 3:], deep.predict(flat, pred_leaf=True))
  with pytest.raises(ValueError, match="model 1 has 3 trees, more than 2"):
    tree_ops.stack_trees(models, num_trees=2)


def test_folds_are_seeded_balanced_and_need_enough_lists():
  folds = leaf_trees.assign_folds(range(100, 111), 3, seed=4)
  assert folds == leaf_trees.assign_folds(reversed(range(100, 111)), 3, seed=4)
  assert folds != leaf_trees.assign_folds(range(100, 111), 3, seed=5)
  assert sorted(np.bincount(list(folds.values()))) == [3, 4, 4]
  with pytest.raises(ValueError, match="5 folds need at least 5 training lists, got 4"):
    leaf_trees.assign_folds([1, 2, 3, 4], 5, seed=0)


def test_lists_sharing_an_id_are_refused_by_cross_fitting():
  features, labels, _ = _lists()
  features["qid"] = tf.fill([12, 1], tf.constant(-1, tf.int64))  # No qid in the data: -1.
  with pytest.raises(ValueError, match=r"12 training lists have 1 distinct qids \(shared: \[-1\]"):
    leaf_trees.fit([(features, labels)], SPEC, CONFIG, num_folds=3, seed=0)


def test_trees_of_more_leaves_than_the_key_space_are_refused():
  features, labels, _ = _lists()
  fitted = leaf_trees.fit([(features, labels)], SPEC, CONFIG, num_folds=1, seed=0)
  with pytest.raises(ValueError, match="more than num_leaves 2"):
    LeafIds(fitted.tree_arrays(), 1, CONFIG.n_estimators, 2, NAMES)
