"""Checkpoint manifests: the file written last, which makes a checkpoint complete.

After every file of checkpoint `ckpt-N` (its index and data files and, for
sharded runs, every table shard under `shards-N/`) is written,
`write(prefix, ...)` writes `ckpt-N.manifest.json` with the byte size of each
file, the project version, the checkpoint format and the run's description
(`run_info`: its tables and config). A checkpoint without its manifest, or
whose files differ from it in size (truncated, missing), is incomplete:
restores skip it and say why (`problem`). Writing a file last marks
completeness on any filesystem `tf.io.gfile` supports, object stores included,
where a rename is a copy. Checkpoints of versions before manifests (format 1)
have none; they are accepted when no older checkpoint of the directory has
one (`TrainingCheckpoint` decides).
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

import mxrec_pipeline

# 2: checkpoints with manifests, no export state, the best metric in the checkpoint.
# 3: every placement's tables by key in shards-N; one host's flat tables only there
#    (keras/checkpoints.one_host_checkpoint).
FORMAT = 3
SUFFIX = ".manifest.json"


def path(prefix: str) -> str:
  """The manifest of checkpoint `prefix` (e.g. `.../ckpt-3`)."""
  return prefix + SUFFIX


def _sizes(paths: list[str], root: str) -> dict[str, int]:
  return {os.path.relpath(p, root): tf.io.gfile.stat(p).length for p in sorted(paths)}


def _files_under(directory: str) -> list[str]:
  if not tf.io.gfile.isdir(directory):
    return []
  return [
      os.path.join(root, name) for root, _, names in tf.io.gfile.walk(directory) for name in names
  ]


def checkpoint_files(prefix: str) -> list[str]:
  """The files of TF checkpoint `prefix`: its index and data files."""
  return [prefix + ".index"] + tf.io.gfile.glob(prefix + ".data-*")


def write(prefix: str, run_info: dict, shards_dir: str | None = None,
          state: dict | None = None) -> str:
  """Writes the manifest of checkpoint `prefix` (after all its files); returns its path.

  Args:
    prefix: The checkpoint's path prefix.
    run_info: JSON-able description of the run (tables, config), recorded.
    shards_dir: The checkpoint's `shards-N` directory, or None.
    state: JSON-able state of the run's driver saved with the checkpoint
      (e.g. a continuous job's partition cursor), recorded as "state".
  """
  directory = os.path.dirname(prefix)
  manifest = {
      "format": FORMAT, "version": mxrec_pipeline.__version__,
      "files": _sizes(checkpoint_files(prefix), directory),
      "shards": _sizes(_files_under(shards_dir), shards_dir) if shards_dir else {}, "run": run_info,
      **({"state": state} if state is not None else {})
  }
  with tf.io.gfile.GFile(path(prefix), "w") as f:
    f.write(json.dumps(manifest, indent=1, sort_keys=True))
  return path(prefix)


def read(prefix: str) -> dict | None:
  """The manifest of `prefix`, or None when there is none or it is unreadable."""
  if not tf.io.gfile.exists(path(prefix)):
    return None
  try:
    with tf.io.gfile.GFile(path(prefix)) as f:
      manifest = json.loads(f.read())
  except (json.JSONDecodeError, UnicodeDecodeError, tf.errors.OpError):
    return None
  return manifest if isinstance(manifest, dict) else None


def problem(prefix: str, shards_dir: str | None = None) -> str | None:
  """Why checkpoint `prefix` cannot be restored, from its manifest; None when it can.

  Checks that the manifest exists and parses, that its format is not newer
  than this version's, and that every file it lists exists with its size.
  `shards_dir` (default: `shards-N` beside `ckpt-N`) holds its table shards.
  """
  if shards_dir is None:
    shards_dir = os.path.join(os.path.dirname(prefix), "shards-" + prefix.rsplit("-", 1)[1])
  manifest = read(prefix)
  if manifest is None:
    what = "unreadable" if tf.io.gfile.exists(path(prefix)) else "missing"
    return f"its manifest {path(prefix)} is {what} (the save did not finish)"
  if int(manifest.get("format", 0)) > FORMAT:
    return (f"it was written by mxrec-pipeline {manifest.get('version')} in checkpoint format "
            f"{manifest.get('format')}; this is {mxrec_pipeline.__version__}, format {FORMAT}")
  for root, files in ((os.path.dirname(prefix), manifest.get("files",
                                                             {})), (shards_dir,
                                                                    manifest.get("shards", {}))):
    for name, size in files.items():
      file = os.path.join(root, name)
      if not tf.io.gfile.exists(file):
        return f"{file} is missing"
      actual = tf.io.gfile.stat(file).length
      if actual != size:
        return f"{file} holds {actual} bytes, {size} were written"
  return None


def tables_placement(prefix: str) -> str | None:
  """Where checkpoint `prefix`'s tables lived ("one_host", "workers", "parameter_servers").

  None when its manifest is missing or does not say (versions before placements).
  """
  return (((read(prefix) or {}).get("run") or {}).get("placement") or {}).get("tables")


def differences(recorded: dict, current: dict) -> list[str]:
  """What of the run's tables differs between a checkpoint's `run_info` and this run's.

  Compares each table's spec fields that shape its saved state (dim,
  key_dtype, device_vocabulary_size, host/SSD sizes) and which tables exist.
  Returns one phrase per difference, e.g. "table 'user' dim 16 -> 32".
  """
  before, now = recorded.get("tables", {}), current.get("tables", {})
  out = [f"table '{name}' is not in this config" for name in sorted(set(before) - set(now))]
  out += [f"table '{name}' is new in this config" for name in sorted(set(now) - set(before))]
  for name in sorted(set(before) & set(now)):
    for field in sorted(set(before[name]) | set(now[name])):
      if before[name].get(field) != now[name].get(field):
        out.append(f"table '{name}' {field} {before[name].get(field)!r} -> "
                   f"{now[name].get(field)!r}")
  return out
