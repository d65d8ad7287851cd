"""Where a run starts from: its newest checkpoint, a warm start, or a checkpoint to export.

`resume` restores the run's TrainingCheckpoint as `pipeline.resume` says and
names the epoch it continues at; `warm_start` fills a new one-host run's
tables from another run's (keras/warm_start.py); `restore_every_variable`
and `restore_dense_variables` restore a model for export and refuse a
checkpoint that lacks one of its variables (a config with another model
would otherwise serve random weights). Used by keras/pipeline.py; see
docs/restarts.md.
"""

from __future__ import annotations

import contextlib
import os
import re

import tensorflow as tf

from mxrec_pipeline.hparams import PipelineHparams, WarmStart
from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.keras import checkpoints as checkpoints_lib
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.keras import warm_start as warm_start_lib
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util import model_files


def resume(checkpoint: checkpoints_lib.TrainingCheckpoint, hparams: PipelineHparams, model,
           num_epochs: int | None) -> int:
  """Restores the run's latest checkpoint as `hparams.resume` says; returns the start epoch.

  `num_epochs` None: a continuous run (keras/continuous.py), whose epochs are
  the partitions trained.

  Prints where it resumed: the checkpoint, the epochs and steps done, and
  the epoch it continues at (or that nothing is left of `num_epochs`).

  Raises:
    FileExistsError: a checkpoint exists and `hparams.resume` is false.
    checkpoints.CheckpointError: as TrainingCheckpoint.restore.
  """
  if not checkpoint.exists():
    return 0
  if not hparams.resume:
    newest = os.path.basename(checkpoint.latest or checkpoint.newest())
    raise FileExistsError(
        f"{checkpoint.directory} holds checkpoint {newest} and `resume` is false: set "
        "pipeline.resume: true to continue it, or start over with `mxrec-pipeline train --fresh` "
        "(which clears the run's outputs) or another model_dir")
  epochs_done = checkpoint.restore()
  if num_epochs is None:  # A continuous run: epochs are partitions.
    rest = "continuing with the next partition"
  elif epochs_done < num_epochs:
    rest = f"continuing at epoch {epochs_done + 1} of {num_epochs}"
  else:
    rest = f"nothing left to train ({num_epochs} epoch(s) planned)"
  print(
      f"Resumed from {checkpoint.restored}: {epochs_done} epoch(s) and "
      f"{int(model.optimizer.iterations.numpy())} step(s) done, {rest}", flush=True)
  return epochs_done


def warm_start(hparams: PipelineHparams, sharded: bool, model) -> None:
  """Applies `hparams.warm_start` to a new run's tables (keras/warm_start.py), printing each.

  Raises:
    ValueError: tables sharded over workers or ps tasks (`sharded`); see
      warm_start.apply.
  """
  if sharded:
    raise ValueError("pipeline.warm_start fills the tables of a one-host run; this run shards "
                     f"them ({hparams.strategy}): warm start a one-host run first, then "
                     "resume it on the cluster")
  spec = WarmStart.from_dict(hparams.warm_start)
  for line in warm_start_lib.apply(spec,
                                   initialize.get_config_initializer().tables,
                                   model.sparse_optimizer):
    print(line, flush=True)


def restore_every_variable(checkpoint: tf.train.Checkpoint, path: str) -> None:
  """Restores `checkpoint` from `path`; every variable built so far must get a value.

  Values the checkpoint holds that nothing built here uses (e.g. the dense
  optimizer's slots, created only by a first training step) are fine.

  Raises:
    ValueError: a variable has no value in `path` (TF names the unbound
      objects), e.g. an export with a config of more hidden layers than the
      run's: it would otherwise serve its random initial weights.
  """
  status = checkpoint.restore(path).expect_partial()
  try:
    status.assert_existing_objects_matched()
  except AssertionError as e:
    # TF's message lists each unbound object with its values: keep the names.
    names = re.findall(r"<tf\.Variable '([^']+)'", str(e))
    found = re.search(r"Found (\d+) Python objects", str(e))
    detail = (f"{found.group(1) if found else len(names)} unbound, e.g. {', '.join(names)}"
              if names else str(e))
    raise ValueError(f"{path}: the model built from this config has variables the checkpoint "
                     f"lacks (is it the config the run trained with?): {detail}") from None


def restore_one_host(model, path: str, shards_dir: str) -> None:
  """Restores a one-host run's checkpoint `path` into `model` (built on one host), for export.

  Format 3 (keras/checkpoints.one_host_checkpoint): `path`, then the flat
  tables from `shards_dir` onto their saved rows; earlier formats hold every
  table in `path`.

  Raises:
    ValueError: as restore_every_variable; FileNotFoundError, ValueError: as
      distributed/checkpoint.restore_table (a missing or unreadable shard).
  """
  if int((manifest.read(path) or {}).get("format", 0)) < 3:
    restore_every_variable(checkpoints_lib.training_checkpoint(model), path)
    return
  # `dense_model/<i>` are by position: more here than saved is a model with variables it lacks.
  saved = {
      name.split("/")[1] for name, _ in model_files.checkpoint_names(path).items()
      if name.startswith("dense_model/")
  }
  dense = checkpoints_lib.dense_variables(model)
  if len(dense) > len(saved):
    raise ValueError(f"{path}: the model built from this config has variables the checkpoint "
                     f"lacks (is it the config the run trained with?): {len(dense) - len(saved)} "
                     f"unbound, e.g. {', '.join(v.name for v in dense[len(saved):][:3])}")
  try:
    restore_every_variable(checkpoints_lib.one_host_checkpoint(model), path)
  except ValueError as e:  # A variable of another shape.
    if str(e).startswith(path):
      raise
    raise ValueError(f"{path}: the model built from this config does not match the checkpoint "
                     f"(is it the config the run trained with?): {e}") from None
  flat = {n: t for n, t in initialize.get_config_initializer().tables.items() if not t.is_tiered}
  number = checkpoints_lib.checkpoint_number(path)
  with table_checkpoints.full_shards(os.path.dirname(shards_dir), number, flat,
                                     [model.sparse_optimizer]) as full:  # A delta: its chain.
    for table in flat.values():
      checkpoint_lib.restore_table(full, table, [model.sparse_optimizer], keep_rows=True)


def restore_dense_variables(model, tables, path: str) -> None:
  """Restores a sharded run's dense model from `path`; every dense variable must get a value.

  The tables' rows come from their shard files, not this checkpoint, so TF's
  matching cannot tell them from missing variables: the dense (floating)
  variables, tables and their slots excluded, are set to NaN first, and one
  still NaN after the restore had no value in `path`.

  Raises:
    ValueError: as restore_every_variable, naming up to three unbound variables.
  """
  table_variables = set()
  for shard in (s for t in tables for s in t.local_shards()):
    slots = {}
    with contextlib.suppress(KeyError):  # No slots built for this optimizer.
      slots = shard.slot_variables(model.sparse_optimizer)
    table_variables |= {v.ref() for v in [shard.variable, *slots.values()]}
  dense = [v for v in model.variables if v.dtype.is_floating and v.ref() not in table_variables]
  for variable in dense:
    variable.assign(tf.fill(tf.shape(variable), tf.constant(float("nan"), variable.dtype)))
  checkpoints_lib.training_checkpoint(model, sharded=True).restore(path).expect_partial()
  unbound = [v.name for v in dense if tf.reduce_all(tf.math.is_nan(v)).numpy()]
  if unbound:
    raise ValueError(f"{path}: the model built from this config has variables the checkpoint "
                     f"lacks (is it the config the run trained with?): {len(unbound)} unbound, "
                     f"e.g. {', '.join(unbound[:3])}")
