"""Keras side of tables sharded over workers (distributed.ShardedTable).

Under MultiWorkerMirroredStrategy with more than one worker, the pipeline
(keras/pipeline.py) shards every table of the model by key over the workers
(docs/distributed.md "Many workers"): it creates one `ShardedTable` per
TableSpec with `create_sharded_tables` (outside the strategy's scope: each
worker's shard is its own variable) and builds the model with one `ShardedLookup`
layer per feature, which takes the feature's raw ids (no insertion in tf.data);
`ShardedLookupGroup` looks every feature up in one
`sharded_table.lookup_tables` call inside the Keras train/test step
(`strategy.run`), one exchange for the tables routed all-to-all. The
table gradient comes back to each owner as IndexedSlices on its shard, which
the hash optimizer applies locally (optimizers/base.py). Single-process
modules (core, keras/layers.py) stay unaware of sharding.

Serving: `snapshots` builds, one shard at a time in the exporting process
(distributed/export.table_snapshot), the compact snapshot a single-process
table exports (its keys' rows + a default row, a SortedKeyTable key ->
position); `ShardedLookup.serving_rows`/`serving_positions` then read it, so
the SavedModel serves raw ids with plain TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import tensorflow as tf

from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.distributed import export
from mxrec_pipeline.distributed.ps_table import PSShardedTable
from mxrec_pipeline.distributed.sharded_table import ShardedTable
from mxrec_pipeline.distributed.sharded_table import lookup_tables
from mxrec_pipeline.keras import layers


def create_sharded_tables(strategy: tf.distribute.Strategy, specs: Iterable[layers.TableSpec],
                          seed: int | None = None, collective_timeout_s: float = 0.0,
                          routing: str = "auto") -> dict[str, ShardedTable]:
  """One ShardedTable per spec, created in spec order (the same on every worker).

  Call outside `strategy.scope()`, after init(). Prints each table's shard
  count and routing ("auto" resolved). Rows per shard are the
  spec's device_vocabulary_size; initial rows by layers.table_initializer
  (random ones are drawn per shard, so other initial rows than one
  process's; "zeros" gives the same).

  Args:
    strategy: The MultiWorkerMirroredStrategy, one replica per worker.
    specs: The model's TableSpecs.
    seed: The run's seed, or None.
    collective_timeout_s: The all-to-all routing's timeout (unused by the
      all_gather routing, which takes the strategy's).
    routing: "all_gather", "all_to_all" or "auto" (ShardedTable's; the
      YAML's `pipeline.sharding.routing`).

  Returns:
    Table name -> ShardedTable.

  Raises:
    ValueError: a tiered spec (host/SSD tiers are not sharded yet), naming
      the table; anything ShardedTable refuses (e.g. a config differing on
      another worker).
  """
  tables = {}
  for spec in specs:
    if spec.tiered:
      raise ValueError(f"table '{spec.name}': tiered tables (host_vocabulary_size > 0) cannot be "
                       "sharded over MultiWorkerMirroredStrategy workers yet; use "
                       "ParameterServerStrategy (tiers per ps shard) or MirroredStrategy on one "
                       "host")
    tables[spec.name] = ShardedTable(strategy, name=spec.name, dim=spec.dim,
                                     device_vocabulary_size=spec.device_vocabulary_size,
                                     emb_initializer=layers.table_initializer(spec, seed),
                                     key_dtype=tf.as_dtype(spec.key_dtype),
                                     collective_timeout_s=collective_timeout_s, routing=routing)
    print(
        f"table '{spec.name}': sharded over {tables[spec.name].num_shards} workers, "
        f"{tables[spec.name].routing} routing", flush=True)
  return tables


class ShardedLookup(tf.keras.layers.Layer):
  """Embeds one sparse feature through a table sharded over the workers.

  Call with the feature's raw ids: [batch_size, ..., num_ids] of the table's
  key dtype (int64, int32 or string), or a tf.RaggedTensor of them. Returns
  [batch_size, ..., dim] float32 (combined over num_ids by the feature's
  combiner), or [batch_size, ..., num_ids, dim] with combiner None. In
  training absent keys get rows at their owners; otherwise they read zeros.
  Must run inside the strategy's replica context (Keras' train/test step).

  Under ParameterServerStrategy the same layer reads a PSShardedTable
  (keras/ps.py): `lookup` then runs on the ps tasks that own the ids.

  Args:
    feature: The SparseFeature it embeds.
    table: The ShardedTable (or PSShardedTable) of the feature's table.

  Attributes:
    embeddings: This worker's shard variable (the table's rows it owns); not
      among the layer's Keras weights. None for a PSShardedTable (its shards
      are `table.shard_variables`).
    serving_rows, serving_positions: During export: the gathered snapshot's
      [num_keys + 1, dim] rows and its SortedKeyTable key -> position.
  """

  def __init__(self, feature: layers.SparseFeature, table: ShardedTable | PSShardedTable, **kwargs):
    super().__init__(**kwargs)
    self.feature = feature
    # Neither tracked: Keras refuses a model variable created outside the
    # strategy's scope, which this worker's own shard is; checkpoints save
    # the shards per worker (distributed/checkpoint.py) or per ps task.
    object.__setattr__(self, "table", table)
    object.__setattr__(self, "embeddings", getattr(table, "variable", None))
    self._rows_dtype = (table.shard_variables[0]
                        if self.embeddings is None else table.variable).dtype
    layers.set_serving_snapshot(self, None)

  def call(self, ids, training=None):
    training = bool(training) if training is not None else False
    flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
    if self.serving_rows is not None or _in_scratch_graph(self):
      emb = self.local_rows(flat)
    else:
      emb = self.table.lookup(flat, training=training)
    return self.combine(ids, emb)

  def local_rows(self, flat: tf.Tensor) -> tf.Tensor:
    """[*flat.shape, dim] rows read without a collective: the serving snapshot's, or zeros.

    Zeros while Keras builds the functional model by tracing `call` on
    placeholders in its scratch graph, under the strategy's scope but outside
    any replica context: only the output's shape and dtype matter there.
    """
    if self.serving_rows is not None:
      keys = key_index_lib.to_keys(flat, f"table '{self.feature.table}'")
      return tf.gather(self.serving_rows, self.serving_positions.lookup(keys))
    return tf.zeros(tf.concat([tf.shape(flat), [self.table.dim]], 0), self._rows_dtype)

  def combine(self, ids, emb: tf.Tensor) -> tf.Tensor:
    """The rows of `ids`' flat values, shaped as `ids` and combined by the feature's combiner."""
    if isinstance(ids, tf.RaggedTensor):
      emb = ids.with_flat_values(emb)
    return layers.combine(emb, self.feature.combiner)

  def get_config(self):
    config = super().get_config()
    config.update(feature=dataclasses.asdict(self.feature), table=self.feature.table)
    return config


class ShardedLookupGroup(tf.keras.layers.Layer):
  """Embeds every sparse feature of a step through ShardedTables in one exchange.

  Call with {feature name: raw ids} (each as `ShardedLookup` takes it);
  returns {feature name: embeddings} as each feature's ShardedLookup would.
  In the train and test steps all the features' ids go through one
  `distributed.sharded_table.lookup_tables` call: the tables routed
  all-to-all share one exchange (4 collectives a step, not 4 per feature).
  Serving (the snapshots set on the per-feature layers by keras/export.py)
  and Keras' scratch-graph tracing read each feature's layer without a
  collective.

  Args:
    lookups: One ShardedLookup per feature, over ShardedTables: the model's
      sparse layers (their `embeddings`, `feature` and serving snapshots);
      they are not called in the model's graph themselves.
  """

  def __init__(self, lookups, **kwargs):
    super().__init__(**kwargs)
    # Untracked: the model tracks them as its sparse layers.
    object.__setattr__(self, "lookups", list(lookups))

  def call(self, inputs, training=None):
    training = bool(training) if training is not None else False
    flats = {}
    for lookup in self.lookups:
      ids = inputs[lookup.feature.name]
      flats[lookup.feature.name] = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
    if _in_scratch_graph(self) or any(lookup.serving_rows is not None for lookup in self.lookups):
      rows = [lookup.local_rows(flats[lookup.feature.name]) for lookup in self.lookups]
    else:
      rows = lookup_tables([(lookup.table, flats[lookup.feature.name]) for lookup in self.lookups],
                           training=training)
    return {
        lookup.feature.name: lookup.combine(inputs[lookup.feature.name], emb)
        for lookup, emb in zip(self.lookups, rows)
    }

  def get_config(self):
    config = super().get_config()
    config.update(features=[dataclasses.asdict(lookup.feature) for lookup in self.lookups])
    return config


def _in_scratch_graph(layer: tf.keras.layers.Layer) -> bool:
  """Whether Keras is tracing `layer.call` for the output's signature only (no replica context).

  Keras 2.15 (base_layer._infer_output_signature) traces a layer called on
  symbolic inputs in a FuncGraph named "<layer name>_scratch_graph".
  """
  return tf.distribute.in_cross_replica_context() and getattr(
      tf.compat.v1.get_default_graph(), "name", None) == f"{layer.name}_scratch_graph"


def snapshots(tables: Mapping[str, object], staging_dir: str | None = None,
              barrier=None) -> dict[str, export.Snapshot] | None:
  """Every table's serving snapshot (distributed/export.table_snapshot; eagerly).

  The same compact form as KeyIndex.to_compact_table of a single-process
  table, built one shard at a time: ps shards read from their tasks on the
  coordinator; over workers, every other worker writes its shard to
  `staging_dir` (before a `barrier`), and the worker holding shard 0 reads
  its own in place and those files.

  Returns:
    Table name -> Snapshot; None in a worker that does not export (all
    workers call it when tables are sharded over workers).
  """
  out = {name: export.table_snapshot(table, staging_dir, barrier) for name, table in tables.items()}
  return None if any(s is None for s in out.values()) else out
