"""Keras side of tables sharded over parameter servers (distributed.PSShardedTable).

Under ParameterServerStrategy the pipeline (keras/pipeline.py) trains with
`model.fit` on the chief, the coordinator: Keras' ClusterCoordinator schedules
every step on a worker, dense variables live on the ps tasks (TF places
them). Every table of the model becomes a PSShardedTable (`create_ps_tables`,
outside the strategy's scope: shard i on ps task i) read by `ShardedLookup`
layers (keras/sharded.py) with the feature's raw ids, so ids are inserted and
rows gathered on the owning ps inside the train step, and
SparseRankingModel.train_step hands each table its shard gradients
(`PSShardedTable.apply_gradients`: the hash optimizer's row update on the
owner ps). See docs/distributed.md "Parameter servers".

Also here: each worker's training data (`per_worker_dataset`, Keras'
DatasetCreator) and validation on the coordinator (`evaluate_on_coordinator`,
`CoordinatorValidation`). Checkpoints (keras/table_checkpoints.py) and serving
snapshots (keras/sharded.snapshots) take any table of the protocol.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import tensorflow as tf

from mxrec_pipeline.core import tiers as tiers_lib
from mxrec_pipeline.distributed.ps_table import PSShardedTable
from mxrec_pipeline.keras import layers


def create_ps_tables(strategy: tf.distribute.Strategy, specs: Iterable[layers.TableSpec], optimizer,
                     seed: int | None = None) -> dict[str, PSShardedTable]:
  """One PSShardedTable per spec, shard i on ps task i. Call outside `strategy.scope()`.

  Rows per shard are the spec's device_vocabulary_size (so P ps tasks hold up
  to P times a single-process table's keys); initial rows by
  layers.table_initializer (random ones are drawn per shard; "zeros" gives
  one process's). A tiered spec (host_vocabulary_size > 0) gives every
  shard the spec's tiers on its ps task (distributed/ps_tiers.py): a device
  cache of device_vocabulary_size rows, host_vocabulary_size host rows,
  ssd_vocabulary_size SSD rows in `<ssd_data_path>/shard_<i>`, each per
  shard, the rows drawn per global row of the shard (RowInitializer).

  Args:
    strategy: The ParameterServerStrategy.
    specs: The model's TableSpecs.
    optimizer: The tables' hash optimizer (HashOptimizer); its slots are
      created beside each shard.
    seed: The run's seed, or None.

  Returns:
    Table name -> PSShardedTable.

  Raises:
    ValueError: bad tier arguments (core/tiers.check_tier_args: e.g. a
      missing SSD directory), naming the table; anything PSShardedTable
      refuses.
  """
  tables = {}
  for spec in specs:
    tier_config = tiers_lib.check_tier_args(spec.name, spec.device_vocabulary_size,
                                            spec.host_vocabulary_size, spec.ssd_vocabulary_size,
                                            list(spec.ssd_data_path), spec.cache_policy, tf.float32)
    tables[spec.name] = PSShardedTable(strategy, name=spec.name, dim=spec.dim,
                                       device_vocabulary_size=spec.device_vocabulary_size,
                                       optimizer=optimizer,
                                       emb_initializer=layers.table_initializer(spec, seed),
                                       key_dtype=tf.as_dtype(spec.key_dtype), tiers=tier_config)
  return tables


def per_worker_dataset(
    build_epoch: Callable[[], tf.data.Dataset]) -> tf.keras.utils.experimental.DatasetCreator:
  """The DatasetCreator of an epoch under ParameterServerStrategy: each worker its part, repeated.

  Worker w of W (tf.distribute.InputContext.input_pipeline_id of
  num_input_pipelines) takes batches w, w + W, w + 2W, ... of `build_epoch()`
  and repeats them: ClusterCoordinator hands the epoch's steps to whichever
  worker is free, so a worker must not run dry before the coordinator has
  scheduled steps_per_epoch steps (TF's PS training tutorial repeats for the
  same reason). With equally fast workers each trains about its own part
  once; a faster one may start its part again while a slower one has not
  finished.

  Args:
    build_epoch: Builds the epoch's (features, labels) batches; called on
      each worker's dataset (traced by the coordinator, run on the worker).
  """

  def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    return build_epoch().shard(context.num_input_pipelines, context.input_pipeline_id).repeat()

  return tf.keras.utils.experimental.DatasetCreator(dataset_fn)


def evaluate_on_coordinator(model: tf.keras.Model, dataset: tf.data.Dataset,
                            metrics: Sequence[tf.keras.metrics.Metric]) -> dict[str, float]:
  """Metrics of `model` over one pass of `dataset`, computed by the coordinator itself.

  Each batch runs in this process (a tf.function; dense variables and table
  rows are read from the ps tasks, no id is inserted: unseen ids read zeros,
  as in single-process evaluation), so every batch counts exactly once,
  whatever the workers do. Keras' `model.evaluate` under
  ParameterServerStrategy would schedule batches on workers with per-worker
  copies of the data instead.

  Args:
    model: The trained, compiled SparseRankingModel (its variables on the ps
      tasks).
    dataset: (features, labels[, sample_weight]) batches with raw ids.
    metrics: Fresh metric objects, created outside the strategy's scope.

  Returns:
    Metric name -> value, plus "loss": the compiled loss with the model's
    regularization losses, averaged over batches weighted by batch size, as
    Keras' evaluate reports it.
  """
  loss_mean = tf.keras.metrics.Mean(name="loss")

  @tf.function
  def step(data):
    x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
    y_pred = model(x, training=False)
    # The compiled loss (Keras allows its reduction under a strategy); its
    # running mean, reset by Keras at each fit or evaluate, is not read here.
    batch_loss = model.compiled_loss(y, y_pred, sample_weight, regularization_losses=model.losses)
    loss_mean.update_state(batch_loss, sample_weight=tf.shape(y_pred)[0])
    for metric in metrics:
      metric.update_state(y, y_pred, sample_weight)

  for data in dataset:
    step(data)
  return {m.name: float(m.result()) for m in [*metrics, loss_mean]}


class CoordinatorValidation(tf.keras.callbacks.Callback):
  """Validates on the coordinator at the end of each epoch, adding `val_*` to the epoch's logs.

  Keras 2.15's fit validates under ParameterServerStrategy by scheduling
  batches on the workers; this callback runs `evaluate_on_coordinator`
  instead and writes its results into the logs as fit's validation would
  ("val_loss", "val_ndcg_10", ...). Put it first in the callback list: the
  callbacks after it (checkpoint, best-model export, TensorBoard, History)
  then see the validation metrics in the same logs.

  Args:
    evaluate: () -> metric name -> value (e.g. a partial of
      evaluate_on_coordinator with fresh metrics each call).
  """

  def __init__(self, evaluate: Callable[[], dict[str, float]]):
    super().__init__()
    self._evaluate = evaluate

  def on_epoch_end(self, epoch, logs=None):
    if logs is not None:
      logs.update({f"val_{name}": value for name, value in self._evaluate().items()})
