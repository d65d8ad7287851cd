"""The export half of a Keras pipeline: the serving SavedModel and what it records of the run.

`PipelineExport` is a base of keras/pipeline.ModelFitPipeline: it restores a
training checkpoint into a model to export in this process
(`restore_for_export`, sharded runs' shard files included), writes the
SavedModel that maps raw ids with stock TF lookup tables (`export_saved_model`,
keras/export.py), and describes the run for manifests and exports
(`run_info`). It uses the pipeline's builders, hparams, placement and
compile functions; it holds no state of its own beyond the export's sources.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from typing import Callable, Iterator, Sequence

import tensorflow as tf

from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.distributed import export as distributed_export
from mxrec_pipeline.keras import callbacks as callbacks_lib
from mxrec_pipeline.keras import export as export_lib
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import placed_models
from mxrec_pipeline.keras import restoring
from mxrec_pipeline.keras import sharded
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.keras.strategies import TablePlacement
from mxrec_pipeline.keras.training import ranking_results
from mxrec_pipeline.util import model_files

# TableSpec fields that shape a table's saved state; a checkpoint restores only onto the same.
_SAVED_TABLE_FIELDS = ("dim", "key_dtype", "device_vocabulary_size", "host_vocabulary_size",
                       "ssd_vocabulary_size")


class PipelineExport:
  """Restore for export, the serving export and the run's description of a ModelFitPipeline.

  Expects the attributes ModelFitPipeline sets (`_model_builder`,
  `_dataset_builder`, `_hparams`, `_placement`, `_strategy_in_use`,
  `_sharded_tables`, `_export_source`, `_export_scratch`, `_export_snapshots`, `_exports`,
  `_faults`, `_run_config`) and its `_compile`, `_sparse_optimizer`, `_use`, `_keeps_best`,
  `build_metrics` and `build_loss`.
  """

  def restore_for_export(self, checkpoint: str) -> tf.keras.Model:
    """The model of training checkpoint `checkpoint` (a `ckpt-<N>` prefix), in this process.

    For `export_saved_model` (jobs.export), with no cluster. A single-process
    run's checkpoint restores into `build_compiled_model()`. A sharded run's
    (MultiWorkerMirroredStrategy workers or ParameterServerStrategy ps
    tasks: its tables in `shards-<N>` beside `ckpt-<N>`) restores the dense
    model into the raw-id model those runs train (ShardedLookup layers);
    `export_saved_model` then builds each table's serving snapshot from its
    shard files, one at a time (distributed/export.files_snapshot: keys and
    rows, no slots; a tiered table's rows of every tier), so it writes the
    same SavedModel as the run's own export and holds the rows once.

    Call after init(). Every table's shards are checked before anything is
    built from them.

    Raises:
      FileNotFoundError: a table's shards are missing or unreadable (e.g. a
        shard file or its data file), naming the table and the file.
      ValueError: shards of jobs of different sizes in one table's
        directory; a model builder that is not a ModelBuilder (sharded runs
        only); table rows of another dim; a variable of another shape than
        the checkpoint's (TF's restore); a variable the checkpoint lacks
        (e.g. a config with more hidden layers than the run's), named.
    """
    self._export_source = self._export_snapshots = None
    number = int(checkpoint.rsplit("-", 1)[1])
    shards_dir = table_checkpoints.shards_path(os.path.dirname(checkpoint), number)
    placement = manifest.tables_placement(checkpoint)
    if placement == TablePlacement.ONE_HOST.value or (placement is None and
                                                      not tf.io.gfile.isdir(shards_dir)):
      model = self.build_compiled_model()
      restoring.restore_one_host(model, checkpoint, shards_dir)
      return model
    if not isinstance(self._model_builder, model_lib.ModelBuilder):
      raise ValueError(f"{checkpoint} is a sharded run's checkpoint ({shards_dir}): its tables "
                       "export through an mxrec_pipeline ModelBuilder; got "
                       f"{type(self._model_builder).__name__}")
    if len(table_checkpoints.chain(os.path.dirname(checkpoint), number)) > 1:  # A delta.
      self._export_scratch = tempfile.mkdtemp(prefix="mxrec-export-")
      shards_dir = table_checkpoints.full_shards_in(os.path.dirname(checkpoint), number,
                                                    self._model_builder.tables,
                                                    self._export_scratch)
    for name in self._model_builder.tables:  # Checks every shard before anything is built.
      checkpoint_lib.saved_key_count(shards_dir, name)
    specs = [  # Unused rows: the export reads the shard files (tiered ones hold every tier's).
        dataclasses.replace(spec, host_vocabulary_size=0, ssd_vocabulary_size=0, ssd_data_path=())
        for spec in self._model_builder.tables.values()
    ]
    strategy = tf.distribute.get_strategy()  # One replica: one shard holding every key.
    model = self._use(
        placed_models.sharded_model(strategy, self._model_builder, self._dataset_builder,
                                    self._hparams, self._compile, self._sparse_optimizer,
                                    specs=specs, build_slots=False))
    self._placement = TablePlacement.WORKERS
    restoring.restore_dense_variables(model, self._sharded_tables.values(), checkpoint)
    self._export_source = shards_dir
    self._strategy_in_use = strategy
    return model

  def export_saved_model(self, model, export_to: str) -> str | None:
    """Exports a SavedModel that scores raw ids; see export.export_serving_model.

    Tables sharded over workers: every worker calls it; the others stage
    their shards, the chief writes the SavedModel and returns `export_to`,
    the others return None.
    """
    snapshots = staging = None
    if self._export_source is not None:  # restore_for_export of a sharded run's checkpoint.
      snapshots = self._restored_snapshots()
    elif self._placement.sharded:  # Built one shard at a time by the chief, or the coordinator.
      self._exports += 1
      staging = distributed_export.staging_path(self._shard_dir(), self._exports)
      strategy = self._strategy_in_use
      snapshots = sharded.snapshots(self._sharded_tables, staging,
                                    lambda: table_checkpoints.barrier(strategy))
      if snapshots is None:  # Another worker exports; this one wrote its shards.
        return None
    try:
      return self._export_with(model, export_to, snapshots)
    finally:
      if staging is not None:
        distributed_export.remove_staging(staging)

  def export_latest(self, model,
                    callbacks: Sequence[tf.keras.callbacks.Callback] = ()) -> str | None:
    """Exports `model` as `model_dir/export/latest_model` at the end of training.

    When the run's BestModelExporter (among `callbacks`) wrote its export at
    the last epoch end, on one host, that export serves this very model: it
    is copied (without its best_metric.json) instead of exported again (a
    SavedModel export traces and serializes the serving functions: seconds).
    Otherwise `export_saved_model`. Returns as it does.
    """
    latest = os.path.join(self._hparams.model_dir, "export", "latest_model")
    best = self._best_exporter(callbacks)
    if self._keeps_best and best is None:
      print(
          "early stopping (keep_best): no epoch was exported as the best (a NaN metric?); "
          "latest_model is the last epoch's model", flush=True)
    if self._keeps_best and best is not None:  # One host (EarlyStopping): its best export.
      return export_lib.copy_export(best.path, latest, ignore=[best.STATE_FILE],
                                    before_rename=lambda _: self._faults.reach("export"))
    if best is None or not best.current or self._placement.sharded:
      return self.export_saved_model(model, latest)
    return export_lib.copy_export(best.path, latest, ignore=[best.STATE_FILE],
                                  before_rename=lambda _: self._faults.reach("export"))

  @staticmethod
  def _best_exporter(callbacks) -> callbacks_lib.BestModelExporter | None:
    """The run's BestModelExporter among `callbacks` that has written an export, or None."""
    best = next((c for c in callbacks if isinstance(c, callbacks_lib.BestModelExporter)), None)
    return best if best is not None and tf.io.gfile.isdir(best.path) else None

  def evaluate_export(self, export_dir: str) -> dict[str, float]:
    """RANKING_METRICS and "loss" of the export in `export_dir` on the validation data.

    As `train_and_validate` returns them (export.evaluate_export: the
    export's serving_default signature on the whole validation lists).
    """
    results = export_lib.evaluate_export(export_dir, self._dataset_builder, self.build_metrics(),
                                         self.build_loss())
    return ranking_results(results)

  @contextlib.contextmanager
  def serving_scorer(self, model) -> Iterator[Callable[[dict], tf.Tensor]]:
    """Scores raw features with `model` as its export would serve them, while open.

    For the model `restore_for_export` returned (mxrec_pipeline/sidecar.py
    validates checkpoints with it): yields features (as
    `build_raw_valid_dataset` gives them) -> [batch_size, list_size] float32
    scores, computed by the ServingModule `export_saved_model` saves (the
    same snapshots of the tables: absent ids read the zero row).
    """
    snapshots = self._restored_snapshots() if self._export_source is not None else None
    with export_lib.serving_module(model, *self._serving_features(), snapshots,
                                   self._feature_deriver()) as module:
      score = tf.function(lambda features: module.score(features)[export_lib.OUTPUT_KEY])
      yield score

  def _restored_snapshots(self) -> dict:
    """Table name -> serving snapshot of the shards restore_for_export found, read once."""
    if self._export_snapshots is None:
      try:
        self._export_snapshots = {
            name: distributed_export.files_snapshot(self._export_source, name)
            for name in self._sharded_tables
        }
      finally:
        if self._export_scratch is not None:
          model_files.remove(self._export_scratch)
          self._export_scratch = None
    return self._export_snapshots

  def _shard_dir(self) -> str:
    """Where every worker writes table shards (checkpoints, export staging)."""
    return self._shard_checkpoint_dir or os.path.join(self._hparams.model_dir, "checkpoints")

  def _serving_features(self) -> tuple:
    """(context spec, example spec, mask name, sparse features) of what the export serves."""
    builder = self._dataset_builder
    return (
        builder._context_feature_spec,  # pylint: disable=protected-access
        builder._example_feature_spec,  # pylint: disable=protected-access
        builder._mask_feature_name,  # pylint: disable=protected-access
        builder.sparse_features)

  def _export_with(self, model, export_to: str, snapshots) -> str:
    return export_lib.export_serving_model(model, export_to, *self._serving_features(),
                                           before_rename=lambda _: self._faults.reach("export"),
                                           snapshots=snapshots, run_info=self.run_info(),
                                           feature_deriver=self._feature_deriver())

  def _feature_deriver(self):
    """The dataset builder's FeatureDeriver (keras/datasets.py), which exports run too, or None."""
    return getattr(self._dataset_builder, "feature_deriver", None)

  def run_info(self) -> dict:
    """What every checkpoint manifest and export records of this run: tables and config.

    {"tables": table name -> the TableSpec fields that shape its saved state
    (None for a model builder that declares no tables), "config": the job
    config the pipeline was given (`run_config`), else the PipelineHparams,
    "placement": {"tables": "one_host", "workers" or "parameter_servers",
    "replicas"}}. (Checkpoint format 2 recorded "table_rows" too, the
    checkpoint keys of one-host tables' rows, which keras/warm_start.py reads.)
    """
    tables = getattr(self._model_builder, "tables", None)
    strategy = self._strategy_in_use
    return {
        "placement": {
            "tables": self._placement.value,
            "replicas": strategy.num_replicas_in_sync if strategy is not None else 1
        },
        "tables": None if tables is None else {
            name: {field: getattr(spec, field) for field in _SAVED_TABLE_FIELDS}
            for name, spec in tables.items()
        },
        "config": self._run_config if self._run_config is not None else json.loads(
            json.dumps(dataclasses.asdict(self._hparams), default=str)),
    }
