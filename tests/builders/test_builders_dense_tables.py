"""builders/movielens_dense.py's stock-Keras tables, the benchmarks' references.

DenseTable (vocabulary lookup + Embedding) reads zeros for ids outside the
vocabulary; HashedTable (Hashing + Embedding) gives every id a row, the same id
always the same row, colliding ids one shared row. Both combine like SparseLookup.
"""

import numpy as np
import pytest
import tensorflow as tf

from builders import movielens_dense
from mxrec_pipeline.keras.layers import TableSpec


def _rows(layer, ids):
  return layer(tf.constant(ids), combiner=None).numpy()


def test_dense_table_reads_its_vocabulary_and_zeros_outside_it():
  table = movielens_dense.DenseTable(TableSpec("d", 4, 10), [5, 9, 11], seed=1)
  rows = _rows(table, [[5, 9, 11, 7]])[0]
  assert rows.shape == (4, 4)
  assert np.abs(rows[:3]).sum(axis=1).min() > 0
  np.testing.assert_array_equal(rows[3], 0.0)


@pytest.mark.parametrize("key_dtype, ids", [("int64", [[3, 8, 3, 10**12]]),
                                            ("string", [[b"a", b"b", b"a", b"zz"]])])
def test_hashed_table_gives_every_id_a_row_the_same_for_the_same_id(key_dtype, ids):
  table = movielens_dense.HashedTable(TableSpec("h", 4, 10, key_dtype=key_dtype), 7, seed=1)
  rows = _rows(table, ids)[0]
  assert rows.shape == (4, 4) and np.abs(rows).sum(axis=1).min() > 0
  np.testing.assert_array_equal(rows[0], rows[2])
  assert table.embedding.input_dim == 7
  mean = table(tf.ragged.constant(ids), combiner="mean").numpy()
  np.testing.assert_allclose(mean[0], rows.mean(axis=0), rtol=1e-6)


def test_hashed_table_with_one_bin_shares_it_and_round_trips_its_config():
  table = movielens_dense.HashedTable(TableSpec("one", 2, 10), 1, seed=3)
  rows = _rows(table, [[1, 2, 3]])[0]
  np.testing.assert_array_equal(rows, np.repeat(rows[:1], 3, axis=0))
  again = movielens_dense.HashedTable.from_config(table.get_config())
  assert again.num_bins == 1 and again.spec == table.spec
