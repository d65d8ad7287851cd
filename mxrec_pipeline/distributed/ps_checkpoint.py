"""Checkpoints (distributed/checkpoint.py's format, a bundle per ps task) and export of PS tables.

`save` writes shard i of a table on ps task i as the bundle
`<directory>/<table>/shard-<i>-of-<P>` of distributed/checkpoint.py (keys,
values, slot/<optimizer>/<slot>, iterations/<optimizer> = the table's step,
key state), read on the coordinator from each PS. `restore` re-shards any
such checkpoint by `sharding.owner(key, P')` onto the P' ps tasks of this
job: saved by a ParameterServerStrategy job with another ps count, by a
MultiWorkerMirroredStrategy job (ShardedTable) or by one process
(create_table, shard 0 of 1); and a PS checkpoint restores onto one process
or onto workers with checkpoint.restore_shard. `snapshot_tables` reads
every shard into distributed/export.TableSnapshot, the stock-TF serving model.

Both run eagerly on the coordinator: every read and write of a shard is an
op placed on its ps task (tf.device), as the training step's are.
"""

from __future__ import annotations

from typing import Sequence

from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import export
from mxrec_pipeline.distributed.ps_table import PSShardedTable


def save(directory: str, table: PSShardedTable, start_chain: bool = False) -> list[str]:
  """Saves every shard of `table` (its keys, rows, slots and step): checkpoint.save_table.

  `start_chain`: delta checkpoints follow (distributed/delta.save_delta: each
  ps shard writes its own), as checkpoint.save_table's.

  Returns:
    The bundles' prefixes, shard 0 first.
  """
  return checkpoint.save_table(directory, table, [table.optimizer], start_chain=start_chain)


def restore(directory: str, table: PSShardedTable) -> list[int]:
  """Restores `table` from any checkpoint of checkpoint.py's format, re-sharded by owner.

  Returns:
    The number of keys restored into each shard.

  Raises:
    FileNotFoundError, ValueError: as checkpoint.restore_shard (no or missing
      shards, a shard too small for its keys, another dim, another optimizer).
  """
  return checkpoint.restore_table(directory, table, [table.optimizer])


def snapshot_tables(tables: Sequence[PSShardedTable]) -> export.TableSnapshot:
  """The stock-TF serving snapshot (export.TableSnapshot) of every shard of each table.

  Read one shard at a time from its ps task (export.table_snapshot): the
  coordinator holds each table's rows once, not their slots.
  """
  return export.TableSnapshot(
      {t.table_name: (t.key_dtype, export.table_snapshot(t)) for t in tables})
