"""lists_with_relevant: the lists of a batch with a relevant document, dense and ragged features."""

import tensorflow as tf

from mxrec_pipeline.keras import datasets


def test_keeps_the_lists_with_a_label_above_zero_in_dense_and_ragged_features():
  labels = tf.constant([[0.0, 1.0], [0.0, -1.0], [2.0, 0.0]])
  features = {
      "user_id": tf.constant([[1], [2], [3]], tf.int64),
      "history": tf.ragged.constant([[b"a"], [], [b"b", b"c"]]),  # A multi-valued feature.
  }
  kept, kept_labels, weights = datasets.lists_with_relevant(features, labels, tf.ones([3]))
  assert kept["user_id"].numpy().tolist() == [[1], [3]]
  assert kept["history"].to_list() == [[b"a"], [b"b", b"c"]]
  assert kept_labels.numpy().tolist() == [[0.0, 1.0], [2.0, 0.0]]
  assert weights.numpy().tolist() == [1.0, 1.0]


def test_a_batch_without_a_relevant_list_keeps_nothing():
  kept, labels = datasets.lists_with_relevant({"history": tf.ragged.constant([[b"a"], [b"b"]])},
                                              tf.constant([[0.0], [0.0]]))
  assert kept["history"].to_list() == [] and labels.shape[0] == 0
