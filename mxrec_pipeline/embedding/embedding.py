"""`Embedding`: the TPUEmbedding mid-level API on the sparse core.

tf.tpu.experimental.embedding.TPUEmbedding's custom training loop runs here
with only the import changed (the class is also exported as `TPUEmbedding`),
under tf.distribute.MirroredStrategy or no strategy. Per step:

  enqueue   (outside strategy.run, on the host): every table's ids of every
            replica go through the table's native key index in one call, in
            the order of the global batch, so N replicas assign the same rows
            as one replica would; unseen ids get rows only with training=True.
  dequeue   (in each replica): the replica's rows, per id, then combined:
            [*output_shape, dim] (core/lookup.py, core/combiner.py).
  apply_gradients (in each replica): the activations' gradients go back to the
            replica's distinct rows; each table's HashOptimizer all-reduces
            them across replicas and updates those rows and their slots only.

Insertion runs in enqueue, not in a `dataset.map`, so TPUEmbedding code stays
unchanged and a distributed dataset never has to split a batch's unique rows.
See docs/tpu-embedding.md for the loop, the API mapping and the reasons.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import tensorflow as tf

from mxrec_pipeline.core import embedding as core_embedding
from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.core import lookup as core_lookup
from mxrec_pipeline.core import restore_sum
from mxrec_pipeline.core.sorted_key_table import SortedKeyTable
from mxrec_pipeline.embedding import lookup, optimizers, shapes
from mxrec_pipeline.embedding.config import FeatureConfig, TableConfig
from mxrec_pipeline.util import initialize

# The methods have no tensor-dependent Python control flow; converting them
# (and what they call) with AutoGraph inside tf.function costs seconds per process.
_not_autograph = tf.autograph.experimental.do_not_convert


@dataclasses.dataclass
class _Step:
  """What enqueue left for dequeue / apply_gradients of one step.

  Attributes:
    training: enqueue's `training`.
    graph: The graph enqueue built its tensors in; None when eager.
    rows: Per replica, table name -> [num_unique] int64 rows of the replica's
      distinct ids (-1 for unseen ids when not training).
    features: Per replica, per feature: (restore [n] int32 positions in the
      table's rows, FeaturePlan).
    applied: Replica ids that called apply_gradients.
  """

  training: bool
  graph: object
  rows: list
  features: list
  applied: set = dataclasses.field(default_factory=set)


class Embedding(tf.Module):
  """Embedding tables of the sparse core behind TPUEmbedding's API.

  Create it under the strategy's scope (`with strategy.scope():`), or with no
  strategy. It joins the current mxRec run (`util.initialize.init()`), or
  starts one when there is none. Its tables are created here, one per distinct
  TableConfig (`vocabulary_size` rows, the most distinct ids the table holds),
  with the tables' optimizers; their slots appear at the first
  apply_gradients.

  Output shapes follow TPUEmbedding's priority: FeatureConfig.output_shape,
  then `build(per_replica_input_shapes)`, then the input; a lower-priority
  shape that disagrees raises ValueError naming the feature (see
  `mxrec_pipeline.embedding.shapes`).

  Checkpoint it with the model: `tf.train.Checkpoint(model=model,
  embedding=embedding)` saves every table's rows, key index (id -> row) and
  optimizer slots, and restores them into an Embedding of the same feature
  config, with or without a strategy (optimizer=None skips the slots, e.g.
  for serving).

  Args:
    feature_config: A FeatureConfig, or a nest (dict, list, tuple) of them;
      enqueue's features, dequeue's activations and apply_gradients'
      gradients have this structure.
    optimizer: SGD, Adagrad or Adam of this package, used by tables whose
      TableConfig has none; None for lookup-only use (apply_gradients then
      raises for those tables).
    pipeline_execution_with_tensor_core: TPUEmbedding's overlap switch; no
      effect here.

  Raises:
    ValueError: an optimizer (global or a table's) of another class, two
      tables with one name, a table name create_table rejects or that the run
      already has.
    NotImplementedError: the current run uses dynamic expansion.
  """

  def __init__(self, feature_config, optimizer: optimizers.Optimizer | None,
               pipeline_execution_with_tensor_core: bool = False):
    super().__init__(name="embedding")
    del pipeline_execution_with_tensor_core  # See the docstring.
    optimizers.check_optimizer(optimizer, "Embedding")
    paths, flat, configs, names = flatten_feature_config(feature_config)
    _untracked(self, strategy=tf.distribute.get_strategy(), feature_config=feature_config,
               paths=paths, features=flat, table_configs=configs, table_names=names,
               table_of_feature=[names[_index(configs, f.table)] for f in flat],
               declared=[f.output_shape for f in flat], built=False, step=None,
               lock=threading.Lock())
    if not initialize.is_initialized():
      initialize.init()
    run = initialize.get_config_initializer()
    if run.config.use_dynamic_expansion:
      raise NotImplementedError(
          "Embedding: the current run was started with init(use_dynamic_expansion=True); "
          "TableConfig.vocabulary_size is a fixed device capacity here, so join a run "
          "without dynamic expansion")
    taken = [name for name in names if name in run.tables]
    if taken:  # Checked before any table is created, so a failure creates none.
      raise ValueError(f"Embedding: the current run already has tables named {taken}; give "
                       "the TableConfigs other names")
    tables, hash_optimizers, optimizer_of_table = {}, {}, {}
    by_config = {}
    with tf.init_scope(), self._strategy.scope():
      for name, config in zip(names, configs):
        tables[name] = core_embedding.create_table(key_dtype=tf.int64, dim=config.dim, name=name,
                                                   emb_initializer=config.initializer,
                                                   device_vocabulary_size=config.vocabulary_size)
        table_optimizer = config.optimizer if config.optimizer is not None else optimizer
        if table_optimizer is None:
          continue
        if table_optimizer not in by_config:
          kind = type(table_optimizer).__name__
          key = kind if kind not in hash_optimizers else f"{kind}_{len(hash_optimizers)}"
          hash_optimizers[key] = table_optimizer.build_hash_optimizer(key)
          by_config[table_optimizer] = key
        optimizer_of_table[name] = by_config[table_optimizer]
    self._tables = tables
    self._optimizers = hash_optimizers
    _untracked(self, optimizer_of_table=optimizer_of_table)

  # ----------------------------------------------------------------- build --

  @_not_autograph
  def build(self, per_replica_input_shapes=None, per_replica_batch_size=None):
    """Fixes the output shapes given the per-replica input shapes.

    Tables exist from the constructor on; build only records shapes (priority
    2 of the output-shape rules). enqueue / dequeue / __call__ build with no
    shapes when not built yet; a second call does nothing, as TPUEmbedding's.

    Args:
      per_replica_input_shapes: None, a nest of input shapes (TensorShapes or
        lists) of the feature config's structure, or an int batch size
        (deprecated in TPUEmbedding).
      per_replica_batch_size: Deprecated batch size: output shapes [batch]
        (or [batch, max_sequence_length] for sequence features).

    Raises:
      ValueError: a shape of rank < 1, or one that disagrees with a
        FeatureConfig.output_shape (naming the feature).
      TypeError or ValueError: shapes of another structure.
    """
    if self._built:
      return
    if isinstance(per_replica_input_shapes, int) or (per_replica_input_shapes is None and
                                                     per_replica_batch_size):
      batch_size = per_replica_input_shapes or per_replica_batch_size
      incoming = [
          tf.TensorShape([batch_size, f.max_sequence_length])
          if f.max_sequence_length > 0 and not f.output_shape else tf.TensorShape([batch_size])
          for f in self._features
      ]
    elif per_replica_input_shapes is not None:
      flat = tf.__internal__.nest.flatten_up_to(self._feature_config, per_replica_input_shapes)
      incoming = [
          shapes.output_shape_from_input_shape(path, feature, shape)
          for path, feature, shape in zip(self._paths, self._features, flat)
      ]
    else:
      incoming = None
    if incoming is not None:
      for path, declared, shape in zip(self._paths, self._declared, incoming):
        shapes.check_output_shape(path, declared, shape)
      _untracked(self, declared=[shapes.resolve(d, s) for d, s in zip(self._declared, incoming)])
    _untracked(self, built=True)

  @property
  def output_shapes(self) -> list[tf.TensorShape]:
    """Declared output shapes (FeatureConfig's, else build's), flat."""
    return list(self._declared)

  # ---------------------------------------------------------------- tables --

  @property
  def embedding_tables(self) -> dict[TableConfig, tf.Variable]:
    """TableConfig -> its [vocabulary_size, dim] float32 rows.

    Plain (or, under a strategy, mirrored) variables, usable for CPU lookups
    at serving time: map ids to rows with `row_lookup_tables()` (or
    `export_key_index()`), then `tf.nn.embedding_lookup(table, rows)`.
    """
    return {
        config: self._tables[name].variable
        for config, name in zip(self._table_configs, self._table_names)
    }

  def sparse_tables(self) -> dict[str, tuple[object, list]]:
    """Table name -> (its sparse-core table, [its hash optimizer] or [] without one).

    The tables of the table protocol (core/table_protocol.Table) behind the
    TableConfigs, for the by-key and delta checkpoints of
    distributed/embedding_checkpoint.py.
    """
    return {
        name: (self._tables[name], [self._optimizers[self._optimizer_of_table[name]]]
               if name in self._optimizer_of_table else []) for name in self._table_names
    }

  @property
  def num_replicas(self) -> int:
    """Replicas of the strategy the Embedding was built under (1: none)."""
    return self._strategy.num_replicas_in_sync

  def export_key_index(self) -> dict[TableConfig, tuple[tf.Tensor, tf.Tensor]]:
    """TableConfig -> (keys [n] int64, rows [n] int64): which id owns which row.

    Unordered. int32 ids are their int64 value; string ids are
    `tf.strings.to_hash_bucket_fast(ids, 2**63 - 1)`.
    """
    return {
        config: self._tables[name].key_index.export()
        for config, name in zip(self._table_configs, self._table_names)
    }

  def row_lookup_tables(self) -> dict[TableConfig, SortedKeyTable]:
    """TableConfig -> core/sorted_key_table.SortedKeyTable of id -> row (-1 if absent).

    A snapshot of the key indexes, needing no custom op: together with
    `embedding_tables` it serves lookups in plain TensorFlow (and can be
    saved in a SavedModel):

      rows = row_tables[config].lookup(ids)                # -1: never trained
      emb = tf.nn.embedding_lookup(tables[config], tf.maximum(rows, 0))
      emb *= tf.cast(rows >= 0, emb.dtype)[..., None]      # unseen ids: zeros
    """
    return {
        config: self._tables[name].key_index.to_stock_table()
        for config, name in zip(self._table_configs, self._table_names)
    }

  def serving_tables(self) -> dict[TableConfig, tuple[SortedKeyTable, tf.Tensor]]:
    """TableConfig -> (positions, rows): compact snapshots for serving, only the used rows.

    `rows` is [num_keys + 1, dim] float32: the rows of the ids the table
    holds, then a default row of zeros; `positions` is a stock
    SortedKeyTable int64 id -> int64 position in `rows`
    (num_keys, the default row, for absent ids). See
    `KeyIndex.to_compact_table`. Saved in a SavedModel (rows as a
    tf.Variable) instead of `embedding_tables` and `row_lookup_tables()`, a
    table of vocabulary_size V with n ids stores n + 1 rows instead of V:

      emb = tf.nn.embedding_lookup(rows, positions.lookup(ids))  # unseen: zeros
    """
    return {
        config: self._tables[name].key_index.to_compact_table(
            functools.partial(core_lookup.unique_embeddings, self._tables[name], training=False)
        ) for config, name in zip(self._table_configs, self._table_names)
    }

  # ------------------------------------------------------------ train step --

  @_not_autograph
  def enqueue(self, features, weights=None, training: bool = True, name: str | None = None,
              device: str | None = None) -> None:
    """Inserts the step's ids and records the lookups for dequeue.

    Call it outside `strategy.run`, with the batch from the (distributed)
    dataset iterator. With training=True, the same step must call dequeue()
    and apply_gradients() (in every replica) before the next enqueue.

    Args:
      features: Nest of the feature config's structure: per feature a
        tf.Tensor (rank 1, or rank >= 2 with last dimension 1), tf.SparseTensor
        or tf.RaggedTensor (rank >= 2) of int32/int64 ids (string ids are
        hashed), or their PerReplica values from a distributed dataset.
      weights: None, or a nest of that structure with None or per-id weights
        (same type and layout as the ids; sparse and ragged features only).
      training: True: unseen ids get rows (a full table fails the step naming
        it). False: unseen ids read zeros and take no row.
      name: Name scope of the insertion ops.
      device: TPUEmbedding's per-host enqueue; not available.

    Raises:
      RuntimeError: called inside strategy.run, or the previous
        enqueue(training=True) was not followed by apply_gradients (that
        enqueue is then dropped, so a step that failed half-way, e.g. while
        being traced, does not block the next one).
      ValueError: features or weights of another structure, a bad input
        (see `shapes.input_shape`), a shape disagreeing with the declared
        output shape, plain tensors under a strategy of several replicas
        (each naming the feature).
      NotImplementedError: `device`.
    """
    if device is not None:
      raise NotImplementedError(f"enqueue(device={device!r}): per-device enqueue is not "
                                "available; enqueue every replica's features at once")
    if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context() is False:
      raise RuntimeError("enqueue must be called outside strategy.run (in the step function, "
                         "with the dataset iterator's batch), as in TPUEmbedding's "
                         "training_step; dequeue and apply_gradients go inside strategy.run")
    with self._lock:
      pending = self._step
      if pending is not None and pending.training and (len(pending.applied)
                                                       < self._strategy.num_replicas_in_sync):
        # Reported once: a step that failed half-way must not block the next one.
        _untracked(self, step=None)
        raise RuntimeError(
            "enqueue was called, but the previous enqueue(training=True) was not followed by "
            "apply_gradients: a training step must call enqueue(..., training=True), dequeue() "
            "and apply_gradients(...) (in every replica) before the next enqueue; use "
            "training=False for evaluation steps. (The unapplied enqueue is dropped; if its "
            "step raised an error before apply_gradients, just run the step again.)")
    self._maybe_build()
    tf.nest.assert_same_structure(self._feature_config, features)
    flat_weights = [None] * len(self._features)
    if weights is not None:
      tf.nest.assert_same_structure(self._feature_config, weights)
      flat_weights = tf.nest.flatten(weights)
    num_replicas = self._strategy.num_replicas_in_sync
    per_replica = [
        self._local_values(path, value, num_replicas)
        for path, value in zip(self._paths, tf.nest.flatten(features))
    ]
    per_replica_weights = [
        (None,) * num_replicas if w is None else self._local_values(path, w, num_replicas)
        for path, w in zip(self._paths, flat_weights)
    ]
    with tf.name_scope(name or "enqueue"):
      plans = [[
          self._plan(i, per_replica[i][r], per_replica_weights[i][r])
          for i in range(len(self._features))
      ] for r in range(num_replicas)]
      rows, restores = self._insert(plans, training)
    step = _Step(training=training, graph=current_graph(), rows=rows,
                 features=[list(zip(restores[r], plans[r])) for r in range(num_replicas)])
    with self._lock:
      _untracked(self, step=step)

  @_not_autograph
  def dequeue(self, name: str | None = None):
    """The activations of the last enqueue, for this replica.

    Call it inside strategy.run (or with no strategy), in the step that
    called enqueue.

    Returns:
      Nest of the feature config's structure: per feature
      [*output_shape, dim] float32.

    Raises:
      RuntimeError: no enqueue in this step, or called outside strategy.run
        under a strategy of several replicas.
    """
    replica = self._replica_id("dequeue")
    step = self._current_step("dequeue")
    with tf.name_scope(name or "dequeue"):
      rows = step.rows[replica]
      outputs = [
          plan.activation(
              core_lookup.id_embeddings(self._tables[table], rows[table], restore,
                                        training=step.training))
          for table, (restore, plan) in zip(self._table_of_feature, step.features[replica])
      ]
    return tf.nest.pack_sequence_as(self._feature_config, outputs)

  @_not_autograph
  def apply_gradients(self, gradients, name: str | None = None) -> None:
    """Applies the activations' gradients to the rows this step looked up.

    Call it inside strategy.run (or with no strategy), after dequeue, in a
    step whose enqueue had training=True. A None gradient leaves its feature's
    rows untouched (TPUEmbedding applies a zero gradient instead, which moves
    Adam's moments).

    Args:
      gradients: Nest of the feature config's structure: per feature None or
        a tensor (or IndexedSlices) of its activation's shape, e.g.
        `tape.gradient(loss, activations)`.
      name: Name scope.

    Raises:
      RuntimeError: no enqueue(training=True) before it in this step, called
        twice for one enqueue, a table without optimizer, or outside
        strategy.run under a strategy of several replicas.
      ValueError: a gradient that is not a tensor or of the wrong shape
        (naming the feature's path); TypeError/ValueError for another
        structure.
    """
    replica = self._replica_id("apply_gradients")
    step = self._current_step("apply_gradients")
    check_can_apply(step.training, replica in step.applied)
    tf.nest.assert_same_structure(self._feature_config, gradients)
    by_table = {}
    for i, grad in enumerate(tf.nest.flatten(gradients)):
      if grad is None:
        continue
      restore, plan = step.features[replica][i]
      grad = activation_gradient(self._paths[i], grad, plan, self._features[i].table.dim)
      by_table.setdefault(self._table_of_feature[i], []).append((grad, restore, plan))
    missing = sorted(t for t in by_table if t not in self._optimizer_of_table)
    if missing:
      raise RuntimeError(f"apply_gradients: tables {missing} have no optimizer; give the "
                         "Embedding or their TableConfig an optimizer")
    pairs_by_optimizer = {}
    with tf.name_scope(name or "apply_gradients"):
      for table_name, grads in by_table.items():
        table = self._tables[table_name]
        # Every distinct row has an id of these features when none of the
        # table's features has a None gradient.
        complete = len(grads) == self._table_of_feature.count(table_name)
        row_grads = _row_gradients(step.rows[replica][table_name], grads, table.dim, complete)
        pairs_by_optimizer.setdefault(self._optimizer_of_table[table_name], []).append(
            (row_grads, table.variable))
      # The same order in every replica: each call all-reduces across them.
      for key in sorted(pairs_by_optimizer):
        self._optimizers[key].apply_gradients(pairs_by_optimizer[key])
    with self._lock:
      step.applied.add(replica)
      if len(step.applied) == self._strategy.num_replicas_in_sync:
        _untracked(self, step=None)

  # ---------------------------------------------------------- plain lookup --

  @_not_autograph
  def __call__(self, features, weights=None, training: bool = False):
    """Looks features up directly (no enqueue/dequeue), e.g. for evaluation or serving.

    Runs in any context (also inside strategy.run, with that replica's
    tensors). The result is differentiable with respect to
    `embedding_tables`' variables (IndexedSlices gradients).

    Args:
      features: Nest of the feature config's structure of plain tensors (see
        enqueue).
      weights: As for enqueue.
      training: True inserts unseen ids (they get rows); False (default)
        reads zeros for them.

    Returns:
      Nest of activations, as dequeue's.

    Raises:
      ValueError: as enqueue.
    """
    self._maybe_build()
    tf.nest.assert_same_structure(self._feature_config, features)
    flat_weights = ([None] * len(self._features) if weights is None else tf.nest.flatten(weights))
    plans = [[
        self._plan(i, _to_tensor(value), w)
        for i, (value, w) in enumerate(zip(tf.nest.flatten(features), flat_weights))
    ]]
    rows, restores = self._insert(plans, training)
    outputs = [
        plan.activation(
            core_lookup.id_embeddings(self._tables[table], rows[0][table], restore,
                                      training=training))
        for table, restore, plan in zip(self._table_of_feature, restores[0], plans[0])
    ]
    return tf.nest.pack_sequence_as(self._feature_config, outputs)

  # -------------------------------------------------------------- internals --

  def _maybe_build(self):
    if not self._built:
      self.build()

  def _plan(self, i: int, inp, weight) -> lookup.FeaturePlan:
    """Shape checks and FeaturePlan of feature i's input (one replica's)."""
    return plan_feature(self._paths[i], self._features[i], self._declared[i], inp, weight)

  def _insert(self, plans, training: bool):
    """One key-index insertion per table over all replicas' ids.

    Args:
      plans: Per replica, per feature: FeaturePlan.
      training: As enqueue's.

    Returns:
      (rows, restores): per replica, table name -> [u] int64 rows of the
      replica's distinct ids; per replica, per feature, [n] int32 positions
      in its table's rows.
    """
    num_replicas = len(plans)
    rows = [{} for _ in range(num_replicas)]
    restores = [[None] * len(self._features) for _ in range(num_replicas)]
    with tf.device(key_index_lib.HOST_DEVICE):
      for table_name in self._table_names:
        members = [i for i, t in enumerate(self._table_of_feature) if t == table_name]
        # Feature-major, then replica: the order of one replica's global batch.
        keys = [
            tf.reshape(key_index_lib.to_keys(plans[r][i].ids, what=self._paths[i]), [-1])
            for i in members for r in range(num_replicas)
        ]
        unique_rows, restore, _ = self._tables[table_name].key_index.insert(
            keys[0] if len(keys) == 1 else tf.concat(keys, 0), training=training)
        sizes = [tf.size(k) for k in keys]
        parts = [restore] if len(keys) == 1 else tf.split(restore, tf.stack(sizes))
        part = {(i, r): parts[j * num_replicas + r] for j, i in enumerate(members)
                for r in range(num_replicas)}
        for r in range(num_replicas):
          if num_replicas == 1:
            rows[r][table_name] = unique_rows
            for i in members:
              restores[r][i] = part[(i, r)]
            continue
          # This replica's distinct rows, and its ids' positions among them.
          local_parts = [part[(i, r)] for i in members]
          mine, local = tf.unique(
              tf.concat(local_parts, 0) if len(members) > 1 else local_parts[0], out_idx=tf.int32)
          rows[r][table_name] = tf.gather(unique_rows, mine)
          split = ([local] if len(members) == 1 else tf.split(
              local, tf.stack([tf.size(p) for p in local_parts])))
          for i, s in zip(members, split):
            restores[r][i] = s
    return rows, restores

  def _local_values(self, path: str, value, num_replicas: int) -> tuple:
    """Per-replica components of an input (a plain value is one replica's)."""
    values = self._strategy.experimental_local_results(value)
    if len(values) != num_replicas:
      raise ValueError(f"Input {path} has {len(values)} per-replica value(s), but the strategy has "
                       f"{num_replicas} replicas; feed enqueue from "
                       "strategy.experimental_distribute_dataset(...) (or "
                       "distribute_datasets_from_function)")
    return values

  def _replica_id(self, what: str) -> int:
    """This replica's index; 0 without a strategy."""
    num_replicas = self._strategy.num_replicas_in_sync
    context = tf.distribute.get_replica_context()
    if context is None or (num_replicas > 1 and context.strategy is not self._strategy):
      if num_replicas == 1:
        return 0
      raise RuntimeError(f"{what} must be called inside strategy.run (one call per replica), "
                         "as in TPUEmbedding's training_step")
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is None:
      raise RuntimeError(f"{what}: the replica id is not static in this context")
    return int(replica)

  def _current_step(self, what: str) -> _Step:
    step = self._step
    if step is None:
      raise RuntimeError(f"{what} was called without enqueue: call enqueue(features, "
                         "training=...) first in the same step")
    if not reachable(step.graph):
      raise RuntimeError(f"{what} must be called in the same step (tf.function) as the "
                         "enqueue it follows; this one has no enqueue")
    return step


TPUEmbedding = Embedding


def check_can_apply(training: bool, applied: bool) -> None:
  """Raises RuntimeError unless the step's enqueue had training=True and was not applied yet."""
  if not training:
    raise RuntimeError("apply_gradients was called after enqueue(training=False); use "
                       "training=True in training steps")
  if applied:
    raise RuntimeError("apply_gradients was called twice after one enqueue; call enqueue "
                       "before each apply_gradients")


def activation_gradient(path: str, grad, plan: lookup.FeaturePlan, dim: int) -> tf.Tensor:
  """A feature's activation gradient as a tensor, checked against its [*plan.shape, dim].

  Raises:
    ValueError: not a tensor (or IndexedSlices), or of another shape (naming
      the feature's path).
  """
  if isinstance(grad, tf.IndexedSlices):  # E.g. the loss gathered from the activations.
    grad = tf.convert_to_tensor(grad)
  if not isinstance(grad, tf.Tensor):
    raise ValueError(f"found non-tensor type {type(grad).__name__} at path {path}")
  expected = plan.shape.concatenate([dim])
  if not grad.shape.is_compatible_with(expected):
    raise ValueError(f"Found gradient of shape {grad.shape} at path {path}. "
                     f"Expected shape {expected}.")
  return grad


def plan_feature(path: str, feature: FeatureConfig, declared: tf.TensorShape, inp,
                 weight) -> lookup.FeaturePlan:
  """Shape checks and FeaturePlan of one feature's input (one replica's).

  Args:
    path: The feature's path, for messages.
    feature: Its FeatureConfig.
    declared: Its declared output shape (FeatureConfig's or build's; unset: none).
    inp: Its ids (see `Embedding.enqueue`).
    weight: None or per-id weights.

  Raises:
    ValueError: a bad input or a shape disagreeing with `declared` (naming
      the feature).
  """
  inp = _to_tensor(inp)
  incoming = shapes.output_shape_from_input_shape(path, feature,
                                                  shapes.input_shape(path, feature, inp))
  shapes.check_output_shape(path, declared, incoming)
  return lookup.plan(path, feature, inp, weight, shapes.resolve(declared, incoming))


def flatten_feature_config(feature_config) -> tuple[list, list, list, list]:
  """The features and tables of a feature config, as TPUEmbedding orders them.

  Args:
    feature_config: A FeatureConfig, or a nest (dict, list, tuple) of them.

  Returns:
    (paths, features, table_configs, table_names): per feature its path in
    the nest (or its name) and its FeatureConfig, flat; the distinct
    TableConfigs in order of first use and their names (`table_<i>` when
    unnamed).

  Raises:
    ValueError: a leaf that is not a FeatureConfig, two tables with one
      name, a TableConfig optimizer of another class.
  """
  paths = [_path_name(path) for path in tf.__internal__.nest.yield_flat_paths(feature_config)]
  flat = tf.nest.flatten(feature_config)
  for path, feature in zip(paths, flat):
    if not isinstance(feature, FeatureConfig):
      raise ValueError(f"feature_config {path or ''}: expected a "
                       f"mxrec_pipeline.embedding.FeatureConfig, got {type(feature).__name__}")
  paths = [path or feature.name or "feature" for path, feature in zip(paths, flat)]
  configs = []  # Distinct TableConfigs in order of first use, as TPUEmbedding orders them.
  for feature in flat:
    if not any(feature.table is c for c in configs):
      configs.append(feature.table)
  names = []
  for i, config in enumerate(configs):
    name = config.name or f"table_{i}"
    if name in names:
      raise ValueError(f"Tables must have a unique name. Multiple tables with name {name} "
                       "found.")
    names.append(name)
    optimizers.check_optimizer(config.optimizer, f"TableConfig {name}")
  return paths, flat, configs, names


def _row_gradients(rows: tf.Tensor, grads, dim: int, complete: bool) -> tf.IndexedSlices:
  """Gradient of a table's rows from its features' activation gradients.

  Each feature's activation is linear in its ids' embeddings, so the
  gradient of those embeddings is the activation gradient taken back through
  the FeaturePlan (a tape over zeros gives that transpose). With `complete`
  (every row has an id in `grads`) the ids' gradients are summed per distinct
  row by their restore indices (core/restore_sum.py, as the gradient of a
  training lookup), so the optimizer gets each row once; otherwise each id's
  gradient goes to its row as it is, rows repeating as ids do (the hash
  optimizer sums them), so that rows of features without a gradient get no
  update.

  Args:
    rows: [u] int64, the replica's distinct rows of the table.
    grads: [(activation gradient, restore [n] int32, FeaturePlan)].
    dim: Embedding dimension.
    complete: Every row of `rows` has an id in `grads`.

  Returns:
    IndexedSlices of [u, dim] float32 on `rows` (complete), else of
    [sum of n, dim] on the ids' rows (repeated).
  """
  with tf.GradientTape() as tape:
    per_id = [tf.zeros([tf.size(restore), dim]) for _, restore, _ in grads]
    for p in per_id:
      tape.watch(p)
    activations = [plan.activation(p) for p, (_, _, plan) in zip(per_id, grads)]
  id_grads = tape.gradient(activations, per_id, output_gradients=[g for g, _, _ in grads])
  id_grad = tf.concat(id_grads, 0) if len(grads) > 1 else id_grads[0]
  restores = [restore for _, restore, _ in grads]
  restore = tf.concat(restores, 0) if len(grads) > 1 else restores[0]
  if complete:
    return tf.IndexedSlices(restore_sum.sum_by_restore(id_grad, restore, tf.size(rows)), rows)
  return tf.IndexedSlices(id_grad, tf.gather(rows, restore))


def _to_tensor(value):
  if isinstance(value, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)):
    return value
  return tf.convert_to_tensor(value)


def _path_name(path: tuple) -> str:
  return "/".join(str(p) for p in path)


def _index(configs: list, config: TableConfig) -> int:
  return next(i for i, c in enumerate(configs) if c is config)


def current_graph():
  """The graph new tensors go to; None when executing eagerly."""
  return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def reachable(graph) -> bool:
  """Whether tensors of `graph` (None: eager) can be used in the current graph."""
  if graph is None:
    return True
  current = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
  while current is not None:
    if current is graph:
      return True
    current = getattr(current, "outer_graph", None)
  return False


def _untracked(module: tf.Module, **attributes) -> None:
  """Sets Python state that checkpoints must not track (configs, step state)."""
  for name, value in attributes.items():
    object.__setattr__(module, f"_{name}", value)
