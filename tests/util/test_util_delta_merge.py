"""util/delta_merge.py against a hand-checked chain: changes, deletions, re-additions."""

import numpy as np

from mxrec_pipeline.util import delta_merge


def _delta(keys, values, deleted):
  return {
      "keys": np.array(keys, np.int64), "values": np.array(values, np.float32),
      "deleted": np.array(deleted, np.int64)
  }


def test_each_key_ends_with_its_last_event_in_the_chain():
  full = {
      "keys": np.array([5, 1, 3, 7], np.int64), "values": np.array([50, 10, 30, 70], np.float32)
  }
  deltas = [
      _delta([3, 9], [31, 90], deleted=[7, 1]),  # 3 changed, 9 new; 7 and 1 evicted.
      _delta([1, 3], [11, 32], deleted=[9, 3]),  # 1 back; 3 evicted and re-admitted; 9 evicted.
      _delta([], [], deleted=[5]),  # 5 evicted.
  ]
  merged = delta_merge.merge(full, deltas, ["keys", "values"], "deleted")
  np.testing.assert_array_equal(merged["keys"], [1, 3])
  np.testing.assert_array_equal(merged["values"], [11, 32])


def test_no_delta_is_the_full_save_by_key():
  full = {"keys": np.array([2, 1], np.int64), "values": np.array([[20.0], [10.0]], np.float32)}
  merged = delta_merge.merge(full, [], ["keys", "values"], "deleted")
  np.testing.assert_array_equal(merged["keys"], [1, 2])
  np.testing.assert_array_equal(merged["values"], [[10.0], [20.0]])
