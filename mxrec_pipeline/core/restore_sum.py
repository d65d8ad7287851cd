"""A training lookup's per-id read whose gradient comes summed per distinct row.

Insertion gives a batch's distinct rows and, per id, `restore`: the position of
its row among them. A training lookup reads the distinct rows' embeddings
`unique_emb` [num_unique, dim] once, then every id's with `gather_by_restore`,
the values of `tf.gather(unique_emb, restore)` (float32: the native
MxGatherByRestore, into an output buffer it keeps from step to step). Its
gradient is `sum_by_restore`: the native MxSumByRestore adds each id's
gradient to its distinct row's by restore index, one range of distinct rows
per intra-op thread, where TF would densify IndexedSlices on restore with an
UnsortedSegmentSum on one thread. The table variable's gradient is then
IndexedSlices on the distinct rows, each once, which every optimizer takes as
it is. The values equal `tf.math.unsorted_segment_sum(grad, restore,
num_unique)`, added in the same (position) order.

Serving graphs never hold these ops: reads with training=False use plain
gathers (core/lookup.py). See docs/architecture.md#one-training-step.
"""

from __future__ import annotations

import tensorflow as tf

from mxrec_pipeline import ops


def sum_by_restore(values: tf.Tensor, restore: tf.Tensor, num_unique) -> tf.Tensor:
  """Sums the ids' gradients per distinct row: `unsorted_segment_sum(values, restore, num_unique)`.

  float32 values go through the native MxSumByRestore (native/core/
  row_optimizers.h, SumByRestore); other dtypes through
  `tf.math.unsorted_segment_sum`.

  Args:
    values: [*restore_shape, dim] float tensor, the ids' gradients.
    restore: [*restore_shape] int32 positions in [0, num_unique).
    num_unique: int32 scalar, the number of distinct rows.

  Returns:
    [num_unique, dim] of values' dtype; zeros for a row no id has.

  Raises:
    tf.errors.InvalidArgumentError: a restore value outside [0, num_unique)
      (float32, naming its position and value).
  """
  dim = tf.shape(values)[-1]
  flat_values = tf.reshape(values, [-1, dim])
  flat_restore = tf.reshape(restore, [-1])
  if values.dtype != tf.float32:
    return tf.math.unsorted_segment_sum(flat_values, flat_restore, num_unique)
  summed = ops.load().mx_sum_by_restore(flat_values, tf.cast(flat_restore, tf.int32),
                                        tf.cast(num_unique, tf.int32))
  summed.set_shape([None, values.shape[-1]])
  return summed


def gather_by_restore(unique_emb: tf.Tensor, restore: tf.Tensor) -> tf.Tensor:
  """`tf.gather(unique_emb, restore)`, its gradient summed per row by `sum_by_restore`.

  Args:
    unique_emb: [num_unique, dim] float embeddings of a batch's distinct rows.
    restore: [*ids_shape] int32 positions into unique_emb.

  Returns:
    [*ids_shape, dim] of unique_emb's dtype: float32 from the native
    MxGatherByRestore (native/kernels/row_optimizer_kernels.cc), other dtypes
    from `tf.gather`. The gradient with respect to unique_emb is a dense
    [num_unique, dim] tensor (TF's gather gives IndexedSlices on restore, which
    the gather of unique_emb's own rows then densifies with an
    UnsortedSegmentSum).

  Why MxGatherByRestore keeps its output buffer from step to step (reused only
  while no one else holds it): a batch's per-id read is large (4096 x 16 ids of
  dim 64: 16 MB) and freed every step, and glibc malloc hands such blocks back
  to the kernel now and then, so that the next step maps them afresh, one page
  fault per 4 KB (benchmarks/bench_sparse_core.py: the slow steps took ~5,000
  minor faults against ~300). The cost: each such read keeps one batch's
  output between steps (what the step holds at its peak anyway).

  Raises:
    tf.errors.InvalidArgumentError: float32, a restore value outside
      [0, num_unique), naming its (flat) position and value.
  """

  @tf.custom_gradient
  def gather(emb):

    def grad(dy):
      return sum_by_restore(tf.convert_to_tensor(dy), restore, tf.shape(emb)[0])

    if emb.dtype != tf.float32:
      return tf.gather(emb, restore), grad
    return ops.load().mx_gather_by_restore(emb, tf.cast(restore, tf.int32)), grad

  return gather(unique_emb)
