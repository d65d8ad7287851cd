"""Embeddings of a batch's inserted ids: the one lookup path of every API.

Insertion (get_asc_insert_func in the dataset, sparse_lookup on tensor ids, the
TPUEmbedding-style enqueue) gives per table the batch's distinct rows,
`unique_rows` [num_unique] int64, and per feature `restore`, int32 positions
into them shaped like the ids (or ragged). A lookup is then

  unique_embeddings(table, unique_rows, ...)  -> [num_unique, dim]
  per_id(unique_emb, restore)                 -> [*ids_shape, dim]

with the first step chosen by the table's `kind` (see `TableKind`). The Keras
`SparseLookup`, `sparse_lookup` and `Embedding.dequeue` all read through here;
`combiner.combine` then reduces each position's ids.

Rows of -1 (ids with no row: unseen ones when not training, ids not admitted
yet when training with admission, core/admission.py) read the default value,
zeros unless given, and get no gradient.
"""

from __future__ import annotations

import enum

import tensorflow as tf

from mxrec_pipeline.core import default_value as default_value_lib


class TableKind(enum.Enum):
  """How a table keeps its rows, hence how `unique_embeddings` reads them.

  Every table has `kind` (and `is_tiered`, for `kind is TableKind.TIERED`).

  FLAT: a [device_vocabulary_size, dim] variable; unique_rows index it.
  TIERED: the variable caches rows of device, host and SSD tiers
    (core/tiers.py). In training unique_rows are device slots of the batch's
    plan, whose moves run first; otherwise they are global rows, read wherever
    they live without moving them.
  EXPANSION: a growable native row store (core/expansion.py), grown to cover
    unique_rows, then read by its lookup op.
  """

  FLAT = "flat"
  TIERED = "tiered"
  EXPANSION = "expansion"


def unique_embeddings(table, unique_rows: tf.Tensor, *, training: bool,
                      plan_token: tf.Tensor | None = None, default_value=None,
                      admitting: bool = False) -> tf.Tensor:
  """Embeddings of a table's distinct rows, read as the table's kind needs.

  Args:
    table: A table from create_table (SparseEmbedding or ExpansionTable).
    unique_rows: [num_unique] int64 rows from the batch's insertion; -1 for ids
      without a row (see the module docstring).
    training: The batch was inserted for training (rows were handed out).
    plan_token: Tiered tables in training: the batch's [1] int64 plan token
      (core/tiers.py); ignored otherwise.
    default_value: Scalar or [dim] value read by rows of -1 (zeros when None).
    admitting: Training with admission (flat and tiered tables): rows of -1
      read default_value and get no gradient.

  Returns:
    [num_unique, dim] embeddings of the table's value dtype. Their gradient
    with respect to `table.variable` is IndexedSlices on the rows read.

  Raises:
    ValueError: a tiered table in training without plan_token; default_value
      neither a scalar nor of shape [dim].
    NotImplementedError: admitting with an expansion table.
  """
  if table.kind is TableKind.EXPANSION:
    if admitting:
      raise NotImplementedError(f"table '{table.table_name}': admission and eviction are not "
                                "available with dynamic expansion yet")
    local_emb, _ = table.lookup_unique(unique_rows, training)
    if training or default_value is None:
      return local_emb
    default = default_value_lib.default_embedding(default_value, table.dim, local_emb.dtype,
                                                  table.table_name)
    return tf.where(tf.expand_dims(unique_rows >= 0, -1), local_emb, default)
  if table.kind is TableKind.TIERED and not training:
    return table.tiers.read(table.variable, unique_rows, default_value)
  if table.kind is TableKind.TIERED:
    if plan_token is None:
      raise ValueError(f"table '{table.table_name}' is tiered: a training lookup needs the "
                       "batch's plan token, which get_asc_insert_func puts in the batch")
    with tf.control_dependencies([table.tiers.apply_plan(table.variable, plan_token)]):
      # The rows (hence the gradient's indices, hence the optimizer's reads of
      # its slots) depend on the moves: in a tf.compat.v1 graph nothing else
      # orders them.
      unique_rows = tf.identity(unique_rows)
  return gather_rows(table.variable, unique_rows, training=training, default_value=default_value,
                     admitting=admitting)


def gather_rows(rows, unique_rows: tf.Tensor, *, training: bool = True, default_value=None,
                admitting: bool = False) -> tf.Tensor:
  """`gather(rows, unique_rows)`, with rows of -1 reading the default value.

  The read of a flat table, of a tiered table's device rows once the batch's
  plan is applied, and of a bare rows variable (e.g. an exported snapshot).

  Args:
    rows: [capacity, dim] variable (or tensor) of rows.
    unique_rows: [num_unique] int64; -1 marks an id without a row when not
      training (or when admitting).
    training: With False, rows of -1 read `default_value`.
    default_value: Scalar or [dim] value for rows of -1 (zeros when None).
    admitting: Training with admission: rows of -1 (ids not admitted yet)
      read `default_value` and get no gradient.

  Returns:
    [num_unique, dim] of rows' dtype. Their gradient with respect to `rows`
    is IndexedSlices on unique_rows (the rows >= 0 when admitting).

  Raises:
    ValueError: default_value neither a scalar nor of shape [dim].
  """
  rows = _replica_local(rows)
  if training and not admitting:
    return tf.gather(rows, unique_rows)
  default = default_value_lib.default_embedding(default_value, rows.shape[-1], rows.dtype,
                                                rows.name.split("/")[0])
  present = unique_rows >= 0
  if not training:
    unique_emb = tf.gather(rows, tf.maximum(unique_rows, 0))
  else:
    # Only rows >= 0 are gathered, so the gradient is IndexedSlices on those
    # rows alone: ids without a row (not admitted yet) get no update.
    gathered = tf.gather(rows, tf.boolean_mask(unique_rows, present))
    unique_emb = tf.scatter_nd(
        tf.where(present), gathered,
        tf.stack(
            [tf.size(unique_rows, out_type=tf.int64),
             tf.shape(gathered, out_type=tf.int64)[1]]))
  return tf.where(tf.expand_dims(present, -1), unique_emb, default)


def per_id(unique_emb: tf.Tensor, restore):
  """Every id's embedding: `gather(unique_emb, restore)`.

  Args:
    unique_emb: [num_unique, dim] from `unique_embeddings` or `gather_rows`.
    restore: [*ids_shape] int32 positions into unique_emb, or a
      tf.RaggedTensor of them.

  Returns:
    [*ids_shape, dim]; a tf.RaggedTensor [..., (num_ids), dim] for ragged
    restore.
  """
  if isinstance(restore, tf.RaggedTensor):
    return restore.with_flat_values(tf.gather(unique_emb, restore.flat_values))
  return tf.gather(unique_emb, restore)


def _replica_local(rows):
  """In a replica context, the replica's own component of mirrored rows.

  TF 2.15's DistributedVariable has no sparse_read in a replica context, so
  `tf.gather` on it reads the whole table (and lazy Adam's scatter then copies
  it); gathering from the local component reads only the rows, with the same
  values and gradients.
  """
  if (isinstance(rows, tf.distribute.DistributedValues) and
      not tf.distribute.in_cross_replica_context()):
    context = tf.distribute.get_replica_context()
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is not None:
      return context.strategy.experimental_local_results(rows)[replica]
  return rows
