"""Feature admission: keys get rows only after access_threshold sightings (x faae_coefficient)."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.core.embedding import sparse_lookup
from mxrec_pipeline.graph import modifier
from mxrec_pipeline.optimizers import gradient_descent
from mxrec_pipeline.util.initialize import init, terminate_config_initializer

import sparse_testlib as lib

CAPACITY, DIM = 4, 2


def _stats(table):
  return {name: int(value) for name, value in admission.table_stats(table).items()}


def test_feature_spec_admission_with_faae_coefficients():
  init()
  table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
  specs = [
      FeatureSpec("a", table_name="t", access_threshold=2),
      FeatureSpec("b", table_name="t", access_threshold=2, faae_coefficient=2)
  ]
  batches = [{"a": np.array([1, 2, 2], np.int64), "b": np.array([3], np.int64)},
             {"a": np.array([1, 4], np.int64), "b": np.array([4], np.int64)}]
  dataset = tf.data.Dataset.from_generator(
      lambda: iter(batches),
      output_signature={"a": tf.TensorSpec([None], tf.int64), "b": tf.TensorSpec([None], tf.int64)})
  inserted = list(dataset.map(get_asc_insert_func(specs, is_training=True)))
  initial = lib.initial_rows(CAPACITY, DIM)

  # Batch 1 counts: key 1 -> 1, key 2 -> 2, key 3 -> 2 (coefficient 2). Threshold 2.
  first = inserted[0]
  assert first["mxrec__t__unique_rows"].numpy().tolist() == [-1, 0, 1]
  emb = sparse_lookup(table, specs[0], batch=first).numpy()
  np.testing.assert_array_equal(emb, [np.zeros(DIM), initial[0], initial[0]])
  np.testing.assert_array_equal(sparse_lookup(table, specs[1], batch=first).numpy(), [initial[1]])
  # Batch 2: key 1 reaches 2 -> row 2; key 4 has 1 + 2 -> row 3.
  assert inserted[1]["mxrec__t__unique_rows"].numpy().tolist() == [2, 3]
  assert lib.index_dict(table) == {2: 0, 3: 1, 1: 2, 4: 3}
  assert _stats(table) == {
      "size": 4, "capacity": CAPACITY, "admissions": 4, "evictions": 0, "pending": 0
  }


def test_pending_keys_read_zeros_and_get_no_update():
  init()
  table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
  optimizer = gradient_descent.create_hash_optimizer(0.5)
  config = {"access_threshold": 2, "eviction_threshold": None, "faae_coefficient": 1}
  ids = tf.constant([[5, 6], [5, 7]], tf.int64)  # Key 5 is seen twice: admitted, row 0.
  target = np.arange(4 * DIM, dtype=np.float32).reshape([2, 2, DIM])
  with tf.GradientTape() as tape:
    emb = sparse_lookup(table, ids, access_and_evict_config=config)
    loss = tf.reduce_sum(emb * target)
  grad = tape.gradient(loss, table.variable)
  # Keys 6 and 7 have no row, hence no gradient; key 5's row, its two ids' summed.
  assert grad.indices.numpy().tolist() == [0]
  optimizer.apply_gradients([(grad, table.variable)])

  initial = lib.initial_rows(CAPACITY, DIM)
  np.testing.assert_array_equal(emb.numpy()[0, 1], np.zeros(DIM))
  np.testing.assert_array_equal(emb.numpy()[1, 1], np.zeros(DIM))
  np.testing.assert_array_equal(emb.numpy()[0, 0], initial[0])
  expected = initial.copy()
  expected[0] -= 0.5 * (target[0, 0] + target[1, 0])
  np.testing.assert_allclose(table.variable.numpy(), expected, rtol=1e-6)
  assert _stats(table)["pending"] == 2 and _stats(table)["admissions"] == 1


def test_serving_default_value_for_pending_keys():
  init()
  table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
  emb = sparse_lookup(table, tf.constant([9], tf.int64), serving_default_value=0.25,
                      access_and_evict_config={"access_threshold": 3})
  np.testing.assert_array_equal(emb.numpy(), [[0.25, 0.25]])


def test_tf2_checkpoint_keeps_admission_counts(tmp_path):
  init()
  table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
  config = {"access_threshold": 3}
  sparse_lookup(table, tf.constant([8, 8, 9], tf.int64), access_and_evict_config=config)
  path = tf.train.Checkpoint(index=table.key_index).save(tmp_path / "ckpt")
  terminate_config_initializer()

  init()
  table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
  tf.train.Checkpoint(index=table.key_index).restore(path).assert_consumed()
  assert _stats(table) == {
      "size": 0, "capacity": CAPACITY, "admissions": 0, "evictions": 0, "pending": 2
  }
  # Key 8 had 2 sightings: one more admits it; key 9 (1 + 1) still waits.
  sparse_lookup(table, tf.constant([8, 9], tf.int64), access_and_evict_config=config)
  assert lib.index_dict(table) == {8: 0}


def test_tf1_saver_keeps_admission_counts(tmp_path):

  def build():
    init()
    table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 2})
    return table, ids, emb, admission.table_stats(table), tf.compat.v1.train.Saver()

  with tf.Graph().as_default():
    _, ids, emb, _, saver = build()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(emb, {ids: [1, 2, 2]})
      path = saver.save(sess, str(tmp_path / "model.ckpt"))
  terminate_config_initializer()
  with tf.Graph().as_default():
    table, ids, emb, stats, saver = build()
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, path)
      assert sess.run(stats) == {
          "size": 1, "capacity": CAPACITY, "admissions": 1, "evictions": 0, "pending": 1
      }
      sess.run(emb, {ids: [1]})
      keys, rows = sess.run(table.key_index.export())
      assert dict(zip(keys.tolist(), rows.tolist())) == {2: 0, 1: 1}


def test_bad_settings_are_named():
  with pytest.raises(ValueError, match=r"`access_threshold` must be None or an int >= 0, got -1"):
    FeatureSpec("f", access_threshold=-1)
  with pytest.raises(ValueError, match=r"`faae_coefficient` must be None or an int >= 1"):
    FeatureSpec("f", faae_coefficient=0)
  init()
  table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
  with pytest.raises(ValueError, match=r"access_and_evict_config takes"):
    sparse_lookup(table, tf.constant([1], tf.int64), access_and_evict_config={"threshold": 1})
  sparse_lookup(table, tf.constant([1], tf.int64), access_and_evict_config={"access_threshold": 2})
  with pytest.raises(ValueError, match=r"table 't' already has"):
    get_asc_insert_func([FeatureSpec("f", table_name="t", access_threshold=3)], is_training=True)


def _graph_lookups(modify_graph):
  """Per-batch embeddings and the final index of two features of one admitting table."""
  users = np.array([[1], [2], [3], [1], [9], [2]], np.int64)
  items = np.array([[5, 6], [6, 7], [5, 5], [8, 1], [6, 6], [7, 5]], np.int64)
  with tf.Graph().as_default():
    init()
    specs = [
        FeatureSpec("user", table_name="t", access_threshold=2),
        FeatureSpec("item", table_name="t", access_threshold=2)
    ]
    dataset = tf.data.Dataset.from_tensor_slices({"user": users, "item": items}).batch(2)
    if not modify_graph:
      dataset = dataset.map(get_asc_insert_func(specs, is_training=True))
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    batch = iterator.get_next()
    table = lib.make_table("t", dim=DIM, capacity=10)
    if modify_graph:
      config = {"access_threshold": 2}
      embs = [
          sparse_lookup(table, batch[name], modify_graph=True, access_and_evict_config=config)
          for name in ("user", "item")
      ]
      modifier.modify_graph_and_start_emb_cache()
      initializer = modifier.get_initializer(True)
    else:
      embs = [sparse_lookup(table, spec, batch=batch) for spec in specs]
      initializer = iterator.initializer
    export = table.key_index.export()
    values = []
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(initializer)
      for _ in range(3):
        values.append(sess.run(embs))
      keys, rows = sess.run(export)
  terminate_config_initializer()
  return values, dict(zip(keys.tolist(), rows.tolist()))


def test_modify_graph_access_and_evict_config_equals_feature_spec_mode():
  modified, modified_index = _graph_lookups(modify_graph=True)
  feature_spec, feature_spec_index = _graph_lookups(modify_graph=False)
  # Batch 1 (users 1, 2; items 5, 6, 6, 7): only 6 is seen twice. Batch 2 (3, 1;
  # 5, 5, 8, 1): 1 and 5 reach 2, in that order. Batch 3 (9, 2; 6, 6, 7, 5): 2, 7.
  assert modified_index == feature_spec_index == {6: 0, 1: 1, 5: 2, 2: 3, 7: 4}
  for got, want in zip(modified, feature_spec):
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)
  np.testing.assert_array_equal(modified[0][0], np.zeros([2, 1, DIM]))  # Users 1, 2 pending.
