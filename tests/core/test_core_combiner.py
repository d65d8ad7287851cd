"""core/combiner.combine equals a NumPy reference in dense, ragged and segment form."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import combiner

# Two positions of ids (one empty), their embeddings [n, 2] and weights.
LISTS = [[[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], []]
WEIGHTS = [[2.0, 1.0, 0.5], []]


def _reference(kind, lists=LISTS, weights=None, dim=2):
  """[len(lists), dim]: sum(w e), / sum(w) (mean), / sqrt(sum w^2) (sqrtn); empty: 0."""
  out = np.zeros([len(lists), dim])
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


def _ragged_cases():
  """Ragged per_id inputs: [4, (ids), 3] with empty rows, and [2, (lists), (ids), 3]."""
  rng = np.random.default_rng(7)
  flat = tf.constant(rng.normal(size=[9, 3]), tf.float32)
  rank1 = tf.RaggedTensor.from_row_lengths(flat, [3, 0, 5, 1])
  nested = tf.RaggedTensor.from_row_lengths(tf.RaggedTensor.from_row_lengths(flat, [2, 0, 4, 3]),
                                            [3, 1])
  padded = tf.RaggedTensor.from_uniform_row_length(
      tf.RaggedTensor.from_row_lengths(flat, [2, 0, 4, 0, 3, 0]), 3)  # [2, 3, (ids), 3]
  return {"rank1": rank1, "nested": nested, "padded": padded}


def _dense_reference(kind, per_id):
  """NumPy combine of a ragged per_id, its outer dimensions padded with zero rows, and
  the gradient of sum(combined * cotangent) with respect to its flat values."""
  splits = per_id.nested_row_splits[-1].numpy()
  flat = per_id.flat_values.numpy().astype(np.float64)
  lists = [flat[splits[s]:splits[s + 1]].tolist() for s in range(len(splits) - 1)]
  combined = _reference(kind, lists, dim=flat.shape[1])
  counts = np.diff(splits)
  norm = {"sum": np.ones_like(counts), "mean": counts, "sqrtn": np.sqrt(counts)}[kind]
  cotangent = np.arange(len(lists) * flat.shape[1]).reshape(combined.shape) % 5 - 2.0
  grad = np.repeat(cotangent / np.maximum(norm, 1)[:, None], counts, axis=0)
  return combined, cotangent, grad


@pytest.mark.parametrize("kind", combiner.COMBINERS)
@pytest.mark.parametrize("case", ["rank1", "nested", "padded"])
def test_fused_combine_matches_numpy_and_combine_with_gradients(kind, case):
  per_id = _ragged_cases()[case]
  want, cotangent, want_grad = _dense_reference(kind, per_id)
  results = {}
  for fn in (combiner.combine, combiner.fused_combine):
    flat = per_id.flat_values
    with tf.GradientTape() as tape:
      tape.watch(flat)
      got = fn(per_id.with_flat_values(flat), kind)
      # The inner segments, in order: the outer dimensions padded as TF pads them.
      inner = tf.reshape(got, [-1, 3]) if case != "nested" else tf.concat([got[0, :3], got[1, :1]],
                                                                          0)
      loss = tf.reduce_sum(inner * tf.constant(cotangent, tf.float32))
    results[fn.__name__] = (got.numpy(), tape.gradient(loss, flat).numpy())
    np.testing.assert_allclose(inner.numpy(), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(results[fn.__name__][1], want_grad, rtol=1e-6, atol=1e-6)
  fused, reference = results["fused_combine"], results["combine"]
  assert fused[0].shape == reference[0].shape
  np.testing.assert_allclose(fused[0], reference[0], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(fused[1], reference[1], rtol=1e-6, atol=1e-7)


def test_fused_combine_in_a_function_keeps_the_static_shape():
  per_id = _ragged_cases()["padded"]
  spec = tf.RaggedTensorSpec([None, 3, None, 3], tf.float32, ragged_rank=2,
                             row_splits_dtype=tf.int64)
  fn = tf.function(lambda x: combiner.fused_combine(x, "mean"), input_signature=[spec])
  assert fn.get_concrete_function().structured_outputs.shape.as_list() == [None, 3, 3]
  np.testing.assert_allclose(
      fn(per_id).numpy(),
      combiner.combine(per_id, "mean").numpy(), rtol=1e-6)


def test_fused_combine_falls_back_to_combine_and_checks_its_inputs():
  dense = tf.constant([[[1.0, 2.0], [3.0, 4.0]]])
  np.testing.assert_allclose(combiner.fused_combine(dense, "mean").numpy(), [[2.0, 3.0]])
  doubles = tf.ragged.constant([[[1.0], [2.0]], []], ragged_rank=1, dtype=tf.float64)
  np.testing.assert_allclose(combiner.fused_combine(doubles, "sum").numpy(), [[3.0], [0.0]])
  ragged = tf.ragged.constant([[[1.0], [2.0]]], ragged_rank=1)
  assert combiner.fused_combine(ragged, None) is ragged
  with pytest.raises(ValueError, match=r"fused_combine: `combiner` must be one of .* got 'max'"):
    combiner.fused_combine(ragged, "max")


@pytest.mark.parametrize("splits, message", [
    ([1, 2], "row_splits must start at 0, got 1"),
    ([0, 2, 1], "row_splits must be non-decreasing, got 2 then 1 at position 2"),
    ([0, 1], "row_splits must end at the number of values, 2, got 1"),
    ([], "row_splits must be a vector of at least one element"),
])
def test_segment_combine_op_names_bad_row_splits(splits, message):
  from mxrec_pipeline import ops  # pylint: disable=import-outside-toplevel
  values = tf.ones([2, 3])
  with pytest.raises(tf.errors.InvalidArgumentError, match=f"MxSegmentCombine: {message}"):
    ops.load().mx_segment_combine(values, tf.constant(splits, tf.int64), combiner="mean")
  with pytest.raises(
      tf.errors.InvalidArgumentError, match="MxSegmentCombine: values must be a "
      r"matrix \[n, dim\], got shape \[2\]"):
    ops.load().mx_segment_combine(tf.ones([2]), tf.constant([0, 2], tf.int64), combiner="sum")
  if message.startswith("row_splits must end"):
    return  # The gradient op takes n from row_splits.
  with pytest.raises(tf.errors.InvalidArgumentError, match=f"MxSegmentCombineGrad: {message}"):
    ops.load().mx_segment_combine_grad(tf.ones([max(len(splits) - 1, 0), 3]),
                                       tf.constant(splits, tf.int32), combiner="sum")
