"""The owner function: which shard holds the row of a key.

owner(key) = splitmix64(key) mod num_shards, where splitmix64 is the
finalizer of Steele, Lea & Flood's SplitMix64 generator ("Fast splittable
pseudorandom number generators", OOPSLA 2014; the `mix64` variant 13 of
Stafford's "Better bit mixing", as in java.util.SplittableRandom) applied to
the key's 64 bits plus the golden-ratio increment:

  z = key + 0x9E3779B97F4A7C15            (mod 2^64, key's two's complement bits)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
  z = (z ^ (z >> 27)) * 0x94D049BB133111EB
  z = z ^ (z >> 31)
  owner = z mod num_shards                (unsigned)

Every output bit depends on every input bit, so consecutive ids, ids that are
multiples of the shard count, and string ids (already FarmHash-fingerprinted
to int64 by core/key_index.to_keys) spread evenly. It uses only stock TF ops
on uint64 (bitcast, add, multiply, xor, shift, floormod): serving code and
restores reproduce it with plain TensorFlow, and `owner_numpy` with NumPy.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _check_num_shards(num_shards) -> int:
  if isinstance(num_shards, bool) or not isinstance(num_shards, (int, np.integer)) or \
      num_shards < 1:
    raise ValueError(f"`num_shards` must be a positive int, got {num_shards!r}")
  return int(num_shards)


def mix64(keys: tf.Tensor) -> tf.Tensor:
  """SplitMix64's finalizer of int64 keys (see the module docstring).

  Args:
    keys: [any shape] int64.

  Returns:
    [keys' shape] uint64.
  """
  z = tf.bitcast(tf.convert_to_tensor(keys, tf.int64), tf.uint64) + tf.constant(_GAMMA, tf.uint64)
  for shift, multiplier in ((30, _MIX1), (27, _MIX2)):
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(shift, tf.uint64)))
    z = z * tf.constant(multiplier, tf.uint64)
  return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(31, tf.uint64)))


def owner(keys: tf.Tensor, num_shards: int) -> tf.Tensor:
  """The shard owning each key: `mix64(key) mod num_shards`.

  Args:
    keys: [any shape] int64 keys (core/key_index.to_keys of the raw ids).
    num_shards: Number of shards, >= 1 (the workers of the job).

  Returns:
    [keys' shape] int32 in [0, num_shards).

  Raises:
    ValueError: num_shards not a positive int.
  """
  num_shards = _check_num_shards(num_shards)
  shard = tf.math.floormod(mix64(keys), tf.constant(num_shards, tf.uint64))
  return tf.cast(shard, tf.int32)


def owner_numpy(keys, num_shards: int) -> np.ndarray:
  """NumPy twin of `owner` (int64 array-like -> int32 array), for references and tools."""
  num_shards = _check_num_shards(num_shards)
  with np.errstate(over="ignore"):
    z = np.asarray(keys, np.int64).view(np.uint64) + np.uint64(_GAMMA)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    z = z ^ (z >> np.uint64(31))
  return (z % np.uint64(num_shards)).astype(np.int32)
