"""TableConfig / FeatureConfig checks, shared tables, table names, joining an mxRec run."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline import embedding as tpu_embedding
from mxrec_pipeline.core import embedding as core_embedding
from mxrec_pipeline.util import initialize

import embedding_testlib as lib


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocabulary_size=0, dim=2), "`vocabulary_size` must be an int >= 1, got 0"),
    (dict(vocabulary_size=4, dim=2.0), "`dim` must be an int >= 1, got 2.0"),
    (dict(vocabulary_size=4, dim=2, initializer="zeros"), "`initializer` must be callable"),
    (dict(vocabulary_size=4, dim=2, combiner="max"), "`combiner` must be one of"),
])
def test_table_config_rejects_bad_values(kwargs, message):
  with pytest.raises(ValueError, match=message):
    tpu_embedding.TableConfig(**kwargs)


def test_feature_config_rejects_bad_values():
  table = tpu_embedding.TableConfig(4, 2)
  with pytest.raises(ValueError, match="`table` must be a mxrec_pipeline.embedding.TableConfig"):
    tpu_embedding.FeatureConfig(tf.tpu.experimental.embedding.TableConfig(4, 2))
  with pytest.raises(ValueError, match="`max_sequence_length` must be an int >= 0, got -1"):
    tpu_embedding.FeatureConfig(table, max_sequence_length=-1)
  assert tpu_embedding.FeatureConfig(table, output_shape=[3, 4]).output_shape == [3, 4]


def test_shared_table_is_one_table_with_one_row_per_id():
  rows = lib.initial_rows(8, 2)
  table = tpu_embedding.TableConfig(8, 2, initializer=lib.constant_initializer(rows))
  other = tpu_embedding.TableConfig(8, 2)
  embedding = tpu_embedding.Embedding([
      tpu_embedding.FeatureConfig(table),
      tpu_embedding.FeatureConfig(other),
      tpu_embedding.FeatureConfig(table)
  ], tpu_embedding.SGD(1.0))
  assert list(embedding.embedding_tables) == [table, other]
  assert sorted(initialize.get_config_initializer().tables) == ["table_0", "table_1"]
  embedding.enqueue([
      tf.constant([[5], [6]], tf.int64),
      tf.constant([[5], [6]], tf.int64),
      tf.ragged.constant([[6, 7], [5]], dtype=tf.int64)
  ])
  first, _, third = embedding.dequeue()
  assert lib.row_of(embedding, table) == {5: 0, 6: 1, 7: 2}
  np.testing.assert_allclose(first.numpy(), rows[:2], rtol=1e-6)
  np.testing.assert_allclose(third.numpy(), [(rows[1] + rows[2]) / 2, rows[0]], rtol=1e-6)
  # d(sum of both features)/d row: id 5: 1 (first) + 1 (third, alone) = 2; id 6: 1 + 1/2.
  embedding.apply_gradients([tf.ones([2, 2]), None, tf.ones([2, 2])])
  after = embedding.embedding_tables[table].numpy()
  np.testing.assert_allclose(after[:3], [rows[0] - 2.0, rows[1] - 1.5, rows[2] - 0.5], rtol=1e-6)


def test_rows_of_a_shared_tables_feature_without_gradient_stay_untouched():
  # Row of id 7 (only the second feature's) moves at step 1; at step 2 that
  # feature's gradient is None, so lazy Adam must not touch the row (a zero
  # gradient would move it by its momentum). Id 5's row trains both steps.
  rows = lib.initial_rows(8, 2)
  table = tpu_embedding.TableConfig(8, 2, initializer=lib.constant_initializer(rows))
  embedding = tpu_embedding.Embedding(
      [tpu_embedding.FeatureConfig(table),
       tpu_embedding.FeatureConfig(table)], tpu_embedding.Adam(0.1))
  ids = [tf.constant([[5]], tf.int64), tf.constant([[7], [5]], tf.int64)]
  embedding.enqueue(ids, training=True)
  embedding.dequeue()
  embedding.apply_gradients([tf.ones([1, 2]), tf.ones([2, 2])])
  after_first = embedding.embedding_tables[table].numpy()
  assert lib.row_of(embedding, table) == {5: 0, 7: 1}
  assert np.all(after_first[:2] != rows[:2])
  embedding.enqueue(ids, training=True)
  embedding.dequeue()
  embedding.apply_gradients([tf.ones([1, 2]), None])
  after_second = embedding.embedding_tables[table].numpy()
  np.testing.assert_array_equal(after_second[1], after_first[1])
  assert np.all(after_second[0] != after_first[0])


def test_duplicate_table_names_raise():
  a, b = tpu_embedding.TableConfig(4, 2, name="same"), tpu_embedding.TableConfig(4, 2, name="same")
  with pytest.raises(ValueError, match="Tables must have a unique name.*same"):
    tpu_embedding.Embedding([tpu_embedding.FeatureConfig(a), tpu_embedding.FeatureConfig(b)], None)


def test_embedding_starts_a_run_or_joins_the_current_one():
  assert not initialize.is_initialized()
  table = tpu_embedding.TableConfig(4, 2, name="first")
  tpu_embedding.Embedding(tpu_embedding.FeatureConfig(table), None)
  run = initialize.get_config_initializer()  # Started by the Embedding.
  assert list(run.tables) == ["first"]
  core_embedding.create_table(key_dtype=tf.int64, dim=2, name="mxrec_table",
                              emb_initializer=tf.zeros, device_vocabulary_size=4)
  tpu_embedding.Embedding(tpu_embedding.FeatureConfig(tpu_embedding.TableConfig(4, 2, name="more")),
                          None)
  assert initialize.get_config_initializer() is run
  assert list(run.tables) == ["first", "mxrec_table", "more"]
  with pytest.raises(ValueError, match=r"already has tables named \['first'\]"):
    tpu_embedding.Embedding(
        tpu_embedding.FeatureConfig(tpu_embedding.TableConfig(4, 2, name="first")), None)


def test_tpu_embedding_alias_and_default_initializer():
  assert tpu_embedding.TPUEmbedding is tpu_embedding.Embedding
  table = tpu_embedding.TableConfig(1000, 16)
  embedding = tpu_embedding.TPUEmbedding(tpu_embedding.FeatureConfig(table), None)
  values = embedding.embedding_tables[table].numpy()
  # Truncated normal, stddev 1/sqrt(dim) = 0.25 before truncation at 2 stddevs.
  assert np.abs(values).max() <= 0.5 + 1e-6
  assert 0.15 < values.std() < 0.25


def test_runs_with_dynamic_expansion_are_refused():
  initialize.init(use_dynamic_expansion=True)
  with pytest.raises(NotImplementedError, match="use_dynamic_expansion=True"):
    tpu_embedding.Embedding(tpu_embedding.FeatureConfig(tpu_embedding.TableConfig(4, 2)), None)
