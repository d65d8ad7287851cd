"""Reading the per-shard bundles of distributed/checkpoint.py: whole, or only what a shard owns.

A table's checkpoint is one bundle per saving shard, `<dir>/<table>/shard-<i>-of-<W>`
(SaveV2's format). `saved_shards` lists and checks them; `read_all_shards`
reads every one into NumPy (warm starts, tools); `owned_keys` + `owned_chunks`
read only what shard j of W' owns: its own bundle alone when W' == W (the
owner function puts exactly shard j's keys there), else every bundle streamed
`chunk_rows` keys at a time with RestoreV2 slices, keeping the owned ones, so
a restoring process never holds another shard's rows.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Iterator

import numpy as np
import tensorflow as tf

from mxrec_pipeline.distributed import sharding
from mxrec_pipeline.util import model_files

SHARD_FILE = re.compile(r"shard-(\d+)-of-(\d+)\.index")
KEY_STATE = ("last_seen",)
# A key's last-seen time when nothing tracks it (no admission or eviction): bundles whose keys
# all have it leave `last_seen` out (key_state_entries), readers fill it back in.
NOT_SEEN = -1
PENDING = ("pending_keys", "pending_counts", "pending_last_seen")
# Keys read at a time from a bundle that another shard count re-shards.
CHUNK_ROWS = 1 << 16


def shard_prefix(directory: str, table_name: str, shard_id: int, num_shards: int) -> str:
  """Path prefix of one shard's bundle: `<directory>/<table>/shard-<i>-of-<W>`."""
  return os.path.join(directory, table_name, f"shard-{shard_id}-of-{num_shards}")


def saved_shards(directory: str, table_name: str) -> list[str]:
  """Prefixes of the saved shards of a table, in shard order.

  Raises:
    FileNotFoundError: no shard, or a shard of the saved job missing (named).
    ValueError: shards of jobs of different sizes in one directory.
  """
  folder = os.path.join(directory, table_name)
  names = tf.io.gfile.listdir(folder) if tf.io.gfile.isdir(folder) else []
  found = [SHARD_FILE.fullmatch(f) for f in names]
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


def read_tensors(prefix: str, table_name: str, names, optional=()) -> dict[str, np.ndarray]:
  """The tensors `names` of one shard's bundle, and those of `optional` it holds.

  Raises:
    ValueError: the bundle lacks a tensor (saved without this optimizer?).
    FileNotFoundError: the bundle cannot be read (its data file missing or
      truncated), naming the table and the file.
  """
  try:
    reader = model_files.checkpoint_reader(prefix)
  except (tf.errors.OpError, ValueError) as e:
    raise FileNotFoundError(f"table '{table_name}': cannot read shard {prefix}: {e}") from None
  out = {}
  held = reader.get_variable_to_shape_map()
  unset = "last_seen" in names and "keys" in names and "last_seen" not in held
  for name in [*names, *(n for n in optional if n in held)]:
    if name == "last_seen" and unset:
      continue
    try:
      out[name] = reader.get_tensor(name)
    except tf.errors.NotFoundError as e:
      raise ValueError(f"table '{table_name}': shard {prefix} has no `{name}` "
                       "(saved without this optimizer?)") from e
    except tf.errors.OpError as e:  # E.g. the data file missing: TF names it.
      raise FileNotFoundError(f"table '{table_name}': cannot read `{name}` of shard {prefix}: "
                              f"{e.message}") from None
  return _full_key_state(out, unset)


def key_state_entries(rows: tf.Tensor, last_seen: tf.Tensor) -> dict[str, tf.Tensor]:
  """A bundle's per-key state: `rows` as int32 when they fit, `last_seen` only when any is set.

  4 or 12 bytes a key instead of 16 (int64 rows and last-seen times; 12 or
  20 with the int64 key instead of 24), saved by full bundles and deltas
  alike; `read_tensors` gives them back as int64, NOT_SEEN for an unsaved
  `last_seen`. Eager.

  Args:
    rows, last_seen: [n] int64, the keys' rows and last-seen times.
  """
  fits = int(tf.size(rows)) == 0 or int(tf.reduce_max(rows)) <= np.iinfo(np.int32).max
  out = {"rows": tf.cast(rows, tf.int32) if fits else rows}
  if bool(tf.reduce_any(last_seen != NOT_SEEN)):
    out["last_seen"] = last_seen
  return out


def _full_key_state(tensors: dict[str, np.ndarray], unset: bool) -> dict[str, np.ndarray]:
  """What key_state_entries left out or narrowed, as the int64 state it came from."""
  if "rows" in tensors:
    tensors["rows"] = tensors["rows"].astype(np.int64, copy=False)
  if unset:
    tensors["last_seen"] = np.full(tensors["keys"].shape, NOT_SEEN, np.int64)
  return tensors


def saved_key_count(directory: str, table_name: str) -> int:
  """The number of keys in the saved shards of a table (reads each shard's `keys`).

  Checks the checkpoint before anything is built from it: every shard is
  there and its bundle reads.

  Raises:
    FileNotFoundError, ValueError: see saved_shards and read_all_shards.
  """
  return sum(
      read_tensors(p, table_name, ["keys"])["keys"].size
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
  names = ["keys", "values", *KEY_STATE, *PENDING, "counters"]
  for optimizer in optimizers:
    names += [f"slot/{optimizer.optimizer_name}/{s}" for s in optimizer.slot_initial_values]
    names.append(f"iterations/{optimizer.optimizer_name}")
  parts = [read_tensors(p, table_name, names) for p in saved_shards(directory, table_name)]
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
def row_tensors(optimizers=()) -> list[str]:
  """Names of a bundle's [n, dim] tensors: values, then each optimizer's slots."""
  names = ["values"]
  for optimizer in optimizers:
    names += [f"slot/{optimizer.optimizer_name}/{s}" for s in optimizer.slot_initial_values]
  return names


@dataclasses.dataclass
class OwnedKeys:
  """What shard `shard_id` of `num_shards` owns of a checkpoint, before any row is read.

  Attributes:
    prefixes: The bundles to read (its own alone, or every one).
    masks: Per bundle, [n_b] bool: the keys it owns.
    keys, last_seen: [m] int64, the owned keys and their last-seen times, in
      bundle order (the order owned_chunks yields their rows in).
    rows: [m] int64, their saved rows, when read from their own shard's
      bundle (the saved shard count) and it records them; else None.
    state: pending_keys, pending_counts, pending_last_seen ([p] int64, the
      owned pending keys), counters ([3] int64) and iterations/<optimizer>.
    dim, dtype: The rows' dim and NumPy dtype.
    layouts: Per bundle, name -> (saved shape, dtype) of its row tensors.
  """

  prefixes: list[str]
  masks: list[np.ndarray]
  keys: np.ndarray
  last_seen: np.ndarray
  state: dict[str, np.ndarray]
  dim: int
  dtype: np.dtype
  layouts: list[dict]
  rows: np.ndarray | None = None


def owned_keys(directory: str, table_name: str, shard_id: int, num_shards: int,
               optimizers=()) -> OwnedKeys:
  """The keys shard `shard_id` of `num_shards` owns in a table's checkpoint (reads no rows).

  Saved by as many shards, only shard `shard_id`'s bundle is read, and its
  counters (admissions, evictions, latest timestamp) come back as saved.
  Otherwise every bundle's keys are read, the admission and eviction totals go
  to shard 0 alone (so the shards' counters still add up to the saved ones)
  and every shard gets the latest timestamp, its eviction clock. Every
  bundle's tensors are checked before any row is read.

  Raises:
    FileNotFoundError, ValueError: as saved_shards and read_all_shards;
      ValueError: a bundle of a same-sized job holding a key its shard does
      not own (not written with this owner function), naming table and file.
  """
  prefixes = saved_shards(directory, table_name)
  iterations = [f"iterations/{optimizer.optimizer_name}" for optimizer in optimizers]
  head_names = ["keys", *KEY_STATE, *PENDING, "counters", *iterations]
  same = len(prefixes) == num_shards
  if same:
    prefixes = [prefixes[shard_id]]
  heads, masks, layouts = [], [], []
  for prefix in prefixes:
    # Saved rows (not in bundles of versions before them) matter only to their own shard.
    head = read_tensors(prefix, table_name, head_names, optional=["rows"] if same else [])
    shapes = layout(prefix, table_name, row_tensors(optimizers))
    layouts.append(shapes)
    dim, dtype = shapes["values"][0][1], shapes["values"][1].as_numpy_dtype
    keep = sharding.owner_numpy(head["keys"], num_shards) == shard_id
    pending = sharding.owner_numpy(head["pending_keys"], num_shards) == shard_id
    if same and not (keep.all() and pending.all()):
      raise ValueError(f"table '{table_name}': shard {prefix} holds keys that shard {shard_id} of "
                       f"{num_shards} does not own; it was not written with this project's owner "
                       "function")
    heads.append({n: head[n][keep] for n in ("keys", *KEY_STATE, "rows") if n in head} |
                 {n: head[n][pending] for n in PENDING} |
                 {n: head[n] for n in ["counters", *iterations]})
    masks.append(keep)
  counters = np.stack([h["counters"] for h in heads])
  if not same:
    first = shard_id == 0
    counters = np.array(
        [[counters[:, 0].sum() * first, counters[:, 1].sum() * first, counters[:, 2].max()]],
        np.int64)
  state = {n: np.concatenate([h[n] for h in heads]) for n in PENDING}
  state["counters"] = counters[0]
  state.update({n: heads[0][n] for n in iterations})
  return OwnedKeys(prefixes, masks, np.concatenate([h["keys"] for h in heads]),
                   np.concatenate([h["last_seen"] for h in heads]), state, dim, dtype, layouts,
                   rows=heads[0]["rows"] if same and "rows" in heads[0] else None)


def owned_chunks(owned: OwnedKeys, table_name: str, names, chunk_rows: int = CHUNK_ROWS,
                 as_numpy: bool = True) -> Iterator[dict[str, np.ndarray]]:
  """The owned keys' rows of the tensors `names`, at most `chunk_rows` saved keys read at a time.

  `names` are among the row tensors `owned` was read with (row_tensors of its
  optimizers).

  Yields:
    Name -> [k, dim] array of the next k owned keys (in `owned.keys` order):
    NumPy, or (not `as_numpy`) tensors on the device the read ran on.

  Raises:
    FileNotFoundError: a bundle's data cannot be read, naming the table and file.
  """
  for prefix, keep, shapes in zip(owned.prefixes, owned.masks, owned.layouts):
    layout = {n: shapes[n] for n in names}
    for start in range(0, keep.size, chunk_rows):
      mask = keep[start:start + chunk_rows]
      if mask.any():
        chunk = read_rows(prefix, table_name, layout, start, mask.size, as_numpy)
        if mask.all():
          yield chunk
        elif as_numpy:
          yield {n: value[mask] for n, value in chunk.items()}
        else:
          yield {n: tf.boolean_mask(value, mask) for n, value in chunk.items()}


def read_owned(directory: str, table_name: str, shard_id: int, num_shards: int, optimizers=(),
               chunk_rows: int = CHUNK_ROWS) -> dict[str, np.ndarray]:
  """owned_keys + owned_chunks gathered: read_all_shards' arrays, only the owned keys'.

  Peak memory: the owned state plus one chunk.
  """
  owned = owned_keys(directory, table_name, shard_id, num_shards, optimizers)
  names = row_tensors(optimizers)
  chunks = list(owned_chunks(owned, table_name, names, chunk_rows))
  out = {"keys": owned.keys, "last_seen": owned.last_seen} | owned.state
  for name in names:
    out[name] = (np.concatenate([c[name] for c in chunks])
                 if chunks else np.zeros([0, owned.dim], owned.dtype))
  return out


def layout(prefix: str, table_name: str, names) -> dict[str, tuple[list[int], tf.DType]]:
  """Name -> (saved shape, dtype) of the tensors `names` of one bundle.

  Raises:
    ValueError: the bundle lacks one (saved without this optimizer?).
  """
  reader = model_files.checkpoint_reader(prefix)  # Its index only: read_tensors read the bundle.
  shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
  missing = [n for n in names if n not in shapes]
  if missing:
    raise ValueError(f"table '{table_name}': shard {prefix} has no `{missing[0]}` "
                     "(saved without this optimizer?)")
  return {n: (shapes[n], dtypes[n]) for n in names}


def read_rows(prefix: str, table_name: str, layout, start: int, length: int, as_numpy: bool = True):
  """Keys start..start+length-1 of the per-key tensors of `layout` in one bundle (RestoreV2 slices).

  Name -> NumPy array, or (not `as_numpy`) the tensor where RestoreV2 ran:
  under a ps shard's device, the rows stay on that ps.

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
  return {name: value.numpy() if as_numpy else value for name, value in zip(names, values)}
