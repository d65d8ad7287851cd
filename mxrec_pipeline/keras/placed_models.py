"""The compiled model of a run for where its tables live, and the batches it reads.

`build(placement, strategy, ...)` makes the model of each TablePlacement
(keras/strategies.placement_for decides it): on one host the model builder's
model in the strategy's scope, tables created by its SparseLookup layers; over
MultiWorkerMirroredStrategy workers, ShardedTables (keras/sharded.py) created
outside the scope as each worker's own variables, the dense model mirrored
inside it; over ParameterServerStrategy ps tasks, PSShardedTables
(keras/ps.py). Sharded models look their tables up by raw ids, so the batches
then come from a raw-id copy of the dataset builder (`with_raw_ids`); the
builder the pipeline was given is never changed. Used by
keras/pipeline.ModelFitPipeline (training and restore for export).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Sequence

import tensorflow as tf

from mxrec_pipeline.hparams import (MULTI_WORKER_MIRRORED, PARAMETER_SERVER, PipelineHparams,
                                    Sharding)
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import ps
from mxrec_pipeline.keras import sharded
from mxrec_pipeline.keras.layers import TableSpec
from mxrec_pipeline.keras.strategies import TablePlacement


@dataclasses.dataclass
class PlacedModel:
  """A compiled model, the builder its batches come from, and its sharded tables.

  Attributes:
    model: The compiled SparseRankingModel (or the builder's model).
    data: The dataset builder of its batches: the one given, or its raw-id
      copy when the tables are sharded.
    tables: Table name -> ShardedTable or PSShardedTable; None on one host
      (the tables are the run's, core/embedding.py).
  """

  model: tf.keras.Model
  data: object
  tables: dict | None = None


# compile(model, sparse_optimizer): the pipeline's losses, metrics and optimizers.
Compile = Callable[[tf.keras.Model, object], None]


@contextlib.contextmanager
def generator_rng(enabled: bool):
  """Keras layers built inside draw from tf.random.Generator (when `enabled`).

  A dropout layer's generator state is then a variable, which the training
  checkpoint saves (callbacks.random_generators), so a resumed run draws the
  masks an uninterrupted one would. Keras' process-wide choice is restored on
  exit; layers keep the kind of generator they were built with.
  """
  before = tf.keras.backend.experimental.is_tf_random_generator_enabled()
  if enabled:
    tf.keras.backend.experimental.enable_tf_random_generator()
  try:
    yield
  finally:
    if not before:
      tf.keras.backend.experimental.disable_tf_random_generator()


def build(placement: TablePlacement, strategy: tf.distribute.Strategy,
          model_builder: model_lib.AbstractModelBuilder, dataset_builder, hparams: PipelineHparams,
          compile_model: Compile, new_sparse_optimizer: Callable[[], object]) -> PlacedModel:
  """The compiled model of `placement` under `strategy`; see the module docstring.

  Args:
    placement: Where the tables live (keras/strategies.placement_for).
    strategy: The run's strategy.
    model_builder: The pipeline's model builder.
    dataset_builder: The pipeline's dataset builder.
    hparams: The run's PipelineHparams.
    compile_model: Compiles a model with a given hash optimizer.
    new_sparse_optimizer: Makes the tables' hash optimizer (called once).

  Raises:
    ValueError: a sharded placement with a model builder that is not an
      mxrec_pipeline ModelBuilder (its tables unknown), or a table the
      placement cannot hold (see `sharded_model`, `ps_model`).
  """
  if placement is TablePlacement.PARAMETER_SERVERS:
    return ps_model(strategy, model_builder, dataset_builder, hparams, compile_model,
                    new_sparse_optimizer())
  if placement is TablePlacement.WORKERS:
    return sharded_model(strategy, model_builder, dataset_builder, hparams, compile_model,
                         new_sparse_optimizer)
  with strategy.scope(), generator_rng(hparams.seed is not None):
    model = model_builder.build()  # Its SparseLookup layers create the run's tables.
    compile_model(model, new_sparse_optimizer())
  return PlacedModel(model, dataset_builder)


def ps_model(strategy: tf.distribute.Strategy, model_builder, dataset_builder,
             hparams: PipelineHparams, compile_model: Compile, sparse_optimizer) -> PlacedModel:
  """The compiled model with its tables sharded over the ps tasks (keras/ps.py).

  The PSShardedTables (rows, key indexes, hash-optimizer slots) are created
  outside the strategy's scope, shard i on ps task i; the dense model and its
  optimizer inside it (TF places them on the ps tasks).

  Raises:
    ValueError: a model builder that is not a ModelBuilder, or bad tier
      arguments of a table.
  """
  if not isinstance(model_builder, model_lib.ModelBuilder):
    raise ValueError(f"{PARAMETER_SERVER} shards the tables of an mxrec_pipeline ModelBuilder; "
                     f"got {type(model_builder).__name__}")
  tables = ps.create_ps_tables(strategy, model_builder.tables.values(), sparse_optimizer,
                               model_builder.seed)
  with strategy.scope(), generator_rng(hparams.seed is not None):
    model = model_builder.build(sharded_tables=tables)
    compile_model(model, sparse_optimizer)
  return PlacedModel(model, raw_id_builder(dataset_builder), tables)


def sharded_model(strategy: tf.distribute.Strategy, model_builder, dataset_builder,
                  hparams: PipelineHparams, compile_model: Compile,
                  new_sparse_optimizer: Callable[[],
                                                 object], specs: Sequence[TableSpec] | None = None,
                  build_slots: bool = True) -> PlacedModel:
  """The compiled model with its tables sharded by key over the workers (keras/sharded.py).

  The ShardedTables of `specs` (default: the model builder's), routed as
  `hparams.sharding` says, and the hash optimizer (with its slots unless not
  `build_slots`: a model restored to export only) are created outside the
  strategy's scope, as each worker's own variables; the dense model and its
  optimizer inside it, mirrored.

  Raises:
    ValueError: a model builder that is not a ModelBuilder, or a tiered table.
  """
  if not isinstance(model_builder, model_lib.ModelBuilder):
    raise ValueError(
        f"{MULTI_WORKER_MIRRORED} with {strategy.num_replicas_in_sync} workers shards the "
        f"tables of an mxrec_pipeline ModelBuilder; got {type(model_builder).__name__}")
  tables = sharded.create_sharded_tables(strategy, specs or model_builder.tables.values(),
                                         model_builder.seed, hparams.collective_timeout_s or 0.0,
                                         routing=Sharding.from_dict(hparams.sharding).routing)
  sparse_optimizer = new_sparse_optimizer()
  if build_slots:
    sparse_optimizer.build([table.variable for table in tables.values()])
  with strategy.scope(), generator_rng(hparams.seed is not None):
    model = model_builder.build(sharded_tables=tables)
    compile_model(model, sparse_optimizer)
  return PlacedModel(model, raw_id_builder(dataset_builder), tables)


def raw_id_builder(dataset_builder):
  """A copy of `dataset_builder` whose batches keep raw ids (`with_raw_ids`), or itself."""
  with_raw_ids = getattr(dataset_builder, "with_raw_ids", None)
  return with_raw_ids() if with_raw_ids is not None else dataset_builder
