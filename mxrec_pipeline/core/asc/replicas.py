"""Per-replica batches of inserted global batches: one host, N replicas.

get_asc_insert_func inserts a GLOBAL batch once (deterministic key -> row
assignment, admission counted once, one device-cache plan of a tiered table);
its per-table `unique_rows` belong to the whole batch, so tf.distribute's own
split along the batch axis cannot split them. `split_batch` does: replica r of
N gets examples [r * B // N, (r + 1) * B // N) of every batch-major tensor
and, per table, the distinct rows of its own ids (re-deduplicated,
first-occurrence order) with restore indices into them; a tiered table's plan
token goes to every replica unchanged. `distribute_dataset` hands the N
elements `split_dataset` makes of each global batch to a strategy with
`distribute_datasets_from_function`, whose one-host input pipeline gives
element i to replica i % N (TF 2.15's OwnedMultiDeviceIterator), so they form
one step. Every other tensor of a batch must be batch-major (dense,
tf.RaggedTensor or tf.SparseTensor).

Mirrors TPUEmbedding's "enqueue the global batch, dequeue per replica" and
TorchRec's per-rank input split, on TF's input pipeline.
See docs/architecture.md#scale-out.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import helper


def split_batch(batch, by_table: dict[str, list[fs.FeatureSpec]], replica_id, num_replicas: int):
  """Replica `replica_id`'s part of an inserted global batch.

  Args:
    batch: A batch dict from get_asc_insert_func, or a tuple whose first
      element is it (`(features, labels[, sample_weight])`, as Keras takes).
      The dict holds `unique_rows_key(table)` [num_unique] int64 and
      `restore_key(feature)` (ids' shape, int32, or ragged) of every spec in
      `by_table`; every other tensor is batch-major, [batch_size, ...].
    by_table: Table name -> FeatureSpecs (helper.group_by_table).
    replica_id: Scalar int (Python or tensor) in [0, num_replicas).
    num_replicas: N >= 1.

  Returns:
    The batch's structure with examples [r * B // N, (r + 1) * B // N) of
    every batch-major tensor; per table, `unique_rows_key(table)` holds the
    distinct rows of the replica's ids ([num_local_unique] int64, a subset of
    the global ones, in first-occurrence order) and each feature's restore
    indices point into them. Plan tokens are unchanged. N = 1 returns `batch`.

  Raises:
    ValueError: a batch without the insertion results of a spec (named).
  """
  if num_replicas == 1:
    return batch
  features, rest = (batch[0], tuple(batch[1:])) if isinstance(batch, tuple) else (batch, None)
  for table_name, specs in by_table.items():
    for key in [fs.unique_rows_key(table_name)] + [fs.restore_key(s.name) for s in specs]:
      if key not in features:
        raise ValueError(f"split_batch: the batch has no '{key}' (table '{table_name}'); map "
                         "the dataset with get_asc_insert_func of the same FeatureSpecs first")
  restore_keys = {fs.restore_key(s.name) for specs in by_table.values() for s in specs}
  batch_major = [
      v for k, v in sorted(features.items()) if not fs.is_insertion_key(k) or k in restore_keys
  ]
  size = _num_rows(batch_major[0])
  replica_id = tf.cast(replica_id, tf.int64)
  start = size * replica_id // num_replicas
  end = size * (replica_id + 1) // num_replicas

  out = {}
  for key, value in features.items():
    if not fs.is_insertion_key(key) or key in restore_keys:
      out[key] = _slice(value, start, end)
    else:  # unique rows (replaced below) and plan tokens (shared by the replicas).
      out[key] = value
  for table_name, specs in by_table.items():
    restores = [out[fs.restore_key(s.name)] for s in specs]
    flat = [
        tf.reshape(r.flat_values if isinstance(r, tf.RaggedTensor) else r, [-1]) for r in restores
    ]
    positions, local = tf.unique(flat[0] if len(flat) == 1 else tf.concat(flat, 0),
                                 out_idx=tf.int32)
    out[fs.unique_rows_key(table_name)] = tf.gather(features[fs.unique_rows_key(table_name)],
                                                    positions)
    parts = [local] if len(flat) == 1 else tf.split(local, [tf.size(f) for f in flat])
    for spec, restore, part in zip(specs, restores, parts):
      out[fs.restore_key(spec.name)] = helper.like(restore, part)
  if rest is None:
    return out
  return (out, *tf.nest.map_structure(lambda x: _slice(x, start, end), rest))


def split_dataset(dataset: tf.data.Dataset, by_table: dict[str, list[fs.FeatureSpec]],
                  num_replicas: int) -> tf.data.Dataset:
  """N consecutive elements per global batch: replica 0's, ..., replica N-1's (`split_batch`)."""
  if num_replicas == 1:
    return dataset

  def replicas(*batch):
    batch = batch[0] if len(batch) == 1 else batch
    return tf.data.Dataset.range(num_replicas).map(
        lambda r: split_batch(batch, by_table, r, num_replicas))

  return dataset.flat_map(replicas)


def distribute_dataset(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset,
                       tgt_key_specs: Sequence[fs.FeatureSpec]):
  """An inserted dataset of global batches, as per-replica batches of `strategy`.

  Args:
    strategy: A strategy of one host (one input pipeline), e.g. MirroredStrategy.
    dataset: Global batches mapped with get_asc_insert_func(tgt_key_specs).
    tgt_key_specs: Those FeatureSpecs (timestamp specs are ignored).

  Returns:
    A tf.distribute.DistributedDataset whose step gives replica r
    `split_batch(global batch, ..., r, N)`; for one replica, `dataset` as
    the strategy distributes it (`experimental_distribute_dataset`).

  Raises:
    ValueError: more than one input pipeline (several workers: tables are
      then sharded, see docs/distributed.md).
  """
  num_replicas = strategy.num_replicas_in_sync
  if num_replicas == 1:
    return strategy.experimental_distribute_dataset(dataset)
  by_table = helper.group_by_table([s for s in tgt_key_specs if not s.is_timestamp])

  def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    if context.num_input_pipelines != 1:
      raise ValueError(
          f"distribute_dataset: {context.num_input_pipelines} input pipelines; per-replica "
          "insertion serves the replicas of one host (one input pipeline)")
    return split_dataset(dataset, by_table, num_replicas).prefetch(num_replicas)

  return strategy.distribute_datasets_from_function(dataset_fn)


def _num_rows(value) -> tf.Tensor:
  """The batch size of a batch-major tensor, int64 scalar."""
  if isinstance(value, tf.RaggedTensor):
    return value.nrows(out_type=tf.int64)
  if isinstance(value, tf.SparseTensor):
    return value.dense_shape[0]
  return tf.shape(value, out_type=tf.int64)[0]


def _slice(value, start: tf.Tensor, end: tf.Tensor):
  """Rows [start, end) of a batch-major dense, ragged or sparse tensor (None stays None)."""
  if value is None:
    return None
  if isinstance(value, tf.SparseTensor):
    rank = tf.size(value.dense_shape)
    return tf.sparse.slice(value, tf.concat([[start], tf.zeros([rank - 1], tf.int64)], 0),
                           tf.concat([[end - start], value.dense_shape[1:]], 0))
  return value[start:end]
