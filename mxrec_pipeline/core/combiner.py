"""The combiner: reduces the embeddings of one position's ids to one vector.

One weighted reduction serves every API: the Keras `SparseLookup` (dense or
ragged ids), `sparse_lookup` callers and the TPUEmbedding-style `Embedding`
(ids given as segments of a flat list). With weights w (1 when not given), as
tf.nn.embedding_lookup_sparse and TPUEmbedding define them:

  sum:   sum_i w_i e_i
  mean:  sum_i w_i e_i / sum_i w_i
  sqrtn: sum_i w_i e_i / sqrt(sum_i w_i^2)

Positions without ids (and positions whose weights sum to zero) give zeros.

`combine` is made of TF ops only (the reference, and what a SavedModel
serves); `fused_combine` reduces a ragged input without weights in one native
op, forward and backward (MxSegmentCombine, native/core/segment_combine.cc),
as TPUEmbedding fuses its combiners into the lookup: the sparse core's Keras
lookups use it in training and evaluation.
"""

from __future__ import annotations

import tensorflow as tf

from mxrec_pipeline import ops

COMBINERS = ("sum", "mean", "sqrtn")


def check_combiner(combiner: str | None, where: str, allow_none: bool = False) -> None:
  """Raises unless `combiner` is one of COMBINERS (or None when allowed).

  Args:
    combiner: The value to check.
    where: What holds it, for the message, e.g. "SparseFeature 'item'".
    allow_none: Whether None (keep every id's embedding) is accepted.

  Raises:
    ValueError: naming `where`, the supported combiners and the bad value.
  """
  if combiner in COMBINERS or (allow_none and combiner is None):
    return
  raise ValueError(f"{where}: `combiner` must be one of {COMBINERS}"
                   f"{' or None' if allow_none else ''}, got {combiner!r}")


def combine(per_id, combiner: str | None, weights=None, segment_ids: tf.Tensor | None = None,
            num_segments: tf.Tensor | None = None):
  """Reduces per-id embeddings to one embedding per position.

  The ids of a position are given in one of three forms:
    dense:   per_id [..., num_ids, dim], weights [..., num_ids];
    ragged:  per_id a tf.RaggedTensor [..., (num_ids), dim] whose last ragged
             dimension holds each position's ids, weights a tf.RaggedTensor
             [..., (num_ids)] of the same row partitions;
    segment: per_id [n, dim] with segment_ids [n] int32/int64 (the position
             of each id, in [0, num_segments)) and num_segments, a scalar.

  Args:
    per_id: Float embeddings of every id, in one of the forms above.
    combiner: "sum", "mean", "sqrtn" (see the module docstring), or None to
      return `per_id` unchanged.
    weights: None (every weight 1) or per-id weights of the form's layout,
      any real dtype (cast to per_id's).
    segment_ids: Segment form only: each id's position.
    num_segments: Segment form only: the number of positions.

  Returns:
    [..., dim] (dense and ragged forms; a ragged outer dimension is padded
    with zero rows) or [num_segments, dim] (segment form) of per_id's dtype.

  Raises:
    ValueError: an unknown combiner, weights with combiner None, or only one
      of segment_ids and num_segments.
  """
  if combiner is None:
    if weights is not None:
      raise ValueError("combine: weights need a combiner; combiner None keeps every id")
    return per_id
  check_combiner(combiner, "combine")
  if (segment_ids is None) != (num_segments is None):
    raise ValueError("combine: give both segment_ids and num_segments, or neither")
  if (segment_ids is None and weights is None and not isinstance(per_id, tf.RaggedTensor) and
      per_id.shape.rank is not None and per_id.shape.rank >= 2 and per_id.shape[-2] == 1):
    # One id of weight 1 per position (e.g. an item id): every combiner gives
    # its embedding. Skips a sum over one id and a division by one (forward
    # and backward), which cost ~10% of the MovieLens step's op time.
    return tf.squeeze(per_id, -2)

  def reduce(values):  # [...ids' layout..., k] -> [..., k], summed over each position's ids
    if segment_ids is not None:
      return tf.math.unsorted_segment_sum(values, segment_ids, num_segments)
    if isinstance(per_id, tf.RaggedTensor):
      total = tf.reduce_sum(per_id.with_flat_values(values), axis=-2)
      return total.to_tensor() if isinstance(total, tf.RaggedTensor) else total
    return tf.reduce_sum(values, axis=-2)

  values = per_id.flat_values if isinstance(per_id, tf.RaggedTensor) else per_id
  if weights is None:
    w = tf.ones_like(values[..., :1])
  else:
    flat_weights = weights.flat_values if isinstance(weights, tf.RaggedTensor) else weights
    w = tf.expand_dims(tf.cast(flat_weights, values.dtype), -1)
    values = values * w
  total = reduce(values)
  if combiner == "sum":
    return total
  norm = reduce(w) if combiner == "mean" else tf.sqrt(reduce(tf.square(w)))
  return tf.math.divide_no_nan(total, norm)


def fused_combine(per_id, combiner: str | None):
  """`combine(per_id, combiner)`, a ragged input's reduction in one native op.

  A tf.RaggedTensor per_id of float32 [..., (num_ids), dim] (its innermost
  ragged dimension holds each position's ids, its flat values are
  [n, dim]) is reduced by MxSegmentCombine over the innermost row_splits, and
  its gradient is MxSegmentCombineGrad: one op each way instead of TF's
  segment ids, two segment sums, a division and their gradients. Any other
  input (dense, other dtypes, combiner None) goes to `combine`. No weights:
  weighted ids go through `combine`.

  Args:
    per_id: Float embeddings of every id, as for `combine`'s dense and ragged
      forms.
    combiner: "sum", "mean", "sqrtn", or None (per_id returned unchanged).

  Returns:
    As `combine`: [..., dim] of per_id's dtype, a ragged outer dimension
    padded with zero rows. Equal to `combine`'s result up to float32
    rounding (the same sums, in the same order of ids).

  Raises:
    ValueError: an unknown combiner.
    tf.errors.InvalidArgumentError: malformed row_splits (not from 0 to the
      number of ids, or decreasing), naming MxSegmentCombine.
  """
  if (combiner is None or not isinstance(per_id, tf.RaggedTensor) or per_id.dtype != tf.float32 or
      per_id.flat_values.shape.rank != 2):
    return combine(per_id, combiner)
  check_combiner(combiner, "fused_combine")

  def reduce_innermost(ragged):
    if isinstance(ragged.values, tf.RaggedTensor):
      return ragged.with_values(reduce_innermost(ragged.values))
    return ops.load().mx_segment_combine(ragged.values, ragged.row_splits, combiner=combiner)

  total = reduce_innermost(per_id)
  return total.to_tensor() if isinstance(total, tf.RaggedTensor) else total


@tf.RegisterGradient("MxSegmentCombine")
def _segment_combine_grad(op, grad):
  """Every id's gradient: its position's gradient / the position's norm (no row_splits')."""
  return [
      ops.load().mx_segment_combine_grad(grad, op.inputs[1],
                                         combiner=op.get_attr("combiner").decode()), None
  ]
