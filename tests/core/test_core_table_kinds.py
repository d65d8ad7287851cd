"""Every table says its kind, and core/lookup.py reads each kind's rows."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import initializers
from mxrec_pipeline.core import lookup
from mxrec_pipeline.core.embedding import create_table
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init

INIT = initializers.RowInitializer("truncated_normal", stddev=0.1, seed=7)


def _rows(table, unique_rows, **kwargs):
  return lookup.unique_embeddings(table, tf.constant(unique_rows, tf.int64), **kwargs).numpy()


def test_flat_table_reads_rows_and_defaults_for_missing_rows():
  init()
  table = create_table(tf.int64, 2, "flat", INIT, device_vocabulary_size=4)
  assert (table.kind, table.is_tiered) == (lookup.TableKind.FLAT, False)
  rows = table.variable.numpy()
  np.testing.assert_array_equal(_rows(table, [2, 0], training=True), rows[[2, 0]])
  np.testing.assert_array_equal(_rows(table, [1, -1], training=False, default_value=5.0),
                                [rows[1], [5.0, 5.0]])


def test_tiered_table_needs_the_plan_in_training():
  init()
  table = create_table(tf.int64, 2, "tiered", INIT, device_vocabulary_size=2,
                       host_vocabulary_size=4,
                       optimizer_list=[lazy_adam.create_hash_optimizer(0.1)])
  assert (table.kind, table.is_tiered) == (lookup.TableKind.TIERED, True)
  with pytest.raises(ValueError, match="table 'tiered' is tiered: a training lookup needs"):
    _rows(table, [0], training=True)
  # Not training: global rows are read wherever they live (a fresh row: its initial value).
  np.testing.assert_allclose(_rows(table, [3, -1], training=False),
                             [INIT.rows(tf.constant([3], tf.int64), 2, tf.float32)[0], [0, 0]])


def test_expansion_table_grows_and_refuses_admission():
  init(use_dynamic_expansion=True)
  table = create_table(tf.int64, 2, "grow", tf.keras.initializers.Constant(0.5),
                       device_vocabulary_size=2)
  assert (table.kind, table.is_tiered) == (lookup.TableKind.EXPANSION, False)
  np.testing.assert_array_equal(_rows(table, [3], training=True), [[0.5, 0.5]])
  np.testing.assert_array_equal(_rows(table, [-1], training=False, default_value=2.0), [[2.0, 2.0]])
  with pytest.raises(NotImplementedError, match="table 'grow': admission"):
    _rows(table, [0], training=True, admitting=True)
