"""Eviction: keys idle past eviction_threshold lose their rows, which are reset and reused."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.core.embedding import sparse_lookup
from mxrec_pipeline.core.feature_process import EvictHook, EvictSchedule
from mxrec_pipeline.keras.callbacks import EvictCallback
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init

import sparse_testlib as lib

CAPACITY, DIM = 4, 2
SPECS = [
    FeatureSpec("ids", table_name="t", eviction_threshold=10),
    FeatureSpec("ts", is_timestamp=True)
]
# Batch times 105, 120, 121: after batch 2, key 1 (last seen 105) is idle 15 s > 10 s.
BATCHES = [{"ids": [1, 2], "ts": [100, 105]}, {"ids": [2, 3], "ts": [120, 118]},
           {"ids": [7, 3], "ts": [121, 121]}]


def _dataset():

  def batches():
    return ({k: np.array(v, np.int64) for k, v in b.items()} for b in BATCHES)

  signature = {"ids": tf.TensorSpec([None], tf.int64), "ts": tf.TensorSpec([None], tf.int64)}
  return tf.data.Dataset.from_generator(batches, output_signature=signature).map(
      get_asc_insert_func(SPECS, is_training=True))


def _inserted_batches():
  """The batches inserted one by one, eagerly: nothing runs ahead of the test."""
  insert = get_asc_insert_func(SPECS, is_training=True)
  for batch in BATCHES:
    yield insert({k: tf.constant(v, tf.int64) for k, v in batch.items()})


def _train_step(table, optimizer, batch):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(sparse_lookup(table, SPECS[0], batch=batch) - 1.0))
  optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])


def test_evict_frees_idle_rows_resets_them_and_reuses_lowest_first():
  init()
  table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
  optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.1)
  batches = _inserted_batches()
  for _ in range(2):
    _train_step(table, optimizer, next(batches))
  assert lib.index_dict(table) == {1: 0, 2: 1, 3: 2}
  trained = table.variable.numpy()
  m = optimizer.get_slot("t", "m").numpy()
  assert np.all(m[:3] != 0)

  freed = admission.evict_all()
  assert freed["t"].numpy().tolist() == [0]
  assert lib.index_dict(table) == {2: 1, 3: 2}
  initial = lib.initial_rows(CAPACITY, DIM)
  np.testing.assert_array_equal(table.variable.numpy()[0], initial[0])
  np.testing.assert_array_equal(table.variable.numpy()[1:], trained[1:])
  for slot in ("m", "v"):
    value = optimizer.get_slot("t", slot).numpy()
    np.testing.assert_array_equal(value[0], np.zeros(DIM))
    assert np.all(value[1:3] != 0)
  stats = {k: int(v) for k, v in admission.table_stats(table).items()}
  assert stats == {"size": 2, "capacity": CAPACITY, "admissions": 3, "evictions": 1, "pending": 0}

  # Key 7 takes the freed row 0.
  third = next(batches)
  assert third["mxrec__t__unique_rows"].numpy().tolist() == [0, 2]


def test_evict_hook_runs_on_step_interval_in_a_session():
  with tf.Graph().as_default():
    init()
    table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
    optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.1)
    batch = tf.compat.v1.data.make_one_shot_iterator(_dataset()).get_next()
    loss = tf.reduce_sum(tf.square(sparse_lookup(table, SPECS[0], batch=batch) - 1.0))
    grads = tf.compat.v1.gradients(loss, [table.variable])
    train_op = optimizer.apply_gradients(zip(grads, [table.variable]))
    export = table.key_index.export()
    hook = EvictHook(evict_enable=True, evict_step_interval=2, clock=lambda: 0.0)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as sess:
      sess.run(train_op)
      assert hook.last_freed == {}
      sess.run(train_op)  # Step 2: key 1 is idle 15 s.
      assert hook.last_freed["t"].tolist() == [0]
      sess.run(train_op)
      keys, rows = sess.raw_session().run(export)
  assert lib.sorted_export(keys, rows)[0].tolist() == [2, 3, 7]


def test_evict_callback_evicts_and_resets_slots():
  init()
  table = lib.make_table("t", dim=DIM, capacity=CAPACITY)
  optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.1)
  batches = _inserted_batches()
  for _ in range(2):
    _train_step(table, optimizer, next(batches))

  class Model:  # What the callback reads of a SparseRankingModel.
    sparse_optimizer = optimizer

  now = [0.0]
  callback = EvictCallback(evict_time_interval=60, clock=lambda: now[0])
  callback.set_model(Model())
  callback.on_train_begin()
  callback.on_train_batch_end(0)
  assert callback.last_freed == {}
  now[0] = 61.0
  callback.on_train_batch_end(1)
  assert callback.last_freed["t"].tolist() == [0]
  np.testing.assert_array_equal(optimizer.get_slot("t", "v").numpy()[0], np.zeros(DIM))


def test_schedule_counts_steps_and_wall_time():
  now = [0.0]
  schedule = EvictSchedule(time_interval_s=100, step_interval=3, clock=lambda: now[0])
  assert [schedule.step() for _ in range(6)] == [False, False, True, False, False, True]
  now[0] = 100.0
  assert schedule.step()  # Time interval passed.
  assert not schedule.step()


def test_bad_settings_are_named():
  with pytest.raises(ValueError, match=r"`evict_time_interval` must be an int in \[1, "):
    EvictHook(evict_enable=True, evict_time_interval=0)
  with pytest.raises(ValueError, match=r"`evict_step_interval` must be an int"):
    EvictHook(evict_step_interval=-2)
  init()
  with pytest.raises(ValueError, match=r"eviction_threshold needs a FeatureSpec with "
                     r"is_timestamp=True"):
    get_asc_insert_func([FeatureSpec("ids", eviction_threshold=5)], is_training=True)
