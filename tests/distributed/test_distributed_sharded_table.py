"""ShardedTable in one process (one shard): lookups, gradients, bytes counted, misuse errors.

The multi-worker behaviour is in test_distributed_training.py; here the
routing runs with one replica, where every key is owned locally.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline import hparams
from mxrec_pipeline.core import key_index
from mxrec_pipeline.distributed import all_to_all
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
      1000, 16, 2, routing="all_to_all") == (1000 * (8 + 2 * 16 * 4) + 2 * 8 + 4)
  with pytest.raises(ValueError, match="`routing` must be"):
    exchange.bytes_per_step_formula(1000, 16, 2, routing="ring")


def test_bad_routing_is_refused():
  with pytest.raises(ValueError, match=r"ShardedTable\('item'\): `routing` must be one of"):
    _table(routing="ring")


@pytest.mark.parametrize(
    "routing, num_shards, table_index, chosen",
    [
        ("auto", 1, 0, "all_gather"),  # One shard exchanges nothing.
        ("auto", 2, 0, "all_to_all"),
        ("auto", 512, 63, "all_to_all"),
        ("auto", 2, 64, "all_gather"),  # Past the all-to-all's instance-key tables.
        ("all_gather", 8, 0, "all_gather"),
        ("all_to_all", 1, 0, "all_to_all"),
    ])
def test_choose_routing(routing, num_shards, table_index, chosen):
  assert sharded_table.choose_routing(routing, num_shards, table_index) == chosen


def test_one_shard_auto_table_routes_by_all_gather():
  assert _table(routing="auto").routing == "all_gather"


def test_config_routings_are_the_tables():
  assert hparams.ROUTINGS == (*sharded_table.ROUTINGS, sharded_table.AUTO)


def test_all_to_all_keys_never_overflow_int32():
  keys = all_to_all.AllToAllKeys(all_to_all.MAX_TABLES - 1)
  last = all_to_all.MAX_LOOKUPS_PER_GROUP - 1
  keys.lookups.assign(last)
  group, instances = keys.next()  # The last lookup of the first group: the largest keys.
  assert int(group) == all_to_all.GROUP_KEY
  assert [int(k) for k in instances] == [
      1 + ((4 * last + k) * all_to_all.MAX_TABLES + all_to_all.MAX_TABLES - 1) for k in range(4)
  ]
  assert max(int(k) for k in instances) <= np.iinfo(np.int32).max
  group, instances = keys.next()  # The next group starts over.
  assert int(group) == all_to_all.GROUP_KEY + 1
  assert [int(k) for k in instances] == [1 + k * all_to_all.MAX_TABLES + 63 for k in range(4)]
  small = all_to_all.AllToAllKeys(0, lookups_per_group=2)
  assert [int(small.next()[0]) - all_to_all.GROUP_KEY for _ in range(5)] == [0, 0, 1, 1, 2]
  with pytest.raises(ValueError, match="`lookups_per_group` must be in"):
    all_to_all.AllToAllKeys(0, lookups_per_group=0)
  with pytest.raises(ValueError, match="all_to_all routing serves the first 64 tables"):
    all_to_all.AllToAllKeys(64)


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


def test_lookup_tables_reads_as_each_table_lookup():
  # One shard: the all_gather routing; a table twice (two features sharing it), rows 2 and 4 wide.
  item = _table()
  user = sharded_table.ShardedTable(tf.distribute.get_strategy(), name="user", dim=4,
                                    device_vocabulary_size=8,
                                    emb_initializer=tf.keras.initializers.Constant(0.25))
  ids = tf.constant([[3, 5], [3, 7]], tf.int64)
  got = sharded_table.lookup_tables([(item, ids), (user, ids[:, :1]), (item, ids[:1])])
  assert [g.shape.as_list() for g in got] == [[2, 2, 2], [2, 1, 4], [1, 2, 2]]
  np.testing.assert_array_equal(got[1].numpy(), np.full([2, 1, 4], 0.25))
  # Each pair's bytes counted on its table: item's 2 lookups (3 then 2 keys), user's one (1 key).
  assert item.exchange_stats()["ids"] == (3 * 8 + 8) + (2 * 8 + 8)
  assert user.exchange_stats() == {"ids": 8 + 8, "rows": 16, "gradients": 16 + 4}
  evicting = sharded_table.ShardedTable(tf.distribute.get_strategy(), name="clicks", dim=2,
                                        device_vocabulary_size=8,
                                        emb_initializer=tf.keras.initializers.Zeros(),
                                        eviction_threshold_s=10)
  with pytest.raises(ValueError, match=r"ShardedTable\('clicks'\): eviction_threshold_s needs"):
    sharded_table.lookup_tables([(user, ids), (evicting, ids)])
  # The batch time's all-gather (8 B from the one worker) is counted on the evicting table.
  before = user.exchange_stats()["ids"]
  sharded_table.lookup_tables([(user, ids), (evicting, ids)], timestamp=tf.constant(5, tf.int64))
  assert user.exchange_stats()["ids"] - before == 3 * 8 + 8
  assert evicting.exchange_stats()["ids"] == 8 + 3 * 8 + 8
