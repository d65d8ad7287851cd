"""`PSEmbedding`: TPUEmbedding's mid-level API with the tables sharded over parameter servers.

embedding/embedding.py's `Embedding` (tf.tpu.experimental.embedding.
TPUEmbedding's enqueue / dequeue / apply_gradients) for a
ParameterServerStrategy custom loop: each TableConfig becomes a
distributed/ps_table.PSShardedTable (`vocabulary_size` rows per shard), and the
three calls run in the tf.function that ClusterCoordinator.schedule runs on a
worker (one replica per worker, so no strategy.run is needed). `enqueue` looks
each table's ids up in one PSShardedTable.lookup under a GradientTape over its
shard variables and computes the activations; `dequeue` returns them;
`apply_gradients` takes their gradients back through that tape to each shard's
rows and applies the TPUEmbedding optimizer's row update (SGD, Adagrad, Adam)
on the owner ps. A None gradient leaves its feature's rows untouched.

Not here: `build`, `__call__`, the serving helpers (use
distributed/ps_checkpoint.py's `snapshot_tables`), tables without an
optimizer, admission and eviction. Example: `PSEmbedding`. See
docs/distributed.md#the-mx_rec-and-tpuembedding-apis-on-parameter-servers.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.embedding import embedding as embedding_lib
from mxrec_pipeline.embedding import optimizers
from mxrec_pipeline.util import initialize


@dataclasses.dataclass
class _Step:
  """What enqueue left for dequeue and apply_gradients (one traced step).

  Attributes:
    training: enqueue's `training`.
    graph: The graph enqueue built its tensors in; None when eager.
    tapes: Table name -> the GradientTape of its lookup and activations.
    activations: Per feature [*shape, dim] activation.
    plans: Per feature its FeaturePlan.
    applied: Whether apply_gradients ran.
  """

  training: bool
  graph: object
  tapes: dict
  activations: list
  plans: list
  applied: bool = False


class PSEmbedding(tf.Module):
  """TPUEmbedding's enqueue / dequeue / apply_gradients over PSShardedTables.

  Create it on the coordinator outside `strategy.scope()` (as every
  PSShardedTable); call enqueue, dequeue and apply_gradients in the
  scheduled tf.function, in that order, once each per training step. It
  joins the current mxRec run (`util.initialize.init()`), or starts one,
  and registers its tables there (`ps_tables`), as Embedding does.

  Args:
    strategy: The ParameterServerStrategy, or None: one shard per table on
      this process's CPU (the single-process PS tables).
    feature_config: A FeatureConfig, or a nest of them (the structure of
      enqueue's features, dequeue's activations, apply_gradients' gradients).
    optimizer: SGD, Adagrad or Adam of mxrec_pipeline.embedding, for tables
      whose TableConfig has none.

  Attributes:
    tables: Table name -> its PSShardedTable (save them with
      distributed/ps_checkpoint.py).

  Raises:
    ValueError: what Embedding refuses of the feature config or optimizers, a
      table with no optimizer or a name the run already has (naming them), or
      what PSShardedTable refuses.

  Example (the chief is the coordinator):
    >>> table = TableConfig(vocabulary_size=100_000, dim=16, name="movie")
    >>> embedding = PSEmbedding(strategy, {"movie": FeatureConfig(table=table)}, Adam(0.01))
    >>> @tf.function
    ... def train_step(features, labels):
    ...   embedding.enqueue(features, training=True)
    ...   with tf.GradientTape() as tape:
    ...     activations = embedding.dequeue()
    ...     tape.watch(activations)
    ...     loss = loss_fn(activations, labels)
    ...   embedding.apply_gradients(tape.gradient(loss, activations))
    ...   return loss
    >>> loss = coordinator.schedule(train_step, args=(features, labels))
  """

  def __init__(self, strategy: tf.distribute.Strategy | None, feature_config,
               optimizer: optimizers.Optimizer | None):
    super().__init__(name="ps_embedding")
    optimizers.check_optimizer(optimizer, "PSEmbedding")
    paths, features, configs, names = embedding_lib.flatten_feature_config(feature_config)
    no_optimizer = [n for n, c in zip(names, configs) if (c.optimizer or optimizer) is None]
    if no_optimizer:
      raise ValueError(f"PSEmbedding: tables {no_optimizer} have no optimizer (their slots are "
                       "created beside each shard); give PSEmbedding or their TableConfig one")
    if not initialize.is_initialized():  # As Embedding: join the run, or start one.
      initialize.init()
    run = initialize.get_config_initializer()
    taken = [name for name in names if name in run.tables or name in run.ps_tables]
    if taken:
      raise ValueError(f"PSEmbedding: the current run already has tables named {taken}; give "
                       "the TableConfigs other names")
    hash_optimizers = {}  # embedding Optimizer -> its HashOptimizer, shared as Embedding shares.
    tables = {}
    for name, config in zip(names, configs):
      table_optimizer = config.optimizer or optimizer
      if table_optimizer not in hash_optimizers:
        kind = type(table_optimizer).__name__
        hash_optimizers[table_optimizer] = table_optimizer.build_hash_optimizer(
            f"{kind}_{len(hash_optimizers)}" if hash_optimizers else kind)
      tables[name] = ps_table.PSShardedTable(strategy, name=name, dim=config.dim,
                                             device_vocabulary_size=config.vocabulary_size,
                                             optimizer=hash_optimizers[table_optimizer],
                                             emb_initializer=config.initializer)
    self.tables = tables
    run.ps_tables.update(tables)
    # Python state that checkpoints must not track (as Embedding's).
    object.__setattr__(self, "_feature_config", feature_config)
    object.__setattr__(self, "_paths", paths)
    object.__setattr__(self, "_features", features)
    object.__setattr__(self, "_table_of_feature",
                       [names[[c is f.table for c in configs].index(True)] for f in features])
    object.__setattr__(self, "_step", None)

  @tf.autograph.experimental.do_not_convert
  def enqueue(self, features, weights=None, training: bool = True, name: str | None = None) -> None:
    """Looks the step's ids up on their owner ps and computes the activations.

    Args:
      features: Nest of the feature config's structure: per feature a
        tf.Tensor (rank 1, or rank >= 2 with last dimension 1),
        tf.SparseTensor or tf.RaggedTensor of int32/int64/string ids.
      weights: None, or a nest of that structure with None or per-id weights.
      training: True inserts unseen ids on their owner ps (a full shard
        fails naming the table); False reads zeros for them, inserts nothing.
      name: Name scope.

    Raises:
      ValueError: features or weights of another structure or a bad input
        (naming the feature, as Embedding.enqueue).
    """
    tf.nest.assert_same_structure(self._feature_config, features)
    flat_weights = [None] * len(self._features)
    if weights is not None:
      tf.nest.assert_same_structure(self._feature_config, weights)
      flat_weights = tf.nest.flatten(weights)
    activations = [None] * len(self._features)
    tapes = {}
    with tf.name_scope(name or "enqueue"):
      plans = [
          embedding_lib.plan_feature(path, feature, feature.output_shape, value, weight)
          for path, feature, value, weight in zip(self._paths, self._features,
                                                  tf.nest.flatten(features), flat_weights)
      ]
      for table_name, table in self.tables.items():
        members = [i for i, t in enumerate(self._table_of_feature) if t == table_name]
        keys = [
            tf.reshape(key_index_lib.to_keys(plans[i].ids, what=self._paths[i]), [-1])
            for i in members
        ]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
          tape.watch(table.shard_variables)
          per_id = table.lookup(keys[0] if len(keys) == 1 else tf.concat(keys, 0),
                                training=training)
          parts = ([per_id] if len(keys) == 1 else tf.split(per_id,
                                                            tf.stack([tf.size(k) for k in keys])))
          for i, part in zip(members, parts):
            activations[i] = plans[i].activation(part)
        tapes[table_name] = tape
    object.__setattr__(
        self, "_step",
        _Step(training=training, graph=embedding_lib.current_graph(), tapes=tapes,
              activations=activations, plans=plans))

  @tf.autograph.experimental.do_not_convert
  def dequeue(self, name: str | None = None):
    """The activations of the last enqueue: per feature [*output_shape, dim] float32.

    Raises:
      RuntimeError: no enqueue in this step.
    """
    step = self._current_step("dequeue")
    with tf.name_scope(name or "dequeue"):
      return tf.nest.pack_sequence_as(self._feature_config,
                                      [tf.identity(a) for a in step.activations])

  @tf.autograph.experimental.do_not_convert
  def apply_gradients(self, gradients, name: str | None = None) -> tf.Operation:
    """Applies the activations' gradients to the rows of this step, on their owner ps.

    Args:
      gradients: Nest of the feature config's structure: per feature None or
        a tensor (or IndexedSlices) of its activation's shape.
      name: Name scope.

    Returns:
      The op of the updates.

    Raises:
      RuntimeError: no enqueue(training=True) before it in this step, or a
        second call for one enqueue.
      ValueError: a gradient of the wrong shape or type (naming the feature).
    """
    step = self._current_step("apply_gradients")
    embedding_lib.check_can_apply(step.training, step.applied)
    tf.nest.assert_same_structure(self._feature_config, gradients)
    by_table = {}
    for i, grad in enumerate(tf.nest.flatten(gradients)):
      if grad is None:
        continue
      grad = embedding_lib.activation_gradient(self._paths[i], grad, step.plans[i],
                                               self._features[i].table.dim)
      by_table.setdefault(self._table_of_feature[i], []).append((step.activations[i], grad))
    updates = []
    with tf.name_scope(name or "apply_gradients"):
      for table_name, pairs in by_table.items():
        table = self.tables[table_name]
        shard_grads = step.tapes[table_name].gradient([a for a, _ in pairs], table.shard_variables,
                                                      output_gradients=[g for _, g in pairs])
        updates.append(table.apply_gradients(shard_grads))
    step.applied = True
    return tf.group(updates)

  def _current_step(self, what: str) -> _Step:
    step = self._step
    if step is None or not embedding_lib.reachable(step.graph):
      raise RuntimeError(f"{what} was called without enqueue: call enqueue(features, "
                         "training=...) first in the same step (tf.function)")
    return step
