"""A table sharded row-wise by key owner over the workers of a MultiWorkerMirroredStrategy.

`ShardedTable`: each worker holds one shard, an ordinary single-process table
of the core (core/embedding.create_table) created outside the strategy's
scope, so its rows are this worker's own variable, neither mirrored nor
all-reduced. A lookup routes the batch's ids to their owners and the rows
back (distributed/exchange.py, or distributed/all_to_all.py with
routing="all_to_all"); the gradient comes back to the owners as IndexedSlices
on their shard variable, and `apply_gradients` hands it to a hash optimizer
(mxrec_pipeline.optimizers) with no cross-worker aggregation: the exchange
already brought every worker's gradient of the owner's rows. Dense variables
stay mirrored and all-reduced as MultiWorkerMirroredStrategy does.

TorchRec's ShardedEmbeddingCollection (row-wise) and TPUEmbedding's
mod-sharding work the same way. A custom training loop:
docs/distributed.md#many-workers-multiworkermirroredstrategy-tables-sharded-by-key.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.core import lookup
from mxrec_pipeline.distributed import all_to_all
from mxrec_pipeline.distributed import exchange
from mxrec_pipeline.util import initialize

# What must agree across workers, in the order compared.
CONFIG_FIELDS = ("name", "dim", "device_vocabulary_size", "key_dtype", "value_dtype", "num_shards",
                 "access_threshold", "eviction_threshold_s", "routing")
# How a lookup reaches the owners: distributed/exchange.py (all-gathers, the
# public ReplicaContext API) or distributed/all_to_all.py (all-to-alls).
ROUTINGS = ("all_gather", "all_to_all")
AUTO = "auto"  # choose_routing picks one of ROUTINGS.


def choose_routing(routing: str, num_shards: int, table_index: int) -> str:
  """The routing a table uses: `routing`, or for "auto" the one that moves fewer bytes.

  "auto" -> "all_to_all" on two or more shards for the run's first
  all_to_all.MAX_TABLES tables, else "all_gather". A worker receives about
  W n (8 + 2 d s) bytes per step with all-gathers and n (8 + 2 d s) times
  the all-to-all's chunk padding (1.0-1.2 at W <= 8, about 2 at W = 64)
  with all-to-alls, so the all-to-all moves fewer bytes at every W >= 2
  (docs/scaling.md); it was also faster on the measured 2-worker job. One
  shard exchanges nothing either way.

  Args:
    routing: "all_gather", "all_to_all" or "auto".
    num_shards: Workers the table is sharded over.
    table_index: The table's creation index in the run.

  Raises:
    ValueError: another routing, naming the choices.
  """
  if routing == AUTO:
    return "all_to_all" if num_shards > 1 and table_index < all_to_all.MAX_TABLES else "all_gather"
  if routing not in ROUTINGS:
    raise ValueError(f"`routing` must be one of {[*ROUTINGS, AUTO]}, got {routing!r}")
  return routing


def shard_of_worker(strategy: tf.distribute.Strategy) -> tuple[int, int]:
  """(shard_id, num_shards) of this process: its replica id and the replicas in sync.

  MultiWorkerMirroredStrategy numbers replicas chief first, then workers by
  task index; with one replica per worker that is the shard. A strategy with
  one replica (any other, or no cluster) gives (0, 1).

  Raises:
    ValueError: a worker with several local replicas (e.g. several GPUs):
      a shard per replica of one host is not supported yet.
  """
  num_shards = strategy.num_replicas_in_sync
  if num_shards == 1:
    return 0, 1
  if len(strategy.extended.worker_devices) != 1:
    raise ValueError(
        f"ShardedTable: one replica per worker is supported, this worker has "
        f"{len(strategy.extended.worker_devices)} ({strategy.extended.worker_devices})")
  resolver = strategy.cluster_resolver
  cluster = resolver.cluster_spec().as_dict()
  task_id = int(resolver.task_id)
  has_chief = "chief" in cluster
  if resolver.task_type == "chief":
    return 0, num_shards
  return task_id + (1 if has_chief else 0), num_shards


class ShardedTable(tf.Module):
  """A table whose rows are split over the workers by `sharding.owner(key)`.

  Create it on every worker, in the same order, with the same arguments,
  OUTSIDE `strategy.scope()`; look it up inside `strategy.run`.

  Args:
    strategy: The MultiWorkerMirroredStrategy (one replica per worker); any
      single-replica strategy gives one shard holding every key.
    name: Table name, as create_table's (the shard is registered under it).
    dim: Embedding dimension.
    device_vocabulary_size: Rows of each worker's shard (as create_table's):
      the most distinct keys a worker owns; a full shard fails naming the
      table.
    emb_initializer: As create_table's; rows are drawn per shard, so a
      random initializer gives other initial rows than one process would
      (a constant one, or a restored checkpoint, gives the same).
    key_dtype: tf.int64, tf.int32 or tf.string (fingerprinted as the core
      does).
    value_dtype: Floating dtype of the rows.
    init_param: Factor on the initial values (create_table's).
    access_threshold: Admission (core/admission.py, mxRec's
      access_threshold): sightings a key needs, over all workers' batches,
      before its owner gives it a row; None admits every key at once. Each
      worker sends its keys' occurrence counts with them; the owner counts
      them as one process counts the global batch.
    eviction_threshold_s: Eviction (core/admission.py): `evict` removes keys
      unseen for longer than this many seconds of the batches' timestamps
      (`lookup(..., timestamp=)`); None never evicts.
    routing: "all_gather" (distributed/exchange.py: public ReplicaContext
      all-gathers; each worker receives every worker's ids and rows),
      "all_to_all" (distributed/all_to_all.py: each worker receives only its
      own, about W times fewer bytes) or "auto" (`choose_routing`: all_to_all
      on 2+ workers for the run's first 64 tables).
    collective_timeout_s: Timeout of the all-to-alls in seconds (0: none);
      the all-gathers take the strategy's CommunicationOptions timeout.

  Attributes:
    routing: The routing used ("auto" resolved).
    shard: This worker's SparseEmbedding.
    shard_id, num_shards: This worker's shard and the number of shards.
    bytes_exchanged: [3] int64 variable, this worker's ExchangeBytes (ids,
      rows, gradients) summed over lookups.

  Raises:
    ValueError: created inside a strategy scope; arguments create_table
      refuses; an unknown routing; all_to_all routing for a table past the
      run's first all_to_all.MAX_TABLES; a config that differs on another
      worker (naming the table, the field and both values).
  """

  def __init__(self, strategy: tf.distribute.Strategy, *, name: str, dim: int,
               device_vocabulary_size: int, emb_initializer: Callable,
               key_dtype: tf.DType = tf.int64, value_dtype: tf.DType = tf.float32,
               init_param: float = 1.0, access_threshold: int | None = None,
               eviction_threshold_s: int | None = None, routing: str = "all_gather",
               collective_timeout_s: float = 0.0):
    super().__init__(name=None)
    if tf.distribute.has_strategy():
      raise ValueError(f"ShardedTable('{name}'): create it outside strategy.scope(): its rows are "
                       "this worker's shard, not a mirrored variable")
    self.shard_id, self.num_shards = shard_of_worker(strategy)
    # The table's creation index, the same on every worker (the config check
    # below refuses another order): the all-to-alls' instance keys use it.
    table_index = len(initialize.get_config_initializer().tables)
    try:
      self.routing = choose_routing(routing, self.num_shards, table_index)
    except ValueError as e:
      raise ValueError(f"ShardedTable('{name}'): {e}") from None
    self._collective_timeout_s = float(collective_timeout_s)
    self._all_to_all_keys = (all_to_all.AllToAllKeys(table_index)
                             if self.routing == "all_to_all" else None)
    self._strategy = strategy
    self.shard = embedding.create_table(key_dtype=key_dtype, dim=dim, name=name,
                                        emb_initializer=emb_initializer,
                                        device_vocabulary_size=device_vocabulary_size,
                                        init_param=init_param, value_dtype=value_dtype).as_shard(
                                            self.shard_id, self.num_shards)
    if access_threshold is not None or eviction_threshold_s is not None:
      admission.configure(name, admission.AdmitEvictConfig(access_threshold, eviction_threshold_s),
                          f"ShardedTable('{name}')")
    self.bytes_exchanged = tf.Variable(tf.zeros([3], tf.int64), trainable=False,
                                       name=f"{name}/bytes_exchanged")
    check_same_config(strategy, self.config())

  @property
  def table_name(self) -> str:
    return self.shard.table_name

  @property
  def dim(self) -> int:
    return self.shard.dim

  @property
  def key_dtype(self) -> tf.DType:
    return self.shard.key_dtype

  @property
  def device_vocabulary_size(self) -> int:
    """Rows of each worker's shard."""
    return self.shard.device_vocabulary_size

  def local_shards(self) -> list[embedding.SparseEmbedding]:
    """[shard]: this worker's core table (core/table_protocol.py)."""
    return [self.shard]

  def stats(self) -> dict[str, int]:
    """core/table_protocol.STAT_NAMES -> this worker's shard's key-index counters."""
    return self.shard.stats()

  @property
  def variable(self) -> tf.Variable:
    """[device_vocabulary_size, dim] rows of this worker's shard (a plain, per-worker variable)."""
    return self.shard.variable

  def config(self) -> dict:
    """The CONFIG_FIELDS of this table on this worker."""
    return {
        "name": self.shard.table_name,
        "dim": self.shard.dim,
        "device_vocabulary_size": self.shard.device_vocabulary_size,
        "key_dtype": self.shard.key_dtype.name,
        "value_dtype": self.shard.variable.dtype.name,
        "num_shards": self.num_shards,
        "access_threshold": self.access_threshold,
        "eviction_threshold_s": self.eviction_threshold_s,
        "routing": self.routing,
    }

  @property
  def access_threshold(self) -> int:
    """Sightings a key needs before it gets a row (0: no admission)."""
    config = admission.config_of(self.table_name)
    return 0 if config is None else (config.access_threshold or 0)

  @property
  def eviction_threshold_s(self) -> int:
    """Idle seconds after which `evict` removes a key (-1: no eviction)."""
    config = admission.config_of(self.table_name)
    if config is None or config.eviction_threshold_s is None:
      return -1
    return config.eviction_threshold_s

  def evict(self, optimizers=None) -> list[tf.Tensor]:
    """Evicts this shard's idle keys (core/admission.evict); every worker calls it.

    No collective: each owner knows its keys' last-seen times, the global
    batches' timestamps (see `lookup`).

    Args:
      optimizers: The hash optimizers whose slots of the table to reset;
        None: every hash optimizer of the run.

    Returns:
      [freed]: [num_evicted] int64 freed rows of this worker's shard.

    Raises:
      ValueError: the table has no eviction_threshold_s.
    """
    if self.eviction_threshold_s < 0:
      raise ValueError(f"ShardedTable('{self.table_name}'): evict needs eviction_threshold_s")
    return self.shard.evict(optimizers)

  def lookup(self, ids, training: bool = True, default_value=None,
             timestamp: tf.Tensor | None = None) -> tf.Tensor:
    """Every id's row, read from its owner's shard. Call inside `strategy.run`.

    Args:
      ids: [any shape] tensor of the table's key_dtype, this worker's ids.
      training: True inserts keys absent from their owner's shard (a full
        shard fails naming the table); False reads `default_value` for them.
      default_value: Scalar or [dim] row of absent keys when not training,
        and in training of keys not admitted yet (zeros by default).
      timestamp: int64 scalar, this worker's batch time in seconds
        (core/admission.batch_timestamp of its timestamps); required in
        training with eviction_threshold_s. The owners record the largest
        over the workers as the keys' last-seen time, as one process does
        for the global batch.

    Returns:
      [*ids.shape, dim] of the rows' dtype; differentiable with respect to
      `variable` (IndexedSlices on the owner's rows).

    Raises:
      ValueError: ids of another dtype than the table's key_dtype, a
        training lookup without `timestamp` on a table with eviction (both
        naming the table), a call outside `strategy.run`.
      tf.errors.ResourceExhaustedError (at run time): an owner's shard is
        full (naming the table).
    """
    (out,) = lookup_tables([(self, ids)], training, default_value, timestamp)
    return out

  def _request(self, ids, training: bool, default_value, batch_time) -> _Request:
    """This table's part of a step's lookups: its distinct keys and owner side (see lookup)."""
    ids = tf.convert_to_tensor(ids)
    if ids.dtype != self.shard.key_dtype:
      raise ValueError(f"ShardedTable('{self.table_name}'): ids must be "
                       f"{self.shard.key_dtype.name}, got {ids.dtype.name}")
    keys = key_index_lib.to_keys(ids, f"table '{self.table_name}'")
    unique_keys, restore, occurrences = tf.unique_with_counts(tf.reshape(keys, [-1]),
                                                              out_idx=tf.int32)
    admitting = training and self.access_threshold > 1
    container = initialize.get_config_initializer().container
    evicting = training and self.eviction_threshold_s >= 0

    def lookup_owned(owned_keys, weights=None):
      rows, restore_owned = admission.insert(container, self.table_name, owned_keys, training,
                                             counts=weights,
                                             timestamp=batch_time if evicting else None)
      return lookup.gather_per_id(self.shard.variable, rows, restore_owned, training=training,
                                  default_value=default_value, admitting=admitting)

    return _Request(self, unique_keys, tf.reshape(restore, tf.shape(ids)), lookup_owned,
                    tf.cast(occurrences, tf.int64) if admitting else None)

  def exchange_stats(self) -> dict[str, int]:
    """Bytes this worker received so far from the table's exchanges: ids, rows, gradients."""
    values = self.bytes_exchanged.numpy()
    return {"ids": int(values[0]), "rows": int(values[1]), "gradients": int(values[2])}


@dataclasses.dataclass(frozen=True)
class _Request:
  """One table's lookup in a step: its distinct keys, where each id reads, its owner side."""

  table: ShardedTable
  unique_keys: tf.Tensor  # [n] int64
  restore: tf.Tensor  # [*ids.shape] int32 into unique_keys
  lookup_owned: Callable[..., tf.Tensor]
  weights: tf.Tensor | None  # [n] int64 sightings, with admission


def lookup_tables(lookups: Sequence[tuple[ShardedTable, object]], training: bool = True,
                  default_value=None, timestamp: tf.Tensor | None = None) -> list[tf.Tensor]:
  """Several tables' lookups of one step; those routed all-to-all share one exchange.

  As `ShardedTable.lookup` for each (table, ids) pair, with the same
  arguments, but the pairs whose table has routing "all_to_all" (and one rows
  dtype) go through one all_to_all.exchange_lookup_group: 4 collectives for
  the step instead of 4 per table, and the chunks' padding of all their keys
  together (docs/scaling.md). A table may appear in several pairs (features
  sharing it). Pairs routed by all-gathers run their own exchanges. The
  group's bytes are counted in its first table's `bytes_exchanged`. Call
  inside `strategy.run`, on every worker with the same tables in the same
  order.

  Args:
    lookups: (ShardedTable, ids) pairs; ids as `ShardedTable.lookup` takes.
    training, default_value, timestamp: As `ShardedTable.lookup`'s, for
      every pair (the batch time, when a table evicts, is all-gathered once).

  Returns:
    Per pair, [*ids.shape, dim] rows, as `ShardedTable.lookup` returns.

  Raises:
    ValueError: as `ShardedTable.lookup` (naming the table).
  """
  evicting = [i for i, (t, _) in enumerate(lookups) if t.eviction_threshold_s >= 0]
  counted = [tf.zeros([3], tf.int64) for _ in lookups]
  batch_time = None
  if training and evicting:
    first_evicting = lookups[evicting[0]][0]
    if timestamp is None:
      raise ValueError(f"ShardedTable('{first_evicting.table_name}'): eviction_threshold_s needs "
                       "the batch's `timestamp` in training lookups")
    batch_time = exchange.max_over_workers(tf.cast(timestamp, tf.int64))
    # The timestamps' all-gather, counted on the first evicting table.
    counted[evicting[0]] += tf.constant([exchange.KEY_BYTES * first_evicting.num_shards, 0, 0],
                                        tf.int64)
  requests = [table._request(ids, training, default_value, batch_time) for table, ids in lookups]  # pylint: disable=protected-access
  rows = [None] * len(requests)
  groups = {}  # rows dtype -> indices of the all-to-all pairs
  for i, r in enumerate(requests):
    if r.table.routing == "all_to_all":
      groups.setdefault(r.table.variable.dtype, []).append(i)
    else:
      rows[i], by_pair = exchange.exchange_lookup(r.unique_keys, r.lookup_owned, r.table.num_shards,
                                                  r.table.dim, r.table.variable.dtype, r.weights)
      counted[i] += by_pair.as_vector()
  for dtype, members in groups.items():
    first = requests[members[0]].table
    group_rows, by_group = all_to_all.exchange_lookup_group(
        [requests[i].unique_keys for i in members],
        [requests[i].lookup_owned for i in members],
        first.num_shards,
        [requests[i].table.dim for i in members],
        dtype,
        first._all_to_all_keys,
        first._collective_timeout_s,  # pylint: disable=protected-access
        [requests[i].weights for i in members])
    for i, unique_rows in zip(members, group_rows):
      rows[i] = unique_rows
    counted[members[0]] += by_group.as_vector()
  updates = []
  for r, c in zip(requests, counted):
    updates.append(r.table.bytes_exchanged.assign_add(c))
  with tf.control_dependencies(updates):
    return [lookup.per_id(unique_rows, r.restore) for unique_rows, r in zip(rows, requests)]


def apply_gradients(optimizer, grads_and_tables: Sequence[tuple[object, ShardedTable]]):
  """Applies the shards' gradients with a hash optimizer, each worker to its own shard.

  Call it after `strategy.run` (which returns each table's gradient), outside
  `strategy.scope()`: the gradients are already complete per owner, so no
  cross-worker aggregation must happen (the hash optimizer would all-reduce
  them in a replica context). With one replica per worker, `strategy.run`'s
  results are this worker's values.

  Args:
    optimizer: A HashOptimizer (lazy Adam, Adagrad, SGD, FTRL) created outside
      the strategy scope.
    grads_and_tables: Pairs (IndexedSlices gradient of `table.variable`, or
      None; ShardedTable).

  Returns:
    The optimizer's update op (graph) or None (eager).

  Raises:
    ValueError: called inside a strategy scope or replica context.
  """
  if tf.distribute.has_strategy():
    raise ValueError("apply_gradients of sharded tables: call it after strategy.run and outside "
                     "strategy.scope(), so that no strategy aggregates the shards' gradients")
  pairs = []
  for grad, table in grads_and_tables:
    if isinstance(grad, tf.distribute.DistributedValues):
      (grad,) = grad.values  # One replica per worker.
    pairs.append((grad, table.variable))
  return optimizer.apply_gradients(pairs)


def _config_vector(config: dict) -> np.ndarray:
  """The config as int64s: a fingerprint of the name, then the other fields."""
  digest = hashlib.sha256(config["name"].encode()).digest()
  name_code = int.from_bytes(digest[:8], "little", signed=True)
  dtypes = [tf.as_dtype(config[f]).as_datatype_enum for f in ("key_dtype", "value_dtype")]
  return np.array([
      name_code, config["dim"], config["device_vocabulary_size"], *dtypes, config["num_shards"],
      config["access_threshold"], config["eviction_threshold_s"],
      ROUTINGS.index(config["routing"])
  ], np.int64)


def check_same_config(strategy: tf.distribute.Strategy, config: dict) -> None:
  """Refuses a table whose config differs between workers.

  All-gathers CONFIG_FIELDS over the strategy's collectives (every worker
  calls this for each table, in creation order). A worker that never reaches
  it makes the others fail at the collective timeout.

  Raises:
    ValueError: naming the table, the first differing field, and the value
      of each shard.
  """
  if strategy.num_replicas_in_sync == 1:
    return
  vector = tf.constant(_config_vector(config))

  def gather():
    context = tf.distribute.get_replica_context()
    # The replica id, which the exchange uses as the shard: it must be the
    # shard_of_worker that names this worker's checkpoint files.
    replica = tf.cast(tf.reshape(context.replica_id_in_sync_group, [1]), tf.int64)
    return context.all_gather(tf.concat([vector, replica], 0)[tf.newaxis], axis=0)

  (gathered,) = strategy.experimental_local_results(strategy.run(gather))
  gathered = gathered.numpy()
  shard_id = shard_of_worker(strategy)[0]
  if gathered[shard_id, -1] != shard_id:
    raise ValueError(f"ShardedTable('{config['name']}'): this worker is replica "
                     f"{gathered[shard_id, -1]} of the strategy but shard {shard_id} by its "
                     "cluster spec; one replica per worker, chief first, is supported")
  for i, field in enumerate(CONFIG_FIELDS):
    values = gathered[:, i]
    if (values != values[0]).any():
      shown = [
          int(v) if field not in ("key_dtype", "value_dtype") else tf.as_dtype(int(v)).name
          for v in values
      ]
      if field == "name":
        shown = "a different table name"
      elif field == "routing":
        shown = [ROUTINGS[int(v)] for v in values]
      raise ValueError(
          f"ShardedTable('{config['name']}'): the workers disagree on `{field}`: "
          f"{shown} by shard (this worker is shard {shard_id}); create the same tables with "
          "the same arguments, in the same order, on every worker")
