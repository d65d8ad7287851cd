"""SavedModel export that serves raw ids with plain TensorFlow.

`export_serving_model` exports each table as a compact snapshot: the rows of
its key index's keys plus a default row, [num_keys + 1, dim] (core/key_index.py
`to_compact_table`; flat and tiered tables alike), with a
core/sorted_key_table.SortedKeyTable key -> position (keys in a variable, so
`saved_model.pb` does not grow with them; absent keys: the default, zero,
row). The exported functions map raw ids with `tf.unique` and those tables,
through the input pipeline's `insert_ids` layout, then run the trained model
with training=False. The SavedModel holds the model's layers but not its
tables' full variables, optimizers or metrics, and loads with `tensorflow`
alone. It is written beside its directory and renamed into place.

Signatures:
  serving_default(examples: [batch_size] string, serialized ELWC protos)
      -> {"scores": [batch_size, list_size] float32}; padded positions score
      tfr's padding value.
  predict(<one input per feature, raw dtype; mask>) -> {"scores": ...}; only
      when every feature is dense (a ragged feature has no dense raw form).
See docs/architecture.md#serving.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Callable, Iterator, Mapping, Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

import mxrec_pipeline
from mxrec_pipeline.core import lookup as core_lookup
from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import helper
from mxrec_pipeline.keras import datasets
from mxrec_pipeline.keras.layers import SparseFeature, SparseLookup, set_serving_snapshot
from mxrec_pipeline.keras.sharded import ShardedLookup
from mxrec_pipeline.keras.sharded import ShardedLookupGroup
from mxrec_pipeline.util import atomic_dir
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util import local_variable
from mxrec_pipeline.util import model_files
from mxrec_pipeline.util import storage

SERVING_INPUT = "examples"
# The run an export came from: {"version", "run": {"tables", "config"}} (not read by serving).
RECORD_FILE = os.path.join("assets.extra", "mxrec_pipeline.json")
OUTPUT_KEY = "scores"


class ServingModule(tf.Module):
  """What the SavedModel holds: the model's layers and one compact snapshot per table.

  Tracks (hence saves) the model's layers other than its SparseLookups, and
  per table `serving_rows[table]` ([num_keys + 1, dim] float32 variable) and
  `lookup_tables[table]` (SortedKeyTable int64 key -> int64 position in it);
  the model itself is not tracked, so its tables' full variables, optimizers
  and metrics stay out of the SavedModel.

  Args:
    model: The trained SparseRankingModel.
    context_feature_spec, example_feature_spec: tf.io feature specs of the raw
      features (as the dataset builder's).
    mask_feature_name: Name of the list mask.
    sparse_features: The model's SparseFeatures.
    snapshots: None, or for a model whose tables are sharded over workers
      (its ShardedLookups take raw ids), table name -> keras/sharded.Snapshot
      gathered from every shard: then no id is inserted when serving, the
      layers read these snapshots.
    feature_deriver: None, or the dataset builder's FeatureDeriver: its
      features are computed from the raw ones first (training=False).
  """

  def __init__(self, model, context_feature_spec, example_feature_spec, mask_feature_name: str,
               sparse_features: Sequence[SparseFeature], snapshots: Mapping | None = None,
               feature_deriver: datasets.FeatureDeriver | None = None):
    super().__init__(name="mxrec_serving")
    object.__setattr__(self, "_model", model)  # Untracked: see the class docstring.
    object.__setattr__(self, "_derive", feature_deriver)
    self.model_layers = [
        layer for layer in model.layers
        if not isinstance(layer, (SparseLookup, ShardedLookup, ShardedLookupGroup))
    ]
    self._context_spec = dict(context_feature_spec)
    self._example_spec = dict(example_feature_spec)
    self._mask = mask_feature_name
    specs = [fs.FeatureSpec(f.name, table_name=f.table) for f in sparse_features]
    self._by_table = helper.group_by_table(specs)
    self.lookup_tables = {}
    self.serving_rows = {}
    self._raw_ids = snapshots is not None
    if snapshots is not None:
      self._tiered = []
      for name in self._by_table:
        self.lookup_tables[name] = snapshots[name].positions
        self.serving_rows[name] = snapshots[name].rows
      return
    tables = initialize.get_config_initializer().tables
    self._tiered = [name for name in self._by_table if tables[name].is_tiered]
    for name in self._by_table:
      table = tables[name]
      positions, rows = table.key_index.to_compact_table(
          functools.partial(core_lookup.unique_embeddings, table, training=False))
      self.lookup_tables[name] = positions
      self.serving_rows[name] = local_variable.local_variable(rows, f"{name}_serving_rows")

  def _stock_insert(self, table_name, keys):
    unique_keys, restore = tf.unique(keys, out_idx=tf.int32)
    return self.lookup_tables[table_name].lookup(unique_keys), restore

  def score(self, features: dict) -> dict:
    """Scores raw features (as tfr's ELWC parsing gives them): {"scores": [B, L]}."""
    if self._derive is not None:
      features = self._derive(dict(features), False)
    if self._raw_ids:  # ShardedLookups read raw ids.
      inputs = dict(features)
    else:
      inputs = helper.insert_ids(dict(features), self._by_table, self._stock_insert)
    for name in self._tiered:  # Tiered tables' plan input: unused when serving.
      inputs[fs.plan_key(name)] = tf.zeros([1], tf.int64)
    model_inputs = {name: inputs[name] for name in self._model.input_names}
    return {OUTPUT_KEY: self._model(model_inputs, training=False)}

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


@contextlib.contextmanager
def serving_module(
    model, context_feature_spec, example_feature_spec, mask_feature_name: str,
    sparse_features: Sequence[SparseFeature], snapshots: Mapping | None = None,
    feature_deriver: datasets.FeatureDeriver | None = None) -> Iterator[ServingModule]:
  """The ServingModule of `model`, its sparse layers reading the snapshots while open.

  What `export_serving_model` saves, usable in this process too:
  `module.score(features)` scores raw features as the export serves them
  (mxrec_pipeline/sidecar.py validates checkpoints with it). Arguments as
  `export_serving_model`'s. On exit the layers read their tables again.
  """
  module = ServingModule(model, context_feature_spec, example_feature_spec, mask_feature_name,
                         sparse_features, snapshots, feature_deriver)
  sparse_layers = [
      layer for layer in getattr(model, "_sparse_layers", [])
      if layer.feature.table in module.serving_rows
  ]
  try:
    for layer in sparse_layers:  # The serving functions read the snapshots.
      name = layer.feature.table
      set_serving_snapshot(layer, module.serving_rows[name],
                           module.lookup_tables[name] if isinstance(layer, ShardedLookup) else None)
    yield module
  finally:
    for layer in sparse_layers:
      set_serving_snapshot(layer, None)


def export_serving_model(model, export_dir: str, context_feature_spec, example_feature_spec,
                         mask_feature_name: str, sparse_features: Sequence[SparseFeature],
                         before_rename: Callable[[str], None] | None = None,
                         snapshots: Mapping | None = None, run_info: dict | None = None,
                         feature_deriver: datasets.FeatureDeriver | None = None) -> str:
  """Writes a SavedModel that scores raw ids; see the module docstring.

  The SavedModel is written to a temporary directory beside `export_dir`,
  then renamed into place, replacing an earlier export
  (`atomic_dir.write_dir_atomically`); leftovers of killed exports to
  `export_dir` are removed first.

  Args:
    model: The trained SparseRankingModel.
    export_dir: Output directory (replaced if present).
    context_feature_spec, example_feature_spec: Raw feature specs.
    mask_feature_name: Name of the list mask.
    sparse_features: The model's SparseFeatures.
    snapshots: Tables sharded over workers: table name -> their gathered
      keras/sharded.Snapshot (see ServingModule).
    before_rename: Called with the temporary directory once the SavedModel
      is written there, before it is renamed to export_dir (tests; the
      `export` fault point).
    run_info: What to record of the run (ModelFitPipeline.run_info): written
      with the project version to `assets.extra/mxrec_pipeline.json`.
    feature_deriver: The dataset builder's FeatureDeriver, or None: the
      export computes its features from the raw ones (stock TF ops).

  Returns:
    export_dir.
  """
  with serving_module(model, context_feature_spec, example_feature_spec, mask_feature_name,
                      sparse_features, snapshots, feature_deriver) as module:
    signatures = {
        "serving_default": tf.function(
            module.serve_elwc,
            input_signature=[tf.TensorSpec([None], tf.string, name=SERVING_INPUT)])
    }
    raw = module.raw_input_signature()
    if raw is not None:
      signatures["predict"] = tf.function(
          lambda **features: module.score(features)).get_concrete_function(**raw)

    def write(path):
      tf.saved_model.save(module, path, signatures=signatures)
      tf.io.gfile.makedirs(os.path.join(path, "assets.extra"))
      with tf.io.gfile.GFile(os.path.join(path, RECORD_FILE), "w") as f:
        f.write(
            json.dumps({"version": mxrec_pipeline.__version__, "run": run_info or {}}, indent=1,
                       sort_keys=True))

    with storage.full_storage_named(f"export {os.path.basename(export_dir)}", export_dir,
                                    "the previous export there is intact"):
      atomic_dir.write_dir_atomically(export_dir, write, before_rename=before_rename)
  return export_dir


def copy_export(source: str, export_dir: str, ignore: Sequence[str] = (),
                before_rename: Callable[[str], None] | None = None) -> str:
  """Writes a copy of the export `source` as `export_dir`, as `export_serving_model` writes one.

  For an export of a model whose state `source` already serves (a run whose
  last epoch was its best: latest_model is then best_model_by_metric's
  SavedModel). Beside `export_dir`, then renamed into place; `ignore`: file
  names (fnmatch patterns) not copied; `before_rename` as
  export_serving_model's.

  Returns:
    export_dir.
  """
  with storage.full_storage_named(f"export {os.path.basename(export_dir)}", export_dir,
                                  "the previous export there is intact"):
    atomic_dir.write_dir_atomically(export_dir,
                                    lambda path: model_files.copy_tree(source, path, ignore),
                                    before_rename=before_rename)
  return export_dir


def evaluate_export(export_dir: str, builder, metrics: Sequence[tf.keras.metrics.Metric],
                    loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]) -> dict[str, float]:
  """The validation metrics and mean batch loss of the SavedModel in `export_dir`.

  Scores `builder.build_serialized_valid_dataset()` with the export's
  serving_default signature, as a client would, against the labels of
  `build_raw_valid_dataset(all_lists=True)` (the same lists); with the
  builder's `skip_lists_without_relevant`, lists without a relevant document
  are left out, as validation leaves them out.

  Args:
    export_dir: An export of `export_serving_model`.
    builder: A keras/datasets.BaseDatasetBuilder of the data to score.
    metrics: Keras metrics (fresh), updated with (labels, scores).
    loss: (labels, scores) -> scalar loss of a batch.

  Returns:
    {metric name: value} and "loss": the mean of the batches' losses
    (unweighted by their sizes, unlike Keras' evaluate). Lists are scored
    whole, even where `valid_list_size` cuts them for validation.

  Raises:
    ValueError: the serialized and parsed batches do not pair up.
  """
  serve = tf.saved_model.load(export_dir).signatures["serving_default"]
  losses = []
  batches = tf.data.Dataset.zip(
      (builder.build_serialized_valid_dataset(), builder.build_raw_valid_dataset(all_lists=True)))
  for serialized, (_, labels) in batches:
    if serialized.shape[0] != labels.shape[0]:
      raise ValueError(f"evaluate_export: a batch of {serialized.shape[0]} serialized lists "
                       f"beside {labels.shape[0]} parsed ones: the two readings differ")
    scores = serve(**{SERVING_INPUT: serialized})[OUTPUT_KEY]
    # The export pads to the batch's longest list, the dataset to valid_list_size.
    width = tf.shape(labels)[1]
    scores = tf.pad(scores, [[0, 0], [0, tf.maximum(width - tf.shape(scores)[1], 0)]])[:, :width]
    if builder.skip_lists_without_relevant:
      kept, labels = datasets.lists_with_relevant({"scores": scores}, labels)
      scores = kept["scores"]
      if int(tf.size(labels)) == 0:
        continue
    for metric in metrics:
      metric.update_state(labels, scores)
    losses.append(float(loss(labels, scores)))
  results = {metric.name: float(metric.result()) for metric in metrics}
  return results | {"loss": sum(losses) / len(losses) if losses else float("nan")}
