"""File operations on a run's storage through TensorFlow's filesystem layer.

A model_dir (checkpoints, table shards, exports, metrics.json, the resolved
config, logs) may live on any filesystem TensorFlow reaches: local disk, GCS
(`gs://`), S3 or HDFS with their plugins, or the in-memory `ram://`. Every
read, write, listing, copy and removal of those paths goes through
`tf.io.gfile`, never Python's `os`/`shutil`/`glob` (tests/util/
test_util_model_files.py checks the storage modules for such calls). Writes
of small files are atomic where the filesystem renames atomically: written
beside the target, then renamed over it.
"""

from __future__ import annotations

import fnmatch
import json
import os
from typing import Sequence

import tensorflow as tf


def is_local(path: str) -> bool:
  """Whether `path` is on the local POSIX filesystem (no `scheme://` prefix, or file://)."""
  return "://" not in path or path.startswith("file://")


def write_text_atomically(path: str, text: str) -> str:
  """Writes `text` to `path` (UTF-8) through a temporary file renamed over it; returns path."""
  temporary = f"{path}.tmp-{os.getpid()}"
  with tf.io.gfile.GFile(temporary, "w") as f:
    f.write(text)
  tf.io.gfile.rename(temporary, path, overwrite=True)
  return path


def read_text(path: str) -> str:
  """The UTF-8 text of `path` (tf.errors.NotFoundError when absent)."""
  with tf.io.gfile.GFile(path, "r") as f:
    return f.read()


def read_json_lines(path: str) -> list[dict]:
  """The JSON objects of a JSON-lines file, in order ([] when there is no file)."""
  if not tf.io.gfile.exists(path):
    return []
  return [json.loads(line) for line in read_text(path).splitlines() if line.strip()]


def append_json_line(path: str, record: dict) -> None:
  """Adds `record` as the last line of the JSON-lines file `path` (created if absent).

  Rewrites the file atomically (`write_text_atomically`) rather than opening
  it in append mode, which object stores (GCS, S3) do not offer: a kill
  leaves the file with or without the line, never a torn one.
  """
  text = read_text(path) if tf.io.gfile.exists(path) else ""
  write_text_atomically(path, text + json.dumps(record, sort_keys=True) + "\n")


def remove(path: str) -> bool:
  """Removes the file or directory tree at `path`; whether there was one.

  Raises:
    tf.errors.OpError: the filesystem refused, naming the path.
  """
  if not tf.io.gfile.exists(path):
    return False
  if not tf.io.gfile.isdir(path):
    tf.io.gfile.remove(path)
  elif is_local(path):
    tf.io.gfile.rmtree(path)
  else:
    _remove_tree(path)
  return True


def _remove_tree(path: str) -> None:
  """rmtree for filesystems that list by name prefix (`ram://` lists `assets.extra/x` in
  `assets` as `.extra`, which its own rmtree then fails to delete): children first."""
  for name in tf.io.gfile.listdir(path):
    child = os.path.join(path, name.rstrip("/"))
    if not tf.io.gfile.exists(child):  # A sibling's name seen through the prefix.
      continue
    if tf.io.gfile.isdir(child):
      _remove_tree(child)
    else:
      tf.io.gfile.remove(child)
  try:
    tf.io.gfile.rmtree(path)  # The directory itself, now empty.
  except tf.errors.NotFoundError:
    pass  # Only a sibling's name was listed in it: nothing of its own is left.


def rename_tree(source: str, target: str) -> None:
  """Renames the directory `source` to `target` (absent): atomic on a local filesystem.

  Elsewhere (object stores, `ram://`), where TF's filesystems rename files but
  not directories atomically (`ram://` not at all), the tree is copied, then
  `source` removed: a process killed meanwhile leaves `target` partial and
  `source` whole.
  """
  if is_local(source):
    tf.io.gfile.rename(source, target)
    return
  copy_tree(source, target)
  remove(source)


def copy_tree(source: str, target: str, ignore: Sequence[str] = ()) -> None:
  """Copies the directory tree `source` to `target` (created), skipping names matching `ignore`.

  Args:
    source, target: Directories on any TF filesystems (they may differ).
    ignore: fnmatch patterns of file or directory names not copied (at any
      depth), as shutil.ignore_patterns.
  """
  tf.io.gfile.makedirs(target)
  for name in tf.io.gfile.listdir(source):
    name = name.rstrip("/")
    if any(fnmatch.fnmatch(name, pattern) for pattern in ignore):
      continue
    source_path, target_path = os.path.join(source, name), os.path.join(target, name)
    if not tf.io.gfile.exists(source_path):  # ram:// lists `<source>.x` siblings as `.x`.
      continue
    if tf.io.gfile.isdir(source_path):
      copy_tree(source_path, target_path, ignore)
    else:
      if tf.io.gfile.exists(target_path):  # (copy's overwrite fails on ram://.)
        tf.io.gfile.remove(target_path)
      try:
        tf.io.gfile.copy(source_path, target_path)
      except tf.errors.OpError as e:  # TF's message may not name the file.
        raise type(e)(e.node_def, e.op,
                      f"copying {source_path} to {target_path}: {e.message}") from None


def checkpoint_reader(prefix: str):
  """A reader of the TF checkpoint bundle `prefix` (its `.index` and data files).

  tf.train.load_checkpoint would first ask whether `prefix` is a directory,
  which a filesystem without directories (ram://, object stores) answers yes
  for any prefix of a file's name; this reads the bundle itself.

  Raises:
    tf.errors.OpError: the bundle cannot be read.
  """
  return tf.compat.v1.train.NewCheckpointReader(prefix)


def checkpoint_names(prefix: str) -> dict[str, list[int]]:
  """Name -> shape of every tensor in checkpoint bundle `prefix` (checkpoint_reader)."""
  return checkpoint_reader(prefix).get_variable_to_shape_map()
