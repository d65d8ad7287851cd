"""Errors of tables that name the culprit: full tiered tables, stuck eager lookups, id dtypes."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import initializers
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.core.embedding import create_table, sparse_lookup
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init

INIT = initializers.RowInitializer("truncated_normal", stddev=0.1, seed=7)


@pytest.fixture(autouse=True)
def _run():
  init()


def _tiered(device, host, ssd=0, ssd_path=()):
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  table = create_table(tf.int64, 4, "t", INIT, device_vocabulary_size=device,
                       host_vocabulary_size=host, ssd_vocabulary_size=ssd, ssd_data_path=ssd_path,
                       optimizer_list=[optimizer])
  return table, optimizer


def _step(table, optimizer, ids):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(sparse_lookup(table, tf.constant(ids, tf.int64)))
  optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])


def test_full_tiered_table_gives_each_tier_and_the_tier_remedy(tmp_path):
  table, optimizer = _tiered(device=2, host=2, ssd=1, ssd_path=str(tmp_path))
  for k in (1, 2, 3, 4, 5):
    _step(table, optimizer, [[k]])
  message = ("table 't' is full: 5 rows in all (device_vocabulary_size=2 device-cache rows + "
             "host_vocabulary_size=2 host rows + ssd_vocabulary_size=1 SSD rows), 5 used, and "
             "this batch brings 1 new keys. Nothing was inserted. Raise host_vocabulary_size or "
             "ssd_vocabulary_size")
  with pytest.raises(tf.errors.ResourceExhaustedError) as raised:
    _step(table, optimizer, [[6]])
  assert message in raised.value.message
  assert "1100" not in raised.value.message and "larger device_vocabulary_size" not in (
      raised.value.message)


def test_flat_full_table_keeps_the_device_vocabulary_size_wording():
  table = create_table(tf.int64, 4, "flat", INIT, device_vocabulary_size=2)
  sparse_lookup(table, tf.constant([1, 2], tf.int64))
  with pytest.raises(
      tf.errors.ResourceExhaustedError,
      match=r"table 'flat' is full: device_vocabulary_size=2 rows, 2 used, .* "
      r"Create the table with a larger device_vocabulary_size"):
    sparse_lookup(table, tf.constant([3], tf.int64))


def test_eager_lookups_without_an_optimizer_step_fail_at_once_saying_why():
  table, optimizer = _tiered(device=2, host=10)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(sparse_lookup(table, tf.constant([[1, 2]], tf.int64)))
  # Both device rows are pinned until the optimizer step of that lookup: a second
  # training lookup cannot get room, and no other thread could free it.
  with pytest.raises(tf.errors.ResourceExhaustedError) as raised:
    sparse_lookup(table, tf.constant([[3]], tf.int64))
  message = raised.value.message
  assert "table 't': the device cache (device_vocabulary_size=2) has no room for the 1 new ids" in (
      message)
  assert "held by earlier training lookups whose optimizer step has not run yet" in message
  assert "prefetch" not in message
  # After the step, the same lookup proceeds.
  optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])
  _step(table, optimizer, [[3]])


@pytest.mark.parametrize("ids, key_dtype, message", [
    (tf.constant([["a", "b"]]), tf.int64,
     "FeatureSpec 'f': ids are string, but table 'item' has key_dtype int64; give int64 ids"),
    (tf.constant([[1, 2]], tf.int64), tf.string,
     "FeatureSpec 'f': ids are int64, but table 'item' has key_dtype string"),
    (tf.constant([[1, 2]], tf.int32), tf.int64, "ids are int32, but table 'item' has key_dtype"),
])
def test_insert_func_refuses_ids_of_another_dtype_than_the_table(ids, key_dtype, message):
  create_table(key_dtype, 4, "item", INIT, device_vocabulary_size=8)
  dataset = tf.data.Dataset.from_tensor_slices({"f": ids})
  with pytest.raises(ValueError, match=message):
    dataset.map(get_asc_insert_func([FeatureSpec("f", table_name="item")], is_training=True))


def test_insert_func_accepts_ids_of_the_table_dtype():
  create_table(tf.string, 4, "item", INIT, device_vocabulary_size=8)
  dataset = tf.data.Dataset.from_tensor_slices({"f": tf.constant([["a", "b"]])})
  batch = next(
      iter(dataset.map(get_asc_insert_func([FeatureSpec("f", table_name="item")],
                                           is_training=True))))
  assert np.asarray(batch["f"]).tolist() == [b"a", b"b"]
