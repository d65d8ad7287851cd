"""RowInitializer: initial rows by global row, from the native MxRowInit op.

A flat table (RowInitializer.__call__, rows 0..n-1) and a tiered table
(RowInitializer.rows, any global rows) must get the same values; each kind must
have its distribution; the usual initializers convert with their seed.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline import ops
from mxrec_pipeline.core import initializers
from mxrec_pipeline.core.embedding import create_table
from mxrec_pipeline.util.initialize import init

RowInitializer = initializers.RowInitializer

# ~200k values per distribution.
ROWS, DIM = 6250, 32
TRUNCATED_STD = 0.8796  # Stddev of a normal truncated at 2 sigma, in sigmas.


def _values(initializer, rows=ROWS, dim=DIM):
  return initializer.rows(tf.range(rows, dtype=tf.int64), dim).numpy().ravel()


KIND_ARGS = [
    dict(kind="truncated_normal", mean=0.1, stddev=0.2, seed=3),
    dict(kind="normal", mean=-0.5, stddev=0.3, seed=4),
    dict(kind="uniform", minval=-0.25, maxval=0.75, seed=5),
    dict(kind="constant", value=0.125, seed=6),
]

# -- flat and tiered tables agree ----------------------------------------------


@pytest.mark.parametrize("args", KIND_ARGS, ids=lambda a: a["kind"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_rows_of_globals_are_the_call_rows_at_those_positions(args, dtype):
  init_ = RowInitializer(**args, scale=1.5)
  flat = init_([500, 7], dtype=dtype)
  assert flat.dtype == dtype and flat.shape == [500, 7]
  globals_ = np.array([499, 0, 3, 3, 250, 17], np.int64)
  rows = init_.rows(tf.constant(globals_), 7, dtype)
  assert rows.dtype == dtype and rows.shape == [6, 7]
  np.testing.assert_array_equal(rows.numpy(), flat.numpy()[globals_])


def test_a_row_depends_only_on_its_global():
  init_ = RowInitializer("truncated_normal", seed=12)
  big = [2**62 + 5, 123456789012345]
  together = init_.rows(tf.constant([7, 0] + big, tf.int64), 16).numpy()
  for i, g in enumerate([7, 0] + big):
    np.testing.assert_array_equal(
        init_.rows(tf.constant([g], tf.int64), 16).numpy()[0], together[i])
  assert init_.rows(tf.constant([], tf.int64), 16).shape == [0, 16]


def test_rows_in_a_tf_function_of_unknown_length():
  init_ = RowInitializer("normal", seed=8)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
  def rows(globals_):
    out = init_.rows(globals_, 5)
    assert out.shape.as_list() == [None, 5]
    return out

  np.testing.assert_array_equal(
      rows(tf.constant([4, 1], tf.int64)).numpy(),
      init_([5, 5]).numpy()[[4, 1]])


def test_rows_run_on_the_host():
  out = RowInitializer(seed=1).rows(tf.constant([1, 2], tf.int64), 3)
  assert out.device.endswith("CPU:0")


def test_seeds_and_columns_give_different_values():
  a = RowInitializer("normal", seed=1)([4, 8]).numpy()
  b = RowInitializer("normal", seed=2)([4, 8]).numpy()
  assert not np.allclose(a, b)
  assert len(np.unique(a)) == a.size


def test_seed_is_taken_modulo_2_to_the_64():

  def rows(seed):
    return RowInitializer("uniform", seed=seed)([3, 4]).numpy()

  np.testing.assert_array_equal(rows(2**64 - 1), rows(-1))
  np.testing.assert_array_equal(rows(2**63), rows(-(2**63)))
  np.testing.assert_array_equal(rows(2**64 + 9), rows(9))
  assert not np.array_equal(rows(2**63), rows(2**63 - 1))


def test_the_op_refuses_negative_globals_and_non_vectors():
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"got -3 at position 1"):
    RowInitializer(seed=1).rows(tf.constant([2, -3], tf.int64), 4)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"must be a vector, got shape \[1,2\]"):
    ops.load().mx_row_init(tf.constant([[1, 2]], tf.int64), dim=4, kind="normal")


# -- distributions ---------------------------------------------------------------


def test_truncated_normal_stays_within_two_stddev():
  v = _values(RowInitializer("truncated_normal", mean=0.1, stddev=0.2, seed=3))
  assert v.min() >= np.float32(0.1 - 0.4) and v.max() <= np.float32(0.1 + 0.4)
  assert v.min() < 0.1 - 0.399 and v.max() > 0.1 + 0.399
  assert abs(v.mean() - 0.1) < 0.002
  assert abs(v.std() - TRUNCATED_STD * 0.2) < 0.002


def test_normal_mean_stddev_and_tails():
  v = _values(RowInitializer("normal", mean=-0.5, stddev=0.3, seed=4))
  assert abs(v.mean() + 0.5) < 0.003
  assert abs(v.std() - 0.3) < 0.003
  z = np.abs(v + 0.5) / 0.3
  assert abs(np.mean(z > 2) - 0.0455) < 0.003  # Not truncated.
  assert np.mean(z > 3) > 0.001


def test_uniform_within_minval_maxval():
  v = _values(RowInitializer("uniform", minval=-0.25, maxval=0.75, seed=5))
  assert v.min() >= -0.25 and v.max() < 0.75
  assert v.min() < -0.249 and v.max() > 0.749
  assert abs(v.mean() - 0.25) < 0.003
  assert abs(v.std() - 1 / np.sqrt(12)) < 0.003


def test_constant_and_scale():
  np.testing.assert_array_equal(
      RowInitializer("constant", value=0.125, scale=4.0)([3, 2]), np.full([3, 2], 0.5, np.float32))
  base = RowInitializer("truncated_normal", seed=9)
  scaled = base.scaled(0.5)
  assert scaled.scale == 0.5 and scaled.seed == base.seed
  assert scaled.scaled(4.0).scale == 2.0
  # Halving is exact: the scaled rows are the rows halved, to the bit.
  np.testing.assert_array_equal(scaled([20, 8]).numpy(), base([20, 8]).numpy() * 0.5)


# -- conversion ------------------------------------------------------------------


@pytest.mark.parametrize(
    "initializer, expected", [
        (tf.keras.initializers.TruncatedNormal(mean=0.5, stddev=0.25, seed=11),
         RowInitializer("truncated_normal", mean=0.5, stddev=0.25, seed=11)),
        (tf.keras.initializers.RandomNormal(mean=-1.0, stddev=2.0, seed=12),
         RowInitializer("normal", mean=-1.0, stddev=2.0, seed=12)),
        (tf.keras.initializers.RandomUniform(minval=-3.0, maxval=1.0, seed=13),
         RowInitializer("uniform", minval=-3.0, maxval=1.0, seed=13)),
        (tf.keras.initializers.Constant(0.75), RowInitializer("constant", value=0.75)),
        (tf.keras.initializers.Zeros(), RowInitializer("constant", value=0.0)),
        (tf.keras.initializers.Ones(), RowInitializer("constant", value=1.0)),
        (tf.compat.v1.truncated_normal_initializer(mean=0.5, stddev=0.25, seed=21),
         RowInitializer("truncated_normal", mean=0.5, stddev=0.25, seed=21)),
        (tf.compat.v1.random_normal_initializer(mean=-1.0, stddev=2.0, seed=22),
         RowInitializer("normal", mean=-1.0, stddev=2.0, seed=22)),
        (tf.compat.v1.random_uniform_initializer(minval=-3.0, maxval=1.0, seed=23),
         RowInitializer("uniform", minval=-3.0, maxval=1.0, seed=23)),
        (tf.compat.v1.constant_initializer(-2.5), RowInitializer("constant", value=-2.5)),
        (tf.compat.v1.zeros_initializer(), RowInitializer("constant", value=0.0)),
        (tf.compat.v1.ones_initializer(), RowInitializer("constant", value=1.0)),
    ], ids=[
        f"{api}-{name}" for api in ("keras", "v1")
        for name in ("TruncatedNormal", "RandomNormal", "RandomUniform", "Constant", "Zeros",
                     "Ones")
    ])
def test_conversion_keeps_distribution_and_seed(initializer, expected):
  converted = initializers.row_initializer(initializer, "t")
  fields = ("kind", "mean", "stddev", "minval", "maxval", "value", "scale")
  if expected.kind == "constant":
    fields = ("kind", "value", "scale")  # A constant has no seed to carry.
  assert {f: getattr(converted, f) for f in fields} == {f: getattr(expected, f) for f in fields}
  if expected.kind != "constant":
    assert converted.seed == expected.seed
  np.testing.assert_array_equal(converted([6, 3]).numpy(), expected([6, 3]).numpy())


def test_conversion_of_classes_and_row_initializers():
  assert initializers.row_initializer(tf.keras.initializers.Ones, "t").value == 1.0
  assert initializers.row_initializer(tf.compat.v1.zeros_initializer, "t").value == 0.0
  row_init = RowInitializer(seed=1)
  assert initializers.row_initializer(row_init, "t") is row_init


def test_unsupported_initializers_name_the_table():
  with pytest.raises(ValueError, match=r"create_table\('my_table'\).*GlorotUniform"):
    initializers.row_initializer(tf.keras.initializers.GlorotUniform(seed=1), "my_table")
  with pytest.raises(ValueError, match=r"create_table\('other'\).*scalar Constant"):
    initializers.row_initializer(tf.keras.initializers.Constant([1.0, 2.0]), "other")


def test_init_param_scales_the_rows_of_flat_and_tiered_tables():
  init()
  row_init = RowInitializer("normal", stddev=0.1, seed=5)
  flat = create_table(tf.int64, 4, "flat", row_init, device_vocabulary_size=16, init_param=0.5)
  tiered = create_table(tf.int64, 4, "tiered",
                        tf.keras.initializers.RandomNormal(stddev=0.1, seed=5),
                        device_vocabulary_size=4, host_vocabulary_size=12, init_param=0.5)
  assert tiered.tiers.row_initializer == row_init.scaled(0.5)
  np.testing.assert_array_equal(flat.variable.numpy(), row_init([16, 4]).numpy() * 0.5)
  np.testing.assert_array_equal(
      tiered.tiers.row_initializer.rows(tf.range(16, dtype=tf.int64), 4).numpy(),
      flat.variable.numpy())


# -- validation and seeds --------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (dict(kind="glorot"), "`kind` must be one of"),
    (dict(kind="normal", stddev=0.0), "`stddev` must be positive"),
    (dict(kind="truncated_normal", stddev=-1.0), "`stddev` must be positive"),
    (dict(kind="uniform", minval=1.0, maxval=0.0), "minval 1.0 > maxval 0.0"),
])
def test_bad_arguments_raise(args, message):
  with pytest.raises(ValueError, match=message):
    RowInitializer(**args)


def test_seed_none_draws_a_seed_reproducibly():
  a, b = RowInitializer(), RowInitializer()
  assert a.seed is not None and a.seed != b.seed
  assert not np.array_equal(a([2, 4]).numpy(), b([2, 4]).numpy())
  tf.keras.utils.set_random_seed(1234)
  first = RowInitializer().seed
  tf.keras.utils.set_random_seed(1234)
  assert RowInitializer().seed == first
  # A Keras initializer without a seed converts to a drawn one too.
  tf.keras.utils.set_random_seed(99)
  drawn = initializers.row_initializer(tf.keras.initializers.TruncatedNormal(), "t").seed
  tf.keras.utils.set_random_seed(99)
  assert initializers.row_initializer(tf.keras.initializers.TruncatedNormal(), "t").seed == drawn
