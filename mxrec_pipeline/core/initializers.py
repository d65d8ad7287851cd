"""Row initializers: initial embedding rows that depend only on the row's global id.

A flat table initializes all its rows at once, by position. A tiered table
(core/tiers.py) creates a row when its id first reaches the device cache, in any
slot, so its initial value must be a function of the id's global row alone:
then a tiered table trains exactly like an all-on-device table built with the
same `RowInitializer` (tests/core/test_core_tiers.py checks this).

The values are counter-based, computed by one native op, MxRowInit (the math
in native/core/row_init.h): element (g, j) of a table with seed s is drawn from
SplitMix64(s, g * dim + j) (Steele, Lea, Flood, "Fast splittable pseudorandom
number generators", OOPSLA 2014) mapped to a uniform in (0, 1) and, for normal
and truncated-normal rows, through the inverse normal CDF in double (Wichura's
AS 241), so truncation is exact rather than by resampling. `row_initializer`
converts the usual tf.keras / tf.compat.v1 initializers to the RowInitializer
of the same distribution and seed; a RowInitializer is also an ordinary
initializer, so a flat table can use the very same values.
See docs/tiers.md#initial-values.
"""

from __future__ import annotations

import dataclasses
import random

import tensorflow as tf

from mxrec_pipeline import ops
from mxrec_pipeline.core import key_index

KINDS = ("truncated_normal", "normal", "uniform", "constant")


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
    """Initial values of `global_rows`: one MxRowInit op, on the host.

    Args:
      global_rows: [n] int64 global rows (>= 0).
      dim: Columns per row.
      dtype: Floating dtype of the result.

    Returns:
      [n, dim] tensor of `dtype`.

    Raises:
      tf.errors.InvalidArgumentError: (when the op runs) a negative global row.
    """
    global_rows = tf.convert_to_tensor(global_rows, tf.int64)
    with tf.device(key_index.HOST_DEVICE):
      values = ops.load().mx_row_init(global_rows, dim=int(dim), kind=self.kind, mean=self.mean,
                                      stddev=self.stddev, minval=self.minval, maxval=self.maxval,
                                      value=self.value, scale=self.scale, seed=_signed64(self.seed))
    dtype = tf.as_dtype(dtype)
    return values if dtype == tf.float32 else tf.cast(values, dtype)

  def __call__(self, shape, dtype=tf.float32, **kwargs):
    """Rows 0..shape[0]-1: the same values a tiered table gives those global rows."""
    del kwargs
    rows, dim = int(shape[0]), int(shape[1])
    return self.rows(tf.range(rows, dtype=tf.int64), dim, tf.as_dtype(dtype))

  def scaled(self, factor: float) -> "RowInitializer":
    """This initializer with every value multiplied by `factor`."""
    return dataclasses.replace(self, scale=self.scale * factor)


def _signed64(seed: int) -> int:
  """`seed` modulo 2^64 as a signed int64 (the op's int attr): the same 64 bits."""
  seed %= 2**64
  return seed - 2**64 if seed >= 2**63 else seed


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
