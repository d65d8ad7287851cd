"""Embeddings of a batch's inserted ids: the one lookup path of every API.

Insertion (get_asc_insert_func in the dataset, sparse_lookup on tensor ids, the
TPUEmbedding-style enqueue) gives per table the batch's distinct rows,
`unique_rows` [num_unique] int64, and per feature `restore`, int32 positions
into them shaped like the ids (or ragged). `id_embeddings(table, unique_rows,
restore, training=...)` -> [*ids_shape, dim] reads them as the table's `kind`
(`TableKind`: FLAT, TIERED, EXPANSION) needs; the Keras `SparseLookup`,
`sparse_lookup` and `Embedding.dequeue` all read through it, and
`combiner.combine` then reduces each position's ids.

Training reads the distinct rows once, then every id's from those
(core/restore_sum.py), so a table's gradient is IndexedSlices on the batch's
distinct rows, each once. Reads outside training are plain gathers (serving
graphs hold no native op). Rows of -1 (ids with no row: unseen ones when not
training, ids not admitted yet when training with admission,
core/admission.py) read the default value, zeros unless given, and get no
gradient. See docs/architecture.md#one-training-step.
"""

from __future__ import annotations

import enum

import tensorflow as tf

from mxrec_pipeline.core import default_value as default_value_lib
from mxrec_pipeline.core import restore_sum


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
  return gather_rows(table.variable, _planned(table, unique_rows, plan_token), training=training,
                     default_value=default_value, admitting=admitting)


def id_embeddings(table, unique_rows: tf.Tensor, restore, *, training: bool,
                  plan_token: tf.Tensor | None = None, default_value=None, admitting: bool = False):
  """Every id's embedding, read as the table's kind needs: THE lookup.

  In training, and for EXPANSION and TIERED tables, reads the distinct rows
  first (`unique_embeddings`, then `per_id`); FLAT tables outside training
  gather each id's row from the table variable (`gather_per_id`). See the
  module docstring.

  Args:
    table: A table from create_table (SparseEmbedding or ExpansionTable).
    unique_rows: [num_unique] int64 rows from the batch's insertion; -1 for ids
      without a row (see the module docstring).
    restore: [*ids_shape] int32 positions into unique_rows, or a
      tf.RaggedTensor of them.
    training, plan_token, default_value, admitting: As for
      `unique_embeddings`.

  Returns:
    [*ids_shape, dim] of the table's value dtype; a tf.RaggedTensor
    [..., (num_ids), dim] for ragged restore. In training the gradient with respect to a
    flat or tiered `table.variable` is IndexedSlices on the batch's distinct
    rows, each once, summed over their ids (rows of -1 get none).

  Raises:
    As `unique_embeddings`.
  """
  if training or table.kind is not TableKind.FLAT:
    return per_id(
        unique_embeddings(table, unique_rows, training=training, plan_token=plan_token,
                          default_value=default_value, admitting=admitting), restore,
        training=training)
  return gather_per_id(table.variable, _planned(table, unique_rows, plan_token), restore,
                       training=training, default_value=default_value, admitting=admitting)


def _planned(table, unique_rows: tf.Tensor, plan_token: tf.Tensor | None) -> tf.Tensor:
  """unique_rows, after the batch's plan is applied to a tiered table (training)."""
  if table.kind is not TableKind.TIERED:
    return unique_rows
  if plan_token is None:
    raise ValueError(f"table '{table.table_name}' is tiered: a training lookup needs the "
                     "batch's plan token, which get_asc_insert_func puts in the batch")
  with tf.control_dependencies([table.tiers.apply_plan(table.variable, plan_token)]):
    # The rows (hence the gradient's indices, hence the optimizer's reads of
    # its slots) depend on the moves: in a tf.compat.v1 graph nothing else
    # orders them.
    return tf.identity(unique_rows)


def gather_per_id(rows, unique_rows: tf.Tensor, restore, *, training: bool = True,
                  default_value=None, admitting: bool = False):
  """Every id's row read from `rows`: `gather(rows, gather(unique_rows, restore))`.

  The same values as `per_id(gather_rows(rows, unique_rows), restore)`, in
  one gather of the rows instead of two, and a backward pass with no segment
  sum: the gradient is the ids' gradients on their rows.

  Args:
    rows: [capacity, dim] variable (or tensor) of rows.
    unique_rows: [num_unique] int64, as for `gather_rows`.
    restore: [*ids_shape] int32 positions into unique_rows, or a
      tf.RaggedTensor of them.
    training, default_value, admitting: As for `gather_rows`.

  Returns:
    [*ids_shape, dim] of rows' dtype (ragged [..., (num_ids), dim] for ragged
    restore). The gradient with respect to `rows` is IndexedSlices on the
    ids' rows, repeated as the ids are (the rows >= 0 when admitting).

  Raises:
    ValueError: default_value neither a scalar nor of shape [dim].
  """
  positions = restore.flat_values if isinstance(restore, tf.RaggedTensor) else restore
  emb = gather_rows(rows, tf.gather(unique_rows, tf.reshape(positions, [-1])), training=training,
                    default_value=default_value, admitting=admitting)
  if positions.shape.rank != 1:  # gather_rows reads a vector of rows.
    emb = tf.reshape(emb, tf.concat([tf.shape(positions), tf.shape(emb)[-1:]], 0))
    emb.set_shape(positions.shape.concatenate(emb.shape[-1:]))
  return restore.with_flat_values(emb) if isinstance(restore, tf.RaggedTensor) else emb


def gather_rows(rows, unique_rows: tf.Tensor, *, training: bool = True, default_value=None,
                admitting: bool = False) -> tf.Tensor:
  """`gather(rows, unique_rows)`, with rows of -1 reading the default value.

  The read of a flat table, of a tiered table's device rows once the batch's
  plan is applied, and of a bare rows variable (e.g. an exported snapshot);
  `gather_per_id` reads through it.

  Args:
    rows: [capacity, dim] variable (or tensor) of rows.
    unique_rows: [num_unique] int64 (or every id's row, repeated, from
      `gather_per_id`); -1 marks an id without a row when not training (or
      when admitting).
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


def per_id(unique_emb: tf.Tensor, restore, *, training: bool = False):
  """Every id's embedding: `gather(unique_emb, restore)`.

  Args:
    unique_emb: [num_unique, dim] from `unique_embeddings` or `gather_rows`.
    restore: [*ids_shape] int32 positions into unique_emb, or a
      tf.RaggedTensor of them.
    training: Read with `restore_sum.gather_by_restore`, whose gradient (a
      dense [num_unique, dim]) the native MxSumByRestore sums by restore;
      else TF's gather (no native op in the graph, e.g. for serving).

  Returns:
    [*ids_shape, dim]; a tf.RaggedTensor [..., (num_ids), dim] for ragged
    restore.
  """
  gather = restore_sum.gather_by_restore if training else tf.gather
  if isinstance(restore, tf.RaggedTensor):
    return restore.with_flat_values(gather(unique_emb, restore.flat_values))
  return gather(unique_emb, restore)


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
