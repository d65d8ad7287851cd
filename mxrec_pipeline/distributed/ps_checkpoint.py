"""Checkpoints (distributed/checkpoint.py's format, a bundle per ps task) and export of PS tables.

`save` writes shard i of a table on ps task i as the bundle
`<directory>/<table>/shard-<i>-of-<P>` of distributed/checkpoint.py (keys,
values, slot/<optimizer>/<slot>, iterations/<optimizer> = the table's step,
key state), read on the coordinator from each PS. `restore` re-shards any
such checkpoint by `sharding.owner(key, P')` onto the P' ps tasks of this
job: saved by a ParameterServerStrategy job with another ps count, by a
MultiWorkerMirroredStrategy job (ShardedTable) or by one process
(create_table, shard 0 of 1); and a PS checkpoint restores onto one process
or onto workers with checkpoint.restore_shard. `snapshot_tables` gathers
every shard into distributed/export.TableSnapshot, the stock-TF serving model.

Both run eagerly on the coordinator: every read and write of a shard is an
op placed on its ps task (tf.device), as the training step's are.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import export
from mxrec_pipeline.distributed.ps_table import PSShardedTable
from mxrec_pipeline.distributed.ps_table import ShardOptimizerView
from mxrec_pipeline.distributed.ps_table import ShardView


def save(directory: str, table: PSShardedTable) -> list[str]:
  """Saves every shard of `table` (its keys, rows, slots and step) under `directory`.

  Returns:
    The bundles' prefixes, shard 0 first.
  """
  prefixes = []
  for i, device in enumerate(table.devices):
    with tf.device(device):
      prefixes.append(
          checkpoint.save_shard(directory, ShardView(table, i), [ShardOptimizerView(table, i)]))
  return prefixes


def restore(directory: str, table: PSShardedTable) -> list[int]:
  """Restores `table` from any checkpoint of checkpoint.py's format, re-sharded by owner.

  Returns:
    The number of keys restored into each shard.

  Raises:
    FileNotFoundError, ValueError: as checkpoint.restore_shard (no or missing
      shards, a shard too small for its keys, another dim, another optimizer).
  """
  counts = []
  for i, device in enumerate(table.devices):
    with tf.device(device):
      counts.append(
          checkpoint.restore_shard(directory, ShardView(table, i), [ShardOptimizerView(table, i)]))
  return counts


def gather(table: PSShardedTable) -> tuple[np.ndarray, np.ndarray]:
  """(keys [n] int64 in increasing order, rows [n, dim]) of every shard of `table`."""
  parts = [table.export_shard(i) for i in range(table.num_shards)]
  keys = np.concatenate([p["keys"] for p in parts])
  values = np.concatenate([p["values"] for p in parts])
  order = np.argsort(keys, kind="stable")
  return keys[order], values[order]


def snapshot_tables(tables: Sequence[PSShardedTable], default_row=0.0) -> export.TableSnapshot:
  """The stock-TF serving snapshot (export.TableSnapshot) of every shard of each table."""
  return export.TableSnapshot([(t.table_name, t.key_dtype, *gather(t)) for t in tables],
                              default_row=default_row)
