"""Automatic graph modification, as mx_rec.graph.modifier.

mxRec's "automatic graph modification" lets a TF1 script call
`sparse_lookup(table, ids, modify_graph=True)` on plain id tensors straight
from `iterator.get_next()`; `modify_graph_and_start_emb_cache()` then rewrites
the graph so those ids are inserted inside the dataset, ahead of the step, as
with FeatureSpecs and get_asc_insert_func, and `get_initializer(is_training)`
gives the new iterators' initializer. `GraphModifierHook` does both for
Estimators. Until the rewrite, the deferred lookups fail with a message saying
to call modify_graph_and_start_emb_cache().

Limits: ids must be `get_next()` outputs (Identity ops allowed); the dataset's
components must be dense tensors; the iterator must be initializable
(`tf.compat.v1.data.make_initializable_iterator`, as in mxRec's examples).
See docs/migrating-from-mxrec.md#what-differs.
"""

from __future__ import annotations

import collections
import os

import tensorflow as tf

from mxrec_pipeline.core.asc import deferred
from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.core.asc import helper
from mxrec_pipeline.core.asc import manager
from mxrec_pipeline.core import admission
from mxrec_pipeline.util import initialize

TRAIN_INITIALIZERS = "mxrec_pipeline_train_initializers"
EVAL_INITIALIZERS = "mxrec_pipeline_eval_initializers"
DUMP_FILE = "modified_graph.pbtxt"
# The deferred lookups' collection and record live in the core (core/asc/deferred.py).
PENDING_LOOKUPS = deferred.PENDING_LOOKUPS


def modify_graph_and_start_emb_cache(full_graph: tf.Graph | None = None,
                                     dump_graph: bool = False) -> None:
  """Rewrites the graph so deferred lookups' ids are inserted in their datasets.

  Call it once, after building the model and its gradients (mxRec's rule), then
  run `get_initializer(True/False)` in the session. Per iterator whose outputs
  feed deferred lookups:

  1. The dataset behind the iterator is found through its `MakeIterator` op and
     re-read with `tf.data.experimental.from_variant`, as a flat tuple of its
     (dense) components.
  2. A `map` adds the insertion results (per table: unique rows; per lookup:
     restore indices), computed by the native op through the same `insert_ids`
     layout as get_asc_insert_func, then `prefetch`.
  3. A new initializable iterator over that dataset replaces the old one: every
     consumer of the old `get_next` outputs is rewired to the new outputs, and
     the placeholders each deferred lookup was built on to the insertion
     results. Gradient ops built before the rewrite are rewired too.
  4. `get_initializer(is_training)` gives the new iterators' initializer.

  Args:
    full_graph: The graph to modify; the default graph when None.
    dump_graph: Write the modified graph to `export_graph/modified_graph.pbtxt`.

  Raises:
    RuntimeError: init() was not called, no lookup used modify_graph=True, or a
      table was not created (start_asc_pipeline's check).
    ValueError: ids not taken from an initializable iterator's get_next, a
      dataset with composite components, or one table looked up both for
      training and evaluation through one iterator.
  """
  container = initialize.get_config_initializer().container
  graph = full_graph or tf.compat.v1.get_default_graph()
  pending = graph.get_collection(PENDING_LOOKUPS)
  if not pending:
    raise RuntimeError("modify_graph_and_start_emb_cache(): no sparse_lookup(..., "
                       "modify_graph=True) in this graph")
  by_get_next = collections.defaultdict(list)
  for lookup in pending:
    by_get_next[_source_get_next(lookup.ids)].append(lookup)
  with graph.as_default():
    for get_next, lookups in by_get_next.items():
      _rewrite(graph, get_next, lookups, container)
    graph.clear_collection(PENDING_LOOKUPS)
    if dump_graph:
      os.makedirs(helper.DUMP_DIR, exist_ok=True)
      tf.io.write_graph(graph.as_graph_def(), helper.DUMP_DIR, DUMP_FILE, as_text=True)
    manager.start_asc_pipeline()


def get_initializer(is_training: bool) -> tf.Operation:
  """The initializer of the modified training (or evaluation) iterators.

  Raises:
    RuntimeError: the graph has no modified iterator of that kind (call
      modify_graph_and_start_emb_cache() first).
  """
  key = TRAIN_INITIALIZERS if is_training else EVAL_INITIALIZERS
  initializers = tf.compat.v1.get_collection(key)
  if not initializers:
    kind = "training" if is_training else "evaluation"
    raise RuntimeError(f"get_initializer({is_training}): no modified {kind} iterator in this "
                       "graph; call modify_graph_and_start_emb_cache() after building lookups "
                       f"with modify_graph=True, is_train={is_training}")
  return tf.group(initializers)


class GraphModifierHook(tf.compat.v1.train.SessionRunHook):
  """Estimator hook of mxRec's graph modification (mx_rec.graph.modifier).

  Pass it in the train, evaluate and predict hooks. Before the graph is
  finalized it rewrites deferred lookups (modify_graph=True), or checks the
  tables of get_asc_insert_func datasets (start_asc_pipeline); once the session
  exists it initializes the rewritten iterators.

  Args:
    dump_graph: Write the modified graph for inspection.
    modify_graph: Rewrite modify_graph=True lookups (False: FeatureSpec mode).
  """

  def __init__(self, dump_graph: bool = False, modify_graph: bool = True):
    self._dump_graph = dump_graph
    self._modify_graph = modify_graph
    self._initializer = None

  def begin(self):
    graph = tf.compat.v1.get_default_graph()
    if self._modify_graph and graph.get_collection(PENDING_LOOKUPS):
      modify_graph_and_start_emb_cache(graph, self._dump_graph)
    else:
      manager.start_asc_pipeline()
    initializers = (graph.get_collection(TRAIN_INITIALIZERS) +
                    graph.get_collection(EVAL_INITIALIZERS))
    self._initializer = tf.group(initializers) if initializers else None

  def after_create_session(self, session, coord):
    del coord
    if self._initializer is not None:
      session.run(self._initializer)


def _through_identity(tensor: tf.Tensor) -> tf.Tensor:
  """The tensor behind any chain of Identity ops."""
  while tensor.op.type == "Identity":
    tensor = tensor.op.inputs[0]
  return tensor


def _source_get_next(ids: tf.Tensor) -> tf.Operation:
  tensor = _through_identity(ids)
  if tensor.op.type != "IteratorGetNext":
    raise ValueError(
        f"sparse_lookup(modify_graph=True): ids '{ids.name}' must come straight from "
        f"iterator.get_next(), got op '{tensor.op.name}' of type {tensor.op.type}; for computed "
        "ids use FeatureSpecs with get_asc_insert_func")
  return tensor.op


def _make_iterator_op(graph: tf.Graph, get_next: tf.Operation) -> tf.Operation:
  iterator = get_next.inputs[0]
  for op in graph.get_operations():
    if op.type == "MakeIterator" and op.inputs[1] is iterator:
      return op
  raise ValueError(f"the iterator of '{get_next.name}' is not initializable; build it with "
                   "tf.compat.v1.data.make_initializable_iterator(dataset)")


def _rewrite(graph: tf.Graph, get_next: tf.Operation, lookups: list[deferred.PendingLookup],
             container: str) -> None:
  outputs = list(get_next.outputs)
  if any(t.dtype == tf.variant for t in outputs):
    raise ValueError(f"'{get_next.name}': graph modification needs a dataset of dense "
                     "tensors (no SparseTensor/RaggedTensor components)")
  training = {}
  for lookup in lookups:
    if training.setdefault(lookup.table_name, lookup.is_train) != lookup.is_train:
      raise ValueError(f"table '{lookup.table_name}' is looked up both with is_train=True and "
                       f"False through '{get_next.name}'; use one iterator per mode")
  variant = _make_iterator_op(graph, get_next).inputs[0]
  structure = tuple(tf.TensorSpec(t.shape, t.dtype) for t in outputs)
  dataset = tf.data.experimental.from_variant(variant, structure)
  specs = [fs.FeatureSpec(lkp.feature_name, table_name=lkp.table_name) for lkp in lookups]
  by_table = helper.group_by_table(specs)

  def native_insert(table_name, keys):
    return admission.insert(container, table_name, keys, training[table_name])

  def add_insertion(*flat):
    features = {lkp.feature_name: flat[_through_identity(lkp.ids).value_index] for lkp in lookups}
    inserted = helper.insert_ids(features, by_table, native_insert)
    return flat + tuple(inserted[fs.unique_rows_key(t)] for t in by_table) + tuple(
        inserted[fs.restore_key(lkp.feature_name)] for lkp in lookups)

  dataset = dataset.map(add_insertion).prefetch(tf.data.AUTOTUNE)
  iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
  new = iterator.get_next()
  new_outputs, rest = new[:len(outputs)], new[len(outputs):]
  new_rows = dict(zip(by_table, rest[:len(by_table)]))
  new_restore = dict(zip((lkp.feature_name for lkp in lookups), rest[len(by_table):]))
  for old, replacement in zip(outputs, new_outputs):
    _rewire(old, replacement)
  for lookup in lookups:
    _rewire(lookup.unique_rows, new_rows[lookup.table_name])
    _rewire(lookup.restore, new_restore[lookup.feature_name])
  is_train = next(iter(training.values()))
  graph.add_to_collection(TRAIN_INITIALIZERS if is_train else EVAL_INITIALIZERS,
                          iterator.initializer)


def _rewire(old: tf.Tensor, new: tf.Tensor) -> None:
  """Makes every consumer of `old` read `new` instead (TF1 graph surgery)."""
  for consumer in list(old.consumers()):
    if consumer is new.op:
      continue
    for index, tensor in enumerate(consumer.inputs):
      if tensor is old:
        consumer._update_input(index, new)  # pylint: disable=protected-access
