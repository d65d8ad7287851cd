"""Serving snapshots of sharded tables: every shard gathered into one stock-TF table.

At the end of a multi-worker job, `gather_shards` all-gathers each worker's
(keys, rows) with the strategy's collectives, so every worker holds the whole
table; the chief then builds the same compact snapshot a single-process table
exports (core/key_index.KeyIndex.to_compact_table, keras/export.py): rows of
the keys in increasing key order plus a default row, [num_keys + 1, dim], and
a SortedKeyTable (core/sorted_key_table.py) key -> position (num_keys for
absent keys). `TableSnapshot` saves it as a SavedModel that serves raw ids with plain
TensorFlow in a fresh process, no custom op, no import of this project.

(Another route to the same serving model: restore every shard into one
process, distributed/checkpoint.restore_shard on a create_table table, then
the single-process export of keras/export.py, unchanged.)
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.core.sorted_key_table import SortedKeyTable


def gather_shards(strategy: tf.distribute.Strategy, table) -> tuple[np.ndarray, np.ndarray]:
  """Every shard's keys and rows, on every worker (eagerly; all workers call it).

  Args:
    strategy: The job's MultiWorkerMirroredStrategy.
    table: A ShardedTable.

  Returns:
    (keys [n] int64 in increasing order, rows [n, dim]) of the whole table.
  """
  keys, rows = table.shard.key_index.export()
  values = tf.gather(table.variable, rows)

  def gather():
    context = tf.distribute.get_replica_context()
    return context.all_gather(keys, axis=0), context.all_gather(values, axis=0)

  all_keys, all_values = strategy.run(gather)
  (all_keys,) = strategy.experimental_local_results(all_keys)
  (all_values,) = strategy.experimental_local_results(all_values)
  order = np.argsort(all_keys.numpy(), kind="stable")
  return all_keys.numpy()[order], all_values.numpy()[order]


def signature_name(table_name: str) -> str:
  """`lookup_<table>`, characters other than letters, digits and '_' replaced by '_'."""
  return "lookup_" + re.sub(r"[^A-Za-z0-9_]", "_", table_name)


class TableSnapshot(tf.Module):
  """A SavedModel-able snapshot of tables for serving: raw ids -> embeddings.

  Per table `rows[name]` ([num_keys + 1, dim] variable, the default row last)
  and `positions[name]` (SortedKeyTable int64 key -> int64 position). Save it
  with `save`, which exports one signature per table, `signature_name(name)`:
  ids [batch] of the table's key dtype (strings fingerprinted as
  core/key_index.to_keys does) -> {"embeddings": [batch, dim]}.

  Args:
    tables: Per table (name, key_dtype, keys [n] int64, rows [n, dim]), e.g.
      from gather_shards.
    default_row: Scalar or [dim] row of absent keys (zeros by default).
  """

  def __init__(self, tables: Sequence[tuple[str, tf.DType, np.ndarray, np.ndarray]],
               default_row=0.0):
    super().__init__(name="sharded_tables_snapshot")
    self.rows = {}
    self.positions = {}
    self._key_dtypes = {}
    for name, key_dtype, keys, rows in tables:
      rows = np.asarray(rows)
      default = np.broadcast_to(np.asarray(default_row, rows.dtype), rows.shape[1:])
      self.rows[name] = tf.Variable(np.concatenate([rows, default[None]]), trainable=False,
                                    name=f"{name}_serving_rows")
      self.positions[name] = SortedKeyTable(keys, default_value=len(keys), name=f"{name}_positions")
      self._key_dtypes[name] = tf.as_dtype(key_dtype)

  def lookup(self, name: str, ids: tf.Tensor) -> tf.Tensor:
    """[*ids.shape, dim] rows of raw ids of table `name` (absent ids: the default row)."""
    keys = key_index_lib.to_keys(tf.convert_to_tensor(ids), f"table '{name}'")
    return tf.gather(self.rows[name], self.positions[name].lookup(keys))

  def save(self, export_dir: str) -> None:
    """Writes the SavedModel (one `signature_name(table)` signature per table) to export_dir."""
    signatures = {}
    for name, dtype in self._key_dtypes.items():
      function = tf.function(lambda ids, name=name: {"embeddings": self.lookup(name, ids)})
      signatures[signature_name(name)] = function.get_concrete_function(
          tf.TensorSpec([None], dtype, "ids"))
    tf.saved_model.save(self, export_dir, signatures=signatures)
