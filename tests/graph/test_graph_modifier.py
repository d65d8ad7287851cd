"""Automatic graph modification (modify_graph=True) and start_asc_pipeline, in TF1 graphs."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.core.asc.manager import start_asc_pipeline
from mxrec_pipeline.core.embedding import create_table, sparse_lookup
from mxrec_pipeline.graph import modifier
from mxrec_pipeline.util.initialize import init, terminate_config_initializer

USERS = np.array([[1], [2], [3], [1], [9], [2]], np.int64)
ITEMS = np.array([[5, 6], [6, 7], [5, 5], [8, 1], [6, 6], [7, 5]], np.int64)


def _table(name="t"):
  return create_table(tf.int64, 4, name, tf.compat.v1.truncated_normal_initializer(seed=3),
                      device_vocabulary_size=20)


def _iterator(mapper=None):
  dataset = tf.data.Dataset.from_tensor_slices({"user": USERS, "item": ITEMS}).batch(2)
  if mapper is not None:
    dataset = dataset.map(mapper)
  iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
  return iterator, iterator.get_next()


def _run_all(sess, tensors, initializer):
  sess.run(initializer)
  out = []
  while True:
    try:
      out.append(sess.run(tensors))
    except tf.errors.OutOfRangeError:
      return out


def _lookups(modify_graph):
  """Embeddings and key index of both features through one table, per batch."""
  with tf.Graph().as_default():
    init()
    specs = [FeatureSpec("user", table_name="t"), FeatureSpec("item", table_name="t")]
    mapper = None if modify_graph else get_asc_insert_func(specs, is_training=True)
    iterator, batch = _iterator(mapper)
    table = _table()
    if modify_graph:
      user = sparse_lookup(table, batch["user"], modify_graph=True)
      item = sparse_lookup(table, batch["item"], modify_graph=True)
      modifier.modify_graph_and_start_emb_cache()
      initializer = modifier.get_initializer(True)
    else:
      user = sparse_lookup(table, specs[0], batch=batch)
      item = sparse_lookup(table, specs[1], batch=batch)
      start_asc_pipeline()
      initializer = iterator.initializer
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      values = _run_all(sess, [user, item], initializer)
      keys, rows = sess.run(table.key_index.export())
  terminate_config_initializer()
  return values, dict(zip(keys.tolist(), rows.tolist()))


def test_modified_graph_equals_feature_spec_mode():
  modified, modified_index = _lookups(modify_graph=True)
  feature_spec, feature_spec_index = _lookups(modify_graph=False)
  assert modified_index == feature_spec_index
  assert len(modified) == 3
  for (u1, i1), (u2, i2) in zip(modified, feature_spec):
    np.testing.assert_array_equal(u1, u2)
    np.testing.assert_array_equal(i1, i2)
  assert modified[0][0].shape == (2, 1, 4) and modified[0][1].shape == (2, 2, 4)


def test_lookup_without_modification_says_what_to_call():
  with tf.Graph().as_default():
    init()
    iterator, batch = _iterator()
    emb = sparse_lookup(_table(), batch["user"], modify_graph=True)
    with tf.compat.v1.Session() as sess:
      sess.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match="call mxrec_pipeline.graph.modifier.modify_graph_and_start"):
        sess.run(emb)
    with pytest.raises(RuntimeError, match="call modify_graph_and_start_emb_cache"):
      modifier.get_initializer(True)


def test_computed_ids_and_missing_lookups_are_rejected():
  with tf.Graph().as_default():
    init()
    _, batch = _iterator()
    table = _table()
    with pytest.raises(RuntimeError, match="no sparse_lookup"):
      modifier.modify_graph_and_start_emb_cache()
    sparse_lookup(table, batch["user"] + 1, modify_graph=True)
    with pytest.raises(ValueError, match="must come straight from iterator.get_next"):
      modifier.modify_graph_and_start_emb_cache()


def test_dump_graph_writes_the_modified_graph(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with tf.Graph().as_default():
    init()
    _, batch = _iterator()
    sparse_lookup(_table(), batch["user"], modify_graph=True)
    modifier.modify_graph_and_start_emb_cache(dump_graph=True)
  text = (tmp_path / "export_graph" / modifier.DUMP_FILE).read_text()
  assert "MxKeyIndexInsert" in text


def test_start_asc_pipeline_names_missing_tables():
  with tf.Graph().as_default():
    init()
    get_asc_insert_func([FeatureSpec("user", table_name="user_table")], is_training=True)
    with pytest.raises(RuntimeError, match=r"tables \['user_table'\] that were never created"):
      start_asc_pipeline()
    _table("user_table")
    start_asc_pipeline()


def test_table_from_another_graph_is_rejected():
  init()
  with tf.Graph().as_default():
    table = _table()
  with tf.Graph().as_default():
    with pytest.raises(RuntimeError, match="created in another graph"):
      sparse_lookup(table, tf.constant([1], tf.int64))
    # An Estimator's next graph re-creates its tables under the same names.
    assert _table() is not table


def test_feat_count_is_checked():
  init()
  insert = get_asc_insert_func([FeatureSpec("item", table_name="t", feat_count=3)],
                               is_training=True)
  _table()
  with pytest.raises(ValueError, match="last dimension is 2, feat_count says 3"):
    insert({"item": tf.constant(ITEMS)})
  with pytest.raises(ValueError, match="`feat_count` must be a positive int"):
    FeatureSpec("x", feat_count=0)
