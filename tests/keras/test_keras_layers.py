"""SparseLookup and its combiners against NumPy, on dense and ragged ids."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.keras import layers
from mxrec_pipeline.util import initialize

TABLE = layers.TableSpec("tok", dim=3, device_vocabulary_size=50)


def _insert(ids, training=True):
  layers.get_or_create_table(TABLE, seed=0)  # The layer would create it when built.
  insert = get_asc_insert_func([fs.FeatureSpec("f", table_name="tok")], is_training=training)
  batch = insert({"f": ids})
  return batch[fs.restore_key("f")], batch[fs.unique_rows_key("tok")]


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_ragged_combiners_match_numpy(combiner):
  initialize.init()
  ids = tf.ragged.constant([[[1, 2, 2], [7]], [[], [2, 9]]], dtype=tf.int64, ragged_rank=2)
  layer = layers.SparseLookup(layers.SparseFeature("f", "tok", combiner), TABLE, seed=0)
  out = layer(_insert(ids), training=True).numpy()
  rows = layer.embeddings.numpy()
  keys, key_rows = (
      t.numpy() for t in initialize.get_config_initializer().tables["tok"].key_index.export())
  row_of = dict(zip(keys, key_rows))
  reduce = {
      "sum": lambda e: e.sum(0), "mean": lambda e: e.mean(0),
      "sqrtn": lambda e: e.sum(0) / np.sqrt(len(e))
  }[combiner]
  for b, lists in enumerate(ids.to_list()):
    for pos, id_list in enumerate(lists):
      want = reduce(rows[[row_of[i] for i in id_list]]) if id_list else np.zeros(3)
      np.testing.assert_allclose(out[b, pos], want, rtol=1e-6, atol=1e-7)


def test_dense_ids_without_combiner_keep_every_id():
  initialize.init()
  ids = tf.constant([[3, 4, 3]], tf.int64)
  layer = layers.SparseLookup(layers.SparseFeature("f", "tok", None), TABLE, seed=0)
  out = layer(_insert(ids), training=True)
  assert out.shape == (1, 3, 3)
  np.testing.assert_array_equal(out[0, 0], out[0, 2])


def test_eval_unseen_ids_read_zeros():
  initialize.init()
  layer = layers.SparseLookup(layers.SparseFeature("f", "tok", "mean"), TABLE, seed=0)
  layer(_insert(tf.constant([[5]], tf.int64)), training=True)
  out = layer(_insert(tf.constant([[5], [6]], tf.int64), training=False), training=False)
  assert np.any(out.numpy()[0] != 0) and np.all(out.numpy()[1] == 0)


def test_specs_validate_and_tables_are_shared():
  with pytest.raises(ValueError, match="`dim` must be a positive int, got 0"):
    layers.TableSpec("t", dim=0, device_vocabulary_size=5)
  with pytest.raises(ValueError, match="combiner"):
    layers.SparseFeature("f", "t", combiner="max")
  with pytest.raises(ValueError, match="uses table 'other'"):
    layers.SparseLookup(layers.SparseFeature("f", "other"), TABLE)
  initialize.init()
  a = layers.get_or_create_table(TABLE)
  assert layers.get_or_create_table(TABLE) is a
  with pytest.raises(ValueError, match="exists with dim=3"):
    layers.get_or_create_table(layers.TableSpec("tok", dim=4, device_vocabulary_size=50))
  with pytest.raises(ValueError, match="host_vocabulary_size=0; the spec asks .*"
                     "host_vocabulary_size=100"):
    layers.get_or_create_table(dataclasses.replace(TABLE, host_vocabulary_size=100))


def test_layer_config_round_trips():
  layer = layers.SparseLookup(layers.SparseFeature("f", "tok", "sqrtn"), TABLE, seed=7)
  clone = layers.SparseLookup.from_config(layer.get_config())
  assert clone.feature == layer.feature and clone.table_spec == TABLE and clone.seed == 7


def test_table_spec_device_reaches_create_table():
  initialize.init()
  spec = dataclasses.replace(TABLE, device="/CPU:0")
  assert layers.get_or_create_table(spec).variable.device.endswith("/device:CPU:0")
  with pytest.raises(ValueError, match=r"table 'gpu_tok': device '/GPU:7' is not visible"):
    layers.get_or_create_table(dataclasses.replace(TABLE, name="gpu_tok", device="/GPU:7"))
  with pytest.raises(ValueError, match=r"TableSpec 'tok': `device` must be a device string"):
    dataclasses.replace(TABLE, device=0)
