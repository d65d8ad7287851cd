"""The files of the Saver's sparse parts: full ones, delta ones, and their chains.

A full sparse part `<dir>/sparse-<name>` and a delta `<dir>/delta-sparse-<name>`
(mxRec's prefixes) each hold `meta.json` and, per table, `table-<quoted
name>/` with `keys.npy` [n] int64, `rows.npy` [n] int64, `embeddings.npy`
[n, dim] and `slot-<i>.npy` [n, dim], sorted by key; a delta's tables also
hold `deleted_keys.npy` [d] int64 (the keys eviction removed since the
chain's previous save), and its meta.json lists its `chain`: the full part it
builds on, the deltas before it and itself, oldest first, as names in the
same directory (the model index of the version). `load_version` reads a
version's tables as one full part: the full arrays, then each delta applied
in order (deletions, then the changed keys).
"""

from __future__ import annotations

import json
import os
import urllib.parse

import numpy as np
import tensorflow as tf

from mxrec_pipeline.util import delta_merge
from mxrec_pipeline.util import model_files

SPARSE_PREFIX = "sparse-"
DELTA_PREFIX = "delta-sparse-"
META_FILE = "meta.json"
FORMAT_VERSION = 1
DELETED = "deleted_keys"


def sparse_dir(checkpoint_path: str) -> str:
  """The sparse part of a dense checkpoint path: `<dir>/sparse-<basename>`."""
  head, tail = os.path.split(checkpoint_path)
  return os.path.join(head, SPARSE_PREFIX + tail)


def delta_dir(checkpoint_path: str) -> str:
  """The delta sparse part of a dense checkpoint path: `<dir>/delta-sparse-<basename>`."""
  head, tail = os.path.split(checkpoint_path)
  return os.path.join(head, DELTA_PREFIX + tail)


def table_dir(table_name: str) -> str:
  """A table's directory in a sparse part (names may hold '/' and be '.': quoted, prefixed)."""
  return "table-" + urllib.parse.quote(table_name, safe="")


def read_meta(directory: str) -> dict:
  """A sparse part's meta.json, checked.

  Raises:
    FileNotFoundError: the directory or its meta.json is missing (named).
    ValueError: meta.json is corrupt or of another format.
  """
  meta_path = os.path.join(directory, META_FILE)
  if not tf.io.gfile.isdir(directory):
    raise FileNotFoundError(f"sparse checkpoint '{directory}' does not exist; it is written "
                            "beside the dense checkpoint by mxrec_pipeline Saver.save()")
  if not tf.io.gfile.exists(meta_path):
    raise FileNotFoundError(f"sparse checkpoint '{directory}' has no {META_FILE}")
  try:
    meta = json.loads(model_files.read_text(meta_path))
    if meta.get("format") != FORMAT_VERSION:
      raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT_VERSION}")
    if not isinstance(meta["tables"], dict):
      raise ValueError("`tables` is not a mapping")
  except (ValueError, KeyError, TypeError, AttributeError, tf.errors.OpError) as e:
    raise ValueError(f"sparse checkpoint '{meta_path}' is corrupt: {e}") from e
  return meta


def version(checkpoint_path: str) -> list[tuple[str, dict]]:
  """(directory, meta.json) of the sparse parts that make a dense checkpoint's tables.

  [the `sparse_dir`'s] for a full save; for a delta, those of the chain its
  meta.json lists, full part first. Each meta.json is read once.

  Raises:
    FileNotFoundError: neither part exists, or a part of the chain is
      missing (named, with the delta that needs it).
    ValueError: a corrupt meta.json.
  """
  full, delta = sparse_dir(checkpoint_path), delta_dir(checkpoint_path)
  if tf.io.gfile.isdir(full) or not tf.io.gfile.isdir(delta):
    return [(full, read_meta(full))]  # Raises for a missing part, naming the full one.
  meta = read_meta(delta)
  chain = meta.get("chain")
  if (not isinstance(chain, list) or not chain or not all(isinstance(n, str) for n in chain) or
      not chain[0].startswith(SPARSE_PREFIX) or chain[-1] != os.path.basename(delta)):
    raise ValueError(f"sparse checkpoint '{os.path.join(delta, META_FILE)}' is corrupt: its "
                     f"chain {chain!r} does not start with a full part and end with itself")
  parts = []
  for name in chain[:-1]:
    directory = os.path.join(os.path.dirname(delta), name)
    if not tf.io.gfile.exists(os.path.join(directory, META_FILE)):
      raise FileNotFoundError(f"delta checkpoint '{delta}' builds on '{directory}', which is "
                              "missing or incomplete: restore an earlier full checkpoint")
    parts.append((directory, read_meta(directory)))
  return parts + [(delta, meta)]


def load_table(directory: str, meta: dict, name: str, delta: bool = False) -> dict:
  """The arrays of one table of a sparse part, checked for dtype and shape consistency.

  Raises:
    FileNotFoundError: a file is missing; ValueError: a file is corrupt (named).
  """
  where = os.path.join(directory, table_dir(name))
  files = ["keys", "rows", "embeddings"] + [f"slot-{i}" for i in range(len(meta["slots"]))]
  arrays = {}
  for file in files + ([DELETED] if delta else []):
    path = os.path.join(where, f"{file}.npy")
    if not tf.io.gfile.exists(path):
      raise FileNotFoundError(f"sparse checkpoint file '{path}' of table '{name}' is missing")
    try:
      with tf.io.gfile.GFile(path, "rb") as f:
        arrays[file] = np.load(f, allow_pickle=False)
    except (ValueError, OSError, EOFError, tf.errors.OpError) as e:
      raise ValueError(f"sparse checkpoint file '{path}' of table '{name}' is corrupt: "
                       f"{e}") from e
  n = arrays["keys"].shape[0] if arrays["keys"].ndim == 1 else -1
  for file, array in arrays.items():
    integer = file in ("keys", "rows", DELETED)
    shape_ok = array.ndim == 1 if file == DELETED else array.shape == ((n,) if integer else
                                                                       (n, meta["dim"]))
    dtype_ok = array.dtype == np.int64 if integer else array.dtype.kind == "f"
    if n < 0 or not shape_ok or not dtype_ok:
      expected = "int64 [n]" if integer else f"float [n, {meta['dim']}]"
      raise ValueError(f"sparse checkpoint file '{os.path.join(where, file + '.npy')}' of table "
                       f"'{name}' is corrupt: {array.dtype} array of shape {array.shape}, "
                       f"expected {expected} with n = {n} keys")
  return arrays


def load_version(parts: list[tuple[str, dict]], name: str) -> tuple[dict, dict]:
  """(arrays, meta) of table `name` after the full part and each delta of `parts`, in order.

  Args:
    parts: A `version`: (directory, meta.json) of each part, full part first.
    name: The table.

  Raises:
    ValueError: a part lacks the table, or a delta saved it with another
      kind, dim or slots than the full part (named); errors of `load_table`.
  """
  for directory, meta in parts:
    if name not in meta["tables"]:
      raise ValueError(f"sparse checkpoint '{directory}' has no table '{name}' "
                       f"(it has {sorted(meta['tables'])})")
  (full_dir, full_meta), delta_parts = parts[0], parts[1:]
  base = full_meta["tables"][name]
  arrays = load_table(full_dir, base, name)
  deltas = []
  for directory, meta in delta_parts:
    table_meta = meta["tables"][name]
    if any(table_meta.get(k) != base.get(k) for k in ("kind", "dim", "slots")):
      raise ValueError(f"delta checkpoint '{directory}': table '{name}' was saved as a "
                       f"{table_meta.get('kind')} of dim {table_meta.get('dim')} with slots "
                       f"{table_meta.get('slots')}, its full part '{full_dir}' as a "
                       f"{base.get('kind')} of dim {base.get('dim')} with {base.get('slots')}")
    deltas.append(load_table(directory, table_meta, name, delta=True))
  return delta_merge.merge(arrays, deltas, list(arrays), DELETED), base


def referenced_dirs(checkpoint_paths) -> set[str]:
  """The sparse parts the versions of `checkpoint_paths` need (their chains), best effort:
  an unreadable version references its own parts only."""
  needed = set()
  for path in checkpoint_paths:
    needed.update({sparse_dir(path), delta_dir(path)})
    try:
      needed.update(directory for directory, _ in version(path))
    except (FileNotFoundError, ValueError):
      pass
  return needed
