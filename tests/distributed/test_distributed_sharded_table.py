"""ShardedTable in one process (one shard): lookups, gradients, bytes counted, misuse errors.

The multi-worker behaviour is in test_distributed_training.py; here the
routing runs with one replica, where every key is owned locally.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import key_index
from mxrec_pipeline.distributed import exchange
from mxrec_pipeline.distributed import sharded_table
from mxrec_pipeline.optimizers import gradient_descent
from mxrec_pipeline.util.initialize import init


def _table(strategy=None, **kwargs):
  init()
  return sharded_table.ShardedTable(strategy or tf.distribute.get_strategy(), name="item", dim=2,
                                    device_vocabulary_size=8,
                                    emb_initializer=tf.keras.initializers.Constant(0.5), **kwargs)


def test_one_shard_lookup_gradient_and_update():
  table = _table()
  assert (table.shard_id, table.num_shards) == (0, 1)
  optimizer = gradient_descent.create_hash_optimizer(learning_rate=0.1)
  ids = tf.constant([[3, 5], [3, 7]], tf.int64)
  with tf.GradientTape() as tape:
    emb = table.lookup(ids)
    loss = tf.reduce_sum(emb)
  np.testing.assert_array_equal(emb.numpy(), np.full([2, 2, 2], 0.5))
  # One worker: 3 keys of 8 bytes + 2 counts; 3 rows of 2 float32; their gradient + 1 count.
  first = {"ids": 3 * 8 + 8, "rows": 3 * 8, "gradients": 3 * 8 + 4}
  assert table.exchange_stats() == first
  grad = tape.gradient(loss, table.variable)
  assert isinstance(grad, tf.IndexedSlices)
  sharded_table.apply_gradients(optimizer, [(grad, table)])
  # Key 3 appears twice: its row moves twice as far.
  after = table.lookup(tf.constant([3, 5, 7, 9], tf.int64), training=False).numpy()
  np.testing.assert_allclose(after, [[0.3, 0.3], [0.4, 0.4], [0.4, 0.4], [0.0, 0.0]])
  second = {"ids": 4 * 8 + 8, "rows": 4 * 8, "gradients": 4 * 8 + 4}
  assert table.exchange_stats() == {k: first[k] + second[k] for k in first}


def test_bytes_formula():
  assert exchange.bytes_per_step_formula(1000, 16, 2) == 2 * 1000 * (8 + 2 * 16 * 4) + 3 * 2 * 4
  assert exchange.bytes_per_step_formula(
      1000, 16, 2, routing="all_to_all") == (1000 * (8 + 2 * 16 * 4) + 2 * 2 * 4)
  with pytest.raises(ValueError, match="`routing` must be"):
    exchange.bytes_per_step_formula(1000, 16, 2, routing="ring")


def test_bad_routing_is_refused():
  with pytest.raises(ValueError, match=r"ShardedTable\('item'\): `routing` must be one of"):
    _table(routing="ring")


def test_created_inside_a_strategy_scope_is_refused():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  with strategy.scope(), pytest.raises(
      ValueError, match=r"ShardedTable\('item'\): create it "
      "outside strategy.scope()"):
    _table(strategy)


def test_apply_gradients_inside_a_strategy_scope_is_refused():
  table = _table()
  optimizer = gradient_descent.create_hash_optimizer(learning_rate=0.1)
  with tf.distribute.MirroredStrategy(["/cpu:0"]).scope(), pytest.raises(
      ValueError, match="call it after strategy.run and outside strategy.scope()"):
    sharded_table.apply_gradients(optimizer, [(None, table)])


def test_lookup_errors():
  table = _table()
  with pytest.raises(ValueError, match=r"ShardedTable\('item'\): ids must be int64, got int32"):
    table.lookup(tf.constant([1], tf.int32))
  with tf.distribute.MirroredStrategy(["/cpu:0"]).scope(), pytest.raises(
      ValueError, match="call it inside strategy.run"):
    table.lookup(tf.constant([1], tf.int64))


def test_string_ids_are_fingerprinted_as_the_core_does():
  table = _table(key_dtype=tf.string)
  ids = tf.constant([["a", "b"], ["a", "c"]])
  assert table.lookup(ids).shape == [2, 2, 2]
  keys, _ = table.shard.key_index.export()
  want = key_index.to_keys(tf.constant(["a", "b", "c"])).numpy()
  assert sorted(keys.numpy().tolist()) == sorted(want.tolist())
