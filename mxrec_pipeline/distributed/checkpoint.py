"""Per-shard checkpoints of sharded tables, restorable onto any number of shards.

`save_shard` writes each worker's shard of a table as one TensorFlow bundle
(the SaveV2/RestoreV2 format of tf.train checkpoints) named
`<directory>/<table>/shard-<i>-of-<W>`, holding the shard's keys (not its
capacity), their rows, the hash optimizers' slots and step counts and the
admission/eviction state. `restore_shard` restores the keys this process
owns by `sharding.owner(key, num_shards)` of the restoring job, reading only
those (distributed/shard_files.py: its own bundle for the same W, else every
bundle streamed in chunks): onto W' != W workers, onto one process, or onto
the same W. Written against the table protocol
(core/table_protocol.py): `save_table`/`restore_table` handle every shard a
process holds, so a single-process table (shard 0 of 1), a worker's shard and
every ps shard save and restore with the same code; dense variables are
checkpointed by the user's tf.train.Checkpoint as under any strategy.

Tiered tables (core/tiers.py, distributed/ps_tiers.py) save the rows and slots
of every tier in the same format, so the bundles restore onto tiered or flat
tables, onto any shard count. See
docs/distributed.md#checkpoints-and-export.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.distributed import shard_files

# The bundles' reading side, named here too for the users of this module.
shard_prefix = shard_files.shard_prefix
saved_shards = shard_files.saved_shards
saved_key_count = shard_files.saved_key_count
read_all_shards = shard_files.read_all_shards
read_owned = shard_files.read_owned
__all__ = [
    "read_all_shards", "read_owned", "restore_shard", "restore_table", "save_shard", "save_table",
    "saved_key_count", "saved_shards", "shard_prefix"
]


def _one_shard(table):
  """The one local shard of `table` (a table of the protocol, or a shard itself)."""
  shards = table.local_shards() if hasattr(table, "local_shards") else [table]
  if len(shards) != 1:
    raise ValueError(f"table '{table.table_name}': this process holds {len(shards)} shards; "
                     "save_table / restore_table save and restore each")
  return shards[0]


def _on_device(shard):
  """The shard's device scope (a ps shard's ops run on its ps task)."""
  return contextlib.nullcontext() if shard.device is None else tf.device(shard.device)


def save_table(directory: str, table, optimizers=(), start_chain: bool = False) -> list[str]:
  """save_shard of every shard this process holds (core/table_protocol.Table.local_shards).

  `start_chain`: as save_shard's (delta checkpoints follow, distributed/delta.py).

  One worker's shard of a ShardedTable, every ps shard of a PSShardedTable
  (read from their ps tasks), or a single-process table as shard 0 of 1.

  Returns:
    The bundles' prefixes, in local-shard order.
  """
  prefixes = []
  for shard in table.local_shards():
    with _on_device(shard):
      prefixes.append(save_shard(directory, shard, optimizers, start_chain=start_chain))
  return prefixes


def restore_table(directory: str, table, optimizers=(), keep_rows: bool = False) -> list[int]:
  """restore_shard of every shard this process holds: the checkpoint re-sharded by owner.

  `keep_rows`: as restore_shard's.

  Returns:
    The number of keys restored into each local shard.

  Raises:
    FileNotFoundError, ValueError: as restore_shard.
  """
  counts = []
  for shard in table.local_shards():
    with _on_device(shard):
      counts.append(restore_shard(directory, shard, optimizers, keep_rows=keep_rows))
  return counts


def save_shard(directory: str, table, optimizers=(), chunk_rows: int = shard_files.CHUNK_ROWS,
               start_chain: bool = False) -> str:
  """Saves this worker's shard of `table` (eagerly); every worker calls it.

  Atomic per shard: the bundle appears complete or not at all. Give each
  checkpoint its own directory (e.g. one per step): a job killed between two
  workers' saves must not leave one directory holding shards of two steps.
  The bundle `<directory>/<table>/shard-<i>-of-<W>` holds

    keys               [n] int64       the shard's keys
    rows               [n] int32       their rows in the shard (a restore onto the same
                                       shard count can keep them: restore_shard's keep_rows;
                                       int64 past 2^31 - 1 rows)
    values             [n, dim]        their rows (tiered tables: read from every tier)
    slot/<opt>/<slot>  [n, dim]        each hash optimizer's slots of those rows
    iterations/<opt>   [] int64        each hash optimizer's step count
    last_seen          [n] int64       admission/eviction state of the keys (left out when
                                       no key has one: shard_files.key_state_entries)
    pending_keys, pending_counts, pending_last_seen   [p] int64, keys not admitted yet
    counters           [3] int64       admissions, evictions, latest timestamp

  The [n]-first tensors are saved in slices of shard_files.CHUNK_ROWS keys,
  so readers of a chunk of keys read only its slice.

  Args:
    directory: Checkpoint directory, shared by the workers (or each worker's
      files copied into one directory before a restore).
    table: A shard (core/table_protocol.TableShard), or a table with one
      local shard: a ShardedTable, a single-process SparseEmbedding (shard 0
      of 1). Under the shard's device (save_table places it).
    optimizers: The hash optimizers training the table (their slots and step
      counts are saved).
    chunk_rows: Keys per saved slice of the per-key tensors.
    start_chain: This full save starts a chain of delta checkpoints
      (distributed/delta.py): the key index's change tracking starts anew.

  Returns:
    The bundle's prefix.
  """
  shard = _one_shard(table)
  state = shard.key_index.export_state()
  order = tf.argsort(state["keys"])
  keys, rows = tf.gather(state["keys"], order), tf.gather(state["rows"], order)
  tiers = shard.tiers if shard.is_tiered else None
  # Before reading a tiered table's rows: building attaches its slots to the tiers.
  slots = [shard.slot_variables(optimizer, create=True) for optimizer in optimizers]
  # A tiered table's rows are global rows: read each tier's, [n, dim * (1 + slots)].
  whole = None if tiers is None else tiers.read_rows(shard.variable, rows)

  def rows_of(variable, block: int):
    """Its rows of keys start..stop-1 (in key order), gathered only when SaveV2 asks."""
    if whole is None:
      return lambda start, stop: tf.gather(variable, rows[start:stop])
    return lambda start, stop: whole[start:stop, block * shard.dim:(block + 1) * shard.dim]

  key_state = shard_files.key_state_entries(rows, tf.gather(state["last_seen"], order))
  # Per-key tensors, saved in slices of chunk_rows keys (`_slices`): name -> (start, stop) -> part.
  per_key = {
      "keys": lambda start, stop: keys[start:stop],
      "values": rows_of(shard.variable, 0),
  }
  per_key.update({
      name: lambda start, stop, value=value: value[start:stop] for name, value in key_state.items()
  })
  tensors = {"counters": state["counters"]}
  tensors.update({name: state[name] for name in shard_files.PENDING})
  slot_rows, steps = optimizer_entries(shard, optimizers, slots, rows_of)
  per_key.update(slot_rows)
  tensors.update(steps)
  num_keys = int(keys.shape[0])
  entries = [(n, "", tensors[n]) for n in sorted(tensors)]
  for name in sorted(per_key):
    entries += _slices(name, per_key[name], num_keys, chunk_rows)
  if start_chain:  # Delta checkpoints after this save hold what changed since it.
    shard.key_index.export_changes(clear=True)
  return write_bundle(shard_prefix(directory, shard.table_name, shard.shard_id, shard.num_shards),
                      entries)


def optimizer_entries(shard, optimizers, slots, rows_of) -> tuple[dict, dict]:
  """A bundle's entries of the hash optimizers training `shard` (full saves and deltas).

  Args:
    shard: The shard saved.
    optimizers: Its hash optimizers.
    slots: Per optimizer, its slot variables of the shard (slot name -> variable).
    rows_of: (variable, block) -> the saved rows of the variable; block is a
      tiered table's slot block in `TieredStorage.read_rows`' layout (0 for a
      flat table).

  Returns:
    ({"slot/<optimizer>/<slot>": rows_of(...)}, {"iterations/<optimizer>": its step count}).
  """
  tiers = shard.tiers if shard.is_tiered else None
  slot_rows, steps = {}, {}
  for optimizer, optimizer_slots in zip(optimizers, slots):
    for slot_name, slot in optimizer_slots.items():
      slot_rows[f"slot/{optimizer.optimizer_name}/{slot_name}"] = rows_of(
          slot, 0 if tiers is None else tiers.slot_block(slot))
    steps[f"iterations/{optimizer.optimizer_name}"] = tf.convert_to_tensor(
        shard.iterations(optimizer))
  return slot_rows, steps


def write_bundle(prefix: str, entries: list[tuple[str, str, tf.Tensor]]) -> str:
  """Writes SaveV2 `entries` (name, shape-and-slice spec, tensor) as bundle `prefix`, atomically.

  Written under a temporary prefix, then renamed data first, index last: a
  process killed while saving leaves no `.index`, so no shard restores from
  a partial bundle (saved_shards looks for the index files).
  """
  tf.io.gfile.makedirs(os.path.dirname(prefix))
  temporary = f"{prefix}_temp_{os.getpid()}"
  tf.raw_ops.SaveV2(prefix=temporary, tensor_names=[e[0] for e in entries],
                    shape_and_slices=[e[1] for e in entries], tensors=[e[2] for e in entries])
  for path in tf.io.gfile.glob(temporary + ".data-*"):
    tf.io.gfile.rename(path, prefix + path[len(temporary):], overwrite=True)
  tf.io.gfile.rename(temporary + ".index", prefix + ".index", overwrite=True)
  return prefix


def _slices(name: str, part, num_keys: int,
            chunk_rows: int = shard_files.CHUNK_ROWS) -> list[tuple[str, str, tf.Tensor]]:
  """(name, shape-and-slice spec, part) entries of SaveV2 for a per-key tensor.

  Saved in slices of `chunk_rows` keys (as TF saves a partitioned variable),
  so a restore or an export reading keys start..start+length touches only
  the slices they fall in: RestoreV2 of a slice of a tensor saved whole
  reads the whole tensor (shard_files.read_rows).

  Args:
    name: The tensor's name in the bundle.
    part: (start, stop) -> the tensor's rows of keys start..stop-1.
    num_keys: The shard's keys (the tensor's first dim).
    chunk_rows: Keys per slice.
  """
  if num_keys <= chunk_rows:
    return [(name, "", part(0, num_keys))]
  entries = []
  for start in range(0, num_keys, chunk_rows):
    value = part(start, min(start + chunk_rows, num_keys))
    shape = [num_keys, *value.shape.as_list()[1:]]
    spec = (" ".join(map(str, shape)) + f" {start},{int(value.shape[0])}" + ":-" * (len(shape) - 1))
    entries.append((name, spec, value))
  return entries


def restore_shard(directory: str, table, optimizers=(), chunk_rows: int = shard_files.CHUNK_ROWS,
                  keep_rows: bool = False) -> int:
  """Restores this worker's shard from the shards of any earlier job (eagerly).

  Keeps the saved keys this worker owns now (all of them for one process),
  whatever the number of shards that saved them, and reads only those
  (shard_files.owned_keys: its own bundle when the shard count is the saved
  one, else every bundle streamed): the keys and their state first, then
  the rows and slots `chunk_rows` saved keys at a time, scattered into the
  shard's variables, so the process holds its shard plus one chunk. Keys get
  rows 0..m-1 in key order; rows past them get their initial values. A
  tiered table's keys get global rows 0..m-1: the first
  device_vocabulary_size on the device, the rest in the host/SSD store (its
  owned rows are read whole, then imported).

  Args:
    directory: As given to save_shard.
    table: A shard, or a table with one local shard (as save_shard's).
    optimizers: The hash optimizers training the table, as saved.
    chunk_rows: Saved keys read at a time.
    keep_rows: A flat table restored onto the shard count that saved it
      gets each key on its saved row (bundles that record rows), not rows
      0..m-1: the key index as it was, so new keys get the rows they would
      have got (a bit-exact resume, keras/checkpoints.py).

  Returns:
    The number of keys restored into this shard.

  Raises:
    FileNotFoundError, ValueError: see shard_files.saved_shards and
      owned_keys (checked before anything is written).
    ValueError: the shard's rows cannot hold its keys, or the saved rows
      have another dim (both naming the table, before anything is written).
  """
  shard = _one_shard(table)
  shard_id, num_shards = shard.shard_id, shard.num_shards
  name = shard.table_name
  owned = shard_files.owned_keys(directory, name, shard_id, num_shards, optimizers)
  tiers = shard.tiers if shard.is_tiered else None
  capacity = shard.device_vocabulary_size if tiers is None else tiers.config.total_rows
  if owned.keys.size > capacity:
    raise ValueError(
        f"table '{name}': shard {shard_id} of {num_shards} gets {owned.keys.size} keys "
        f"of the checkpoint, more than its {capacity} rows")
  if owned.dim != shard.dim:
    raise ValueError(f"table '{name}': the checkpoint's rows have dim {owned.dim}, the table "
                     f"{shard.dim}")
  # Row of each owned key, in the order owned_chunks gives them: rows 0..m-1 by key,
  # or the saved ones.
  order = np.argsort(owned.keys, kind="stable")
  if keep_rows and tiers is None and owned.rows is not None:
    row_of = owned.rows
    if row_of.size and row_of.max() >= capacity:
      raise ValueError(f"table '{name}': the checkpoint's rows reach {row_of.max()}, past the "
                       f"{capacity} rows of shard {shard_id} of {num_shards}")
  else:
    row_of = np.empty(order.size, np.int64)
    row_of[order] = np.arange(order.size, dtype=np.int64)
  state = {"keys": owned.keys[order], "rows": row_of[order], "last_seen": owned.last_seen[order]}
  state.update({n: owned.state[n] for n in (*shard_files.PENDING, "counters")})
  shard.key_index.import_state(
      {n: tf.constant(state[n], tf.int64) for n in key_index_lib.STATE_NAMES})
  names = shard_files.row_tensors(optimizers)
  # A flat table's chunks stay where they were read (a ps shard's: on its ps),
  # not through this process; a tiered one's are assembled here.
  chunks = shard_files.owned_chunks(owned, name, names, chunk_rows, as_numpy=tiers is not None)
  if tiers is not None:
    _restore_tiers(shard, tiers, owned, chunks, row_of, optimizers)
    return int(owned.keys.size)
  targets = [shard.variable]
  shard.variable.assign(shard.initial_rows())
  for optimizer in optimizers:
    slots = shard.slot_variables(optimizer, create=True)
    for slot_name, initial in optimizer.slot_initial_values.items():
      slot = slots[slot_name]
      slot.assign(tf.fill(tf.shape(slot), tf.cast(initial, slot.dtype)))
      targets.append(slot)
    shard.iterations(optimizer).assign(owned.state[f"iterations/{optimizer.optimizer_name}"])
  done = 0
  for chunk in chunks:
    size = int(chunk["values"].shape[0])
    indices = tf.constant(row_of[done:done + size])
    done += size
    for variable, tensor in zip(targets, names):
      # ResourceScatterUpdate: its shape function needs no handle data, which a
      # ps shard's remote variable lacks in eager mode (ScatterNd's does).
      variable.scatter_update(tf.IndexedSlices(chunk[tensor], indices))
  return int(owned.keys.size)


def _restore_tiers(shard, tiers, owned, chunks, row_of: np.ndarray, optimizers) -> None:
  """restore_shard of a tiered table: every tier's rows and slots of global rows 0..m-1.

  Slots of optimizers not given keep their initial values.
  """
  dim = shard.dim
  # Before fresh_rows: building attaches the optimizer's slots to the tiers.
  slots = [shard.slot_variables(optimizer, create=True) for optimizer in optimizers]
  rows = np.sort(row_of)
  whole = tiers.fresh_rows(tf.constant(rows, tf.int64)).numpy()
  blocks = [0]
  for optimizer, optimizer_slots in zip(optimizers, slots):
    blocks += [tiers.slot_block(slot) for slot in optimizer_slots.values()]
    shard.iterations(optimizer).assign(owned.state[f"iterations/{optimizer.optimizer_name}"])
  done = 0
  for chunk in chunks:
    size = len(chunk["values"])
    target = row_of[done:done + size]
    done += size
    for block, values in zip(blocks, chunk.values()):
      whole[target, block * dim:(block + 1) * dim] = values
  tiers.import_rows(shard.variable, tf.constant(rows, tf.int64), tf.constant(whole))
