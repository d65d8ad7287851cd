"""From one feature's ids to its activation: flat ids, then a linear map.

A feature's input (dense, tf.SparseTensor or tf.RaggedTensor ids, optional
weights) becomes a `FeaturePlan`: the flat ids to insert in the table's key
index, and `activation(per_id)`, which takes the ids' embeddings `[n, dim]`
and returns the feature's activation `[*output_shape, dim]`. The map is linear
in the embeddings (gather, weighted segment sums, scatter), so the gradient of
a table is that map's transpose (see Embedding.apply_gradients).

The ids of one position are reduced by the sparse core's combiner
(core/combiner.py: sum, mean or sqrtn, weighted as in
tf.nn.embedding_lookup_sparse; empty positions give zeros). Sequence features
place each id's embedding at its position instead, padded with zeros and
truncated to the sequence length.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.core import combiner as combiner_lib
from mxrec_pipeline.embedding import shapes
from mxrec_pipeline.embedding.config import FeatureConfig


@dataclasses.dataclass(frozen=True)
class FeaturePlan:
  """One feature of one batch (per replica), ready for lookup.

  Attributes:
    ids: [n] ids to look up (the input's dtype: int32, int64 or string).
    activation: per-id embeddings [n, dim] -> [*shape, dim].
    shape: Static output shape of the activation, without dim.
  """

  ids: tf.Tensor
  activation: Callable[[tf.Tensor], tf.Tensor]
  shape: tf.TensorShape


def plan(path: str, feature: FeatureConfig, inp, weight,
         output_shape: tf.TensorShape) -> FeaturePlan:
  """The FeaturePlan of one feature's input.

  Args:
    path: The feature's name in the feature config, for messages.
    feature: Its FeatureConfig.
    inp: Its ids: tf.Tensor (checked by shapes.input_shape), tf.SparseTensor or
      tf.RaggedTensor.
    weight: None, or per-id weights of the same type and layout as `inp`
      (sparse and ragged inputs only; not for sequence features).
    output_shape: The resolved output shape (without dim); the activation is
      reshaped to it when its rank differs from the natural one.

  Raises:
    ValueError: weights on a dense or sequence input or of another type, a
      ragged output_shape that is no multiple of the batch size, an output
      shape with more than one unknown dimension to reshape to (each naming
      the feature).
  """
  dim = feature.table.dim
  if weight is not None and not isinstance(inp, (tf.SparseTensor, tf.RaggedTensor)):
    raise ValueError(f"Weight specified for {path}, but its input is dense")
  if weight is not None and type(weight) is not type(inp):
    raise ValueError(f"Weight for {path} is of type {type(weight).__name__}, which does not "
                     f"match the type of its input, {type(inp).__name__}")
  if isinstance(inp, tf.Tensor):
    keep_last = inp.shape.rank == 1
    out_dims = tf.shape(inp) if keep_last else tf.shape(inp)[:-1]
    natural_shape = inp.shape if keep_last else inp.shape[:-1]
    ids = tf.reshape(inp, [-1])

    def natural(per_id):
      return tf.reshape(per_id, tf.concat([out_dims, [dim]], 0))
  else:
    ids, natural, natural_shape = _sparse_plan(path, feature, inp, weight, dim)
  target = output_shape if output_shape.rank is not None else natural_shape
  return FeaturePlan(ids=ids, activation=_shaped(path, natural, natural_shape, target, dim),
                     shape=target)


def _sparse_plan(path, feature, inp, weight, dim):
  """(flat ids, natural activation fn, its shape without dim) of a sparse/ragged input."""
  rank = inp.shape.rank
  ragged = isinstance(inp, tf.RaggedTensor)
  sp = inp.to_sparse() if ragged else inp
  weights = None
  if weight is not None:
    weights = tf.cast(weight.to_sparse().values if ragged else weight.values, tf.float32)
  length = None
  if ragged and rank == 2 and feature.output_shape:
    length = _ragged_sequence_length(path, feature, inp)
  elif shapes.is_sequence(feature, rank):
    length = feature.max_sequence_length
  if length is not None:
    if weight is not None:
      raise ValueError(f"Weight specified for {path}, but it is a sequence feature")
    keep = sp.indices[:, 1] < length
    positions = tf.boolean_mask(sp.indices, keep)
    out = tf.stack([sp.dense_shape[0], tf.constant(length, tf.int64), tf.constant(dim, tf.int64)])
    return (tf.boolean_mask(sp.values, keep), lambda per_id: tf.scatter_nd(positions, per_id, out),
            tf.TensorShape([inp.shape[0], length]))
  outer = sp.dense_shape[:-1]
  strides = tf.math.cumprod(outer, exclusive=True, reverse=True)
  segments = tf.reduce_sum(sp.indices[:, :-1] * strides, axis=1)
  num_segments = tf.reduce_prod(outer)
  combiner = feature.table.combiner

  def activation(per_id):
    combined = combiner_lib.combine(per_id, combiner, weights, segments, num_segments)
    return tf.reshape(combined, tf.concat([outer, [dim]], 0))

  return sp.values, activation, inp.shape[:-1]


def _ragged_sequence_length(path, feature, inp) -> int | None:
  """TPUEmbedding's rule for a 2D ragged input with FeatureConfig.output_shape.

  Returns None (combine each row) when the output shape has batch_size
  elements, else the sequence length output_elements / batch_size.
  """
  batch_size = inp.shape[0]
  elements = feature.output_shape.num_elements()
  if batch_size is None or elements is None:
    raise ValueError(
        f"Feature {path}: a 2D ragged input with FeatureConfig.output_shape "
        f"{feature.output_shape} needs a static batch size and a fully defined output_shape; "
        f"got input shape {inp.shape}")
  if elements == batch_size:
    return None
  if elements > batch_size and elements % batch_size == 0:
    return elements // batch_size
  raise ValueError(f"Feature {path}: the output shape set in its FeatureConfig must have a "
                   f"multiple of the batch size elements; got output shape "
                   f"{feature.output_shape}, batch size {batch_size}")


def _shaped(path: str, natural, natural_shape: tf.TensorShape, target: tf.TensorShape, dim: int):
  """`natural` then a shape check against, or a reshape to, target + [dim].

  Raises:
    ValueError: a reshape is needed (ranks differ) to a target shape with
      more than one unknown dimension.
  """
  if target.rank == natural_shape.rank:
    return lambda per_id: tf.ensure_shape(natural(per_id), target.concatenate([dim]))
  dims = target.as_list()
  if sum(d is None for d in dims) > 1:
    raise ValueError(f"Feature {path}: cannot reshape its activation of shape "
                     f"{natural_shape.concatenate([dim])} to output shape {target}, which has "
                     "more than one unknown dimension")
  new_shape = [-1 if d is None else d for d in dims] + [dim]
  return lambda per_id: tf.ensure_shape(tf.reshape(natural(per_id), new_shape),
                                        target.concatenate([dim]))
