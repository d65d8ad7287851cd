"""Numbered export versions, TF Serving's model layout: `<export root>/<version>/`.

TF Serving's file-system source loads every subdirectory whose name is an
integer as a version of the model and serves the newest; other names
(`latest_model`, the `.<name>.tmp-*` directories of exports being written)
are not versions. `versions` lists them, `prune` keeps the newest N.
Through tf.io.gfile (util/model_files.py), so on any filesystem TF reaches.
"""

from __future__ import annotations

import tensorflow as tf

from mxrec_pipeline.util import model_files


def versions(root: str) -> list[int]:
  """The integer-named subdirectories of `root`, ascending ([] when `root` is absent)."""
  if not tf.io.gfile.isdir(root):
    return []
  names = [name.rstrip("/") for name in tf.io.gfile.listdir(root)]
  return sorted(int(name) for name in names if name.isdigit())


def prune(root: str, keep: int) -> list[int]:
  """Removes all but the newest `keep` (>= 1) versions under `root`; returns those removed.

  Raises:
    ValueError: `keep` < 1.
  """
  if keep < 1:
    raise ValueError(f"versions to keep must be >= 1, got {keep}")
  old = versions(root)[:-keep]
  for version in old:
    model_files.remove(f"{root.rstrip('/')}/{version}")
  return old
