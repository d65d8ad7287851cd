"""The owner function: TF == NumPy reference (SplitMix64 by hand), even spread, errors."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import key_index
from mxrec_pipeline.distributed import sharding

MASK = (1 << 64) - 1


def _splitmix64_owner(key: int, num_shards: int) -> int:
  """Python-int reference of the module docstring's formula."""
  z = (key + 0x9E3779B97F4A7C15) & MASK
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
  z ^= z >> 31
  return z % num_shards


KEYS = [0, 1, 2, -1, -2**63, 2**63 - 1, 12345678901234, -987654321]


@pytest.mark.parametrize("num_shards", [1, 2, 3, 8, 1000])
def test_owner_matches_reference(num_shards):
  want = [_splitmix64_owner(k, num_shards) for k in KEYS]
  got = sharding.owner(tf.constant(KEYS, tf.int64), num_shards).numpy()
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(sharding.owner_numpy(KEYS, num_shards), want)
  assert got.dtype == np.int32


def test_owner_keeps_shape():
  keys = tf.reshape(tf.range(12, dtype=tf.int64), [3, 4])
  assert sharding.owner(keys, 4).shape == [3, 4]


@pytest.mark.parametrize("name,keys", [
    ("consecutive", np.arange(40_000)),
    ("multiples of the shard count", np.arange(40_000) * 8),
    ("strings", None),
])
def test_owner_spreads_evenly(name, keys):
  if keys is None:
    ids = tf.constant([f"user_{i}" for i in range(40_000)])
    keys = key_index.to_keys(ids).numpy()
  counts = np.bincount(sharding.owner_numpy(keys, 8), minlength=8)
  # 5000 expected per shard; binomial sd ~66.
  assert counts.min() > 4700 and counts.max() < 5300, (name, counts)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_num_shards_checked(bad):
  with pytest.raises(ValueError, match="`num_shards` must be a positive int"):
    sharding.owner(tf.constant([1], tf.int64), bad)
