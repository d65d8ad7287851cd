"""core/combiner.combine equals a NumPy reference in dense, ragged and segment form."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import combiner

# Two positions of ids (one empty), their embeddings [n, 2] and weights.
LISTS = [[[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], []]
WEIGHTS = [[2.0, 1.0, 0.5], []]


def _reference(kind, lists=LISTS, weights=None):
  """[len(lists), 2]: sum(w e), / sum(w) (mean), / sqrt(sum w^2) (sqrtn); empty: 0."""
  out = np.zeros([len(lists), 2])
  for i, ids in enumerate(lists):
    if not ids:
      continue
    e = np.asarray(ids)
    w = np.ones(len(ids)) if weights is None else np.asarray(weights[i])
    total = (w[:, None] * e).sum(0)
    norm = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w**2).sum())}[kind]
    out[i] = total / norm
  return out


@pytest.mark.parametrize("kind", combiner.COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
def test_ragged_and_segment_forms_match_numpy(kind, weighted):
  weights = WEIGHTS if weighted else None
  want = _reference(kind, weights=weights)
  ragged = tf.ragged.constant(LISTS, ragged_rank=1)
  ragged_w = tf.ragged.constant(weights) if weighted else None
  got = combiner.combine(ragged, kind, ragged_w)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
  flat_w = tf.constant(WEIGHTS[0]) if weighted else None
  got = combiner.combine(tf.constant(LISTS[0]), kind, flat_w, segment_ids=tf.constant([0, 0, 0],
                                                                                      tf.int64),
                         num_segments=tf.constant(2, tf.int64))
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("kind", combiner.COMBINERS)
def test_dense_form_keeps_static_shape(kind):
  per_id = tf.constant([[[1.0, 2.0], [3.0, 4.0]], [[0.0, 1.0], [2.0, 0.0]]])  # [2, 2 ids, 2]
  weights = tf.constant([[1.0, 3.0], [2.0, 0.0]])
  got = combiner.combine(per_id, kind, weights)
  assert got.shape == (2, 2)
  want = _reference(kind, per_id.numpy().tolist(), weights.numpy().tolist())
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("kind", combiner.COMBINERS)
def test_one_id_per_position_gives_its_embedding_and_gradient(kind):
  # [2, 3 positions, 1 id, 2]: the shortcut for one unweighted id per position.
  per_id = tf.constant(np.arange(12, dtype=np.float32).reshape(2, 3, 1, 2) - 5)
  with tf.GradientTape() as tape:
    tape.watch(per_id)
    got = combiner.combine(per_id, kind)
    loss = tf.reduce_sum(got * tf.constant([[1.0, -2.0]]))
  assert got.shape == (2, 3, 2)
  np.testing.assert_array_equal(got.numpy(), per_id.numpy()[:, :, 0])
  np.testing.assert_array_equal(
      tape.gradient(loss, per_id).numpy(), np.broadcast_to([[1.0, -2.0]], [2, 3, 1, 2]))


def test_ragged_outer_dimension_pads_zero_rows():
  per_id = tf.ragged.constant([[[[1.0], [3.0]]], [[[2.0]], [[4.0], [6.0]]]], ragged_rank=2)
  np.testing.assert_allclose(
      combiner.combine(per_id, "mean").numpy(), [[[2.0], [0.0]], [[2.0], [5.0]]])


def test_none_keeps_every_id_and_errors_name_the_problem():
  per_id = tf.ones([2, 3, 4])
  assert combiner.combine(per_id, None) is per_id
  with pytest.raises(ValueError, match=r"`combiner` must be one of \('sum', 'mean', 'sqrtn'\), "
                     r"got 'max'"):
    combiner.combine(per_id, "max")
  with pytest.raises(ValueError, match="weights need a combiner"):
    combiner.combine(per_id, None, tf.ones([2, 3]))
  with pytest.raises(ValueError, match="both segment_ids and num_segments"):
    combiner.combine(per_id, "sum", segment_ids=tf.zeros([2], tf.int64))
  with pytest.raises(ValueError, match="SparseFeature 'f'.* or None, got 'max'"):
    combiner.check_combiner("max", "SparseFeature 'f'", allow_none=True)
