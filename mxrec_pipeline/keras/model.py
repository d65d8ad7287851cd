"""Model builders, mirroring tfr.keras.model, with sparse id features.

TF-Ranking's pieces are reused as they are: `FeatureSpecInputCreator`,
`TypeSpecInputCreator`, `PreprocessorWithSpec`, `DNNScorer`, `GAMScorer`,
`UnivariateScorer` and `AbstractModelBuilder` are tfr's own classes. What the
sparse core adds:

* `ModelBuilder(input_creator, preprocessor, scorer, mask_feature_name,
  sparse_features, tables)`: tfr's ModelBuilder whose sparse id features come
  in as the insertion results of the input pipeline (restore indices and the
  table's unique rows) and are embedded by `SparseLookup` layers before the
  user's preprocessor and scorer see them, as float features.
* `SparseRankingModel`: the Keras model it builds. Its `train_step` gives dense
  variables to the compiled optimizer and table rows to a lazy hash optimizer.

See `ModelBuilder` for an example and docs/writing-a-ranker.md for a ranker.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.keras import layers
from mxrec_pipeline.keras import sharded
from mxrec_pipeline.optimizers import factory

# tfr's building blocks, reused unchanged.
AbstractModelBuilder = tfr.keras.model.AbstractModelBuilder
FeatureSpecInputCreator = tfr.keras.model.FeatureSpecInputCreator
TypeSpecInputCreator = tfr.keras.model.TypeSpecInputCreator
PreprocessorWithSpec = tfr.keras.model.PreprocessorWithSpec
UnivariateScorer = tfr.keras.model.UnivariateScorer
DNNScorer = tfr.keras.model.DNNScorer
GAMScorer = tfr.keras.model.GAMScorer
SparseFeature = layers.SparseFeature
TableSpec = layers.TableSpec


class SparseRankingModel(tf.keras.Model):
  """A functional ranking model whose tables train with a lazy hash optimizer.

  Built by ModelBuilder (call `tf.keras.Model`'s functional constructor with
  `inputs`, `outputs` and `sparse_layers`). `compile(sparse_optimizer=...)`
  takes the hash optimizer of the tables (lazy Adam when omitted); the usual
  `optimizer` trains every other variable.

  With `ps_tables` (tables sharded over parameter servers, keras/ps.py) the
  gradients of their shard variables go to each table's `apply_gradients`,
  which runs the tables' hash optimizer on the owning ps tasks.
  """

  def __init__(self, *args, sparse_layers: Sequence[layers.SparseLookup] = (),
               ps_tables: Sequence = (), **kwargs):
    super().__init__(*args, **kwargs)
    self._sparse_layers = list(sparse_layers)
    # distributed.PSShardedTable objects; untracked (their shards are saved
    # per ps task, keras/table_checkpoints.py).
    object.__setattr__(self, "_ps_tables", list(ps_tables))
    self.sparse_optimizer = None

  def compile(self, *args, sparse_optimizer=None, **kwargs):
    """Keras compile, plus `sparse_optimizer` (a HashOptimizer) for the tables.

    The tables' optimizer slots are created now (`HashOptimizer.build`):
    tiered tables move them between tiers with the rows, and a checkpoint
    restore fills them at once.
    """
    super().compile(*args, **kwargs)
    self.sparse_optimizer = sparse_optimizer or factory.get_optimizer("lazy_adam",
                                                                      learning_rate=0.001)
    self.sparse_optimizer.build(self.table_variables)

  @property
  def table_variables(self) -> list[tf.Variable]:
    """Rows of the tables this model looks up, one per table (none of ps tables)."""
    seen, out = set(), []
    for layer in self._sparse_layers:
      if layer.embeddings is not None and id(layer.embeddings) not in seen:
        seen.add(id(layer.embeddings))
        out.append(layer.embeddings)
    return out

  def train_step(self, data):
    x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      loss = self.compute_loss(x, y, y_pred, sample_weight)
    sparse = self.table_variables
    sparse_ids = {id(v) for v in sparse}
    dense = [v for v in self.trainable_variables if id(v) not in sparse_ids]
    shards = [v for table in self._ps_tables for v in table.shard_variables]
    grads = tape.gradient(loss, dense + sparse + shards)
    self.optimizer.apply_gradients(zip(grads[:len(dense)], dense))
    if sparse:  # A model without id tables (e.g. MSLR's dense features) has none.
      self.sparse_optimizer.apply_gradients(zip(grads[len(dense):len(dense) + len(sparse)], sparse))
    start = len(dense) + len(sparse)
    for table in self._ps_tables:
      table.apply_gradients(grads[start:start + table.num_shards])
      start += table.num_shards
    return self.compute_metrics(x, y, y_pred, sample_weight)


def _restore_input(feature_input, name: str):
  """A Keras Input for a feature's restore indices: the feature's shape, int32."""
  spec = feature_input.type_spec
  if isinstance(spec, tf.RaggedTensorSpec):
    spec = tf.RaggedTensorSpec(spec.shape, tf.int32, spec.ragged_rank, spec.row_splits_dtype)
  elif isinstance(spec, tf.TensorSpec):
    spec = tf.TensorSpec(spec.shape, tf.int32)
  else:
    raise ValueError(f"sparse feature '{name}' must be a dense (FixedLenFeature) or ragged "
                     f"(RaggedFeature) input, got {type(spec).__name__}")
  return tf.keras.Input(type_spec=spec, name=fs.restore_key(name))


class ModelBuilder(tfr.keras.model.ModelBuilder):
  """tfr's ModelBuilder with sparse id features embedded by the sparse core.

  Args:
    input_creator: Returns (context_inputs, example_inputs), as in tfr; it
      includes the sparse id features with their raw spec (int64 or string
      FixedLenFeature, or RaggedFeature for multi-valued ids).
    preprocessor: tfr Preprocessor, or a dict feature -> fn (PreprocessorWithSpec),
      applied after the sparse features became [batch_size, (list_size,) dim]
      float embeddings.
    scorer: tfr Scorer, e.g. DNNScorer.
    mask_feature_name: Name of the [batch_size, list_size] bool mask.
    sparse_features: The SparseFeatures; each must be an input.
    tables: TableSpecs of the tables those features use.
    seed: Seed of the tables' initial rows.
    name: Model name.

  Raises:
    ValueError: a sparse feature naming an unknown table or input.

  Example:

    ```python
    context_spec = {"user_id": tf.io.FixedLenFeature([1], tf.int64, default_value=0)}
    example_spec = {"item_id": tf.io.FixedLenFeature([1], tf.int64, default_value=0),
                    "year": tf.io.FixedLenFeature([1], tf.int64, default_value=0)}
    builder = ModelBuilder(
        input_creator=FeatureSpecInputCreator(context_spec, example_spec),
        preprocessor={"year": lambda t: tf.cast(t, tf.float32) / 2000.0},
        scorer=DNNScorer(hidden_layer_dims=[64, 32], output_units=1),
        mask_feature_name="example_list_mask",
        sparse_features=[SparseFeature("user_id", "user"), SparseFeature("item_id", "item")],
        tables=[TableSpec("user", 16, 2000), TableSpec("item", 16, 4000)])
    model = builder.build()  # after mxrec_pipeline.util.initialize.init()
    ```
  """

  def __init__(self, input_creator: Callable, preprocessor, scorer, mask_feature_name: str,
               sparse_features: Sequence[SparseFeature] = (), tables: Sequence[TableSpec] = (),
               seed: int | None = None, name: str | None = None):
    if isinstance(preprocessor, Mapping):
      preprocessor = PreprocessorWithSpec(dict(preprocessor))
    super().__init__(input_creator, preprocessor, scorer, mask_feature_name, name=name)
    self.tables = {t.name: t for t in tables}
    self.sparse_features = list(sparse_features)
    self.seed = seed
    for feature in self.sparse_features:
      if feature.table not in self.tables:
        raise ValueError(f"sparse feature '{feature.name}' uses table '{feature.table}', "
                         f"not among tables {sorted(self.tables)}")

  def build(self, sharded_tables: Mapping | None = None) -> SparseRankingModel:
    """The model; with `sharded_tables` its sparse features take raw ids.

    Args:
      sharded_tables: None (the default): sparse features come in as the
        input pipeline's insertion results (restore indices and unique rows)
        and are embedded by SparseLookup. Table name -> ShardedTable
        (keras/sharded.py, MultiWorkerMirroredStrategy) or PSShardedTable
        (keras/ps.py, ParameterServerStrategy): they come in as raw ids,
        embedded by ShardedLookup layers; over ShardedTables, every feature
        through one ShardedLookupGroup (one exchange a step).
    """
    context_inputs, example_inputs = self._input_creator()
    mask = tf.keras.Input(shape=(None,), dtype=tf.bool, name=self._mask_feature_name)
    all_inputs = {**context_inputs, **example_inputs}
    model_inputs = dict(all_inputs)
    context_features, example_features = dict(context_inputs), dict(example_inputs)
    sparse_layers = []
    grouped = []  # (ShardedLookup, its features dict): ShardedTables share one exchange.
    unique_rows_inputs = {}
    plan_inputs = {}
    for feature in self.sparse_features:
      if feature.name not in all_inputs:
        raise ValueError(f"sparse feature '{feature.name}' is not among the inputs "
                         f"{sorted(all_inputs)}")
      target = context_features if feature.name in context_inputs else example_features
      if sharded_tables is not None:
        layer = sharded.ShardedLookup(feature, sharded_tables[feature.table],
                                      name=f"sparse_lookup_{feature.name}")
        sparse_layers.append(layer)
        if isinstance(layer.table, sharded.ShardedTable):
          grouped.append((layer, target))  # Looked up below, every feature in one exchange.
        else:
          target[feature.name] = layer(all_inputs[feature.name])
        continue
      restore = _restore_input(all_inputs[feature.name], feature.name)
      model_inputs.pop(feature.name)
      model_inputs[fs.restore_key(feature.name)] = restore
      table = feature.table
      if table not in unique_rows_inputs:
        unique_rows_inputs[table] = tf.keras.Input(shape=(), dtype=tf.int64,
                                                   name=fs.unique_rows_key(table))
        model_inputs[fs.unique_rows_key(table)] = unique_rows_inputs[table]
        if self.tables[table].tiered:
          # The device-cache plan of the batch, [1] int64 (core/tiers.py).
          plan_inputs[table] = tf.keras.Input(shape=(), dtype=tf.int64, name=fs.plan_key(table))
          model_inputs[fs.plan_key(table)] = plan_inputs[table]
      layer = layers.SparseLookup(feature, self.tables[table], seed=self.seed,
                                  name=f"sparse_lookup_{feature.name}")
      sparse_layers.append(layer)
      plan = (plan_inputs[table],) if table in plan_inputs else ()
      target[feature.name] = layer((restore, unique_rows_inputs[table], *plan))
    if grouped:
      group = sharded.ShardedLookupGroup([layer for layer, _ in grouped], name="sharded_lookups")
      embedded = group({layer.feature.name: all_inputs[layer.feature.name] for layer, _ in grouped})
      for layer, target in grouped:  # Each in its feature's place: the dicts' order is kept.
        target[layer.feature.name] = embedded[layer.feature.name]
    context_features, example_features = self.preprocess(context_features, example_features, mask)
    logits = self.score(context_features, example_features, mask)
    model_inputs[self._mask_feature_name] = mask
    ps_tables = [
        t for t in (sharded_tables or {}).values() if isinstance(t, ps_table.PSShardedTable)
    ]
    return SparseRankingModel(inputs=model_inputs, outputs=logits, name=self._name,
                              sparse_layers=sparse_layers, ps_tables=ps_tables)
