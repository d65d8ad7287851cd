"""The all-to-all routing of a sharded table: each worker moves only its own ids and rows.

`exchange_lookup` runs the step of exchange.exchange_lookup (ids to owners,
rows back, gradients home) with TF's CollectiveAllToAllV2
(collective_ops.all_to_all_v2, CPU and GPU, over the gRPC collective executor
MultiWorkerMirroredStrategy sets up) instead of all-gathers, as TorchRec's
row-wise input/output dists and TFRA's all-to-all embedding do: each worker
buckets its distinct keys by owner, one all-reduce (max) of a number agrees on
the largest count M, the keys go out in chunks of M led by their count and
the rows come back, one all-to-all each; the gradient of an all-to-all is the
reverse all-to-all. A worker receives about its own n distinct ids and rows,
n (8 + 2 d s) bytes per step instead of exchange.py's W n (8 + 2 d s).

all_to_all_v2 is not reachable through the public ReplicaContext in TF 2.15;
its collectives are keyed by (group_key, instance_key), which every worker
must give identically: `AllToAllKeys` hands them out per table and lookup,
never overflowing int32.
See docs/scaling.md#one-training-step.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf
from tensorflow.python.ops import collective_ops  # pylint: disable=g-direct-tensorflow-import

from mxrec_pipeline.distributed import exchange
from mxrec_pipeline.distributed import sharding

# Group keys of the all-to-alls, far above those MultiWorkerMirroredStrategy
# hands out (from 1 up, one per device group). Instance keys are scoped by
# their group: every LOOKUPS_PER_GROUP lookups of a table move to the next
# group key, so int32 instance keys never overflow.
GROUP_KEY = 1 << 30
MAX_TABLES = 64  # Instance keys interleave the tables: 1 + (call * 64 + table index).
_KEYS_PER_LOOKUP = 4  # the largest count, ids forward, rows forward, rows backward.
# The most lookups whose instance keys fit in int32: 1 + ((4 * lookup + 3) * 64 + 63) < 2**31.
MAX_LOOKUPS_PER_GROUP = (
    (1 << 31) - 2 -
    (_KEYS_PER_LOOKUP - 1) * MAX_TABLES - MAX_TABLES) // (_KEYS_PER_LOOKUP * MAX_TABLES) + 1
LOOKUPS_PER_GROUP = MAX_LOOKUPS_PER_GROUP  # AllToAllKeys' default (tests lower it).


class AllToAllKeys(tf.Module):
  """Collective keys of a table's all-to-alls: new ones every lookup, the same on every worker.

  TF resolves a collective instance once (its shape included), so an exchange
  whose chunk size changes from step to step needs new instance keys at every
  call, as MultiWorkerMirroredStrategy's launchers take call-time keys. A
  per-worker counter of lookups, advanced identically on every worker,
  gives them: lookup c of table t uses group GROUP_KEY + c // per_group and
  instance keys 1 + ((4 * (c % per_group) + k) * MAX_TABLES + t), k < 4, all
  int32 for any number of lookups (a new group every ~8.4 million lookups of
  a table; TF sets a group up on its first collective).

  Args:
    table_index: The table's creation index in the run, < MAX_TABLES (the
      same on every worker: ShardedTable's config check refuses another
      order).
    lookups_per_group: Lookups per group key, in [1, MAX_LOOKUPS_PER_GROUP];
      None: LOOKUPS_PER_GROUP (the maximum; tests lower it to reach the
      next group in a few steps).

  Raises:
    ValueError: table_index >= MAX_TABLES, or lookups_per_group out of range.
  """

  def __init__(self, table_index: int, lookups_per_group: int | None = None):
    super().__init__(name=None)
    if not 0 <= table_index < MAX_TABLES:
      raise ValueError(f"all_to_all routing serves the first {MAX_TABLES} tables of a run, this is "
                       f"table {table_index}; use routing='all_gather'")
    if lookups_per_group is None:
      lookups_per_group = LOOKUPS_PER_GROUP
    if not 1 <= lookups_per_group <= MAX_LOOKUPS_PER_GROUP:
      raise ValueError(f"`lookups_per_group` must be in [1, {MAX_LOOKUPS_PER_GROUP}], got "
                       f"{lookups_per_group}")
    self._table_index = table_index
    self._per_group = lookups_per_group
    with tf.init_scope():
      self.lookups = tf.Variable(0, dtype=tf.int64, trainable=False, name="all_to_all_lookups")

  def next(self) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """(int32 group key, the _KEYS_PER_LOOKUP int32 instance keys) of one more lookup."""
    call = self.lookups.assign_add(1, read_value=True) - 1
    group = tf.cast(GROUP_KEY + call // self._per_group, tf.int32)
    in_group = call % self._per_group
    return group, [
        tf.cast(1 + ((_KEYS_PER_LOOKUP * in_group + k) * MAX_TABLES + self._table_index), tf.int32)
        for k in range(_KEYS_PER_LOOKUP)
    ]


def _all_to_all(t, num_shards: int, group_key, forward_key, backward_key, timeout_s: float):
  """all_to_all_v2 over the workers; differentiable (its gradient is the reverse exchange)."""

  @tf.custom_gradient
  def exchange_rows(x):

    def grad(dy):
      return collective_ops.all_to_all_v2(tf.convert_to_tensor(dy), num_shards, group_key,
                                          backward_key, timeout=timeout_s)

    return collective_ops.all_to_all_v2(x, num_shards, group_key, forward_key,
                                        timeout=timeout_s), grad

  if not t.dtype.is_floating:
    return collective_ops.all_to_all_v2(t, num_shards, group_key, forward_key, timeout=timeout_s)
  return exchange_rows(t)


def _largest(count: tf.Tensor, num_shards: int, group_key, instance_key,
             timeout_s: float) -> tf.Tensor:
  """The largest of every worker's int32 scalar `count`: one all-reduce (max) of 4 bytes."""
  return collective_ops.all_reduce_v2(count[tf.newaxis], num_shards, group_key, instance_key,
                                      merge_op="Max", final_op="Id", timeout=timeout_s)[0]


def exchange_lookup(unique_keys: tf.Tensor, lookup_owned: Callable[..., tf.Tensor], num_shards: int,
                    dim: int, dtype: tf.DType, keys: AllToAllKeys, timeout_s: float = 0.0,
                    weights: tf.Tensor | None = None) -> tuple[tf.Tensor, exchange.ExchangeBytes]:
  """See exchange.exchange_lookup; the same contract, routed by all-to-alls.

    1. bucket    this worker's distinct keys sorted by owner; counts [W] per owner
    2. largest   all_reduce(max) of this worker's largest count -> M, the
                 same on every worker (all_to_all sends equal chunks)
    3. ids       all_to_all([W, 1 + M] keys): chunk j is the count of keys
                 for owner j, then those keys, padded -> the keys every
                 worker asks me, each chunk led by its count
    4. lookup    the owner's rows of the valid ones
    5. rows      all_to_all([W, M, dim] rows) -> my keys' rows from their owners
    backward:    the gradient of an all_to_all is the all_to_all of the
                 gradient (its own transpose): each owner receives the
                 gradient of the rows it sent.

  Args:
    unique_keys, lookup_owned, num_shards, dim, dtype, weights: As
      exchange.exchange_lookup's.
    keys: The table's AllToAllKeys.
    timeout_s: Timeout of each collective in seconds (0: none); a worker
      that does not join fails the others with DeadlineExceededError.

  Returns:
    ([n, dim] rows of unique_keys, ExchangeBytes: ids = W * (1 + M) * 8 (16
    with weights) + 4, rows = gradients = W * M * dim * itemsize).
  """
  context = tf.distribute.get_replica_context()
  if context is None or tf.distribute.in_cross_replica_context():
    raise ValueError("exchange_lookup: call it inside strategy.run (a replica context)")
  n = tf.size(unique_keys, out_type=tf.int32)
  owners = sharding.owner(unique_keys, num_shards)
  order = tf.argsort(owners, stable=True)
  sorted_owners = tf.gather(owners, order)
  send_counts = tf.math.bincount(owners, minlength=num_shards, maxlength=num_shards, dtype=tf.int32)
  group_key, (largest_key, ids_key, rows_key, grads_key) = keys.next()
  chunk = tf.maximum(
      _largest(tf.reduce_max(send_counts), num_shards, group_key, largest_key, timeout_s), 1)  # M
  starts = tf.cumsum(send_counts, exclusive=True)
  slots = sorted_owners * chunk + tf.range(n) - tf.gather(starts, sorted_owners)  # [n]
  padded = num_shards * chunk
  sent = tf.gather(unique_keys, order)
  if weights is not None:
    sent = tf.stack([sent, tf.gather(weights, order)], axis=1)  # [n, 2]
  trailing = tf.shape(sent)[1:]
  outgoing = tf.scatter_nd(slots[:, tf.newaxis], sent, tf.concat([[padded], trailing], 0))
  # Each chunk led by its count (a weighted chunk's: [count, 0]).
  counts = tf.cast(send_counts, sent.dtype)[:, tf.newaxis]
  if weights is not None:
    counts = tf.stack([counts, tf.zeros_like(counts)], axis=-1)
  outgoing = tf.concat(
      [counts, tf.reshape(outgoing, tf.concat([[num_shards, chunk], trailing], 0))],
      axis=1)  # [W, 1 + M, ...]
  incoming = _all_to_all(outgoing, num_shards, group_key, ids_key, None, timeout_s)
  received = tf.cast(incoming[:, 0] if weights is None else incoming[:, 0, 0], tf.int32)  # [W]
  valid = tf.reshape(tf.range(chunk)[tf.newaxis] < received[:, tf.newaxis], [-1])
  positions = tf.cast(tf.reshape(tf.where(valid), [-1]), tf.int32)  # In [0, W * M).
  incoming = tf.gather(tf.reshape(incoming[:, 1:], tf.concat([[padded], trailing], 0)), positions)
  if weights is None:
    own_rows = lookup_owned(incoming)
  else:
    own_rows = lookup_owned(incoming[:, 0], incoming[:, 1])
  replies = tf.scatter_nd(positions[:, tf.newaxis], own_rows, tf.stack([padded, dim]))
  answered = _all_to_all(tf.reshape(replies, tf.stack([num_shards, chunk, dim])), num_shards,
                         group_key, rows_key, grads_key, timeout_s)
  sorted_rows = tf.gather(tf.reshape(answered, tf.stack([padded, dim])), slots)
  rows = tf.scatter_nd(order[:, tf.newaxis], sorted_rows, tf.stack([n, dim]))
  padded64 = tf.cast(padded, tf.int64)
  row_bytes = padded64 * dim * dtype.size
  key_bytes = exchange.KEY_BYTES * (2 if weights is not None else 1)
  return rows, exchange.ExchangeBytes(
      ids=(padded64 + num_shards) * key_bytes + exchange.COUNT_BYTES, rows=row_bytes,
      gradients=row_bytes)
