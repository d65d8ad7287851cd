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

from typing import Callable, Sequence

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


def _largest(values: tf.Tensor, num_shards: int, group_key, instance_key,
             timeout_s: float) -> tf.Tensor:
  """The largest of every worker's int32 [k] `values`, element-wise: one all-reduce (max)."""
  return collective_ops.all_reduce_v2(values, num_shards, group_key, instance_key, merge_op="Max",
                                      final_op="Id", timeout=timeout_s)


def exchange_lookup(unique_keys: tf.Tensor, lookup_owned: Callable[..., tf.Tensor], num_shards: int,
                    dim: int, dtype: tf.DType, keys: AllToAllKeys, timeout_s: float = 0.0,
                    weights: tf.Tensor | None = None) -> tuple[tf.Tensor, exchange.ExchangeBytes]:
  """See exchange.exchange_lookup; the same contract, routed by all-to-alls.

  `exchange_lookup_group` of one table (its steps there).

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
  (rows,), counted = exchange_lookup_group([unique_keys], [lookup_owned], num_shards, [dim], dtype,
                                           keys, timeout_s, [weights])
  return rows, counted


def exchange_lookup_group(
    unique_keys: Sequence[tf.Tensor], lookup_owned: Sequence[Callable[..., tf.Tensor]],
    num_shards: int, dims: Sequence[int], dtype: tf.DType, keys: AllToAllKeys,
    timeout_s: float = 0.0, weights: Sequence[tf.Tensor | None] | None = None
) -> tuple[list[tf.Tensor], exchange.ExchangeBytes]:
  """Several tables' lookups of one step in one exchange: 4 collectives, not 4 per table.

    1. bucket    this worker's distinct keys of every table, sorted by owner;
                 per owner the count of keys and of row values (sum of dims)
    2. largest   all_reduce(max) of [largest key count M, largest value
                 count V] (one table: [M], V = M dim) -> the same on every
                 worker (all_to_all sends equal chunks)
    3. ids       all_to_all([W, T + M, C] int64): chunk j is the count of
                 each table's keys for owner j, then those keys table by table
                 (with their weight with admission: C = 2), padded
    4. lookup    each table's owner side reads its keys' rows
    5. rows      all_to_all([W, V] values): each chunk the rows of its keys
                 back to back, each row as wide as its table -> my keys' rows
    backward:    the gradient of an all_to_all is the all_to_all of the
                 gradient (its own transpose): each owner receives the
                 gradient of the rows it sent, per table.
  Tables of other dims share the chunks without padding rows to the widest;
  the chunks' padding is that of the largest per-owner count of all the
  tables' keys together, relatively less than one table's (docs/scaling.md).

  Args:
    unique_keys: Per table, [n_t] int64 distinct keys of this worker's batch.
    lookup_owned: Per table, its owner side (as exchange.exchange_lookup's).
    num_shards: W, the number of workers (replicas in sync).
    dims: Per table, its embedding dimension.
    dtype: The rows' dtype, every table's.
    keys: The AllToAllKeys the group's collectives take (e.g. its first
      table's; every worker must use the same one).
    timeout_s: Timeout of each collective in seconds (0: none).
    weights: None, or per table None or [n_t] int64 weights (admission
      sightings) routed with its keys; 8 more bytes per key of every table
      when any has them.

  Returns:
    (per table [n_t, dim_t] rows of its unique_keys, the group's
    ExchangeBytes: ids = W (T + M) 8 C + 4 k, T tables, C the int64
    columns (key, and weight with admission), k the all-reduced values (2
    with several tables); rows = gradients = W V itemsize).

  Raises:
    ValueError: called outside a replica context; lists of other lengths.
  """
  context = tf.distribute.get_replica_context()
  if context is None or tf.distribute.in_cross_replica_context():
    raise ValueError("exchange_lookup: call it inside strategy.run (a replica context)")
  num_tables = len(unique_keys)
  weights = [None] * num_tables if weights is None else list(weights)
  if not num_tables or len(lookup_owned) != num_tables or len(dims) != num_tables or len(
      weights) != num_tables:
    raise ValueError(f"exchange_lookup_group: {num_tables} tables' keys, {len(lookup_owned)} "
                     f"lookups, {len(dims)} dims, {len(weights)} weights")
  grouped, weighted = num_tables > 1, any(w is not None for w in weights)
  sizes = [tf.size(u, out_type=tf.int32) for u in unique_keys]
  all_keys = tf.concat(list(unique_keys), 0)
  n = tf.size(all_keys, out_type=tf.int32)
  table_of = tf.concat([tf.fill([size], t) for t, size in enumerate(sizes)], 0)  # [n] int32
  dim_table = tf.constant(list(dims), tf.int32)
  owners = sharding.owner(all_keys, num_shards)
  order = tf.argsort(owners, stable=True)
  sorted_owners = tf.gather(owners, order)
  send_counts = tf.math.bincount(owners, minlength=num_shards, maxlength=num_shards, dtype=tf.int32)
  group_key, (largest_key, ids_key, rows_key, grads_key) = keys.next()
  if grouped:
    send_values = tf.math.unsorted_segment_sum(tf.gather(dim_table, table_of), owners, num_shards)
    largest = _largest(tf.stack([tf.reduce_max(send_counts),
                                 tf.reduce_max(send_values)]), num_shards, group_key, largest_key,
                       timeout_s)
    chunk, width = tf.maximum(largest[0], 1), tf.maximum(largest[1], 1)  # M, V
  else:
    largest = _largest(
        tf.reduce_max(send_counts)[tf.newaxis], num_shards, group_key, largest_key, timeout_s)
    chunk = tf.maximum(largest[0], 1)
    width = chunk * dims[0]
  starts = tf.cumsum(send_counts, exclusive=True)
  slots = sorted_owners * chunk + tf.range(n) - tf.gather(starts, sorted_owners)  # [n]
  padded = num_shards * chunk
  columns = [tf.gather(all_keys, order)]
  if weighted:
    all_weights = tf.concat([
        tf.zeros_like(u, tf.int64) if w is None else tf.cast(w, tf.int64)
        for u, w in zip(unique_keys, weights)
    ], 0)
    columns.append(tf.gather(all_weights, order))
  width_c = len(columns)
  outgoing = tf.scatter_nd(slots[:, tf.newaxis], tf.stack(columns, axis=1),
                           tf.stack([padded, width_c]))
  # Each chunk led by its count of each table's keys, which follow in table order (the stable
  # sort by owner keeps the tables' order): [count, 0, ...] per table.
  by_table = (send_counts if not grouped else tf.math.bincount(owners * num_tables +
                                                               table_of, minlength=num_shards *
                                                               num_tables, maxlength=num_shards *
                                                               num_tables, dtype=tf.int32))
  table_counts = tf.reshape(tf.cast(by_table, tf.int64), [num_shards, num_tables, 1])
  headers = tf.pad(table_counts, [[0, 0], [0, 0], [0, width_c - 1]])
  outgoing = tf.concat([headers, tf.reshape(outgoing, [num_shards, chunk, width_c])],
                       axis=1)  # [W, T + M, C]
  incoming = _all_to_all(outgoing, num_shards, group_key, ids_key, None, timeout_s)
  received_counts = tf.cast(incoming[:, :num_tables, 0], tf.int32)  # [W, T]
  received = tf.reduce_sum(received_counts, axis=1)  # [W]
  valid = tf.reshape(tf.range(chunk)[tf.newaxis] < received[:, tf.newaxis], [-1])
  positions = tf.cast(tf.reshape(tf.where(valid), [-1]), tf.int32)  # In [0, W * M).
  asked = tf.gather(tf.reshape(incoming[:, num_tables:], tf.stack([padded, width_c])),
                    positions)  # [m, C]
  # Where each asked key's row starts in the replies: its source's chunk of V values, after the
  # rows of the keys before it in that chunk.
  if grouped:
    source = positions // chunk
    # A key's table: how many of its chunk's table boundaries lie at or before it.
    bounds = tf.gather(tf.cumsum(received_counts, axis=1), source)  # [m, T]
    asked_tables = tf.reduce_sum(
        tf.cast((positions - source * chunk)[:, tf.newaxis] >= bounds, tf.int32), axis=1)
    before = tf.cumsum(tf.gather(dim_table, asked_tables), exclusive=True)
    first = tf.math.unsorted_segment_min(before, source, num_shards)
    reply_at = source * width + before - tf.gather(first, source)
  else:
    reply_at = positions * dims[0]
  indices, values = [], []
  for t in range(num_tables):
    mine = (slice(None) if not grouped else tf.reshape(tf.where(tf.equal(asked_tables, t)), [-1]))
    pick = (lambda x: x) if not grouped else (lambda x, mine=mine: tf.gather(x, mine))
    asked_keys = pick(asked[:, 0])
    # One table after the other: a table looked up twice (features sharing it) inserts its new
    # keys in the same order every run, so they get the same rows.
    with tf.control_dependencies(values[-1:]):
      if weights[t] is None:
        rows = lookup_owned[t](asked_keys)
      else:
        rows = lookup_owned[t](asked_keys, pick(asked[:, width_c - 1]))
    indices.append(tf.reshape(pick(reply_at)[:, tf.newaxis] + tf.range(dims[t]), [-1]))
    values.append(tf.reshape(rows, [-1]))
  replies = tf.scatter_nd(
      tf.concat(indices, 0)[:, tf.newaxis], tf.concat(values, 0), (num_shards * width)[tf.newaxis])
  answered = tf.reshape(
      _all_to_all(tf.reshape(replies, tf.stack([num_shards, width])), num_shards, group_key,
                  rows_key, grads_key, timeout_s), [-1])
  # Where each of my keys' rows starts in the answers, in all_keys' order.
  if grouped:
    sorted_dims = tf.gather(dim_table, tf.gather(table_of, order))
    value_starts = tf.cumsum(send_values, exclusive=True)
    at_sorted = (sorted_owners * width + tf.cumsum(sorted_dims, exclusive=True) -
                 tf.gather(value_starts, sorted_owners))
  else:
    at_sorted = slots * dims[0]
  answer_at = tf.scatter_nd(order[:, tf.newaxis], at_sorted, n[tf.newaxis])
  out, begin = [], tf.constant(0, tf.int32)
  for t in range(num_tables):
    at = answer_at[begin:begin + sizes[t]]
    out.append(tf.gather(answered, at[:, tf.newaxis] + tf.range(dims[t])))  # [n_t, dim_t]
    begin += sizes[t]
  padded64 = tf.cast(padded, tf.int64)
  row_bytes = tf.cast(num_shards * width, tf.int64) * dtype.size
  return out, exchange.ExchangeBytes(
      ids=(padded64 + num_shards * num_tables) * exchange.KEY_BYTES * width_c +
      exchange.COUNT_BYTES * (2 if grouped else 1), rows=row_bytes, gradients=row_bytes)
