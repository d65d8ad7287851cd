"""Per-shard checkpoints of sharded tables, restorable onto any number of shards.

`save_shard` writes each worker's shard of a table as one TensorFlow bundle
(the SaveV2/RestoreV2 format of tf.train checkpoints) named
`<directory>/<table>/shard-<i>-of-<W>`, holding the shard's keys (not its
capacity), their rows, the hash optimizers' slots and step counts and the
admission/eviction state. `restore_shard` reads every `shard-*-of-<W>` file
of the table and keeps the keys this process owns by
`sharding.owner(key, num_shards)` of the restoring job: onto W' != W workers,
onto one process, or onto the same W. Written against the table protocol
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
import glob
import os
import re

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import key_index as key_index_lib
from mxrec_pipeline.distributed import sharding

_SHARD_FILE = re.compile(r"shard-(\d+)-of-(\d+)\.index")
_KEY_STATE = ("last_seen",)
_PENDING = ("pending_keys", "pending_counts", "pending_last_seen")


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


def save_table(directory: str, table, optimizers=()) -> list[str]:
  """save_shard of every shard this process holds (core/table_protocol.Table.local_shards).

  One worker's shard of a ShardedTable, every ps shard of a PSShardedTable
  (read from their ps tasks), or a single-process table as shard 0 of 1.

  Returns:
    The bundles' prefixes, in local-shard order.
  """
  prefixes = []
  for shard in table.local_shards():
    with _on_device(shard):
      prefixes.append(save_shard(directory, shard, optimizers))
  return prefixes


def restore_table(directory: str, table, optimizers=()) -> list[int]:
  """restore_shard of every shard this process holds: the checkpoint re-sharded by owner.

  Returns:
    The number of keys restored into each local shard.

  Raises:
    FileNotFoundError, ValueError: as restore_shard.
  """
  counts = []
  for shard in table.local_shards():
    with _on_device(shard):
      counts.append(restore_shard(directory, shard, optimizers))
  return counts


def shard_prefix(directory: str, table_name: str, shard_id: int, num_shards: int) -> str:
  """Path prefix of one shard's bundle: `<directory>/<table>/shard-<i>-of-<W>`."""
  return os.path.join(directory, table_name, f"shard-{shard_id}-of-{num_shards}")


def save_shard(directory: str, table, optimizers=()) -> str:
  """Saves this worker's shard of `table` (eagerly); every worker calls it.

  Atomic per shard: the bundle appears complete or not at all. Give each
  checkpoint its own directory (e.g. one per step): a job killed between two
  workers' saves must not leave one directory holding shards of two steps.
  The bundle `<directory>/<table>/shard-<i>-of-<W>` holds

    keys               [n] int64       the shard's keys
    values             [n, dim]        their rows (tiered tables: read from every tier)
    slot/<opt>/<slot>  [n, dim]        each hash optimizer's slots of those rows
    iterations/<opt>   [] int64        each hash optimizer's step count
    last_seen          [n] int64       admission/eviction state of the keys
    pending_keys, pending_counts, pending_last_seen   [p] int64, keys not admitted yet
    counters           [3] int64       admissions, evictions, latest timestamp

  Args:
    directory: Checkpoint directory, shared by the workers (or each worker's
      files copied into one directory before a restore).
    table: A shard (core/table_protocol.TableShard), or a table with one
      local shard: a ShardedTable, a single-process SparseEmbedding (shard 0
      of 1). Under the shard's device (save_table places it).
    optimizers: The hash optimizers training the table (their slots and step
      counts are saved).

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

  def gather(variable, block: int):
    if whole is None:
      return tf.gather(variable, rows)
    return whole[:, block * shard.dim:(block + 1) * shard.dim]

  tensors = {
      "keys": keys,
      "values": gather(shard.variable, 0),
      "last_seen": tf.gather(state["last_seen"], order),
      "counters": state["counters"],
  }
  tensors.update({name: state[name] for name in _PENDING})
  for optimizer, optimizer_slots in zip(optimizers, slots):
    for slot_name, slot in optimizer_slots.items():
      tensors[f"slot/{optimizer.optimizer_name}/{slot_name}"] = gather(
          slot, 0 if tiers is None else tiers.slot_block(slot))
    tensors[f"iterations/{optimizer.optimizer_name}"] = tf.convert_to_tensor(
        shard.iterations(optimizer))
  prefix = shard_prefix(directory, shard.table_name, shard.shard_id, shard.num_shards)
  os.makedirs(os.path.dirname(prefix), exist_ok=True)
  names = sorted(tensors)
  # Written under a temporary prefix, then renamed data first, index last: a
  # process killed while saving leaves no `.index`, so no shard restores from
  # a partial bundle (saved_shards looks for the index files).
  temporary = f"{prefix}_temp_{os.getpid()}"
  tf.raw_ops.SaveV2(prefix=temporary, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[tensors[n] for n in names])
  for path in glob.glob(glob.escape(temporary) + ".data-*"):
    os.replace(path, prefix + path[len(temporary):])
  os.replace(temporary + ".index", prefix + ".index")
  return prefix


def saved_shards(directory: str, table_name: str) -> list[str]:
  """Prefixes of the saved shards of a table, in shard order.

  Raises:
    FileNotFoundError: no shard, or a shard of the saved job missing (named).
    ValueError: shards of jobs of different sizes in one directory.
  """
  folder = os.path.join(directory, table_name)
  found = [_SHARD_FILE.fullmatch(f) for f in (os.listdir(folder) if os.path.isdir(folder) else [])]
  found = [(int(m.group(1)), int(m.group(2))) for m in found if m]
  if not found:
    raise FileNotFoundError(f"table '{table_name}': no shard-*-of-* checkpoint in {folder}")
  sizes = sorted({w for _, w in found})
  if len(sizes) != 1:
    raise ValueError(f"table '{table_name}': {folder} holds shards of jobs of {sizes} workers; "
                     "keep one job's checkpoint per directory")
  (num_saved,) = sizes
  prefixes = []
  for i in range(num_saved):
    if (i, num_saved) not in found:
      raise FileNotFoundError(f"table '{table_name}': shard {i} of {num_saved} is missing "
                              f"({shard_prefix(directory, table_name, i, num_saved)}.index)")
    prefixes.append(shard_prefix(directory, table_name, i, num_saved))
  return prefixes


def _read_shard(prefix: str, table_name: str, names) -> dict[str, np.ndarray]:
  """The tensors `names` of one shard's bundle.

  Raises:
    ValueError: the bundle lacks a tensor (saved without this optimizer?).
    FileNotFoundError: the bundle cannot be read (its data file missing or
      truncated), naming the table and the file.
  """
  try:
    reader = tf.train.load_checkpoint(prefix)
  except (tf.errors.OpError, ValueError) as e:
    raise FileNotFoundError(f"table '{table_name}': cannot read shard {prefix}: {e}") from None
  out = {}
  for name in names:
    try:
      out[name] = reader.get_tensor(name)
    except tf.errors.NotFoundError as e:
      raise ValueError(f"table '{table_name}': shard {prefix} has no `{name}` "
                       "(saved without this optimizer?)") from e
    except tf.errors.OpError as e:  # E.g. the data file missing: TF names it.
      raise FileNotFoundError(f"table '{table_name}': cannot read `{name}` of shard {prefix}: "
                              f"{e.message}") from None
  return out


def saved_key_count(directory: str, table_name: str) -> int:
  """The number of keys in the saved shards of a table (reads each shard's `keys`).

  Checks the checkpoint before anything is built from it: every shard is
  there and its bundle reads.

  Raises:
    FileNotFoundError, ValueError: see saved_shards and read_all_shards.
  """
  return sum(
      _read_shard(p, table_name, ["keys"])["keys"].size
      for p in saved_shards(directory, table_name))


def read_all_shards(directory: str, table_name: str, optimizers=()) -> dict[str, np.ndarray]:
  """Every saved shard of a table, concatenated: the checkpoint's tensors as NumPy arrays.

  Counters: admissions and evictions summed, the latest timestamp the max.

  Raises:
    FileNotFoundError: see saved_shards; a shard's bundle unreadable (e.g.
      its data file missing), naming the table and the shard.
    ValueError: see saved_shards; a shard lacks a tensor (e.g. another
      optimizer's slots).
  """
  names = ["keys", "values", *_KEY_STATE, *_PENDING, "counters"]
  for optimizer in optimizers:
    names += [f"slot/{optimizer.optimizer_name}/{s}" for s in optimizer.slot_initial_values]
    names.append(f"iterations/{optimizer.optimizer_name}")
  parts = [_read_shard(p, table_name, names) for p in saved_shards(directory, table_name)]
  out = {
      name: np.concatenate([p[name] for p in parts]) for name in names
      if name != "counters" and not name.startswith("iterations/")
  }
  counters = np.stack([p["counters"] for p in parts])
  out["counters"] = np.array([counters[:, 0].sum(), counters[:, 1].sum(), counters[:, 2].max()])
  for optimizer in optimizers:
    name = f"iterations/{optimizer.optimizer_name}"
    out[name] = parts[0][name]
  return out


# Rows read at a time from a saved shard whose keys another shard count re-shards.
CHUNK_ROWS = 1 << 16


def read_owned(directory: str, table_name: str, shard_id: int, num_shards: int, optimizers=(),
               chunk_rows: int = CHUNK_ROWS) -> dict[str, np.ndarray]:
  """The saved state of the keys that shard `shard_id` of `num_shards` owns (as read_all_shards').

  Never the whole table: saved by as many shards, shard i's bundle holds
  exactly the keys shard i owns (the owner function is the same), and only it
  is read; its counters and latest timestamp come back as saved. Saved by
  another number of shards, every bundle is streamed `chunk_rows` keys at a
  time (RestoreV2 slices), keeping the owned keys: peak memory is the owned
  state plus one chunk. The admission and eviction totals then go to shard 0
  alone (so the shards' counters still add up to the saved ones) and every
  shard gets the latest timestamp, its eviction clock.

  Returns:
    keys [m], values [m, dim], last_seen [m], slot/<opt>/<slot> [m, dim],
    iterations/<opt> [], pending_* [p], counters [3]: int64 but values and
    slots, in saved order.

  Raises:
    FileNotFoundError, ValueError: as read_all_shards; ValueError when a
      bundle of a same-sized job holds a key its shard does not own (a
      checkpoint of another owner function), naming the table and file.
  """
  prefixes = saved_shards(directory, table_name)
  per_key = ["keys", "values", *_KEY_STATE]
  for optimizer in optimizers:
    per_key += [f"slot/{optimizer.optimizer_name}/{s}" for s in optimizer.slot_initial_values]
  iterations = [f"iterations/{optimizer.optimizer_name}" for optimizer in optimizers]
  if len(prefixes) == num_shards:
    prefix = prefixes[shard_id]
    out = _read_shard(prefix, table_name, [*per_key, *_PENDING, "counters", *iterations])
    owners = sharding.owner_numpy(np.concatenate([out["keys"], out["pending_keys"]]), num_shards)
    if (owners != shard_id).any():
      raise ValueError(f"table '{table_name}': shard {prefix} holds keys that shard {shard_id} of "
                       f"{num_shards} does not own; it was not written by this project's owner "
                       "function")
    return out
  parts, heads, layout = [], [], None
  for prefix in prefixes:
    head = _read_shard(prefix, table_name, ["keys", *_PENDING, "counters", *iterations])
    keep = sharding.owner_numpy(head["keys"], num_shards) == shard_id
    pending = sharding.owner_numpy(head["pending_keys"], num_shards) == shard_id
    heads.append({n: head[n][pending] for n in _PENDING} |
                 {n: head[n] for n in ["counters", *iterations]})
    layout = _layout(prefix, table_name, per_key)
    for start in range(0, keep.size, chunk_rows):
      mask = keep[start:start + chunk_rows]
      if mask.any():
        chunk = _read_rows(prefix, table_name, layout, start, mask.size)
        parts.append({n: value[mask] for n, value in chunk.items()})
  out = {}
  for n in per_key:  # No owned key: empty arrays of the saved shapes and dtypes.
    shape, dtype = layout[n]
    out[n] = (np.concatenate([p[n] for p in parts])
              if parts else np.zeros([0, *shape[1:]], dtype.as_numpy_dtype))
  out.update({n: np.concatenate([h[n] for h in heads]) for n in _PENDING})
  counters = np.stack([h["counters"] for h in heads])
  first = shard_id == 0
  out["counters"] = np.array(
      [counters[:, 0].sum() * first, counters[:, 1].sum() * first, counters[:, 2].max()], np.int64)
  out.update({n: heads[0][n] for n in iterations})
  return out


def _layout(prefix: str, table_name: str, names) -> dict[str, tuple[list[int], tf.DType]]:
  """Name -> (saved shape, dtype) of the tensors `names` of one bundle.

  Raises:
    ValueError: the bundle lacks one (saved without this optimizer?).
  """
  reader = tf.train.load_checkpoint(prefix)  # _read_shard read this bundle already.
  shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
  missing = [n for n in names if n not in shapes]
  if missing:
    raise ValueError(f"table '{table_name}': shard {prefix} has no `{missing[0]}` "
                     "(saved without this optimizer?)")
  return {n: (shapes[n], dtypes[n]) for n in names}


def _read_rows(prefix: str, table_name: str, layout, start: int, length: int):
  """Keys start..start+length-1 of the per-key tensors of `layout` in one bundle (RestoreV2 slices).

  Raises:
    FileNotFoundError: the bundle's data cannot be read (naming the table and file).
  """
  names = list(layout)
  specs = [
      " ".join(map(str, layout[n][0])) + f" {start},{length}" + ":-" * (len(layout[n][0]) - 1)
      for n in names
  ]
  try:
    values = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=names, shape_and_slices=specs,
                                  dtypes=[layout[n][1] for n in names])
  except tf.errors.OpError as e:
    raise FileNotFoundError(f"table '{table_name}': cannot read shard {prefix}: "
                            f"{e.message}") from None
  return {name: value.numpy() for name, value in zip(names, values)}


def restore_shard(directory: str, table, optimizers=()) -> int:
  """Restores this worker's shard from the shards of any earlier job (eagerly).

  Keeps the saved keys this worker owns now (all of them for one process),
  whatever the number of shards that saved them, reading only those
  (`read_owned`: its own bundle when the shard count is the saved one, every
  bundle streamed in chunks otherwise). Keys get rows 0..m-1 in key order;
  rows past them keep their initial values. The admission and eviction
  counters restore as read_owned gives them. A tiered table's keys get global
  rows 0..m-1: the first device_vocabulary_size on the device, the rest in the
  host/SSD store.

  Args:
    directory: As given to save_shard.
    table: A shard, or a table with one local shard (as save_shard's).
    optimizers: The hash optimizers training the table, as saved.

  Returns:
    The number of keys restored into this shard.

  Raises:
    FileNotFoundError, ValueError: see saved_shards and read_owned.
    ValueError: the shard's rows cannot hold its keys, or the saved rows
      have another dim (both naming the table).
  """
  shard = _one_shard(table)
  shard_id, num_shards = shard.shard_id, shard.num_shards
  name = shard.table_name
  saved = read_owned(directory, name, shard_id, num_shards, optimizers)
  order = np.argsort(saved["keys"], kind="stable")
  saved.update({
      n: v[order] for n, v in saved.items()
      if n in ("keys", "values", *_KEY_STATE) or n.startswith("slot/")
  })
  keys = saved["keys"]
  tiers = shard.tiers if shard.is_tiered else None
  capacity = shard.device_vocabulary_size if tiers is None else tiers.config.total_rows
  if keys.size > capacity:
    raise ValueError(f"table '{name}': shard {shard_id} of {num_shards} gets {keys.size} keys of "
                     f"the checkpoint, more than its {capacity} rows")
  if saved["values"].shape[1:] != (shard.dim,):
    raise ValueError(f"table '{name}': the checkpoint's rows have dim "
                     f"{saved['values'].shape[1]}, the table {shard.dim}")
  rows = np.arange(keys.size, dtype=np.int64)
  state = {
      "keys": keys, "rows": rows, "last_seen": saved["last_seen"], "counters": saved["counters"]
  }
  state.update({n: saved[n] for n in _PENDING})
  shard.key_index.import_state(
      {n: tf.constant(state[n], tf.int64) for n in key_index_lib.STATE_NAMES})
  if tiers is not None:
    _restore_tiers(shard, tiers, saved, rows, optimizers)
    return int(keys.size)
  indices = tf.constant(rows[:, None])
  shard.variable.assign(tf.tensor_scatter_nd_update(shard.initial_rows(), indices, saved["values"]))
  for optimizer in optimizers:
    slots = shard.slot_variables(optimizer, create=True)
    for slot_name, initial in optimizer.slot_initial_values.items():
      slot = slots[slot_name]
      values = saved[f"slot/{optimizer.optimizer_name}/{slot_name}"]
      slot.assign(
          tf.tensor_scatter_nd_update(tf.fill(tf.shape(slot), tf.cast(initial, slot.dtype)),
                                      indices, values))
    shard.iterations(optimizer).assign(saved[f"iterations/{optimizer.optimizer_name}"])
  return int(keys.size)


def _restore_tiers(shard, tiers, saved, rows: np.ndarray, optimizers) -> None:
  """restore_shard of a tiered table: every tier's rows and slots of global rows `rows`.

  Slots of optimizers not given keep their initial values.
  """
  dim = shard.dim
  # Before fresh_rows: building attaches the optimizer's slots to the tiers.
  slots = [shard.slot_variables(optimizer, create=True) for optimizer in optimizers]
  whole = tiers.fresh_rows(tf.constant(rows, tf.int64)).numpy()
  whole[:, :dim] = saved["values"]
  for optimizer, optimizer_slots in zip(optimizers, slots):
    for slot_name, slot in optimizer_slots.items():
      block = tiers.slot_block(slot)
      whole[:,
            block * dim:(block + 1) * dim] = (saved[f"slot/{optimizer.optimizer_name}/{slot_name}"])
    shard.iterations(optimizer).assign(saved[f"iterations/{optimizer.optimizer_name}"])
  tiers.import_rows(shard.variable, tf.constant(rows, tf.int64), tf.constant(whole))
