"""Crash-safe directory writes: build beside the target, then rename into place.

`write_dir_atomically(target, write)` has `write` fill a temporary directory
`<target>.tmp-<hex>` beside the target, then swaps it in: the old target is
renamed aside (`<target>.old-<hex>`), the new one renamed in, the old one
deleted. Renames within a directory are atomic on POSIX file systems, so a
process killed at any point leaves at `target` either the old directory or the
new one, complete, except between the two renames, where `target` is briefly
absent and the old directory waits aside; the next write restores it before
starting. Leftovers of killed writes are removed by the next write to the same
target.

`remove_checkpoint_temp_dirs` removes what tf.train.Checkpoint leaves when
killed while saving (`ckpt-<n>_temp/`, its sharded files before the merge).
"""

from __future__ import annotations

import os
import uuid
from typing import Callable

import tensorflow as tf

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
  temp = f"{target}{_TEMP}{uuid.uuid4().hex[:12]}"
  tf.io.gfile.makedirs(temp)
  try:
    write(temp)
    if before_rename is not None:
      before_rename(temp)
  except BaseException:
    tf.io.gfile.rmtree(temp)
    raise
  old = None
  if tf.io.gfile.exists(target):
    old = f"{target}{_OLD}{uuid.uuid4().hex[:12]}"
    tf.io.gfile.rename(target, old)
  tf.io.gfile.rename(temp, target)
  if old is not None:
    tf.io.gfile.rmtree(old)
  return target


def remove_leftovers(target: str) -> list[str]:
  """Cleans up after writes to `target` that were killed; returns what it removed.

  Removes `<target>.tmp-*` (unfinished writes) and `<target>.old-*`
  (replaced directories not deleted yet). If `target` is absent (killed
  between the two renames), the newest `<target>.old-*` is first renamed back
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
    tf.io.gfile.rename(newest, target)
    olds.remove(newest)
  removed = sorted(temps + olds)
  for path in removed:
    tf.io.gfile.rmtree(path)
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
    tf.io.gfile.rmtree(path)
  return removed


def _siblings(target: str, marker: str) -> list[str]:
  """Directories beside `target` named `<target's name><marker>*`."""
  parent, base = os.path.split(target)
  parent = parent or "."
  if not tf.io.gfile.isdir(parent):
    return []
  return [
      os.path.join(parent, name.rstrip("/")) for name in tf.io.gfile.listdir(parent)
      if name.startswith(base + marker)
  ]
