"""Tests of get_dense_and_sparse_variable."""

import pytest
import tensorflow as tf

from mxrec_pipeline.util.initialize import init, terminate_config_initializer
from mxrec_pipeline.util.variable import get_dense_and_sparse_variable

import sparse_testlib as lib


def _names(variables):
  return [v.name for v in variables]


def test_graph_collection_is_split():
  with tf.Graph().as_default():
    init()
    lib.make_table("item")
    weights = tf.compat.v1.get_variable("weights", [3, 1])
    user = lib.make_table("user", dim=2)
    tf.compat.v1.get_variable("bias", [1])
    tf.compat.v1.get_variable("frozen", [1], trainable=False)
    dense, sparse = get_dense_and_sparse_variable()
  assert _names(dense) == ["weights:0", "bias:0"]
  assert _names(sparse) == ["item/embedding:0", "user/embedding:0"]
  assert dense[0] is weights and sparse[1] is user.variable


def test_explicit_variables_are_split_in_their_order():
  init()
  item = lib.make_table("item")
  weights = tf.Variable(tf.zeros([2]))
  dense, sparse = get_dense_and_sparse_variable([weights, item.variable])
  assert len(dense) == 1 and dense[0] is weights
  assert len(sparse) == 1 and sparse[0] is item.variable
  assert get_dense_and_sparse_variable([]) == ([], [])


def test_tables_of_an_earlier_run_are_dense_now():
  init()
  old = lib.make_table("item")
  terminate_config_initializer()
  init()
  new = lib.make_table("item")
  (dense,), (sparse,) = get_dense_and_sparse_variable([old.variable, new.variable])
  assert dense is old.variable and sparse is new.variable


def test_eager_without_variables_raises():
  init()
  lib.make_table("item")
  with pytest.raises(RuntimeError, match=r"eager execution has no variable collections; pass "
                     r"the variables"):
    get_dense_and_sparse_variable()


def test_before_init_raises():
  with pytest.raises(RuntimeError, match=r"not initialized"):
    get_dense_and_sparse_variable([])
