"""Serving snapshots of tables of any placement, built one shard at a time.

A snapshot is what a single-process export holds of a table
(core/key_index.KeyIndex.to_compact_table, keras/export.py): the rows of its
keys plus a default row, [num_keys + 1, dim], and a SortedKeyTable key ->
position (num_keys for absent keys; keys in variables, so `saved_model.pb`
does not grow with them). `table_snapshot` builds it for any table of the
protocol (core/table_protocol.py) without gathering the table anywhere but in
the exporting process: shards held in this process (one process's table,
every ps shard on the coordinator) are read in place; under
MultiWorkerMirroredStrategy every other worker writes its shard's keys and
rows to a staging directory on shared storage, `CHUNK_ROWS` keys per file
(`stage_shard`), and the worker holding shard 0 reads its own shard in place
and those files one at a time. Rows are copied
`CHUNK_ROWS` keys at a time into the snapshot's variable, in key order, so
the exporting process holds the serving rows once (plus one chunk, and about
100 bytes per key of key arrays while the snapshot is built) and no other
process holds any row but its own. `TableSnapshot` saves snapshots as a
SavedModel that serves raw ids with plain TensorFlow, no custom op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.core.sorted_key_table import SortedKeyTable
from mxrec_pipeline.distributed import shard_files
from mxrec_pipeline.util import local_variable
from mxrec_pipeline.util import model_files

# Keys whose rows are copied into the snapshot at a time.
CHUNK_ROWS = shard_files.CHUNK_ROWS


@dataclasses.dataclass
class Snapshot:
  """A table's serving snapshot: rows [num_keys + 1, dim] (default row last) and positions."""

  rows: tf.Variable
  positions: SortedKeyTable


@dataclasses.dataclass
class ShardRows:
  """One shard's part of a snapshot: its keys and a reader of their rows.

  Attributes:
    keys: [n] int64 keys of the shard.
    read: (start, stop) -> [stop - start, dim] NumPy rows of keys[start:stop].
    dim, dtype: The rows' dim and NumPy dtype.
  """

  keys: np.ndarray
  read: Callable[[int, int], np.ndarray]
  dim: int
  dtype: np.dtype


def shard_rows(shard) -> ShardRows:
  """The ShardRows of a shard in this process (core/table_protocol.TableShard).

  Rows are read under the shard's device (a ps shard's on its ps task); a
  tiered shard's from every tier (its embedding block, not its slots).
  """

  def on_device():
    return contextlib.nullcontext() if shard.device is None else tf.device(shard.device)

  with on_device():
    keys, rows = shard.key_index.export()

  def read(start: int, stop: int) -> np.ndarray:
    with on_device():
      if not shard.is_tiered:
        return tf.gather(shard.variable, rows[start:stop]).numpy()
      return shard.tiers.read_rows(shard.variable, rows[start:stop])[:, :shard.dim].numpy()

  return ShardRows(keys.numpy(), read, shard.dim, shard.variable.dtype.as_numpy_dtype)


def file_rows(prefix: str, table_name: str) -> ShardRows:
  """The ShardRows of a saved shard bundle (distributed/checkpoint.save_shard's format).

  Reads its keys now and its rows by RestoreV2 slices when asked.

  Raises:
    FileNotFoundError, ValueError: the bundle is missing or unreadable
      (shard_files.read_tensors), naming the table and the file.
  """
  keys = shard_files.read_tensors(prefix, table_name, ["keys"])["keys"]
  (shape, dtype) = shard_files.layout(prefix, table_name, ["values"])["values"]
  layout = {"values": (shape, dtype)}

  def read(start: int, stop: int) -> np.ndarray:
    return shard_files.read_rows(prefix, table_name, layout, start, stop - start)["values"]

  return ShardRows(keys, read, int(shape[1]), dtype.as_numpy_dtype)


def stage_shard(staging_dir: str, shard, chunk_rows: int = CHUNK_ROWS) -> list[str]:
  """Writes a shard's keys and rows (no slots) for the exporter, `chunk_rows` keys per file.

  Each part is its own bundle (`<shard prefix>-part-<k>`, SaveV2's format),
  so the worker holds one part's rows at a time; `staged_rows` lists them.

  Returns:
    The parts' prefixes, in key order of the shard's parts.
  """
  part = shard_rows(shard)
  prefix = shard_files.shard_prefix(staging_dir, shard.table_name, shard.shard_id, shard.num_shards)
  tf.io.gfile.makedirs(os.path.dirname(prefix))
  prefixes = []
  for k, start in enumerate(range(0, max(part.keys.size, 1), chunk_rows)):
    stop = min(start + chunk_rows, part.keys.size)
    prefixes.append(f"{prefix}-part-{k:06d}")
    tf.raw_ops.SaveV2(prefix=prefixes[-1], tensor_names=["keys",
                                                         "values"], shape_and_slices=["", ""],
                      tensors=[tf.constant(part.keys[start:stop]),
                               part.read(start, stop)])
  return prefixes


def staged_rows(staging_dir: str, table_name: str, shard_id: int,
                num_shards: int) -> list[ShardRows]:
  """The parts `stage_shard` wrote of a shard, each a bundle read by `file_rows`.

  Raises:
    FileNotFoundError: no part of the shard, or a part unreadable (named).
  """
  prefix = shard_files.shard_prefix(staging_dir, table_name, shard_id, num_shards)
  prefixes = sorted(p[:-len(".index")] for p in tf.io.gfile.glob(f"{prefix}-part-*.index"))
  if not prefixes:
    raise FileNotFoundError(f"table '{table_name}': shard {shard_id} of {num_shards} was not "
                            f"staged in {staging_dir}")
  return [file_rows(p, table_name) for p in prefixes]


def build_snapshot(name: str, parts: Sequence[ShardRows], chunk_rows: int = CHUNK_ROWS) -> Snapshot:
  """The Snapshot of table `name` from its shards' parts, rows copied chunk by chunk.

  Rows in increasing key order (as a single-process export's, whatever the
  number of shards): the variable is allocated once and each chunk of
  `chunk_rows` keys is scattered to its keys' places; the default row, last,
  is zeros.

  Raises:
    ValueError: a key in two parts (SortedKeyTable names it), or parts of
      different dims.
  """
  dims = {(p.dim, np.dtype(p.dtype)) for p in parts}
  if len(dims) != 1:
    raise ValueError(f"table '{name}': its shards' rows differ in (dim, dtype): {sorted(dims)}")
  ((dim, dtype),) = dims
  keys = np.concatenate([p.keys for p in parts])
  order = np.argsort(keys, kind="stable")
  positions = SortedKeyTable(keys[order], default_value=keys.size, name=f"{name}_positions")
  place = np.empty_like(order)  # Part-order key -> its place in key order.
  place[order] = np.arange(order.size)
  del keys, order
  rows = local_variable.local_variable(lambda: tf.zeros([place.size + 1, dim], dtype),
                                       f"{name}_serving_rows")
  offset = 0
  for part in parts:
    for start in range(0, part.keys.size, chunk_rows):
      stop = min(start + chunk_rows, part.keys.size)
      rows.scatter_update(
          tf.IndexedSlices(part.read(start, stop), place[offset + start:offset + stop]))
    offset += part.keys.size
  return Snapshot(rows, positions)


def files_snapshot(directory: str, table_name: str, chunk_rows: int = CHUNK_ROWS) -> Snapshot:
  """The Snapshot of a table from its saved shards in `directory` (any number), one at a time.

  Raises:
    FileNotFoundError, ValueError: as shard_files.saved_shards and file_rows.
  """
  prefixes = shard_files.saved_shards(directory, table_name)
  return build_snapshot(table_name, [file_rows(p, table_name) for p in prefixes], chunk_rows)


def table_snapshot(table, staging_dir: str | None = None, barrier: Callable[[], None] | None = None,
                   chunk_rows: int = CHUNK_ROWS) -> Snapshot | None:
  """The serving Snapshot of a table of any placement (eagerly); see the module docstring.

  Args:
    table: A table of core/table_protocol.Table.
    staging_dir: Where workers that hold one shard each write it (a
      directory every worker can write and the exporter read); unused when
      this process holds every shard.
    barrier: Returns once every worker reached it (sharded over workers).
    chunk_rows: Keys whose rows are copied at a time.

  Returns:
    The Snapshot, in the process holding shard 0 (which reads its own shard
    in place); None in the other workers (they only stage their shard).

  Raises:
    ValueError: a table sharded over workers without staging_dir or barrier.
  """
  local = list(table.local_shards())
  if len(local) == table.num_shards:
    return build_snapshot(table.table_name, [shard_rows(s) for s in local], chunk_rows)
  if staging_dir is None or barrier is None:
    raise ValueError(f"table '{table.table_name}': sharded over workers, its snapshot needs a "
                     "staging_dir and a barrier")
  exporter = any(s.shard_id == 0 for s in local)
  if not exporter:
    for shard in local:  # Keys and rows (no slots) of this worker's shards.
      stage_shard(staging_dir, shard, chunk_rows)
  barrier()
  if not exporter:
    return None
  own = {s.shard_id for s in local}  # Read in place; the others' from their staged files.
  parts = [shard_rows(s) for s in local] + [
      part for i in range(table.num_shards) if i not in own
      for part in staged_rows(staging_dir, table.table_name, i, table.num_shards)
  ]
  return build_snapshot(table.table_name, parts, chunk_rows)


def remove_staging(staging_dir: str) -> None:
  """Removes a staging directory of table_snapshot (the exporter, once it has read it)."""
  model_files.remove(staging_dir)


def signature_name(table_name: str) -> str:
  """`lookup_<table>`, characters other than letters, digits and '_' replaced by '_'."""
  return "lookup_" + re.sub(r"[^A-Za-z0-9_]", "_", table_name)


class TableSnapshot(tf.Module):
  """A SavedModel-able set of table snapshots for serving: raw ids -> embeddings.

  Per table `rows[name]` ([num_keys + 1, dim] variable, the default row last)
  and `positions[name]` (SortedKeyTable int64 key -> int64 position). Save it
  with `save`, which exports one signature per table, `signature_name(name)`:
  ids [batch] of the table's key dtype (strings fingerprinted as
  core/key_index.to_keys does) -> {"embeddings": [batch, dim]}.

  Args:
    snapshots: Table name -> (key dtype, Snapshot), e.g. from table_snapshot.
  """

  def __init__(self, snapshots: Mapping[str, tuple[tf.DType, Snapshot]]):
    super().__init__(name="sharded_tables_snapshot")
    self.rows = {name: snapshot.rows for name, (_, snapshot) in snapshots.items()}
    self.positions = {name: snapshot.positions for name, (_, snapshot) in snapshots.items()}
    self._key_dtypes = {name: tf.as_dtype(dtype) for name, (dtype, _) in snapshots.items()}

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


def staging_path(directory: str, number: int) -> str:
  """`<directory>/export-staging-<number>`: where workers stage an export's shards."""
  return os.path.join(directory, f"export-staging-{number}")
