"""Activations equal NumPy references: combiners on sparse and ragged ids, dense, sequences."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline import embedding as tpu_embedding

import embedding_testlib as lib

DIM, ROWS = 3, 32
ID_LISTS = [[7, 3, 7], [], [11], [3, 12, 5, 9]]  # Repeats and an empty row.
WEIGHT_LISTS = [[0.5, 2.0, 1.0], [], [3.0], [1.0, 0.25, 2.0, 0.5]]


def _embedding(**feature_kwargs):
  table = tpu_embedding.TableConfig(
      ROWS, DIM, initializer=lib.constant_initializer(lib.initial_rows(ROWS, DIM)),
      combiner=feature_kwargs.pop("combiner", "mean"), name="t")
  feature = tpu_embedding.FeatureConfig(table, **feature_kwargs)
  return tpu_embedding.Embedding({"f": feature}, tpu_embedding.SGD(0.1)), table


def _ragged(lists, dtype=tf.int64):
  return tf.ragged.constant(lists, dtype=dtype, ragged_rank=1)


def _sparse(lists, dtype=tf.int64):
  return _ragged(lists, dtype).to_sparse()


def _dequeue(embedding, features, weights=None, training=True):
  """Activations of one step; a training step ends with a no-op apply_gradients."""
  embedding.enqueue({"f": features}, weights=None if weights is None else {"f": weights},
                    training=training)
  out = embedding.dequeue()["f"].numpy()
  if training:
    embedding.apply_gradients({"f": None})  # No gradient: the rows stay as they are.
  return out


@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
@pytest.mark.parametrize("make_input", [_ragged, _sparse], ids=["ragged", "sparse"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_combiner_matches_numpy(combiner, make_input, weighted):
  embedding, table = _embedding(combiner=combiner)
  weights = make_input(WEIGHT_LISTS, tf.float32) if weighted else None
  out = _dequeue(embedding, make_input(ID_LISTS), weights, training=False)
  np.testing.assert_array_equal(out, np.zeros([4, DIM]))  # Unseen at evaluation: zeros.
  out = _dequeue(embedding, make_input(ID_LISTS), weights)
  expected = lib.np_combine(ID_LISTS, lib.id_rows(embedding, table), DIM, combiner,
                            WEIGHT_LISTS if weighted else None)
  assert out.shape == (4, DIM)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
  # The plain lookup path gives the same activations.
  call = embedding({"f": make_input(ID_LISTS)},
                   weights=None if weights is None else {"f": weights})["f"]
  np.testing.assert_allclose(call.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_rows_are_handed_out_in_first_occurrence_order():
  embedding, table = _embedding()
  _dequeue(embedding, _ragged(ID_LISTS))
  assert lib.row_of(embedding, table) == {7: 0, 3: 1, 11: 2, 12: 3, 5: 4, 9: 5}


@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
def test_rank3_sparse_and_ragged(combiner):
  """[batch, list, ids] -> [batch, list, dim], combined over the last axis."""
  lists = [[[1, 2], [3]], [[], [4, 4, 5]]]
  embedding, table = _embedding(combiner=combiner)
  ragged = tf.ragged.constant(lists, dtype=tf.int64)
  out = _dequeue(embedding, ragged)
  emb = lib.id_rows(embedding, table)
  expected = lib.np_combine([ids for row in lists for ids in row], emb, DIM, combiner)
  np.testing.assert_allclose(out, expected.reshape([2, 2, DIM]), rtol=1e-5, atol=1e-6)
  sparse = _dequeue(embedding, ragged.to_sparse())
  np.testing.assert_allclose(sparse, out, rtol=1e-6)


@pytest.mark.parametrize(
    "ids", [np.array([4, 9, 4]),
            np.array([[4], [9], [4]]),
            np.array([[[4]], [[9]], [[4]]])], ids=["rank1", "rank2", "rank3"])
def test_dense_ids_are_looked_up_one_per_position(ids):
  embedding, table = _embedding()
  out = _dequeue(embedding, tf.constant(ids, tf.int32))
  emb = lib.id_rows(embedding, table)
  expected = np.stack([emb[k] for k in ids.reshape(-1)])
  shape = ids.shape if ids.ndim == 1 else ids.shape[:-1]
  np.testing.assert_allclose(out, expected.reshape(list(shape) + [DIM]), rtol=1e-6)


@pytest.mark.parametrize("make_input", [_ragged, _sparse], ids=["ragged", "sparse"])
def test_sequence_feature_pads_and_truncates(make_input):
  embedding, table = _embedding(max_sequence_length=3)
  out = _dequeue(embedding, make_input(ID_LISTS))
  emb = lib.id_rows(embedding, table)
  expected = np.zeros([4, 3, DIM])
  for i, ids in enumerate(ID_LISTS):
    for j, key in enumerate(ids[:3]):
      expected[i, j] = emb[key]
  np.testing.assert_allclose(out, expected, rtol=1e-6)
  assert 9 not in lib.row_of(embedding, table)  # Truncated ids take no row.


def test_ragged_with_output_shape_of_batch_times_length_is_a_sequence():
  """TPUEmbedding: 2D ragged, output_shape of batch*k elements -> k ids per row."""
  embedding, table = _embedding(output_shape=[4, 2])
  out = _dequeue(embedding, _ragged(ID_LISTS))
  emb = lib.id_rows(embedding, table)
  expected = np.zeros([4, 2, DIM])
  for i, ids in enumerate(ID_LISTS):
    for j, key in enumerate(ids[:2]):
      expected[i, j] = emb[key]
  np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_gradient_of_weighted_mean_matches_numpy():
  """SGD on a weighted mean: each id's row moves by -lr * w / sum(w) * upstream."""
  embedding, table = _embedding(combiner="mean")
  ids, weights = _ragged(ID_LISTS), _ragged(WEIGHT_LISTS, tf.float32)
  _dequeue(embedding, ids, weights)  # Inserts the ids (evaluation would not).
  before = lib.id_rows(embedding, table)
  upstream = np.random.RandomState(1).normal(size=[4, DIM]).astype(np.float32)
  embedding.enqueue({"f": ids}, weights={"f": weights})
  embedding.dequeue()
  embedding.apply_gradients({"f": tf.constant(upstream)})
  expected = {k: v.astype(np.float64) for k, v in before.items()}
  for i, (id_list, w) in enumerate(zip(ID_LISTS, WEIGHT_LISTS)):
    for key, wj in zip(id_list, w):
      expected[key] -= 0.1 * wj / sum(w) * upstream[i]
  after = lib.id_rows(embedding, table)
  for key in expected:
    np.testing.assert_allclose(after[key], expected[key], rtol=1e-5, atol=1e-6)
