"""Crash-safe directory writes: build beside the target, then rename into place.

`write_dir_atomically(target, write)` has `write` fill a temporary directory
`.<name>.tmp-<hex>` beside the target, then swaps it in: the old target is
renamed aside (`.<name>.old-<hex>`), the new one renamed in, the old one
deleted. Renames within a directory are atomic on POSIX file systems, so a
process killed at any point leaves at `target` either the old directory or the
new one, complete, except between the two renames, where `target` is briefly
absent and the old directory waits aside; the next write restores it before
starting. Leftovers of killed writes are removed by the next write to the same
target. On filesystems without directory renames (object stores, `ram://`)
each rename is a copy (util/model_files.rename_tree): a kill during it can
leave `target` partial until the next write.

`remove_checkpoint_temp_dirs` removes what tf.train.Checkpoint leaves when
killed while saving (`ckpt-<n>_temp/`, its sharded files before the merge).
"""

from __future__ import annotations

import os
import uuid
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.util import model_files

_TEMP = ".tmp-"
_OLD = ".old-"


def write_dir_atomically(target: str, write: Callable[[str], None],
                         before_rename: Callable[[str], None] | None = None) -> str:
  """Writes a directory with `write`, then renames it to `target`.

  Args:
    target: Directory to create or replace (local or any tf.io.gfile file
      system; renames are atomic only where the file system's are).
    write: Called with the path of a new empty temporary directory beside
      `target`, which it fills (e.g. `tf.saved_model.save(module, path)`).
    before_rename: Test seam: called with the temporary directory after
      `write` and before any rename (e.g. to kill the process there).

  Returns:
    target.

  Raises:
    Whatever `write` raises; the temporary directory is then removed and
    `target` left as it was.
  """
  target = target.rstrip("/")
  remove_leftovers(target)
  temp = _sibling(target, _TEMP)
  tf.io.gfile.makedirs(temp)
  try:
    write(temp)
    if before_rename is not None:
      before_rename(temp)
  except BaseException:
    model_files.remove(temp)
    raise
  old = None
  if tf.io.gfile.exists(target):
    old = _sibling(target, _OLD)
    model_files.rename_tree(target, old)
  model_files.rename_tree(temp, target)
  if old is not None:
    model_files.remove(old)
  return target


def remove_leftovers(target: str) -> list[str]:
  """Cleans up after writes to `target` that were killed; returns what it removed.

  Removes `.<name>.tmp-*` (unfinished writes) and `.<name>.old-*`
  (replaced directories not deleted yet). If `target` is absent (killed
  between the two renames), the newest `.<name>.old-*` is first renamed back
  to `target`.

  Args:
    target: The directory `write_dir_atomically` writes.

  Returns:
    Paths removed, sorted.
  """
  target = target.rstrip("/")
  temps = _siblings(target, _TEMP)
  olds = _siblings(target, _OLD)
  if olds and not tf.io.gfile.exists(target):
    newest = max(olds, key=lambda path: tf.io.gfile.stat(path).mtime_nsec)
    model_files.rename_tree(newest, target)
    olds.remove(newest)
  removed = sorted(temps + olds)
  for path in removed:
    model_files.remove(path)
  return removed


def remove_checkpoint_temp_dirs(checkpoint_dir: str, checkpoint_name: str = "ckpt") -> list[str]:
  """Removes the temporary directories of checkpoint saves that were killed.

  tf.train.Checkpoint writes a checkpoint's shards into
  `<prefix>_temp/` and merges them into `<prefix>.index` and
  `<prefix>.data-*`, deleting that directory; a process killed before the
  merge leaves it behind (the `checkpoint` state file still names the
  previous checkpoint). Call this when no save is running, e.g. before
  creating the run's tf.train.CheckpointManager.

  Args:
    checkpoint_dir: The CheckpointManager's directory (absent: nothing to do).
    checkpoint_name: The manager's checkpoint_name (prefixes `<name>-<n>`).

  Returns:
    Paths removed, sorted.
  """
  if not tf.io.gfile.isdir(checkpoint_dir):
    return []
  removed = sorted(
      os.path.join(checkpoint_dir, name.rstrip("/")) for name in tf.io.gfile.listdir(checkpoint_dir)
      if name.startswith(f"{checkpoint_name}-") and "_temp" in name and
      tf.io.gfile.isdir(os.path.join(checkpoint_dir, name)))
  for path in removed:
    model_files.remove(path)
  return removed


def _sibling(target: str, marker: str) -> str:
  """A new name beside `target`: `.<target's name><marker><hex>`.

  Hidden, and not prefixed by the target's name: filesystems that list by
  prefix (`ram://`) would otherwise see it inside the target.
  """
  parent, base = os.path.split(target)
  return os.path.join(parent, f".{base}{marker}{uuid.uuid4().hex[:12]}")


def _siblings(target: str, marker: str) -> list[str]:
  """Directories beside `target` named `.<target's name><marker>*`."""
  parent, base = os.path.split(target)
  parent = parent or "."
  if not tf.io.gfile.isdir(parent):
    return []
  return [
      os.path.join(parent, name.rstrip("/")) for name in tf.io.gfile.listdir(parent)
      if name.startswith(f".{base}{marker}")
  ]
