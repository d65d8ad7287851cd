"""The table protocol: what a table is, whatever its placement.

Every placement composes a table of shards. A single-process table
(core/embedding.SparseEmbedding) is its own one shard; a table sharded over
MultiWorkerMirroredStrategy workers (distributed/sharded_table.ShardedTable) is
one core table per worker plus a collective router; a table sharded over
parameter servers (distributed/ps_table.PSShardedTable) is one `PSShard` per ps
task plus device placement. A shard (`TableShard`) is a key index, its rows
and, optionally, host/SSD tiers, on one device; a hash optimizer's slots of it
are read through the shard. Checkpoints (distributed/checkpoint.py), eviction
(core/admission.py), statistics and export read shards only, so they are
written once for every placement. The placement is chosen once, by
core/placement.table_placement.

Mirrors TorchRec's composition of a sharded module from per-shard lookups and
an input/output dist (`ShardedEmbeddingBagCollection`); the names are mxRec's
(device_vocabulary_size: a shard's rows).
"""

from __future__ import annotations

import contextlib
from typing import Protocol, Sequence, runtime_checkable

import tensorflow as tf

from mxrec_pipeline.core import admission

# Key-index statistics every table reports, summed over its local shards.
STAT_NAMES = ("size", "capacity", "admissions", "evictions", "pending")


@runtime_checkable
class TableShard(Protocol):
  """One shard of a table: what checkpoints, eviction and export read.

  Attributes:
    table_name: The table's name (the same for every shard).
    dim: Embedding dimension.
    device_vocabulary_size: Rows of this shard's device variable.
    shard_id, num_shards: This shard and the table's number of shards.
    device: Device of the shard's ops (its key index and rows), or None to
      let the caller's placement decide (one process).
    key_index: Its core/key_index.KeyIndex.
    variable: [device_vocabulary_size, dim] rows.
    is_tiered: Whether `tiers` holds rows past the device rows.
    tiers: core/tiers.TieredStorage or distributed/ps_tiers.TieredShard, or None.
  """

  table_name: str
  dim: int
  device_vocabulary_size: int
  shard_id: int
  num_shards: int

  @property
  def device(self) -> str | None:
    ...

  def initial_rows(self) -> tf.Tensor:
    """[device_vocabulary_size, dim] initial rows (eviction resets freed rows to them)."""

  def slot_variables(self, optimizer, create: bool = False) -> dict[str, tf.Variable]:
    """Slot name -> the [device_vocabulary_size, dim] slot of `optimizer` on this shard.

    Raises:
      KeyError: `optimizer` has no slots of this shard (and `create` is
        false, or the shard's slots belong to another optimizer).
    """

  def iterations(self, optimizer) -> tf.Variable:
    """int64 scalar: the step count t of `optimizer`'s updates of this shard."""


@runtime_checkable
class Table(Protocol):
  """A table of any placement: its shards, eviction and statistics.

  Lookups differ by how ids reach the rows: a single-process table's ids are
  inserted in the input pipeline (core/asc), a sharded table's are routed in
  the step (`lookup` of ShardedTable and PSShardedTable).
  """

  table_name: str
  dim: int
  key_dtype: tf.DType
  device_vocabulary_size: int
  num_shards: int

  def local_shards(self) -> Sequence[TableShard]:
    """The shards this process saves, restores and evicts (each worker its own; the
    coordinator every ps shard; one process its table)."""

  def evict(self, optimizers=None) -> list[tf.Tensor]:
    """Evicts the local shards' idle keys; [num_evicted] int64 freed rows per local shard."""

  def stats(self) -> dict[str, int]:
    """STAT_NAMES -> the local shards' key-index counters, summed."""


def summed_stats(shards: Sequence[TableShard]) -> dict[str, int]:
  """STAT_NAMES -> the counters of `shards` summed (Python ints)."""
  out = dict.fromkeys(STAT_NAMES, 0)
  for shard in shards:
    with contextlib.nullcontext() if shard.device is None else tf.device(shard.device):
      counters = admission.table_stats(shard)
    for name in STAT_NAMES:
      out[name] += int(counters[name])
  return out
