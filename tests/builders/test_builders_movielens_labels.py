"""MovieLens relevance labels and their config checks (hand-checked values)."""

import numpy as np
import pytest
import tensorflow as tf

from builders import base, movielens


def test_relevance_labels_keep_padding_negative():
  rating = tf.constant([[1.0, 3.0, 4.0, 5.0, -1.0]])
  np.testing.assert_array_equal(
      movielens.relevance_labels(rating, "graded").numpy(), [[0.0, 2.0, 3.0, 4.0, -1.0]])
  np.testing.assert_array_equal(
      movielens.relevance_labels(rating, "liked").numpy(), [[0.0, 0.0, 1.0, 2.0, -1.0]])
  with pytest.raises(ValueError, match="relevance must be one of"):
    movielens.relevance_labels(rating, "stars")


def test_config_checks_name_the_key():
  with pytest.raises(ValueError, match="data.relevance must be one of"):
    movielens.MovieLensDataConfig(relevance="stars")
  with pytest.raises(ValueError, match="model.id_l2 must be >= 0, got -1"):
    movielens.MovieLensModelConfig(id_l2=-1.0)


def test_dataset_builder_takes_the_relevance_of_its_paths():
  ranker = movielens.MovieLensListwise()
  model, dataset = movielens.MovieLensModelConfig(), base.DatasetConfig()
  liked = movielens.MovieLensPaths("train*.tfrecord", "valid*.tfrecord", valid_list_size=4,
                                   relevance="liked")
  assert ranker.build_dataset_builder(liked, dataset, model).relevance == "liked"
  plain = base.DataPaths("train*.tfrecord", "valid*.tfrecord", valid_list_size=4)
  with pytest.raises(TypeError, match="MovieLensPaths.relevance; got DataPaths"):
    ranker.build_dataset_builder(plain, dataset, model)
