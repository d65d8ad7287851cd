"""SavedModel export that serves raw ids with plain TensorFlow.

Each table's native key index is turned, at export time, into a stock
`tf.lookup.StaticHashTable` (key -> row, -1 when absent). A tiered table
(core/tiers.py) is exported as a compact snapshot of its rows from every tier,
[num_keys, dim], with a stock table key -> position in it. The exported
functions map raw ids to (unique rows, restore indices) with `tf.unique` and
those tables, through the same `insert_ids` layout the input pipeline uses, then
run the trained Keras model with training=False, so ids never trained read the
default (zero) embedding. Loading needs only `tensorflow`: no custom-op library,
no import of this project.

Signatures:
  serving_default(examples: [batch_size] string, serialized ELWC protos)
      -> {"scores": [batch_size, list_size] float32}; padded positions score
      tfr's padding value.
  predict(<one input per feature, raw dtype; mask>) -> {"scores": ...}; only
      when every feature is dense (a ragged multi-valued feature has no dense
      raw-tensor form).
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import helper
from mxrec_pipeline.keras.layers import SparseFeature
from mxrec_pipeline.util import initialize

SERVING_INPUT = "examples"
OUTPUT_KEY = "scores"


class ServingModule(tf.Module):
  """What the SavedModel holds: the Keras model and one stock table per table.

  Args:
    model: The trained SparseRankingModel.
    context_feature_spec, example_feature_spec: tf.io feature specs of the raw
      features (as the dataset builder's).
    mask_feature_name: Name of the list mask.
    sparse_features: The model's SparseFeatures.
  """

  def __init__(self, model, context_feature_spec, example_feature_spec, mask_feature_name: str,
               sparse_features: Sequence[SparseFeature]):
    super().__init__(name="mxrec_serving")
    self.model = model
    self._context_spec = dict(context_feature_spec)
    self._example_spec = dict(example_feature_spec)
    self._mask = mask_feature_name
    specs = [fs.FeatureSpec(f.name, table_name=f.table) for f in sparse_features]
    self._by_table = helper.group_by_table(specs)
    tables = initialize.get_config_initializer().tables
    self.lookup_tables = {}
    self.serving_rows = {}
    for name in self._by_table:
      table = tables[name]
      if not table.is_tiered:
        self.lookup_tables[name] = table.key_index.to_stock_table()
        continue
      # A tiered table's rows live in three tiers: export a compact snapshot,
      # key -> position in it, which plain TensorFlow serves.
      keys, global_rows = table.key_index.export()
      self.serving_rows[name] = tf.Variable(table.tiers.read(table.variable, global_rows),
                                            trainable=False, name=f"{name}_serving_rows")
      self.lookup_tables[name] = tf.lookup.StaticHashTable(
          tf.lookup.KeyValueTensorInitializer(keys, tf.range(tf.size(keys, out_type=tf.int64))),
          default_value=-1, name=f"{name}_rows")

  def _stock_insert(self, table_name, keys):
    unique_keys, restore = tf.unique(keys, out_idx=tf.int32)
    return self.lookup_tables[table_name].lookup(unique_keys), restore

  def score(self, features: dict) -> dict:
    """Scores raw features (as tfr's ELWC parsing gives them): {"scores": [B, L]}."""
    inputs = helper.insert_ids(dict(features), self._by_table, self._stock_insert)
    for name in self.serving_rows:  # Tiered tables' plan input: unused when serving.
      inputs[fs.plan_key(name)] = tf.zeros([1], tf.int64)
    model_inputs = {name: inputs[name] for name in self.model.input_names}
    return {OUTPUT_KEY: self.model(model_inputs, training=False)}

  def serve_elwc(self, serialized: tf.Tensor) -> dict:
    """Parses [batch_size] serialized ELWC protos with tfr, then scores them."""
    features = tfr.data.parse_from_example_list(serialized, context_feature_spec=self._context_spec,
                                                example_feature_spec=self._example_spec,
                                                mask_feature_name=self._mask)
    return self.score(features)

  def raw_input_signature(self) -> dict[str, tf.TensorSpec] | None:
    """TensorSpecs of the raw features and mask, or None if one is not dense."""
    specs = {}
    for is_example, feature_spec in ((False, self._context_spec), (True, self._example_spec)):
      for name, spec in feature_spec.items():
        if not isinstance(spec, tf.io.FixedLenFeature):
          return None
        shape = [None] + ([None] if is_example else []) + list(spec.shape)
        specs[name] = tf.TensorSpec(shape, spec.dtype, name=name)
    specs[self._mask] = tf.TensorSpec([None, None], tf.bool, name=self._mask)
    return specs


def export_serving_model(model, export_dir: str, context_feature_spec, example_feature_spec,
                         mask_feature_name: str, sparse_features: Sequence[SparseFeature]) -> str:
  """Writes a SavedModel that scores raw ids; see the module docstring.

  Args:
    model: The trained SparseRankingModel.
    export_dir: Output directory (replaced if present).
    context_feature_spec, example_feature_spec: Raw feature specs.
    mask_feature_name: Name of the list mask.
    sparse_features: The model's SparseFeatures.

  Returns:
    export_dir.
  """
  module = ServingModule(model, context_feature_spec, example_feature_spec, mask_feature_name,
                         sparse_features)
  tiered_layers = [
      layer for layer in getattr(model, "_sparse_layers", [])
      if layer.feature.table in module.serving_rows
  ]
  try:
    for layer in tiered_layers:  # The serving functions read the snapshots.
      layer.serving_rows = module.serving_rows[layer.feature.table]
    signatures = {
        "serving_default": tf.function(
            module.serve_elwc,
            input_signature=[tf.TensorSpec([None], tf.string, name=SERVING_INPUT)])
    }
    raw = module.raw_input_signature()
    if raw is not None:
      signatures["predict"] = tf.function(
          lambda **features: module.score(features)).get_concrete_function(**raw)
    tf.io.gfile.makedirs(export_dir)
    tf.saved_model.save(module, export_dir, signatures=signatures)
  finally:
    for layer in tiered_layers:
      layer.serving_rows = None
  return export_dir
