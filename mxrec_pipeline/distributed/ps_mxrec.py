"""mx_rec's create_table / sparse_lookup / hash-optimizer step on parameter-server tables.

The mxRec quick start's calls (mx_rec.core.embedding.create_table,
sparse_lookup, the hash optimizer's apply_gradients) with the table sharded by
key over the ps tasks of a ParameterServerStrategy: `create_table` builds a
distributed/ps_table.PSShardedTable, `sparse_lookup` looks tensor ids up in it
(inserted in the scheduled step, on their owner ps), `apply_gradients` applies
the hash optimizer's row update on each owner ps. Same arguments as
core/embedding.py's functions (which stay unaware of sharding) plus the strategy.

What differs from one process: FeatureSpecs with get_asc_insert_func, and
modify_graph=True, insert ids in tf.data, which cannot reach the ps key
indexes, so both are refused naming the table (give sparse_lookup the raw ids);
the hash optimizer is given at create_table (`optimizer_list`), its slots
created beside each shard; admission and eviction are create_table's
(access_threshold, eviction_threshold_s), not sparse_lookup's
access_and_evict_config; tiers (mxRec's DDR/SSD modes) are per shard
(distributed/ps_tiers.py); no dynamic expansion. Example: `create_table`.
See docs/distributed.md#the-mx_rec-and-tpuembedding-apis-on-parameter-servers.
"""

from __future__ import annotations

import numbers
from typing import Callable, Sequence

import tensorflow as tf

from mxrec_pipeline.core import tiers as tiers_lib
from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.optimizers.base import HashOptimizer
from mxrec_pipeline.util import initialize


def create_table(strategy: tf.distribute.Strategy | None, key_dtype: tf.DType,
                 dim: int | tf.TensorShape, name: str, emb_initializer: Callable,
                 device_vocabulary_size: int = 1, host_vocabulary_size: int = 0,
                 ssd_vocabulary_size: int = 0, ssd_data_path=(), optimizer_list=None,
                 init_param: float = 1.0, value_dtype: tf.DType = tf.float32,
                 access_threshold: int | None = None, eviction_threshold_s: int | None = None,
                 cache_policy: str = "lru") -> ps_table.PSShardedTable:
  """core/embedding.create_table (mx_rec's), sharded by key over the ps tasks.

  Call it on the coordinator after init(), outside `strategy.scope()`.

  Args:
    strategy: The ParameterServerStrategy (shard i on ps task i), or None:
      one shard on this process's CPU (the single-process PS table).
    key_dtype: tf.int64, tf.int32 or tf.string (fingerprinted as the core does).
    dim: Embedding dimension, a positive int (or a rank-1 TensorShape).
    name: Table name, unique among this run's tables (create_table's and
      these).
    emb_initializer: Called as `emb_initializer(shape=[device_vocabulary_size,
      dim], dtype=value_dtype)` once per shard: a random one draws other
      initial rows than one process would (a constant one gives the same).
    device_vocabulary_size: Rows of each shard: the most distinct keys one ps
      owns (a full shard fails naming the table); with tiers, each shard's
      device cache.
    host_vocabulary_size, ssd_vocabulary_size: Host-memory and SSD rows of
      each shard (mxRec's DDR/SSD modes, core/tiers.py): > 0 host rows make
      the table tiered, each shard keeping its three tiers on its ps
      (distributed/ps_tiers.py). The cache must hold the distinct ids of the
      steps in flight on a shard (about one batch's per worker).
    ssd_data_path: Directories of the SSD files (each shard's under
      `<path>/shard_<i>`); empty: the current directory. They must exist
      and be writable.
    optimizer_list: [the hash optimizer] that trains the table (exactly one,
      of mxrec_pipeline.optimizers: lazy Adam, Adagrad, SGD, FTRL); its slots
      are created beside each shard.
    init_param: Factor on the initial values (mxRec's init_param).
    value_dtype: Floating dtype of the rows.
    access_threshold, eviction_threshold_s: Admission and eviction on the
      owner ps (ps_table.PSShardedTable's; mxRec's access_threshold and
      eviction_threshold); None: off.
    cache_policy: Tiered tables: "lru" or "lfu" (core/embedding.create_table's).

  Returns:
    The PSShardedTable, also registered under `name` in the run
    (`ps_tables`); look it up with `sparse_lookup`, save it with
    distributed/ps_checkpoint.py.

  Raises:
    RuntimeError: init() was not called.
    ValueError: naming the table: a name of a table of this run, bad tier
      arguments (core/tiers.check_tier_args: e.g. an SSD tier without host
      rows, a missing SSD directory), init(use_dynamic_expansion=True), an
      optimizer_list that is not one hash
      optimizer, or what PSShardedTable refuses (inside strategy.scope(), a
      strategy that is not a ParameterServerStrategy, bad sizes or dtypes).

  Example (the chief is the coordinator):
    >>> init()
    >>> optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.01)
    >>> table = ps_mxrec.create_table(strategy, key_dtype=tf.int64, dim=8, name="item",
    ...                               emb_initializer=tf.keras.initializers.Zeros(),
    ...                               device_vocabulary_size=100_000, optimizer_list=[optimizer])
    >>> @tf.function
    ... def train_step(ids, labels):
    ...   with tf.GradientTape() as tape:
    ...     loss = loss_fn(ps_mxrec.sparse_lookup(table, ids, send_count=1024), labels)
    ...   grads = tape.gradient(loss, table.shard_variables)
    ...   ps_mxrec.apply_gradients(optimizer, [(grads, table)])
    ...   return loss
    >>> loss = coordinator.schedule(train_step, args=(ids, labels))
  """
  run = initialize.get_config_initializer()
  where = f"ps_mxrec.create_table('{name}')"
  if name in run.tables or name in run.ps_tables:
    raise ValueError(f"{where}: a table named '{name}' already exists in this run")
  tier_config = tiers_lib.check_tier_args(name, device_vocabulary_size, host_vocabulary_size,
                                          ssd_vocabulary_size, ssd_data_path, cache_policy,
                                          tf.as_dtype(value_dtype))
  if run.config.use_dynamic_expansion:
    raise ValueError(f"{where}: init(use_dynamic_expansion=True) tables are not sharded over ps "
                     "tasks; size the shards with device_vocabulary_size")
  optimizers = list(optimizer_list or [])
  if len(optimizers) != 1 or not isinstance(optimizers[0], HashOptimizer):
    raise ValueError(f"{where}: `optimizer_list` must be [one hash optimizer] (e.g. "
                     "lazy_adam.create_hash_optimizer(...)): its slots are created beside each "
                     f"shard on its ps; got {optimizer_list!r}")
  if isinstance(dim, tf.TensorShape):
    dim = dim.as_list()[0] if dim.rank == 1 else None
  if not isinstance(init_param, numbers.Real):
    raise ValueError(f"{where}: `init_param` must be a number, got {init_param!r}")
  initializer = emb_initializer
  if init_param != 1.0:

    def initializer(shape, dtype):
      return tf.convert_to_tensor(emb_initializer(shape=shape, dtype=dtype), dtype) * tf.cast(
          init_param, dtype)

  try:
    table = ps_table.PSShardedTable(strategy, name=name, dim=dim,
                                    device_vocabulary_size=device_vocabulary_size,
                                    optimizer=optimizers[0], emb_initializer=initializer,
                                    key_dtype=key_dtype, value_dtype=tf.as_dtype(value_dtype),
                                    access_threshold=access_threshold,
                                    eviction_threshold_s=eviction_threshold_s, tiers=tier_config)
  except TypeError as e:  # tf.as_dtype of a bad dtype.
    raise ValueError(f"{where}: {e}") from None
  # Two tables of one name would share (and the second would empty) the key index on each ps.
  run.ps_tables[name] = table
  return table


def sparse_lookup(hashtable: ps_table.PSShardedTable, ids, send_count: int | None = None,
                  dim: int | None = None, is_train: bool = True, name: str | None = None,
                  modify_graph: bool = False, batch: dict | None = None,
                  access_and_evict_config: dict | None = None, is_grad: bool = True,
                  serving_default_value=None, timestamp: tf.Tensor | None = None) -> tf.Tensor:
  """core/embedding.sparse_lookup (mx_rec's) on a PS table; call it in the scheduled step.

  Args:
    hashtable: A table from `create_table` above.
    ids: [any shape] ids of the table's key_dtype (a tensor; FeatureSpecs
      are refused, see the module docstring).
    send_count: The most distinct ids of this table per batch; a batch with
      more fails naming the table. Required with init(use_dynamic=False).
    dim: None or the table's dim.
    is_train: True inserts unseen ids on their owner ps; False reads
      `serving_default_value` for them and inserts nothing.
    name: Name scope of the lookup.
    modify_graph: Must be False (graph modification inserts in tf.data).
    batch: Unused with tensor ids (mxRec's argument, accepted for FeatureSpecs).
    access_and_evict_config: Must be None: give access_threshold and
      eviction_threshold_s to `create_table`.
    is_grad: False stops gradients to the table.
    serving_default_value: Scalar or [dim] row read by unseen ids in
      evaluation and by ids not admitted yet; zeros by default.
    timestamp: int64 scalar, the batch's time in seconds; required in
      training when the table has eviction_threshold_s.

  Returns:
    [*ids.shape, dim] rows of the table's value dtype, differentiable w.r.t.
    `hashtable.shard_variables` (IndexedSlices per shard).

  Raises:
    RuntimeError: init() was not called.
    ValueError: naming the table: not a PS table, a FeatureSpec,
      modify_graph=True, access_and_evict_config, ids of another dtype, a bad
      send_count or dim.
    tf.errors.InvalidArgumentError (at run time): more distinct ids than
      send_count.
  """
  run = initialize.get_config_initializer()
  if not isinstance(hashtable, ps_table.PSShardedTable):
    raise ValueError(f"ps_mxrec.sparse_lookup: `hashtable` must come from ps_mxrec.create_table, "
                     f"got {hashtable!r} (core/embedding.sparse_lookup looks up create_table's)")
  table = hashtable.table_name
  where = f"ps_mxrec.sparse_lookup('{table}')"
  if isinstance(ids, fs.FeatureSpec) or modify_graph:
    what = f"FeatureSpec '{ids.name}'" if isinstance(ids, fs.FeatureSpec) else "modify_graph=True"
    raise ValueError(
        f"{where}: {what} needs ids inserted in tf.data (get_asc_insert_func / graph "
        "modification) into a key index of the dataset's process, which cannot reach the table's "
        "key indexes on the ps tasks; give sparse_lookup the raw ids tensor (e.g. "
        "batch[feature_name]): they are inserted on their owner ps in the step")
  if access_and_evict_config is not None:
    raise ValueError(f"{where}: give access_threshold and eviction_threshold_s to "
                     "ps_mxrec.create_table (admission runs on the owner ps); "
                     "access_and_evict_config is not read here")
  del batch  # Only FeatureSpecs read it.
  ids = tf.convert_to_tensor(ids)
  if ids.dtype != hashtable.key_dtype:
    raise ValueError(f"{where}: ids must be {hashtable.key_dtype.name} (the table's key_dtype), "
                     f"got {ids.dtype.name}")
  if send_count is not None and (isinstance(send_count, bool) or
                                 not isinstance(send_count, numbers.Integral) or send_count < 1):
    raise ValueError(f"{where}: `send_count` must be a positive int, got {send_count!r}")
  if send_count is None and not run.config.use_dynamic:
    raise ValueError(f"{where}: init(use_dynamic=False) needs `send_count`")
  if dim is not None and dim != hashtable.dim:
    raise ValueError(f"{where}: `dim` must be None or the table's dim {hashtable.dim}, "
                     f"got {dim!r}")
  with tf.name_scope(name or f"{table}_lookup"):
    deps = []
    if send_count is not None:
      distinct = tf.size(tf.unique(tf.reshape(ids, [-1]))[0], out_type=tf.int64)
      deps.append(
          tf.debugging.assert_less_equal(
              distinct, tf.constant(send_count, tf.int64),
              message=f"table '{table}': more distinct ids in one batch than "
              f"send_count={send_count}"))
    with tf.control_dependencies(deps):
      out = hashtable.lookup(
          ids, training=is_train,
          default_value=(0.0 if serving_default_value is None else serving_default_value),
          timestamp=timestamp)
  return out if is_grad else tf.stop_gradient(out)


def apply_gradients(optimizer: HashOptimizer,
                    grads_and_tables: Sequence[tuple[Sequence, ps_table.PSShardedTable]],
                    name: str | None = None) -> tf.Operation:
  """The hash optimizer's apply_gradients for PS tables: each shard's rows updated on its ps.

  As the multi-worker path's `sharded_table.apply_gradients(optimizer,
  [(grad, table)])`: the optimizer's row math (`HashOptimizer.apply_sparse`: lazy Adam,
  Adagrad, SGD, FTRL) applied to each table's shards by
  PSShardedTable.apply_gradients, with the table's own step count t.

  Args:
    optimizer: The hash optimizer the tables were created with (create_table's
      optimizer_list).
    grads_and_tables: Pairs ([num_shards] gradients of
      `table.shard_variables` from tape.gradient, table).
    name: Name scope.

  Returns:
    The op of the updates.

  Raises:
    ValueError: a table created with another optimizer, or not a PS table
      (naming it).
  """
  updates = []
  with tf.name_scope(name or getattr(optimizer, "optimizer_name", "apply_gradients")):
    for grads, table in grads_and_tables:
      if not isinstance(table, ps_table.PSShardedTable):
        raise ValueError(f"ps_mxrec.apply_gradients: {table!r} is not a table of "
                         "ps_mxrec.create_table; give dense variables to a dense optimizer")
      if table.optimizer is not optimizer:
        raise ValueError(f"ps_mxrec.apply_gradients: table '{table.table_name}' was created "
                         f"with optimizer {table.optimizer.optimizer_name!r} (its slots sit "
                         "beside its shards), not this one")
      updates.append(table.apply_gradients(list(grads)))
  return tf.group(updates)
