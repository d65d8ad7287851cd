"""Warm start: a new model's tables start from the keys and rows of an earlier run.

The way a team ships a model with one more feature or another dense part:
`pipeline.warm_start: {from: CHECKPOINT, tables: [...], rename: {old: new},
slots: false}` (hparams.WarmStart; mxRec's `Saver(warm_start_tables=...)`).
When a run starts with no checkpoint in its model_dir, each chosen table of
the checkpoint is read (keys, rows and, with `slots`, the sparse optimizer's
slots; from the checkpoint's `shards-N`, or from `ckpt-N` of a one-process
run of checkpoint format 2, whose manifest names each table's rows) and
imported into the new run's table of the same (or renamed) name: key k
gets row i of the new table, the row's values and slots are copied.
Everything else (tables not taken, the dense model, both optimizers' step
counts) starts as initialized; `apply` returns one line per table saying
which.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np
import tensorflow as tf

from mxrec_pipeline.hparams import WarmStart
from mxrec_pipeline.keras import checkpoints as checkpoints_lib
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.util import model_files

SLOTS_PATH = "sparse_optimizer/_slots/{table}/{slot}/.ATTRIBUTES/VARIABLE_VALUE"
KEY_INDEX_PATH = "key_indexes/{table}/.ATTRIBUTES/{field}"


class MissingTable(ValueError):
  """The checkpoint holds no table of that name."""


def resolve(source: str) -> str:
  """The checkpoint prefix of `source`: itself, or the newest complete checkpoint of a directory.

  Raises:
    FileNotFoundError: no such checkpoint (named).
  """
  if tf.io.gfile.exists(source + ".index"):
    return source
  for directory in (source, os.path.join(source, "checkpoints")):
    if tf.io.gfile.isdir(directory):
      prefix = checkpoints_lib.restorable_checkpoint(
          directory, lambda n, d=directory: table_checkpoints.shards_path(d, n))[0]
      if prefix is not None:
        return prefix
  raise FileNotFoundError(f"warm_start.from: no checkpoint at {source}")


def read_table(prefix: str, table: str, optimizer, slots: bool) -> dict[str, np.ndarray]:
  """{"keys": [n] int64, "rows": [n, dim], "slot/<name>": [n, dim]...} of `table` in `prefix`.

  Raises:
    ValueError: the checkpoint lacks the table, its rows' location (a
      checkpoint of a version before manifests) or its slots (named).
  """
  shards_dir = table_checkpoints.shards_path(os.path.dirname(prefix),
                                             checkpoints_lib.checkpoint_number(prefix))
  slot_names = list(optimizer.slot_initial_values) if slots else []
  if tf.io.gfile.isdir(shards_dir):
    if not tf.io.gfile.isdir(os.path.join(shards_dir, table)):
      raise MissingTable(f"warm_start: checkpoint {prefix} has no table '{table}'")
    optimizers = [optimizer] if slots else []
    with table_checkpoints.full_shards(os.path.dirname(prefix),
                                       checkpoints_lib.checkpoint_number(prefix), [table],
                                       optimizers) as full:  # A delta: its chain merged.
      saved = checkpoint_lib.read_all_shards(full, table, optimizers)
    return {"keys": saved["keys"], "rows": saved["values"]
           } | {f"slot/{s}": saved[f"slot/{optimizer.optimizer_name}/{s}"] for s in slot_names}
  reader = model_files.checkpoint_reader(prefix)
  names = reader.get_variable_to_shape_map()
  if KEY_INDEX_PATH.format(table=table, field="keys") not in names:
    raise MissingTable(f"warm_start: checkpoint {prefix} has no table '{table}'")
  rows_key = ((manifest.read(prefix) or {}).get("run", {}).get("table_rows") or {}).get(table)
  if rows_key not in names:
    raise ValueError(f"warm_start: checkpoint {prefix} does not say where table '{table}' keeps "
                     "its rows (a checkpoint of a version before manifests): train one epoch "
                     "from it with this version first")
  rows = reader.get_tensor(KEY_INDEX_PATH.format(table=table, field="rows"))
  out = {
      "keys": reader.get_tensor(KEY_INDEX_PATH.format(table=table, field="keys")),
      "rows": reader.get_tensor(rows_key)[rows]
  }
  for slot in slot_names:
    path = SLOTS_PATH.format(table=table, slot=slot)
    if path not in names:
      raise ValueError(f"warm_start: checkpoint {prefix} has no slot '{slot}' of table '{table}' "
                       f"(another sparse optimizer?); set warm_start.slots: false")
    out[f"slot/{slot}"] = reader.get_tensor(path)[rows]
  return out


def apply(spec: WarmStart, tables: Mapping, optimizer) -> list[str]:
  """Imports the chosen tables of `spec.source` into this run's `tables`; returns the log lines.

  Args:
    spec: The run's WarmStart.
    tables: This run's tables (name -> core SparseEmbedding), empty (a run
      before its first step).
    optimizer: This run's sparse optimizer.

  Raises:
    FileNotFoundError: no checkpoint at spec.source.
    ValueError: a chosen table the checkpoint or this model lacks, of another
      dim, with more keys than the new table's rows, or tiered (named).
  """
  prefix = resolve(spec.source)
  wanted = {spec.rename.get(name, name): name for name in spec.tables}
  unknown = sorted(set(wanted) - set(tables))
  if unknown:
    raise ValueError(f"warm_start: this model has no table {unknown} (tables: {sorted(tables)}; "
                     "rename maps checkpoint names to this model's)")
  renamed_back = {new: old for old, new in spec.rename.items()}
  lines = []
  for name, table in tables.items():
    source = wanted.get(name) if spec.tables else renamed_back.get(name, name)
    if source is None:
      lines.append(f"warm start: table '{name}' initialized (not among warm_start.tables)")
      continue
    if table.is_tiered:
      raise ValueError(f"warm_start: table '{name}' is tiered; warm start fills flat tables only")
    try:
      saved = read_table(prefix, source, optimizer, spec.slots)
    except MissingTable:
      if spec.tables:
        raise
      lines.append(f"warm start: table '{name}' initialized (not in {prefix})")
      continue
    keys, rows = saved["keys"], saved["rows"]
    capacity, dim = table.variable.shape
    if rows.shape[1] != dim:
      raise ValueError(f"warm_start: table '{source}' of {prefix} has dim {rows.shape[1]}, "
                       f"table '{name}' of this model {dim}")
    if len(keys) > capacity:
      raise ValueError(f"warm_start: table '{source}' of {prefix} holds {len(keys)} keys, more "
                       f"than the {capacity} rows of table '{name}' (device_vocabulary_size)")
    positions = np.arange(len(keys), dtype=np.int64)
    table.key_index.import_(tf.constant(keys, tf.int64), tf.constant(positions))
    table.variable.scatter_update(
        tf.IndexedSlices(tf.constant(rows, table.variable.dtype), tf.constant(positions)))
    if spec.slots:
      optimizer.build([table.variable])
      for slot in optimizer.slot_initial_values:
        variable = optimizer.get_slot(name, slot)
        variable.scatter_update(
            tf.IndexedSlices(tf.constant(saved[f"slot/{slot}"], variable.dtype),
                             tf.constant(positions)))
    lines.append(f"warm start: table '{name}' takes {len(keys)} keys from table '{source}' of "
                 f"{prefix}{' with slots' if spec.slots else ''}")
  return lines
