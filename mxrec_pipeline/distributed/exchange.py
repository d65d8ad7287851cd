"""One step's routing of a sharded table: ids to their owners, rows back, gradients home.

`exchange_lookup` runs in the replica context of a MultiWorkerMirroredStrategy
(one replica per worker) with `tf.distribute.ReplicaContext.all_gather` (TF's
CollectiveGatherV2 over gRPC; no MPI, no RPC layer of our own): every worker
gathers all workers' distinct keys, each owner (distributed/sharding.py) looks
up its own in its shard, the rows are all-gathered back and each worker keeps
its slice. Backward, the gradient of all_gather is an all-reduce (sum) sliced
to the worker's part, so autodiff brings each owner every worker's gradient of
its rows as IndexedSlices on its shard variable (repeated keys summed by the
hash optimizer, optimizers/base.py).

This is TorchRec's row-wise sharding (input dist -> lookup -> output dist)
built from all-gathers, as TF 2.15's public replica context has no all_to_all
and all_gather's gradient is defined: each worker moves every worker's ids and
rows, W times the all-to-all volume (distributed/all_to_all.py).
`ExchangeBytes` counts the payload; `exchange_lookup` lists the step.
See docs/scaling.md#one-training-step.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.distributed import sharding

KEY_BYTES = 8  # int64 keys.
COUNT_BYTES = 4  # int32 counts exchanged beside them.


@dataclasses.dataclass(frozen=True)
class ExchangeBytes:
  """Bytes one worker receives from the collectives of one lookup, by part.

  The payload of the collective ops as run, padding included
  (`ReplicaContext.all_gather` pads every worker's part to the largest):
  W parts of max_w n_w entries each.

  Attributes:
    ids: int64 scalar: the all-gathered keys plus the counts (W * max n * 8
      + 2 * W * 4), and with admission the keys' weights (W * max n * 8).
    rows: int64 scalar: the all-gathered rows (W * max n * dim * itemsize).
    gradients: int64 scalar: the all-reduced gradient of the rows in the
      backward pass (N * dim * itemsize) plus its counts (W * 4); counted
      by the forward pass, which fixes its size, even when no gradient is
      taken (evaluation).
  """

  ids: tf.Tensor
  rows: tf.Tensor
  gradients: tf.Tensor

  def as_vector(self) -> tf.Tensor:
    """[3] int64: ids, rows, gradients."""
    return tf.stack([self.ids, self.rows, self.gradients])


def exchange_lookup(unique_keys: tf.Tensor, lookup_owned: Callable[..., tf.Tensor], num_shards: int,
                    dim: int, dtype: tf.DType,
                    weights: tf.Tensor | None = None) -> tuple[tf.Tensor, ExchangeBytes]:
  """The rows of this worker's distinct keys, read from their owners' shards.

  Must run in a replica context (`strategy.run`) on every worker at the same
  point of the step: the collectives are matched by their order. With W
  workers, worker w holding n_w distinct keys of the step:

    1. keys      all_gather(unique keys)   -> K: [N] int64, N = sum n_w, worker-major
    2. owners    owner(K, W) (distributed/sharding.py), the same on every worker
    3. lookup    the owner looks up K[owner == w] in its own shard (inserting
                 absent keys when training) -> own rows [n_own, dim]
    4. rows      all_gather(own rows)      -> [N, dim] in owner-major order, put
                 back in K's order by the stable owner sort
    5. restore   worker w keeps K's slice w

  Args:
    unique_keys: [n] int64 distinct keys of this worker's batch.
    lookup_owned: The owner side: [m] int64 keys this worker owns (may
      repeat when several workers ask) -> [m, dim] their rows; its gradient
      goes to this worker's shard. With `weights`, called as
      lookup_owned(keys, weights) with their [m] int64 weights.
    num_shards: W, the number of workers (replicas in sync).
    dim: Embedding dimension.
    dtype: The rows' dtype.
    weights: Optional [n] int64 per key (admission sightings), routed with
      the keys to their owners (8 more bytes per key, counted in `ids`).

  Returns:
    ([n, dim] rows of unique_keys, ExchangeBytes of this call).

  Raises:
    ValueError: called outside a replica context.
  """
  context = tf.distribute.get_replica_context()
  if context is None or tf.distribute.in_cross_replica_context():
    raise ValueError("exchange_lookup: call it inside strategy.run (a replica context)")
  shard_id = context.replica_id_in_sync_group
  count = tf.size(unique_keys, out_type=tf.int32)
  counts = context.all_gather(tf.reshape(count, [1]), axis=0)  # [W]
  all_keys = context.all_gather(unique_keys, axis=0)  # [N], worker-major.
  owners = sharding.owner(all_keys, num_shards)
  owned = tf.reshape(tf.where(tf.equal(owners, shard_id)), [-1])
  if weights is None:
    own_rows = lookup_owned(tf.gather(all_keys, owned))  # [n_own, dim]
  else:
    all_weights = context.all_gather(weights, axis=0)
    own_rows = lookup_owned(tf.gather(all_keys, owned), tf.gather(all_weights, owned))
  gathered = context.all_gather(own_rows, axis=0)  # [N, dim], owner-major.
  # Back to K's order: the gathered parts follow the stable sort by owner.
  by_owner = tf.argsort(owners, stable=True)
  total = tf.size(all_keys, out_type=tf.int32)
  in_key_order = tf.scatter_nd(tf.expand_dims(by_owner, -1), gathered, tf.stack([total, dim]))
  begin = tf.reduce_sum(counts[:shard_id])
  mine = in_key_order[begin:begin + count]
  return mine, _bytes(counts, dim, dtype, weights is not None)


def max_over_workers(value: tf.Tensor) -> tf.Tensor:
  """The largest of every worker's int64 scalar (all-gathers W * 8 bytes); in replica context."""
  gathered = tf.distribute.get_replica_context().all_gather(tf.reshape(value, [1]), axis=0)
  return tf.reduce_max(gathered)


def _bytes(counts: tf.Tensor, dim: int, dtype: tf.DType, weighted: bool) -> ExchangeBytes:
  workers = tf.size(counts, out_type=tf.int64)
  padded = workers * tf.cast(tf.reduce_max(counts), tf.int64)
  total = tf.cast(tf.reduce_sum(counts), tf.int64)
  row_bytes = dim * dtype.size
  key_bytes = KEY_BYTES * (2 if weighted else 1)
  return ExchangeBytes(ids=padded * key_bytes + 2 * workers * COUNT_BYTES, rows=padded * row_bytes,
                       gradients=total * row_bytes + workers * COUNT_BYTES)


def bytes_per_step_formula(unique_ids_per_worker: float, dim: int, num_workers: int,
                           itemsize: int = 4, routing: str = "all_gather") -> float:
  """Bytes one worker receives per step and table, by the formulas of docs/distributed.md.

  all_gather (this module): W * n * (8 + 2 * dim * itemsize) + 3 * W * 4.
  all_to_all (distributed/all_to_all.py): n * (8 + 2 * dim * itemsize)
  + W * 8 + 4 (the chunks' counts; the largest count). For n distinct ids
  per worker and step, no padding (equal n on every worker, keys spread
  evenly over the owners).

  Args:
    unique_ids_per_worker: n, distinct ids of the table in a worker's batch.
    dim: Embedding dimension.
    num_workers: W.
    itemsize: Bytes per embedding value (4 for float32).
    routing: "all_gather" or "all_to_all" (ShardedTable's routing).

  Raises:
    ValueError: another routing.
  """
  w, n = num_workers, unique_ids_per_worker
  per_id = KEY_BYTES + 2 * dim * itemsize
  if routing == "all_gather":
    return w * n * per_id + 3 * w * COUNT_BYTES
  if routing == "all_to_all":
    return n * per_id + w * KEY_BYTES + COUNT_BYTES
  raise ValueError(f"`routing` must be 'all_gather' or 'all_to_all', got {routing!r}")
