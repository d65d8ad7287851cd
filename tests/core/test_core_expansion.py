"""Dynamic-expansion tables: lookups, growth with no capacity error, the input
pipeline and graph-modification paths, evaluation defaults, checkpoints."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.constants import constants
from mxrec_pipeline.core import embedding, expansion
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.graph import modifier
from mxrec_pipeline.optimizers import lazy_adam_by_addr
from mxrec_pipeline.util.initialize import init, terminate_config_initializer
from mxrec_pipeline.util.variable import get_dense_and_sparse_variable

import sparse_testlib as lib

DIM = 3


def _ids(n, seed=0):
  """n distinct large int64 ids."""
  return np.unique(np.random.RandomState(seed).randint(0, 2**62, size=2 * n, dtype=np.int64))[:n]


def test_lookups_equal_a_plain_table_within_capacity_and_grow_past_it():
  keys = np.array([[7, 3, 7], [11, 3, 5]], np.int64)
  init()
  plain_emb = embedding.sparse_lookup(lib.make_table(dim=DIM, capacity=6), keys).numpy()
  terminate_config_initializer()
  init(use_dynamic_expansion=True)
  table = lib.make_table(dim=DIM, capacity=6)
  assert isinstance(table, expansion.ExpansionTable)
  np.testing.assert_array_equal(embedding.sparse_lookup(table, keys).numpy(), plain_emb)
  # 44 keys in 6 rows: two ids per batch are new each time; no capacity error.
  many = _ids(40)
  for batch in many.reshape(20, 2):
    embedding.sparse_lookup(table, tf.constant(batch))
  size, num_slots, _ = (t.numpy() for t in table.store.size())
  assert table.key_index.size().numpy() == 44
  assert size == 48 and num_slots == -1  # 8 chunks of 6 rows; no optimizer yet.
  index = lib.index_dict(table)
  assert sorted(index.values()) == list(range(44))
  chunk = lib.initial_rows(6, DIM)
  got = embedding.sparse_lookup(table, tf.constant(many)).numpy()
  np.testing.assert_array_equal(got, chunk[[index[k] % 6 for k in many.tolist()]])


def test_eval_lookups_read_the_default_and_take_no_row():
  init(use_dynamic_expansion=True)
  table = lib.make_table(dim=DIM, capacity=4)
  embedding.sparse_lookup(table, tf.constant([1, 2], tf.int64))
  out = embedding.sparse_lookup(table, tf.constant([2, 99], tf.int64), is_train=False,
                                serving_default_value=-1.0).numpy()
  np.testing.assert_array_equal(out[0], lib.initial_rows(4, DIM)[1])
  np.testing.assert_array_equal(out[1], [-1.0] * DIM)
  zeros = embedding.sparse_lookup(table, tf.constant([99], tf.int64), is_train=False).numpy()
  np.testing.assert_array_equal(zeros, np.zeros([1, DIM]))
  assert 99 not in lib.index_dict(table)
  with pytest.raises(
      ValueError, match=r"serving_default_value of table 't' must be a scalar or "
      r"of shape \[3\]"):
    embedding.sparse_lookup(table, tf.constant([1], tf.int64), is_train=False,
                            serving_default_value=[1.0, 2.0])


def test_feature_spec_pipeline_inserts_ahead_and_lookup_grows():
  init(use_dynamic_expansion=True)
  table = lib.make_table("item", dim=DIM, capacity=2)
  spec = FeatureSpec("ids", table_name="item")
  batches = np.arange(12, dtype=np.int64).reshape(3, 4) * 1000
  dataset = (tf.data.Dataset.from_tensor_slices({"ids": batches}).batch(1).map(
      get_asc_insert_func([spec], is_training=True)).prefetch(3))
  outs = [embedding.sparse_lookup(table, spec, batch=batch).numpy() for batch in dataset]
  index = lib.index_dict(table)
  chunk = lib.initial_rows(2, DIM)
  for batch, out in zip(batches, outs):
    np.testing.assert_array_equal(out[0], chunk[[index[k] % 2 for k in batch.tolist()]])
  assert table.store.size()[0].numpy() == 12


def test_graph_modification_feeds_expansion_lookups():
  with tf.Graph().as_default():
    init(use_dynamic_expansion=True)
    dataset = tf.data.Dataset.from_tensor_slices(
        {"ids": np.arange(10, dtype=np.int64).reshape(5, 2)}).batch(1)
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    batch = iterator.get_next()
    table = lib.make_table(dim=DIM, capacity=3)
    emb = embedding.sparse_lookup(table, batch["ids"], modify_graph=True)
    loss = tf.reduce_sum(emb)
    optimizer = lazy_adam_by_addr.create_hash_optimizer_by_address(0.1)
    train_op = optimizer.apply_gradients(
        zip(
            tf.gradients(loss,
                         tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)),
            tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET)))
    modifier.modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(modifier.get_initializer(True))
      for _ in range(5):
        sess.run(train_op)
      size, num_slots, _ = sess.run(table.store.size())
      keys, rows = sess.run(table.key_index.export())
  assert (size, num_slots) == (12, 2) and sorted(keys.tolist()) == list(range(10))
  assert sorted(rows.tolist()) == list(range(10))


def test_anchor_is_the_sparse_variable_and_collections_only_hold_training_lookups():
  with tf.Graph().as_default():
    init(use_dynamic_expansion=True)
    table = lib.make_table(dim=DIM, capacity=4)
    weights = tf.compat.v1.get_variable("weights", [DIM, 1])
    embedding.sparse_lookup(table, tf.constant([1, 2], tf.int64))
    embedding.sparse_lookup(table, tf.constant([3], tf.int64), is_train=False)
    dense, sparse = get_dense_and_sparse_variable()
    assert dense == [weights] and sparse == [table.variable]
    assert sparse[0].shape.as_list() == [0, DIM]
    assert len(tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)) == 1
    address, = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    assert expansion.table_of_address(address, "test") is table


def _train_steps(table, optimizer, batches):
  for ids in batches:
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(embedding.sparse_lookup(table, tf.constant(ids)) - 0.5))
    optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])


def _store_state(table):
  values, initial = table.store.export()
  keys, rows = lib.sorted_export(*table.key_index.export())
  return {"values": values.numpy(), "initial": initial.numpy(), "keys": keys, "rows": rows}


BATCHES = [
    np.array([1, 2, 3, 1]),
    np.array([4, 5, 6, 7]),
    np.array([8, 2, 9, 10]),
    np.array([11, 12, 1, 13])
]


def test_tf2_checkpoint_round_trips_index_rows_and_slots(tmp_path):
  init(use_dynamic_expansion=True)
  table = lib.make_table(dim=DIM, capacity=4)
  optimizer = lazy_adam_by_addr.create_hash_optimizer_by_address(0.1)
  _train_steps(table, optimizer, BATCHES[:3])
  path = tf.train.Checkpoint(table=table, optimizer=optimizer).save(tmp_path / "ckpt")
  saved = _store_state(table)
  _train_steps(table, optimizer, BATCHES[3:])
  continued = _store_state(table)

  terminate_config_initializer()
  init(use_dynamic_expansion=True)
  # The same initializer (chunks grown later come from it), other content first.
  table = lib.make_table(dim=DIM, capacity=4)
  embedding.sparse_lookup(table, tf.constant([77, 78, 79, 80, 81], tf.int64))
  optimizer = lazy_adam_by_addr.create_hash_optimizer_by_address(0.1)
  tf.train.Checkpoint(table=table,
                      optimizer=optimizer).restore(path).assert_existing_objects_matched()
  for name, value in _store_state(table).items():
    np.testing.assert_array_equal(value, saved[name], err_msg=name)
  assert optimizer.iterations.numpy() == 3
  _train_steps(table, optimizer, BATCHES[3:])
  for name, value in _store_state(table).items():
    np.testing.assert_array_equal(value, continued[name], err_msg=name)


def test_stock_tf1_saver_saves_the_row_store(tmp_path):

  def build(seed):
    table = lib.make_table(dim=DIM, capacity=4, seed=seed)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(tf.square(embedding.sparse_lookup(table, ids) - 0.5))
    optimizer = lazy_adam_by_addr.create_hash_optimizer_by_address(0.1)
    train_op = optimizer.apply_gradients(zip(tf.gradients(loss, [table.variable]),
                                             [table.variable]))
    return ids, train_op, [table.store.export(), table.key_index.export(), optimizer.iterations]

  with tf.Graph().as_default():
    init(use_dynamic_expansion=True)
    ids, train_op, state = build(seed=0)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for batch in BATCHES[:3]:
        sess.run(train_op, {ids: batch})
      path = saver.save(sess, str(tmp_path / "model"))
      saved = sess.run(state)
  assert "t/row_store-values" in dict(tf.train.list_variables(path))
  terminate_config_initializer()
  with tf.Graph().as_default():
    init(use_dynamic_expansion=True)
    ids, train_op, state = build(seed=5)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:  # No initializer run: the restore creates them.
      saver.restore(sess, path)
      restored = sess.run(state)
  np.testing.assert_array_equal(restored[0][0], saved[0][0])
  np.testing.assert_array_equal(restored[0][1], saved[0][1])
  np.testing.assert_array_equal(lib.sorted_export(*restored[1])[0], lib.sorted_export(*saved[1])[0])
  assert restored[2] == 3


def test_terminate_releases_index_and_store():
  init(use_dynamic_expansion=True)
  table = lib.make_table(dim=DIM, capacity=4)
  embedding.sparse_lookup(table, tf.constant([1], tf.int64))
  store = table.store
  terminate_config_initializer()
  with pytest.raises(tf.errors.FailedPreconditionError,
                     match=r"the row store of dynamic-expansion table 't' does not exist"):
    store.size()


def test_expansion_table_argument_errors():
  init(use_dynamic_expansion=True)
  with pytest.raises(
      ValueError, match=r"create_table\('t'\): dynamic-expansion tables hold "
      r"float32 rows, got value_dtype=float64"):
    lib.make_table(value_dtype=tf.float64)
  with tf.distribute.OneDeviceStrategy("/CPU:0").scope():
    with pytest.raises(NotImplementedError, match=r"not replicated by tf.distribute"):
      lib.make_table(name="u")


def test_native_ops_check_their_inputs():
  init(use_dynamic_expansion=True)
  table = lib.make_table(dim=DIM, capacity=4)
  embedding.sparse_lookup(table, tf.constant([1, 2], tf.int64))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"table 't': row address 9 \(position 1\) is outside \[-1, 4\)"):
    table.store.lookup(tf.constant([0, 9], tf.int64), table.variable)
  with pytest.raises(
      tf.errors.FailedPreconditionError,
      match=r"the Adam update needs rows with 2 optimizer slot\(s\), but no slot "
      r"layout was set"):
    table.store.apply_adam(tf.constant([0], tf.int64), tf.ones([1, DIM]), 0.1, 0.9, 0.99, 1e-8)
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=r"must be 3|\[n, 3\]"):
    table.store.apply_sgd(tf.constant([0], tf.int64), tf.ones([1, 2]), 0.1, 0.0)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows to write have 2 values"):
    table.store.write_rows(tf.constant([0], tf.int64), tf.ones([1, 2]))
