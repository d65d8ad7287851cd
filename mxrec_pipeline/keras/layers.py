"""Keras side of the sparse core: table/feature specs and the lookup layer.

`TableSpec` describes a table (create_table's arguments), `SparseFeature` says
which table a context or example id feature uses and how multi-valued ids are
combined. `SparseLookup` is the Keras layer over the sparse core's lookup: it
reads the rows that the input pipeline's insertion put in the batch.
"""

from __future__ import annotations

import dataclasses
import zlib

import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import combiner as combiner_lib
from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import lookup
from mxrec_pipeline.util import initialize

# Re-exported: builders and user code import them from here.
COMBINERS = combiner_lib.COMBINERS
combine = combiner_lib.combine
_KEY_DTYPES = ("int32", "int64", "string")
INITIALIZERS = ("truncated_normal", "zeros")


@dataclasses.dataclass(frozen=True)
class TableSpec:
  """An embedding table of the sparse core (create_table's arguments).

  Attributes:
    name: Table name, unique in a model.
    dim: Embedding dimension, > 0.
    device_vocabulary_size: Rows on the device: the most distinct ids, > 0 (a
      tiered table's device cache).
    key_dtype: "int64", "int32" or "string" (hashed to int64).
    initializer_stddev: Stddev of the truncated-normal initial rows, > 0.
    initializer: "truncated_normal" (TruncatedNormal(initializer_stddev),
      the default) or "zeros" (TPUEmbedding's TableConfig initializer
      choices); zeros make the initial rows independent of which rows the
      keys get (e.g. tables sharded over workers equal one process's).
    host_vocabulary_size: Host-memory rows; > 0 makes the table tiered
      (core/tiers.py): the device rows cache device + host + SSD rows.
    ssd_vocabulary_size: SSD rows (needs host_vocabulary_size > 0).
    ssd_data_path: Directories of the SSD files, used in order.
    cache_policy: "lru" or "lfu": which device rows make room.
    device: Where the rows and optimizer slots live, e.g. "/CPU:0"; None
      (the default): create_table's rule (core/placement.py), the host with
      today's CPU-only native kernels, while the dense model runs on the GPU.
      create_table checks it: a device without a kernel for an op that
      updates the table fails naming table, device and op. Ignored under a
      tf.distribute strategy (the pipeline's MirroredStrategy included),
      which places the rows.
  """

  name: str
  dim: int
  device_vocabulary_size: int
  key_dtype: str = "int64"
  initializer_stddev: float = 0.05
  initializer: str = "truncated_normal"
  host_vocabulary_size: int = 0
  ssd_vocabulary_size: int = 0
  ssd_data_path: tuple[str, ...] = ()
  cache_policy: str = "lru"
  device: str | None = None

  @property
  def tiered(self) -> bool:
    """Whether the table has a host tier."""
    return self.host_vocabulary_size > 0

  def __post_init__(self):
    if not self.name:
      raise ValueError("TableSpec `name` must be non-empty")
    for field in ("dim", "device_vocabulary_size"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"TableSpec '{self.name}': `{field}` must be a positive int, "
                         f"got {value!r}")
    if self.key_dtype not in _KEY_DTYPES:
      raise ValueError(f"TableSpec '{self.name}': `key_dtype` must be one of {_KEY_DTYPES}, "
                       f"got {self.key_dtype!r}")
    if not self.initializer_stddev > 0:
      raise ValueError(f"TableSpec '{self.name}': `initializer_stddev` must be positive, "
                       f"got {self.initializer_stddev}")
    if self.device is not None and not isinstance(self.device, str):
      raise ValueError(f"TableSpec '{self.name}': `device` must be a device string such as "
                       f"'/CPU:0' or None, got {self.device!r}")
    if self.initializer not in INITIALIZERS:
      raise ValueError(f"TableSpec '{self.name}': `initializer` must be one of {INITIALIZERS}, "
                       f"got {self.initializer!r}")
    # YAML gives lists; the spec is frozen and hashable.
    object.__setattr__(self, "ssd_data_path", tuple(self.ssd_data_path or ()))


@dataclasses.dataclass(frozen=True)
class SparseFeature:
  """An id feature looked up through the sparse core.

  Attributes:
    name: The feature's name in the context or example feature spec.
    table: Name of the TableSpec it uses; several features may share one.
    combiner: How the ids of one context/example are reduced over the last
      axis: "mean", "sum" or "sqrtn" (TPUEmbedding's combiners), or None to keep
      every id's embedding ([..., num_ids, dim]).
  """

  name: str
  table: str
  combiner: str | None = "mean"

  def __post_init__(self):
    combiner_lib.check_combiner(self.combiner, f"SparseFeature '{self.name}'", allow_none=True)


def table_initializer(spec: TableSpec,
                      seed: int | None = None) -> tf.keras.initializers.Initializer:
  """The initializer of a table's rows: the spec's, seeded by `seed` mixed with the table name.

  With `seed` None the draws are left to TensorFlow's global seed.
  """
  if spec.initializer == "zeros":
    return tf.keras.initializers.Zeros()
  table_seed = None if seed is None else (seed + zlib.crc32(spec.name.encode())) % 2**31
  return tf.keras.initializers.TruncatedNormal(stddev=spec.initializer_stddev, seed=table_seed)


def get_or_create_table(spec: TableSpec, seed: int | None = None) -> embedding.SparseEmbedding:
  """The run's table named `spec.name`, created from the spec if absent.

  Args:
    spec: The table's spec.
    seed: Seed of the initial rows; the table name is mixed in, so tables of
      one seed differ. None leaves them to TensorFlow's global seed.

  Raises:
    RuntimeError: init() was not called.
    ValueError: the run has a table of that name with another dim or size.
  """
  run = initialize.get_config_initializer()
  table = run.tables.get(spec.name)
  if table is None:
    return embedding.create_table(key_dtype=tf.as_dtype(spec.key_dtype), dim=spec.dim,
                                  name=spec.name, emb_initializer=table_initializer(spec, seed),
                                  device_vocabulary_size=spec.device_vocabulary_size,
                                  host_vocabulary_size=spec.host_vocabulary_size,
                                  ssd_vocabulary_size=spec.ssd_vocabulary_size,
                                  ssd_data_path=list(spec.ssd_data_path),
                                  cache_policy=spec.cache_policy, device=spec.device)
  host_rows = table.tiers.config.host_vocabulary_size if table.is_tiered else 0
  if ((table.dim, table.device_vocabulary_size, host_rows)
      != (spec.dim, spec.device_vocabulary_size, spec.host_vocabulary_size)):
    raise ValueError(f"table '{spec.name}' exists with dim={table.dim}, "
                     f"device_vocabulary_size={table.device_vocabulary_size}, "
                     f"host_vocabulary_size={host_rows}; the spec asks for dim={spec.dim}, "
                     f"device_vocabulary_size={spec.device_vocabulary_size}, "
                     f"host_vocabulary_size={spec.host_vocabulary_size}")
  return table


@tf.keras.utils.register_keras_serializable(package="mxrec_pipeline")
def set_serving_snapshot(layer: tf.keras.layers.Layer, rows: tf.Variable | None,
                         positions=None) -> None:
  """Points a lookup layer at an export's snapshot (keras/export.py), or back at its table.

  Sets `layer.serving_rows` (the table's compact [num_keys + 1, dim] rows,
  indexed by the stock serving table's positions) and, for layers that read
  raw ids, `layer.serving_positions` (key -> position), or clears them with
  None. Neither is tracked by the layer: an export's state never enters a
  training checkpoint (Keras tracks a variable assigned as an attribute, keeps
  tracking it after the attribute is cleared, and TF's deferred restoration
  would assign a checkpoint's copy to the next export's snapshot).
  """
  object.__setattr__(layer, "serving_rows", rows)
  object.__setattr__(layer, "serving_positions", positions)


class SparseLookup(tf.keras.layers.Layer):
  """Embeds one sparse feature through the sparse core.

  Call with `(restore, unique_rows)` from the batch that get_asc_insert_func
  filled: restore [batch_size, ..., num_ids] int32 (or ragged), unique_rows
  [num_unique] int64; for a tiered table `(restore, unique_rows, plan)` with
  the [1] int64 plan token (core/tiers.py), applied before the lookup in
  training. Returns [batch_size, ..., dim] float32 (combined over num_ids), or
  [batch_size, ..., num_ids, dim] with combiner None. In training every row
  exists; otherwise rows of -1 (ids never trained) read zeros.

  The layer tracks the table's rows as its weight (so Keras checkpoints and
  SavedModels carry them) but not the table's native key index: a SavedModel of
  the model needs no custom op.

  Args:
    feature: SparseFeature (or its dict) this layer embeds.
    table: TableSpec (or its dict) of the feature's table.
    seed: Seed of the table's initial rows when this layer creates it.
  """

  def __init__(self, feature, table, seed: int | None = None, **kwargs):
    super().__init__(**kwargs)
    self.feature = feature if isinstance(feature, SparseFeature) else SparseFeature(**feature)
    self.table_spec = table if isinstance(table, TableSpec) else TableSpec(**table)
    if self.feature.table != self.table_spec.name:
      raise ValueError(f"SparseLookup: feature '{self.feature.name}' uses table "
                       f"'{self.feature.table}', got TableSpec '{self.table_spec.name}'")
    self.seed = seed
    self.embeddings = None
    set_serving_snapshot(self, None)

  def build(self, input_shape):
    table = get_or_create_table(self.table_spec, self.seed)
    if not isinstance(table, embedding.SparseEmbedding):
      raise NotImplementedError(
          f"SparseLookup: table '{table.table_name}' uses dynamic expansion, which the Keras "
          "pipeline does not support; init() without use_dynamic_expansion")
    self.embeddings = table.variable
    super().build(input_shape)

  @property
  def tiers(self):
    """The table's TieredStorage, or None (flat table, or no run).

    Looked up in the run, not tracked: SavedModels of the model must not
    carry the native cache and store (keras/export.py serves a snapshot).
    """
    if not initialize.is_initialized():
      return None
    table = initialize.get_config_initializer().tables.get(self.table_spec.name)
    return table.tiers if table is not None else None

  def call(self, inputs, training=None):
    restore, unique_rows, *plan = inputs
    training = bool(training) if training is not None else False
    if self.serving_rows is not None:
      emb = lookup.gather_per_id(self.serving_rows, unique_rows, restore, training=False)
    else:
      # Tables with admission (FeatureSpec access_threshold) hold -1 rows in
      # training batches for ids not admitted yet; they read zeros.
      config = admission.config_of(self.table_spec.name)
      emb = lookup.id_embeddings(initialize.get_config_initializer().tables[self.table_spec.name],
                                 unique_rows, restore, training=training,
                                 plan_token=plan[0] if plan else None, admitting=training and
                                 config is not None and config.admits)
      # Ragged ids reduce in one native op (combiner.fused_combine); the
      # exported SavedModel (serving_rows) keeps TF's ops: it needs no custom op.
      return combiner_lib.fused_combine(emb, self.feature.combiner)
    return combine(emb, self.feature.combiner)

  def get_config(self):
    config = super().get_config()
    config.update(feature=dataclasses.asdict(self.feature),
                  table=dataclasses.asdict(self.table_spec), seed=self.seed)
    return config
