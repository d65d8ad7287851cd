"""Checkpoints save and restore key index, rows and slots together."""

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init, terminate_config_initializer

import sparse_testlib as lib

ITEM_BATCHES = [
    np.array([[1, 2, 1], [3, 4, 2]], np.int64),
    np.array([[5, 1, 6], [2, 2, 7]]),
    np.array([[8, 3, 3], [9, 1, 5]], np.int64),
    np.array([[2, 10, 11], [4, 4, 12]])
]
USER_BATCHES = [
    np.array([100, 200], np.int32),
    np.array([300, 100], np.int32),
    np.array([200, 200], np.int32),
    np.array([400, 500], np.int32)
]


def _tables(seed):
  item = lib.make_table("item", dim=3, capacity=16, seed=seed)
  user = lib.make_table("user", dim=2, capacity=8, key_dtype=tf.int32, seed=seed + 1)
  return item, user


def _loss(item, user, item_ids, user_ids):
  item_emb = embedding.sparse_lookup(item, item_ids)  # [2, 3, 3]
  user_emb = embedding.sparse_lookup(user, user_ids)  # [2, 2]
  return (tf.reduce_sum(tf.square(item_emb - 0.5)) + tf.reduce_sum(tf.square(user_emb + 1.0)))


def _eager_step(item, user, optimizer, step):
  with tf.GradientTape() as tape:
    loss = _loss(item, user, tf.constant(ITEM_BATCHES[step], tf.int64),
                 tf.constant(USER_BATCHES[step]))
  variables = [item.variable, user.variable]
  optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))


def _eager_state(item, user, optimizer):
  state = {"iterations": optimizer.iterations.numpy()}
  for table in (item, user):
    keys, rows = lib.sorted_export(*table.key_index.export())
    state.update({
        f"{table.table_name}/keys": keys, f"{table.table_name}/rows": rows,
        f"{table.table_name}/embedding": table.variable.numpy()
    })
    for slot in ("m", "v"):
      state[f"{table.table_name}/{slot}"] = optimizer.get_slot(table.table_name, slot).numpy()
  return state


def _assert_states_equal(got, expected):
  assert sorted(got) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_tf2_checkpoint_round_trips_index_rows_and_slots(tmp_path):
  init()
  item, user = _tables(seed=1)
  optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.1)
  for step in range(3):
    _eager_step(item, user, optimizer, step)
  path = tf.train.Checkpoint(item=item, user=user, optimizer=optimizer).save(tmp_path / "ckpt")
  saved = _eager_state(item, user, optimizer)
  _eager_step(item, user, optimizer, 3)
  continued = _eager_state(item, user, optimizer)

  terminate_config_initializer()
  init()
  item, user = _tables(seed=50)  # Other initial rows: the restore must replace them.
  embedding.sparse_lookup(item, tf.constant([77, 1, 78], tf.int64))  # Keys the checkpoint lacks.
  optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.1)
  checkpoint = tf.train.Checkpoint(item=item, user=user, optimizer=optimizer)
  status = checkpoint.restore(path)
  status.assert_existing_objects_matched()

  assert optimizer.iterations.numpy() == 3
  for table in (item, user):
    name = table.table_name
    keys, rows = lib.sorted_export(*table.key_index.export())
    np.testing.assert_array_equal(keys, saved[f"{name}/keys"])
    np.testing.assert_array_equal(rows, saved[f"{name}/rows"])
    np.testing.assert_array_equal(table.variable.numpy(), saved[f"{name}/embedding"])
  assert 77 not in lib.index_dict(item)
  # Slots appear at the first apply_gradients and take the saved values then: the
  # next step is the one the saving process took.
  _eager_step(item, user, optimizer, 3)
  status.assert_consumed()
  _assert_states_equal(_eager_state(item, user, optimizer), continued)


def _build_session_graph(seed):
  item, user = _tables(seed)
  optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.1)
  item_ids = tf.compat.v1.placeholder(tf.int64, [None, None])
  user_ids = tf.compat.v1.placeholder(tf.int32, [None])
  loss = _loss(item, user, item_ids, user_ids)
  variables = [item.variable, user.variable]
  train_op = optimizer.apply_gradients(zip(tf.compat.v1.gradients(loss, variables), variables))
  state = {"iterations": optimizer.iterations}
  for table in (item, user):
    state[f"{table.table_name}/export"] = table.key_index.export()
    state[f"{table.table_name}/embedding"] = table.variable
    for slot in ("m", "v"):
      state[f"{table.table_name}/{slot}"] = optimizer.get_slot(table.table_name, slot)

  def run_step(sess, step):
    sess.run(train_op, {item_ids: ITEM_BATCHES[step], user_ids: USER_BATCHES[step]})

  def read_state(sess):
    values = sess.run(state)
    for name in ("item", "user"):
      values[f"{name}/keys"], values[f"{name}/rows"] = lib.sorted_export(
          *values.pop(f"{name}/export"))
    return values

  return run_step, read_state


def test_tf1_saver_round_trips_two_tables(tmp_path):
  with tf.Graph().as_default():
    init()
    run_step, read_state = _build_session_graph(seed=1)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step in range(3):
        run_step(sess, step)
      path = saver.save(sess, str(tmp_path / "model.ckpt"))
      saved = read_state(sess)
  assert saved["iterations"] == 3
  assert len(saved["item/keys"]) == 9 and len(saved["user/keys"]) == 3

  names = dict(tf.train.list_variables(path))
  for table in ("item", "user"):  # One entry per table: names do not collide.
    assert names[f"{table}/key_index-keys"] == names[f"{table}/key_index-rows"]
    assert f"{table}/embedding" in names
    assert f"{table}/LazyAdam/m" in names and f"{table}/LazyAdam/v" in names
  assert names["item/key_index-keys"] == [9]

  terminate_config_initializer()
  with tf.Graph().as_default():
    init()
    run_step, read_state = _build_session_graph(seed=50)
    saver = tf.compat.v1.train.Saver()
    # A session that trained on other ids first, then restores: the index is replaced.
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      run_step(sess, 3)
      saver.restore(sess, path)
      _assert_states_equal(read_state(sess), saved)
    # A fresh session restores without running any initializer.
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, path)
      _assert_states_equal(read_state(sess), saved)
