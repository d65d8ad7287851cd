"""Row initializers: initial embedding rows that depend only on the row's global id.

A flat table initializes all its rows at once, by position. A tiered table
(core/tiers.py) creates a row when its id first reaches the device cache, in any
slot, so its initial value must be a function of the id's global row alone:
then a key gets the same initial embedding wherever it lives, and a tiered
table trains exactly like an all-on-device table built with the same
RowInitializer (tests/core/test_core_tiers.py checks this).

The values are counter-based: element (g, j) of a table with seed s is drawn from
SplitMix64(s, g * dim + j) (Steele, Lea, Flood, "Fast splittable pseudorandom
number generators", OOPSLA 2014) mapped to a uniform in (0, 1) and through the
inverse normal CDF (`tf.math.ndtri`, in float32) for normal and truncated-normal
rows, so truncation is exact rather than by resampling.

`row_initializer(emb_initializer)` converts the usual initializers
(tf.keras.initializers TruncatedNormal, RandomNormal, RandomUniform, Constant,
Zeros, Ones and their tf.compat.v1 counterparts) to the RowInitializer of the
same distribution and seed. A RowInitializer is also an ordinary initializer,
`init(shape=[rows, dim], dtype)`, giving rows 0..rows-1, so a flat table can use
the very same values.
"""

from __future__ import annotations

import dataclasses
import math
import random

import tensorflow as tf

KINDS = ("truncated_normal", "normal", "uniform", "constant")
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


@dataclasses.dataclass(frozen=True)
class RowInitializer:
  """Initial rows as a function of (seed, global row, column).

  Attributes:
    kind: "truncated_normal" (within 2 stddev of the mean, as Keras'
      TruncatedNormal), "normal", "uniform" or "constant".
    mean, stddev: Of the (truncated) normal.
    minval, maxval: Of the uniform.
    value: Of the constant.
    seed: 64-bit seed; None draws one from Python's `random` (seeded by
      tf.keras.utils.set_random_seed) when constructed.
    scale: Factor applied to every value (create_table's init_param).

  Raises:
    ValueError: an unknown kind, stddev <= 0 or minval > maxval.
  """

  kind: str = "truncated_normal"
  mean: float = 0.0
  stddev: float = 0.05
  minval: float = -0.05
  maxval: float = 0.05
  value: float = 0.0
  seed: int | None = None
  scale: float = 1.0

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"RowInitializer: `kind` must be one of {KINDS}, got {self.kind!r}")
    if self.kind in ("truncated_normal", "normal") and not self.stddev > 0:
      raise ValueError(f"RowInitializer: `stddev` must be positive, got {self.stddev}")
    if self.kind == "uniform" and self.minval > self.maxval:
      raise ValueError(f"RowInitializer: minval {self.minval} > maxval {self.maxval}")
    if self.seed is None:
      object.__setattr__(self, "seed", random.getrandbits(63))

  def rows(self, global_rows: tf.Tensor, dim: int, dtype=tf.float32) -> tf.Tensor:
    """Initial values of `global_rows`.

    Args:
      global_rows: [n] int64 global rows (>= 0).
      dim: Columns per row.
      dtype: Floating dtype of the result.

    Returns:
      [n, dim] tensor of `dtype`.
    """
    global_rows = tf.convert_to_tensor(global_rows, tf.int64)
    n = tf.size(global_rows)
    if self.kind == "constant":
      return tf.fill([n, dim], tf.cast(self.value * self.scale, dtype))
    counters = (tf.cast(global_rows, tf.uint64)[:, None] * tf.constant(dim, tf.uint64)
                + tf.cast(tf.range(dim, dtype=tf.int64), tf.uint64)[None, :])
    u = _uniform(self.seed, counters)
    if self.kind == "uniform":
      values = self.minval + u * (self.maxval - self.minval)
    else:
      if self.kind == "truncated_normal":
        low, high = _normal_cdf(-2.0), _normal_cdf(2.0)
        u = low + u * (high - low)
      # float32 is ample for initial values and ndtri is ~5x faster in it.
      values = self.mean + self.stddev * tf.math.ndtri(tf.cast(u, tf.float32))
    return tf.cast(values * self.scale, dtype)

  def __call__(self, shape, dtype=tf.float32, **kwargs):
    """Rows 0..shape[0]-1: the same values a tiered table gives those global rows."""
    del kwargs
    rows, dim = int(shape[0]), int(shape[1])
    return self.rows(tf.range(rows, dtype=tf.int64), dim, tf.as_dtype(dtype))

  def scaled(self, factor: float) -> "RowInitializer":
    """This initializer with every value multiplied by `factor`."""
    return dataclasses.replace(self, scale=self.scale * factor)


def _normal_cdf(x: float) -> float:
  return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _uniform(seed: int, counters: tf.Tensor) -> tf.Tensor:
  """SplitMix64 of seed + counter, as float64 uniforms in (0, 1)."""
  x = counters * tf.constant(_GOLDEN, tf.uint64) + tf.constant(seed % 2**64, tf.uint64)
  x = _xor_shift(x, 30) * tf.constant(_MIX1, tf.uint64)
  x = _xor_shift(x, 27) * tf.constant(_MIX2, tf.uint64)
  x = _xor_shift(x, 31)
  # The top 53 bits, centred in their interval: never exactly 0 or 1.
  top = tf.bitwise.right_shift(x, tf.constant(11, tf.uint64))
  return (tf.cast(top, tf.float64) + 0.5) * (1.0 / 2**53)


def _xor_shift(x: tf.Tensor, bits: int) -> tf.Tensor:
  return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(bits, tf.uint64)))


def row_initializer(emb_initializer, table_name: str) -> RowInitializer:
  """The RowInitializer of the same distribution and seed as `emb_initializer`.

  Args:
    emb_initializer: A RowInitializer (returned as is), or a tf.keras or
      tf.compat.v1 TruncatedNormal, RandomNormal, RandomUniform, Constant,
      Zeros or Ones initializer (class or instance).
    table_name: For the error message.

  Raises:
    ValueError: another initializer, naming the table and the supported ones.
  """
  if isinstance(emb_initializer, RowInitializer):
    return emb_initializer
  init = emb_initializer() if isinstance(emb_initializer, type) else emb_initializer
  name = type(init).__name__
  seed = getattr(init, "seed", None)
  if name == "TruncatedNormal":
    return RowInitializer("truncated_normal", mean=float(init.mean), stddev=float(init.stddev),
                          seed=seed)
  if name == "RandomNormal":
    return RowInitializer("normal", mean=float(init.mean), stddev=float(init.stddev), seed=seed)
  if name == "RandomUniform":
    return RowInitializer("uniform", minval=float(init.minval), maxval=float(init.maxval),
                          seed=seed)
  if name in ("Zeros", "Ones", "Constant"):
    value = {"Zeros": 0.0, "Ones": 1.0}.get(name)
    if value is None:
      value = init.value
      if not isinstance(value, (int, float)):
        raise ValueError(f"create_table('{table_name}'): a tiered table needs a scalar "
                         f"Constant initializer, got value {value!r}")
    return RowInitializer("constant", value=float(value))
  raise ValueError(
      f"create_table('{table_name}'): a tiered table (host_vocabulary_size > 0) creates rows "
      f"per id, so its emb_initializer must be a per-row distribution: TruncatedNormal, "
      f"RandomNormal, RandomUniform, Constant, Zeros, Ones (tf.keras or tf.compat.v1) or a "
      f"mxrec_pipeline.core.initializers.RowInitializer; got {name}")
