"""Tests of create_table: arguments, placement, registration."""

import re

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.util.initialize import (get_config_initializer, init,
                                            terminate_config_initializer)


def _create(**overrides):
  args = dict(key_dtype=tf.int64, dim=4, name="t", device_vocabulary_size=8,
              emb_initializer=tf.keras.initializers.RandomNormal(seed=1))
  args.update(overrides)
  return embedding.create_table(**args)


@pytest.fixture(autouse=True)
def _run():
  init()


def test_table_has_rows_of_the_asked_shape_and_is_registered():
  table = _create(key_dtype=tf.int32, dim=tf.TensorShape([4]), init_param=0.5,
                  emb_initializer=tf.ones_initializer())
  assert table.variable.shape == [8, 4]
  assert table.variable.dtype == tf.float32
  assert table.variable.trainable
  assert table.key_dtype == tf.int32
  np.testing.assert_array_equal(table.variable.numpy(), np.full([8, 4], 0.5, np.float32))
  assert table.variable.device.endswith("CPU:0")
  assert get_config_initializer().tables == {"t": table}
  assert table.key_index.size().numpy() == 0
  assert table.key_index.capacity == 8


def test_value_dtype_float64():
  table = _create(value_dtype=tf.float64, emb_initializer=tf.zeros_initializer())
  assert table.variable.dtype == tf.float64


@pytest.mark.parametrize("dim", [0, -3])
def test_dim_must_be_positive(dim):
  with pytest.raises(ValueError, match=rf"create_table\('t'\): `dim` must be a positive int, "
                     rf"got {dim}"):
    _create(dim=dim)


@pytest.mark.parametrize("dim, shown", [(2.5, "2.5"), (True, "True"), ("4", "'4'"),
                                        (tf.TensorShape([2, 3]), "None")])
def test_dim_must_be_an_int(dim, shown):
  with pytest.raises(ValueError, match=rf"`dim` must be a positive int, got {shown}"):
    _create(dim=dim)


@pytest.mark.parametrize("key_dtype", [tf.float32, tf.uint8, tf.bool])
def test_bad_key_dtype(key_dtype):
  with pytest.raises(
      ValueError, match=rf"`key_dtype` must be one of \['int32', 'int64', "
      rf"'string'\], got {key_dtype.name}"):
    _create(key_dtype=key_dtype)


def test_duplicate_name():
  _create()
  with pytest.raises(ValueError, match=r"a table named 't' already exists"):
    _create(dim=2)
  _create(name="u")  # Another name is fine.


@pytest.mark.parametrize("size, shown", [(0, "0"), (-1, "-1"), (2.0, "2.0"), (None, "None")])
def test_device_vocabulary_size_must_be_positive(size, shown):
  with pytest.raises(
      ValueError, match=rf"create_table\('t'\): `device_vocabulary_size` must "
      rf"be a positive int, got {shown}"):
    _create(device_vocabulary_size=size)


@pytest.mark.parametrize("size", [2**40 + 1, 2**62 + 1, 2**63 - 1])
def test_device_vocabulary_size_above_the_native_maximum_fails_cleanly(size):
  # Used to hang (slot count overflow) or crash the process (std::bad_alloc).
  with pytest.raises(
      tf.errors.InvalidArgumentError,
      match=rf"table 't': device_vocabulary_size={size} is above the supported "
      rf"maximum of {2**40} rows"):
    _create(device_vocabulary_size=size)
  assert get_config_initializer().tables == {}


def test_bad_name_value_dtype_and_initializer():
  with pytest.raises(ValueError, match=r"`value_dtype` must be floating, got int32"):
    _create(value_dtype=tf.int32)
  with pytest.raises(ValueError, match=r"`emb_initializer` must be callable, got 3"):
    _create(emb_initializer=3)
  assert get_config_initializer().tables == {}  # Nothing half-created.


def test_numpy_integers_are_accepted():
  table = _create(dim=np.int64(4), device_vocabulary_size=np.int32(8))
  assert type(table.dim) is int and table.dim == 4
  assert type(table.device_vocabulary_size) is int
  assert table.variable.shape == [8, 4]


@pytest.mark.parametrize(
    "name", ["", "_user", "-user", "/user", "user id", "x:y", "user/", "a//b", 3, None])
def test_name_must_be_a_valid_variable_scope(name):
  with pytest.raises(
      ValueError, match=rf"create_table: `name` must be a non-empty string of "
      rf"letters, .*got {re.escape(repr(name))}"):
    _create(name=name)


@pytest.mark.parametrize("name", ["user", "user.id-2", "0_item", "group/item_ids", ".x"])
def test_valid_names_work_eagerly_and_in_graphs(name):
  table = _create(name=name)
  assert embedding.sparse_lookup(table, tf.constant([3], tf.int64)).shape == [1, 4]
  terminate_config_initializer()
  with tf.Graph().as_default():
    init()
    table = _create(name=name)
    assert table.variable.name == f"{name}/embedding:0"
    embedding.sparse_lookup(table, tf.constant([3], tf.int64))


@pytest.mark.parametrize("kind", ["numpy", "outer_tensor", "keras"])
def test_graph_initializer_creates_the_index_whatever_the_initializer_returns(kind):
  terminate_config_initializer()
  rows = np.arange(12, dtype=np.float32).reshape(3, 4)
  with tf.Graph().as_default():
    init()
    outer = tf.constant(rows)  # Built before the table, outside its initializer.
    initializer = {
        "numpy": lambda shape, dtype: rows, "outer_tensor": lambda shape, dtype: outer,
        "keras": tf.keras.initializers.Constant(rows)
    }[kind]
    table = _create(device_vocabulary_size=3, emb_initializer=initializer, init_param=2.0)
    lookup = embedding.sparse_lookup(table, tf.constant([7, 8, 7], tf.int64))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      np.testing.assert_array_equal(sess.run(lookup), 2.0 * rows[[0, 1, 0]])


@pytest.mark.parametrize("tier", [dict(ssd_vocabulary_size=10), dict(ssd_data_path=("/tmp",))])
def test_ssd_tier_needs_a_host_tier(tier):
  with pytest.raises(
      ValueError, match=r"create_table\('t'\): an SSD tier .* needs "
      r"host_vocabulary_size > 0"):
    _create(**tier)


def test_tiers_need_dynamic_expansion_off():
  # Tiered tables themselves are tested in tests/core/test_core_tiers.py.
  terminate_config_initializer()
  init(use_dynamic_expansion=True)
  with pytest.raises(ValueError, match=r"'t'.*use_dynamic_expansion=False"):
    _create(host_vocabulary_size=100)


def test_dynamic_expansion_creates_an_expansion_table():
  # Expansion tables are tested in tests/core/test_core_expansion.py and
  # tests/optimizers/test_optimizers_by_addr.py.
  terminate_config_initializer()
  init(use_dynamic_expansion=True)
  assert type(_create()).__name__ == "ExpansionTable"
