"""Delta checkpoints of tables: what changed since the previous save, and a chain's restore.

A full save that starts a chain (`checkpoint.save_shard(..., start_chain=True)`)
clears the key index's change tracking (core/key_index.KeyIndex.export_changes);
`save_delta` then writes, per shard, a bundle of the same format as a full
one holding only the keys whose rows training touched since the previous
save of the chain (full or delta), with their rows, slots and last-seen
times, the whole pending (not yet admitted) state, the counters and step
counts, plus `deleted_keys`: the keys eviction removed since. A chain is
restored by `restore_chain`: per saved shard, the full bundle with each delta
applied in order (deletions, then the changed keys), then restored as one
checkpoint (checkpoint.restore_shard: onto the same or another shard count).
It equals the full save taken at the last delta's step bit for bit.

Mirrors mxRec's incremental checkpoints (`saver.save(..., save_delta=True)`,
`delta-sparse-*` directories) and DeepRec's sparse incremental checkpoints;
unlike mxRec's, admission and eviction state ride along. Flat and tiered
tables: a tiered table's change tracking is by global row, whose values only
training changes (moves between tiers do not), and its delta reads them from
whichever tier holds them, as its full save does.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import numpy as np
import tensorflow as tf

from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.distributed import shard_files
from mxrec_pipeline.util import delta_merge

DELETED = "deleted_keys"
# Per-key tensors of a bundle other than the rows and slots (checkpoint.save_shard).
_KEY_STATE = ("keys", "rows", "last_seen")


def save_delta(directory: str, table, optimizers=()) -> list[str]:
  """Saves what changed in each shard this process holds since the chain's previous save.

  Args:
    directory: This delta's directory (one per delta: `<table>/shard-<i>-of-<S>`
      under it, as a full save's).
    table: A table of the protocol (core/table_protocol.Table) or a shard.
    optimizers: The hash optimizers training the table, as in its full save.

  Returns:
    The bundles' prefixes.

  A shard whose change tracking never started (no full save with
  `start_chain` before) saves every key: still a correct delta.
  """
  shards = table.local_shards() if hasattr(table, "local_shards") else [table]
  prefixes = []
  for shard in shards:
    with contextlib.nullcontext() if shard.device is None else tf.device(shard.device):
      prefixes.append(_save_shard_delta(directory, shard, optimizers))
  return prefixes


def _save_shard_delta(directory: str, shard, optimizers) -> str:
  name = shard.table_name
  # Before reading a tiered table's rows: building attaches its slots to the tiers.
  slots = [shard.slot_variables(optimizer, create=True) for optimizer in optimizers]
  changes = shard.key_index.export_changes(clear=True)
  order = tf.argsort(changes["keys"])
  keys, rows = tf.gather(changes["keys"], order), tf.gather(changes["rows"], order)
  tiers = shard.tiers if shard.is_tiered else None
  # A tiered table's rows are global rows, read from whichever tier holds them.
  whole = None if tiers is None else tiers.read_rows(shard.variable, rows)

  def rows_of(variable, block: int) -> tf.Tensor:
    if whole is None:
      return tf.gather(variable, rows)
    return whole[:, block * shard.dim:(block + 1) * shard.dim]

  values = rows_of(shard.variable, 0)
  tensors = {
      "keys": keys, "values": values, "counters": changes["counters"],
      DELETED: tf.sort(changes[DELETED])
  }
  tensors.update(shard_files.key_state_entries(rows, tf.gather(changes["last_seen"], order)))
  tensors.update({n: changes[n] for n in shard_files.PENDING})
  for entries in checkpoint_lib.optimizer_entries(shard, optimizers, slots, rows_of):
    tensors.update(entries)
  prefix = checkpoint_lib.shard_prefix(directory, name, shard.shard_id, shard.num_shards)
  return checkpoint_lib.write_bundle(prefix, [(n, "", tensors[n]) for n in sorted(tensors)])


def merged_shard(full_dir: str, delta_dirs, table_name: str, shard_prefix_name: str,
                 optimizers=()) -> dict[str, np.ndarray]:
  """One saved shard's state after its full bundle and each delta, in order (NumPy).

  Args:
    full_dir, delta_dirs: The chain's full checkpoint and deltas, oldest first.
    table_name: The table.
    shard_prefix_name: The shard's bundle name, `shard-<i>-of-<S>`.
    optimizers: The hash optimizers, as saved.

  Raises:
    FileNotFoundError: a delta lacks this shard (naming it).
  """
  names = ["keys", "rows", "values", "last_seen", *shard_files.PENDING, "counters"]
  for optimizer in optimizers:
    names += [f"slot/{optimizer.optimizer_name}/{s}" for s in optimizer.slot_initial_values]
    names.append(f"iterations/{optimizer.optimizer_name}")
  state = shard_files.read_tensors(os.path.join(full_dir, table_name, shard_prefix_name),
                                   table_name, names)
  per_key = [n for n in names if n in _KEY_STATE or n == "values" or n.startswith("slot/")]
  deltas = []
  for directory in delta_dirs:
    prefix = os.path.join(directory, table_name, shard_prefix_name)
    if not tf.io.gfile.exists(prefix + ".index"):
      raise FileNotFoundError(f"table '{table_name}': delta {directory} has no {shard_prefix_name}")
    deltas.append(shard_files.read_tensors(prefix, table_name, names + [DELETED]))
  if not deltas:
    return state
  merged = delta_merge.merge(state, deltas, per_key, DELETED)
  for name in names:
    state[name] = merged[name] if name in per_key else deltas[-1][name]
  return state


def restore_chain(full_dir: str, delta_dirs, table, optimizers=(), keep_rows: bool = False,
                  scratch_dir: str | None = None) -> list[int]:
  """Restores a full checkpoint and its deltas, in order, into the shards this process holds.

  Each saved shard's bundles are merged (`merged_shard`) into a full bundle
  in `scratch_dir` (default: a temporary directory, removed after), which
  then restores as any checkpoint (checkpoint.restore_table: re-sharded by
  owner; `keep_rows` as there).

  Returns:
    The number of keys restored into each local shard.

  Raises:
    FileNotFoundError, ValueError: as checkpoint.restore_table; a delta
      missing a shard.
  """
  shards = table.local_shards() if hasattr(table, "local_shards") else [table]
  with tempfile.TemporaryDirectory() as temporary:
    scratch = scratch_dir or temporary
    materialize_chain(full_dir, delta_dirs, shards[0].table_name, scratch, optimizers)
    return checkpoint_lib.restore_table(scratch, table, optimizers, keep_rows=keep_rows)


def materialize_chain(full_dir: str, delta_dirs, table_name: str, out_dir: str,
                      optimizers=()) -> None:
  """Writes a table's chain (full save, then deltas in order) as full bundles under `out_dir`.

  One bundle per saved shard, `<out_dir>/<table>/shard-<i>-of-<S>`, each the
  `merged_shard` of that shard: what a full save at the last delta's step
  holds. Readers of full checkpoints (restores, exports, warm starts) read it.
  """
  for prefix in shard_files.saved_shards(full_dir, table_name):
    bundle = os.path.basename(prefix)
    state = merged_shard(full_dir, list(delta_dirs), table_name, bundle, optimizers)
    tensors = {n: tf.constant(value) for n, value in state.items()}
    tensors.update(shard_files.key_state_entries(tensors.pop("rows"), tensors.pop("last_seen")))
    checkpoint_lib.write_bundle(os.path.join(out_dir, table_name, bundle),
                                [(n, "", tensors[n]) for n in sorted(tensors)])
