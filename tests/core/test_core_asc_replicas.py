"""split_batch: each replica's part of an inserted global batch, checked by hand.

Every replica must read, through its own unique rows and restore indices, the
rows the global batch reads for its examples; its unique rows are distinct.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import replicas

SPECS = {"item": [fs.FeatureSpec("item_id", "item"), fs.FeatureSpec("history", "item")]}


def global_batch():
  """5 examples: item_id [5, 1], a ragged history over global unique rows [7], sparse tags."""
  unique_rows = tf.constant([40, 41, 42, 43, 44, 45, 46], tf.int64)
  item_restore = tf.constant([[0], [1], [2], [0], [3]], tf.int32)
  history_restore = tf.ragged.constant([[1, 4], [], [5, 0, 6], [2], [4]], tf.int32)
  features = {
      "price": tf.constant([[1.0], [2.0], [3.0], [4.0], [5.0]]),
      fs.unique_rows_key("item"): unique_rows,
      fs.restore_key("item_id"): item_restore,
      fs.restore_key("history"): history_restore,
      fs.plan_key("item"): tf.constant([7], tf.int64),
      "tags": tf.sparse.from_dense(tf.constant([[1, 0], [0, 2], [3, 3], [0, 0], [5, 0]])),
  }
  return features, tf.constant([0.0, 1.0, 2.0, 3.0, 4.0])


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_replicas_read_the_global_rows_of_their_examples(num_replicas):
  features, labels = global_batch()
  rows = features[fs.unique_rows_key("item")].numpy()
  item_rows = rows[features[fs.restore_key("item_id")].numpy()]
  history_rows = [rows[r] for r in features[fs.restore_key("history")].to_list()]
  start = 0
  for r in range(num_replicas):
    local, local_labels = replicas.split_batch((features, labels), SPECS, r, num_replicas)
    end = (r + 1) * 5 // num_replicas
    local_rows = local[fs.unique_rows_key("item")].numpy()
    assert len(set(local_rows)) == len(local_rows)  # Re-deduplicated.
    np.testing.assert_array_equal(local_rows[local[fs.restore_key("item_id")].numpy()],
                                  item_rows[start:end])
    history = local[fs.restore_key("history")]
    assert isinstance(history, tf.RaggedTensor)
    assert [list(local_rows[h]) for h in history.to_list()
           ] == [list(h) for h in history_rows[start:end]]
    np.testing.assert_array_equal(local["price"].numpy()[:, 0], np.arange(start, end) + 1.0)
    np.testing.assert_array_equal(local_labels.numpy(), np.arange(start, end))
    np.testing.assert_array_equal(
        tf.sparse.to_dense(local["tags"]).numpy(),
        tf.sparse.to_dense(features["tags"]).numpy()[start:end])
    assert local[fs.plan_key("item")].numpy().tolist() == [7]  # Shared by the replicas.
    start = end
  assert start == 5


def test_split_dataset_gives_replicas_in_order():
  dataset = tf.data.Dataset.from_tensors(global_batch())
  parts = list(replicas.split_dataset(dataset, SPECS, 2))
  assert [p[1].numpy().tolist() for p in parts] == [[0.0, 1.0], [2.0, 3.0, 4.0]]


def test_missing_insertion_results_are_named():
  features, labels = global_batch()
  del features[fs.restore_key("history")]
  with pytest.raises(ValueError, match="mxrec__history__restore.*table 'item'"):
    replicas.split_batch((features, labels), SPECS, 0, 2)
