"""create_table and sparse_lookup, as in mx_rec.core.embedding.

A table is a [device_vocabulary_size, dim] variable on the device plus a native
key index on the host that maps raw ids to its rows. A lookup is two gathers:
rows of the batch's distinct ids from the variable, then those back to every
id's position. Its gradient is therefore IndexedSlices over the distinct rows
only, duplicates summed, which the hash optimizers apply lazily.

Example (TF2):
  >>> init()
  >>> table = create_table(key_dtype=tf.int64, dim=8, name="item",
  ...                      emb_initializer=tf.keras.initializers.RandomNormal(),
  ...                      device_vocabulary_size=1000)
  >>> emb = sparse_lookup(table, tf.constant([[3, 7], [7, 9]], tf.int64))
  >>> emb.shape
  TensorShape([2, 2, 8])
"""

from __future__ import annotations

import contextlib
import numbers
import re
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import expansion
from mxrec_pipeline.core import initializers
from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.core import lookup
from mxrec_pipeline.core import placement
from mxrec_pipeline.core import table_protocol
from mxrec_pipeline.core import tiers
from mxrec_pipeline.core.asc import deferred
from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.util import initialize

KEY_DTYPES = (tf.int32, tf.int64, tf.string)
# The table name prefixes its variable's name, so it must be a valid TF root scope.
_TABLE_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)*")


class SparseEmbedding(tf.Module):
  """One table of the sparse core: device rows plus the host key index.

  Built by `create_table`; users pass it to `sparse_lookup`. Tracked by
  `tf.train.Checkpoint` (rows and key index); the hash optimizer tracks its
  slots.

  Attributes:
    table_name: Unique name of the table in the run.
    dim: Embedding dimension.
    key_dtype: tf.int32, tf.int64 or tf.string: the dtype lookups must give.
    device_vocabulary_size: Rows of the table: the most distinct ids it holds.
    variable: [device_vocabulary_size, dim] value_dtype rows.
    key_index: The KeyIndex mapping ids to rows.
    shard_id, num_shards: 0 and 1, or the worker's shard of a ShardedTable
      (`as_shard`). A SparseEmbedding is a core/table_protocol.Table and
      TableShard.
  """

  def __init__(self, *, table_name: str, dim: int, key_dtype: tf.DType, value_dtype: tf.DType,
               emb_initializer: Callable, device_vocabulary_size: int, init_param: float,
               device: str | None, container: str, tier_config: tiers.TierConfig | None = None,
               optimizer_list=()):
    super().__init__(name=None)
    self.table_name = table_name
    self.dim = dim
    self.key_dtype = key_dtype
    self.device_vocabulary_size = device_vocabulary_size
    self.shard_id, self.num_shards = 0, 1
    # Tiered: the index hands out global rows of the whole table; the cache maps
    # them to device rows (core/tiers.py).
    self.tiers = None
    index_capacity = device_vocabulary_size
    create_ops = []
    if tier_config is not None:
      row_init = initializers.row_initializer(emb_initializer, table_name)
      if init_param != 1.0:
        row_init = row_init.scaled(init_param)
      self.tiers = tiers.TieredStorage(table_name, dim, tier_config, row_init, container)
      index_capacity = tier_config.total_rows
      create_ops += self.tiers.make_create_ops(
          sum(len(o.slot_initial_values) for o in optimizer_list))
    self.key_index = key_index_lib.KeyIndex(container, table_name, index_capacity,
                                            **_full_table_text(tier_config))
    create_ops = [op for op in [self.key_index.create_op, *create_ops] if op is not None]

    def initial_rows():
      if self.tiers is not None:
        # Device rows are a cache, filled per id from tiers.row_initializer.
        return tf.zeros([device_vocabulary_size, dim], value_dtype)
      value = tf.convert_to_tensor(
          emb_initializer(shape=[device_vocabulary_size, dim], dtype=value_dtype), value_dtype)
      if init_param != 1.0:
        value = value * tf.cast(init_param, value_dtype)
      return value

    # Eviction resets freed rows to their initial values (core/admission.py).
    self._initial_rows = initial_rows

    def initial_value():
      # In a graph, initializing the rows also creates (or empties) the index
      # (and a tiered table's cache and store).
      deps = create_ops
      with tf.control_dependencies(deps):
        # An op made here carries the dependency even when the initializer gave a
        # NumPy array or a tensor built elsewhere.
        return tf.identity(initial_rows())

    # create_table resolved `device` (core/placement.py); None under a
    # distribution strategy, which places the rows.
    with contextlib.nullcontext() if device is None else tf.device(device):
      self.variable = tf.compat.v1.Variable(initial_value, trainable=True, use_resource=True,
                                            name=f"{table_name}/embedding", dtype=value_dtype)
    if self.tiers is not None:
      self.tiers.attach_at_creation(optimizer_list, self.variable)
      if not tf.executing_eagerly():
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                                       self.tiers.saveable())

  @property
  def kind(self) -> lookup.TableKind:
    """TableKind.TIERED with a host tier (`tiers` set), else TableKind.FLAT."""
    return lookup.TableKind.FLAT if self.tiers is None else lookup.TableKind.TIERED

  @property
  def is_tiered(self) -> bool:
    """Whether the rows are a device cache of host/SSD tiers (`tiers` is set)."""
    return self.tiers is not None

  def initial_rows(self) -> tf.Tensor:
    """[device_vocabulary_size, dim] initial rows: emb_initializer's values x init_param."""
    return self._initial_rows()

  # The table protocol (core/table_protocol.py): a single-process table is its one shard.

  @property
  def device(self) -> None:
    """None: the rows' placement was resolved at creation (core/placement.py)."""
    return None

  def as_shard(self, shard_id: int, num_shards: int) -> "SparseEmbedding":
    """Marks this table as shard `shard_id` of `num_shards` (a ShardedTable's worker shard)."""
    self.shard_id, self.num_shards = int(shard_id), int(num_shards)
    return self

  def local_shards(self) -> list["SparseEmbedding"]:
    """[self]: a single-process table is its own one shard."""
    return [self]

  def slot_variables(self, optimizer, create: bool = False) -> dict[str, tf.Variable]:
    """Slot name -> `optimizer`'s slot of this table (`create`: building it first).

    Raises:
      KeyError: the optimizer has no slots of this table and `create` is false.
    """
    if create:
      optimizer.build([self.variable])
    return {
        name: optimizer.get_slot(self.table_name, name) for name in optimizer.slot_initial_values
    }

  def iterations(self, optimizer) -> tf.Variable:
    """The optimizer's own step count: one per optimizer, whatever tables it trains."""
    return optimizer.iterations

  def evict(self, optimizers=None) -> list[tf.Tensor]:
    """[freed rows]: core/admission.evict with the table's eviction_threshold_s.

    Args:
      optimizers: HashOptimizers whose slots to reset; None: every hash
        optimizer of the run.

    Raises:
      ValueError: the table has no eviction threshold (naming it).
    """
    config = admission.config_of(self.table_name)
    if config is None or config.eviction_threshold_s is None:
      raise ValueError(f"table '{self.table_name}': evict needs an eviction_threshold_s")
    if optimizers is None:
      optimizers = initialize.get_config_initializer().hash_optimizers
    return [admission.evict(self, config.eviction_threshold_s, optimizers)]

  def gather_rows(self):
    """(keys [n] int64 increasing, rows [n, dim]) as NumPy arrays (eagerly; tiered: all tiers)."""
    keys, rows = self.key_index.export()
    order = tf.argsort(keys)
    keys, rows = tf.gather(keys, order), tf.gather(rows, order)
    values = (tf.gather(self.variable, rows) if self.tiers is None else self.tiers.read_rows(
        self.variable, rows)[:, :self.dim])
    return keys.numpy(), values.numpy()

  def stats(self) -> dict[str, int]:
    """core/table_protocol.STAT_NAMES -> this table's key-index counters."""
    return table_protocol.summed_stats([self])

  def __repr__(self):
    tiers_repr = "" if self.tiers is None else (
        f", host_vocabulary_size={self.tiers.config.host_vocabulary_size}, "
        f"ssd_vocabulary_size={self.tiers.config.ssd_vocabulary_size}")
    return (f"SparseEmbedding(name={self.table_name!r}, dim={self.dim}, "
            f"device_vocabulary_size={self.device_vocabulary_size}{tiers_repr})")


def create_table(key_dtype: tf.DType, dim: int | tf.TensorShape, name: str,
                 emb_initializer: Callable, device_vocabulary_size: int = 1,
                 host_vocabulary_size: int = 0, ssd_vocabulary_size: int = 0, ssd_data_path=(),
                 optimizer_list=None, init_param: float = 1.0, value_dtype: tf.DType = tf.float32,
                 device: str | None = None, cache_policy: str = "lru") -> SparseEmbedding:
  """Creates a table of the sparse core (mx_rec.core.embedding.create_table).

  Args:
    key_dtype: Dtype of the ids: tf.int32, tf.int64 or tf.string (hashed to
      int64 with a stable fingerprint, an addition beyond mxRec).
    dim: Embedding dimension, a positive int (or a rank-1 TensorShape).
    name: Table name, unique in the run: letters, digits, '_', '.', '-', '/',
      not starting with '_', '-' or '/' (it prefixes the variables' names).
    emb_initializer: Initializer called as `emb_initializer(shape=[rows, dim],
      dtype=value_dtype)`, e.g. tf.compat.v1.truncated_normal_initializer() or a
      tf.keras initializer. Every row is initialized when the table is.
    device_vocabulary_size: Rows on the device: the most distinct ids the table
      can hold. Training fails with an error naming the table when exceeded.
      With init(use_dynamic_expansion=True): the initial rows, grown by as
      many whenever needed (see core/expansion.py).
    host_vocabulary_size: Rows in host memory (mxRec's DDR mode). > 0 makes
      the table tiered (core/tiers.py): the device rows become a cache of the
      device + host + SSD rows, which together bound the distinct ids.
    ssd_vocabulary_size: Rows on SSD (needs host_vocabulary_size > 0).
    ssd_data_path: Directories of the SSD files (a list, or one path), used in
      order as each disk fills; empty: the current directory. They must exist
      and be writable.
    optimizer_list: The hash optimizers that will train a tiered table (mxRec
      requires them with host_vocabulary_size > 0): their slots move between
      tiers with the rows. Needed in tf.compat.v1 graphs; eagerly an optimizer
      may also be attached before the first step (`tiers.attach`), as the Keras
      model's compile does.
    init_param: Factor applied to the initial values (mxRec's init_param).
    value_dtype: Floating dtype of the rows.
    device: Where the rows and the optimizer slots live, e.g. "/CPU:0";
      None: `placement.table_device`'s rule, the device with a kernel for
      every op that updates them in place, `/CPU:0` with today's CPU-only
      native kernels even when a GPU is visible (the dense model still runs
      on the GPU; see core/placement.py). A given device is checked the same
      way. Ignored under a tf.distribute strategy, which places the rows.
    cache_policy: Tiered tables: "lru" or "lfu", how the device cache picks
      the rows that make room (an addition beyond mxRec).

  Returns:
    The SparseEmbedding (an expansion.ExpansionTable with
    init(use_dynamic_expansion=True)), also registered under `name` in the run.

  Raises:
    RuntimeError: init() was not called.
    ValueError: a bad argument, named with its value (dim <= 0, unsupported
      key_dtype, duplicate name, a missing or unwritable SSD directory, an
      initializer a tiered table cannot draw per row, ...), a `device` that
      is not a device string, not visible, or has no kernel for an op that
      updates the table (naming table, device and op).
  """
  run = initialize.get_config_initializer()
  if not isinstance(name, str) or not _TABLE_NAME.fullmatch(name):
    raise ValueError(f"create_table: `name` must be a non-empty string of letters, digits, "
                     f"'_', '.', '-' and '/' that starts with a letter, digit or '.' (it "
                     f"names the table's variables), got {name!r}")
  if name in run.tables and not _in_dead_graph(run.tables[name]):
    raise ValueError(f"create_table: a table named '{name}' already exists in this run")
  try:
    key_dtype = tf.as_dtype(key_dtype)
  except TypeError as e:
    raise ValueError(f"create_table('{name}'): `key_dtype` must be one of "
                     f"{[d.name for d in KEY_DTYPES]}, got {key_dtype!r}") from e
  if key_dtype not in KEY_DTYPES:
    raise ValueError(f"create_table('{name}'): `key_dtype` must be one of "
                     f"{[d.name for d in KEY_DTYPES]}, got {key_dtype.name}")
  if isinstance(dim, tf.TensorShape):
    dim = dim.as_list()[0] if dim.rank == 1 else None
  if not _is_positive_int(dim):
    raise ValueError(f"create_table('{name}'): `dim` must be a positive int, got {dim!r}")
  if not _is_positive_int(device_vocabulary_size):
    raise ValueError(f"create_table('{name}'): `device_vocabulary_size` must be a positive "
                     f"int, got {device_vocabulary_size!r}")
  # NumPy integers (e.g. `ids.max() + 1`) are fine; the table keeps Python ints.
  dim, device_vocabulary_size = int(dim), int(device_vocabulary_size)
  value_dtype = tf.as_dtype(value_dtype)
  if not value_dtype.is_floating:
    raise ValueError(f"create_table('{name}'): `value_dtype` must be floating, "
                     f"got {value_dtype.name}")
  if not callable(emb_initializer):
    raise ValueError(f"create_table('{name}'): `emb_initializer` must be callable, "
                     f"got {emb_initializer!r}")
  tier_config = tiers.check_tier_args(name, device_vocabulary_size, host_vocabulary_size,
                                      ssd_vocabulary_size, ssd_data_path, cache_policy, value_dtype)
  optimizer_list = list(optimizer_list or [])
  expansion_rows = tier_config is None and run.config.use_dynamic_expansion
  if tf.distribute.has_strategy():
    device = None  # The strategy places the rows: on devices with the kernels they need.
    placement.check_strategy_devices(name, placement.strategy_variable_devices(),
                                     value_dtype=value_dtype, expansion=expansion_rows)
  else:
    device = placement.table_device(name, device, value_dtype=value_dtype, expansion=expansion_rows)
  if tier_config is None:
    table_class = (expansion.ExpansionTable
                   if run.config.use_dynamic_expansion else SparseEmbedding)
    table = table_class(table_name=name, dim=dim, key_dtype=key_dtype, value_dtype=value_dtype,
                        emb_initializer=emb_initializer,
                        device_vocabulary_size=device_vocabulary_size, init_param=float(init_param),
                        device=device, container=run.container)
  else:
    if run.config.use_dynamic_expansion:
      raise ValueError(f"create_table('{name}'): host_vocabulary_size > 0 needs "
                       "init(use_dynamic_expansion=False), as in mxRec")
    table = SparseEmbedding(table_name=name, dim=dim, key_dtype=key_dtype, value_dtype=value_dtype,
                            emb_initializer=emb_initializer,
                            device_vocabulary_size=device_vocabulary_size,
                            init_param=float(init_param), device=device, container=run.container,
                            tier_config=tier_config, optimizer_list=optimizer_list)
  run.tables[name] = table
  return table


def _is_positive_int(value) -> bool:
  return (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0)


def sparse_lookup(hashtable: SparseEmbedding, ids, send_count: int | None = None,
                  dim: int | None = None, is_train: bool = True, name: str | None = None,
                  modify_graph: bool = False, batch: dict | None = None,
                  access_and_evict_config: dict | None = None, is_grad: bool = True,
                  serving_default_value=None) -> tf.Tensor:
  """Looks ids up in a table (mx_rec.core.embedding.sparse_lookup).

  Args:
    hashtable: A table from create_table.
    ids: Either a FeatureSpec whose ids `batch` carries, already inserted by
      get_asc_insert_func (the fast path: the model graph has no hashtable op),
      or a tensor of ids of any shape, of the table's key_dtype, inserted here.
    send_count: The most distinct ids of this table per batch (mxRec's all2all
      buffer size). Checked: a batch with more fails naming the table. Required
      when init(use_dynamic=False).
    is_train: True: unseen tensor ids get rows. False: unseen ids read
      `serving_default_value` and take no row. With a FeatureSpec, insertion
      already happened with the insert function's is_training.
    dim: The embedding dimension the caller expects (mxRec's `dim`); None or
      the table's dim.
    name: Name scope of the lookup.
    modify_graph: mxRec's automatic graph modification. In a tf.compat.v1
      graph, tensor ids must come from `iterator.get_next()`, and
      `mxrec_pipeline.graph.modifier.modify_graph_and_start_emb_cache()` moves
      their insertion into the dataset; running the lookup before that fails
      saying so. Eagerly and in tf.function, tensor ids are inserted in the
      graph either way.
    batch: The batch dict from the dataset; required with a FeatureSpec.
    access_and_evict_config: Admission/eviction of the table (mxRec's
      ACCESS_AND_EVICT): dict with `access_threshold`, `eviction_threshold`
      (seconds) and `faae_coefficient` (the weight of this lookup's ids; not with
      modify_graph=True). With a FeatureSpec, the spec's settings must agree.
      See core/admission.py.
    is_grad: False stops gradients to the table.
    serving_default_value: Scalar or [dim] value read for unseen ids when
      is_train is False, and in training for ids not admitted yet; zeros by
      default.

  Returns:
    [*ids.shape, dim] tensor of the table's value_dtype.

  Raises:
    RuntimeError: init() was not called, or the table belongs to another graph.
    ValueError: ids of the wrong dtype (naming table, expected and got), a
      FeatureSpec without `batch` or of another table, a batch that was not
      mapped with get_asc_insert_func, a bad serving_default_value.
    tf.errors.ResourceExhaustedError (at run time): the table is full.
  """
  run = initialize.get_config_initializer()
  if not isinstance(hashtable, (SparseEmbedding, expansion.ExpansionTable)):
    raise ValueError(f"sparse_lookup: `hashtable` must come from create_table, got {hashtable!r}")
  table = hashtable.table_name
  _check_graph(hashtable)
  if run.tables.get(table) is not hashtable:
    raise RuntimeError(f"sparse_lookup: table '{table}' belongs to an earlier init(); "
                       "create it again after init()")
  faae_coefficient = _configure_admission(hashtable, ids, access_and_evict_config, modify_graph)
  admit_config = admission.config_of(table)
  admits = admit_config is not None and admit_config.admits
  if admit_config is not None and hashtable.kind is lookup.TableKind.EXPANSION:
    raise NotImplementedError(f"sparse_lookup('{table}'): admission and eviction are not "
                              "available with dynamic expansion yet")
  if send_count is not None and not _is_positive_int(send_count):
    raise ValueError(f"sparse_lookup('{table}'): `send_count` must be a positive int, "
                     f"got {send_count!r}")
  if dim is not None and dim != hashtable.dim:
    raise ValueError(f"sparse_lookup('{table}'): `dim` must be None or the table's dim "
                     f"{hashtable.dim}, got {dim!r}")
  if send_count is None and not run.config.use_dynamic:
    raise ValueError(f"sparse_lookup('{table}'): init(use_dynamic=False) needs `send_count`")
  with tf.name_scope(name or f"{table}_lookup"):
    deps = []
    token = None  # Tiered tables in training: the batch's plan (core/tiers.py).
    if isinstance(ids, fs.FeatureSpec):
      unique_rows, restore = _inserted_rows(hashtable, ids, batch)
      if hashtable.is_tiered and is_train:
        token = _plan_token(hashtable, ids, batch)
        deps.append(
            tf.debugging.assert_positive(
                token, message=f"table '{table}': this batch was inserted with "
                "is_training=False; look it up with is_train=False"))
      if is_train and not admits:
        # A batch mapped with is_training=False holds -1 rows for unseen ids.
        deps.append(
            tf.debugging.assert_non_negative(
                unique_rows, message=f"table '{table}': this batch was inserted with "
                "is_training=False; look it up with is_train=False"))
    else:
      ids = tf.convert_to_tensor(ids)
      _check_key_dtype(hashtable, ids.dtype, "ids")
      if modify_graph and hashtable.is_tiered:
        raise NotImplementedError(
            f"sparse_lookup('{table}'): tiered tables (host_vocabulary_size > 0) are looked up "
            "with FeatureSpecs and get_asc_insert_func, or with tensor ids in eager/tf.function "
            "code; modify_graph=True does not plan their device cache yet")
      if modify_graph and not (tf.executing_eagerly() or tf.inside_function()):
        # Deferred: graph modification feeds the rows from the dataset.
        unique_rows, restore = deferred.defer_insertion(hashtable, ids, is_train)
      else:
        keys = key_index_lib.to_keys(ids)
        unique_rows, restore = admission.insert(
            run.container, table, keys,
            is_train, counts=tf.fill(tf.shape(keys, out_type=tf.int64),
                                     tf.constant(faae_coefficient, tf.int64)))
        if hashtable.is_tiered and is_train:
          # Planned by the training thread: waiting for room cannot help.
          unique_rows, token = tiers.plan(run.container, table, unique_rows, wait=False)
    if send_count is not None:
      message = f"table '{table}': more distinct ids in one batch than send_count={send_count}"
      deps.append(
          tf.debugging.assert_less_equal(tf.size(unique_rows, out_type=tf.int64),
                                         tf.constant(send_count, tf.int64), message=message))
    with tf.control_dependencies(deps):
      out = lookup.id_embeddings(hashtable, unique_rows, restore, training=is_train,
                                 plan_token=token, default_value=serving_default_value,
                                 admitting=admits and is_train)
    return out if is_grad else tf.stop_gradient(out)


def _plan_token(table: SparseEmbedding, spec: fs.FeatureSpec, batch) -> tf.Tensor:
  key = fs.plan_key(table.table_name)
  if key not in batch:
    raise ValueError(
        f"sparse_lookup('{table.table_name}'): the batch has no device-cache plan of tiered table "
        f"'{table.table_name}' (FeatureSpec '{spec.name}'); map the dataset with "
        "get_asc_insert_func after create_table")
  return batch[key]


def _configure_admission(table, ids, config: dict | None, modify_graph: bool) -> int:
  """Registers access_and_evict_config; returns its faae_coefficient (1 without it)."""
  if config is None:
    return 1
  where = f"sparse_lookup('{table.table_name}')"
  unknown = sorted(set(config) - {"access_threshold", "eviction_threshold", "faae_coefficient"})
  if not isinstance(config, dict) or unknown:
    raise ValueError(f"{where}: access_and_evict_config takes access_threshold, "
                     f"eviction_threshold and faae_coefficient, got {config!r}")
  if table.kind is lookup.TableKind.EXPANSION:
    raise NotImplementedError(f"{where}: admission and eviction are not available with "
                              "dynamic expansion yet")
  coefficient = config.get("faae_coefficient", 1)
  if isinstance(coefficient, bool) or not isinstance(coefficient, int) or coefficient < 1:
    raise ValueError(f"{where}: `faae_coefficient` must be an int >= 1, got {coefficient!r}")
  if coefficient != 1 and (modify_graph or isinstance(ids, fs.FeatureSpec)):
    raise ValueError(f"{where}: set faae_coefficient on the FeatureSpec (modify_graph=True and "
                     "FeatureSpec lookups count ids in the dataset)")
  admission.configure(
      table.table_name,
      admission.AdmitEvictConfig(config.get("access_threshold"), config.get("eviction_threshold")),
      where)
  return coefficient


def _full_table_text(tier_config: tiers.TierConfig | None) -> dict:
  """KeyIndex's "table is full" wording: a tiered table's rows are device + host + SSD."""
  if tier_config is None:
    return {}
  c = tier_config
  return dict(
      rows_text=(f"{c.total_rows} rows in all (device_vocabulary_size={c.device_vocabulary_size} "
                 f"device-cache rows + host_vocabulary_size={c.host_vocabulary_size} host rows + "
                 f"ssd_vocabulary_size={c.ssd_vocabulary_size} SSD rows)"),
      grow_text=("Raise host_vocabulary_size or ssd_vocabulary_size: they add rows in cheaper "
                 "memory than device_vocabulary_size, the device cache"))


def _check_key_dtype(table: SparseEmbedding, dtype: tf.DType, what: str) -> None:
  if dtype != table.key_dtype:
    raise ValueError(f"sparse_lookup('{table.table_name}'): {what} must be "
                     f"{table.key_dtype.name} (the table's key_dtype), got {dtype.name}")


def _inserted_rows(table: SparseEmbedding, spec: fs.FeatureSpec, batch):
  if batch is None:
    raise ValueError(f"sparse_lookup('{table.table_name}'): FeatureSpec '{spec.name}' needs "
                     "`batch`, the dict the dataset gives")
  if spec.table_name != table.table_name:
    raise ValueError(f"sparse_lookup('{table.table_name}'): FeatureSpec '{spec.name}' "
                     f"belongs to table '{spec.table_name}'")
  rows_key, restore_key = fs.unique_rows_key(table.table_name), fs.restore_key(spec.name)
  if rows_key not in batch or restore_key not in batch:
    raise ValueError(
        f"sparse_lookup('{table.table_name}'): the batch has no insertion results of "
        f"FeatureSpec '{spec.name}'; map the dataset with get_asc_insert_func([...this spec...])")
  if spec.index_key in batch:
    _check_key_dtype(table, batch[spec.index_key].dtype, f"FeatureSpec '{spec.name}' ids")
  return batch[rows_key], batch[restore_key]


def _in_dead_graph(table: SparseEmbedding) -> bool:
  """Whether a TF1 table belongs to a graph other than the current default one.

  An Estimator builds a new graph (and calls model_fn, which creates the tables)
  for training, evaluation and prediction; each new graph replaces the tables
  of the previous one. Its session restores the key indexes from the checkpoint.
  """
  if tf.executing_eagerly() or tf.inside_function():
    return False
  variable_graph = getattr(table.variable, "graph", None)
  return variable_graph is not None and variable_graph is not tf.compat.v1.get_default_graph()


def _check_graph(table: SparseEmbedding) -> None:
  """In TF1 graph mode, the table's variable must be in the default graph."""
  if tf.executing_eagerly() or tf.inside_function():
    return
  if table.variable.graph is not tf.compat.v1.get_default_graph():
    raise RuntimeError(
        f"sparse_lookup: table '{table.table_name}' was created in another graph; create "
        "tables in the graph that looks them up (e.g. inside model_fn for an Estimator)")
