"""Deferred insertion: lookups whose ids the graph rewrite will insert in the dataset.

`sparse_lookup(table, ids, modify_graph=True)` in a tf.compat.v1 graph does not
insert `ids` in the graph: it reads placeholders for the insertion results and
records a `PendingLookup` in the graph's PENDING_LOOKUPS collection.
`mxrec_pipeline.graph.modifier.modify_graph_and_start_emb_cache()` later reads
that collection, moves the insertion into the dataset behind the ids' iterator
and rewires the placeholders to its outputs. This module is the core's half of
that contract, so the core needs nothing from the graph layer.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

PENDING_LOOKUPS = "mxrec_pipeline_pending_lookups"


@dataclasses.dataclass
class PendingLookup:
  """A lookup waiting for the rewrite: its ids and the placeholders it reads.

  Attributes:
    table_name: The table looked up.
    ids: The ids, a `get_next()` output (possibly through Identity ops).
    is_train: Whether the lookup inserts unseen ids (sparse_lookup's is_train).
    unique_rows: [num_unique] int64 placeholder of the table's distinct rows.
    restore: int32 placeholder shaped like `ids`: positions into unique_rows.
    feature_name: Name of the feature the rewrite inserts the ids as.
  """

  table_name: str
  ids: tf.Tensor
  is_train: bool
  unique_rows: tf.Tensor
  restore: tf.Tensor
  feature_name: str


def defer_insertion(table, ids: tf.Tensor, is_train: bool) -> tuple[tf.Tensor, tf.Tensor]:
  """Placeholders (unique_rows, restore) for a modify_graph=True lookup.

  Registered in the default graph's PENDING_LOOKUPS collection; the rewrite
  replaces them. Running them before fails with a message saying what to call.

  Args:
    table: The table looked up (its `table_name` is recorded).
    ids: The lookup's ids, of the table's key dtype.
    is_train: sparse_lookup's is_train.

  Returns:
    (unique_rows [None] int64, restore of ids' static shape, int32).
  """
  graph = tf.compat.v1.get_default_graph()
  index = len(graph.get_collection(PENDING_LOOKUPS))
  message = (f"sparse_lookup('{table.table_name}', modify_graph=True) was built but the graph "
             "was not modified: call mxrec_pipeline.graph.modifier."
             "modify_graph_and_start_emb_cache() after building the model (and its "
             "gradients) and before running the session")
  with tf.name_scope("deferred_insertion"):
    guard = tf.debugging.Assert(tf.constant(False), [tf.constant(message)])
    with tf.control_dependencies([guard]):
      # Static shapes as the real tensors will have them: a constant-folded
      # shape here would leak into gradient ops built before the rewrite.
      unique_rows = tf.compat.v1.placeholder_with_default(tf.zeros([0], tf.int64), shape=[None],
                                                          name="unique_rows")
      restore = tf.compat.v1.placeholder_with_default(tf.zeros_like(ids, dtype=tf.int32),
                                                      shape=ids.shape, name="restore")
  graph.add_to_collection(
      PENDING_LOOKUPS,
      PendingLookup(table.table_name, ids, is_train, unique_rows, restore, f"modify_graph_{index}"))
  return unique_rows, restore
