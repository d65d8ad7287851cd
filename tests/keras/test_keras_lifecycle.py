"""A run's life: killed at each fault point, extended, storage faults; each ends where it should.

Runs keras_testlib's task (3 epochs of 6 steps, best model exported by
validation loss) in processes of their own (resume_worker.py), killed at the
named fault points of util/faults.py (MXREC_FAULT), then started again with
the same command; the end state must equal an uninterrupted run's bit for bit.
"""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import uuid

import numpy as np
import pytest
import tensorflow as tf

import keras_testlib as lib
import test_keras_resume
from test_keras_resume import assert_same_state, run_worker
from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.keras import checkpoints as checkpoints_lib
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import initialize

pytestmark = pytest.mark.slow

# keras_testlib's task files: the resume tests' module fixture, shared.
task = test_keras_resume.task


def _state(path) -> dict:
  return json.loads(path.read_text())


def _exports_equal(a, b) -> None:
  readers = [tf.train.load_checkpoint(str(d / "variables" / "variables")) for d in (a, b)]
  names = readers[0].get_variable_to_shape_map()
  assert names == readers[1].get_variable_to_shape_map()
  for name in names:
    if name != "_CHECKPOINTABLE_OBJECT_GRAPH":
      np.testing.assert_array_equal(readers[0].get_tensor(name), readers[1].get_tensor(name),
                                    err_msg=name)


def _no_export_state_in_checkpoints(model_dir) -> None:
  for index in (model_dir / "checkpoints").glob("ckpt-*.index"):
    names = [n for n, _ in tf.train.list_variables(str(index)[:-len(".index")])]
    assert not [n for n in names if "serving" in n or "lookup_tables" in n], index


@pytest.fixture(scope="module")
def reference(task, tmp_path_factory):
  """Three epochs, best model exported, in one process: the run every other must end equal to."""
  tmp = tmp_path_factory.mktemp("reference")
  done = run_worker(task, tmp / "model", tmp / "state.json", "--export-best")
  assert done.returncode == 0, done.stderr[-3000:]
  return {"dir": tmp / "model", "state": _state(tmp / "state.json")}


def _assert_ends_as_reference(model_dir, state, reference, best: bool = True) -> None:
  assert_same_state(state, reference["state"])
  assert state["metrics"] == reference["state"]["metrics"]
  for export in ("latest_model", "best_model_by_metric") if best else ("latest_model",):
    _exports_equal(model_dir / "export" / export, reference["dir"] / "export" / export)
  if best:
    records = [
        json.loads((d / "export" / "best_model_by_metric" / "best_metric.json").read_text())
        for d in (model_dir, reference["dir"])
    ]
    assert records[0] == records[1]
  _no_export_state_in_checkpoints(model_dir)


# One point per class of fault: mid-epoch, validation, between a checkpoint's files and its
# manifest, during a best-model export (the 2nd: the run exported the best model of epoch 1).
# validation:2, checkpoint_files:2 and export:2 run in `make test-lifecycle` (as the matrix's
# cases of every config do); kills during a save and an export are in make test below and in
# test_keras_export.py.
@pytest.mark.parametrize("fault", [
    "train_batch:9", *(pytest.param(f, marks=pytest.mark.lifecycle)
                       for f in ("validation:2", "checkpoint_files:2", "export:2"))
])
def test_killed_at_a_fault_point_then_the_same_command_ends_as_uninterrupted(
    task, reference, tmp_path, fault):
  model_dir = tmp_path / "model"
  killed = run_worker(task, model_dir, tmp_path / "state.json", "--export-best",
                      env={"MXREC_FAULT": fault})
  assert killed.returncode == -9, killed.stderr[-3000:]
  assert f"MXREC_FAULT: killing the process at {fault}" in killed.stdout
  again = run_worker(task, model_dir, tmp_path / "state.json", "--export-best")
  assert again.returncode == 0, again.stderr[-3000:]
  if fault == "checkpoint_files:2":  # ckpt-2's files were written, its manifest not.
    assert "Skipping checkpoint" in again.stdout and "ckpt-2" in again.stdout
    assert "manifest" in again.stdout
  assert "Resumed from" in again.stdout and "ckpt-1: 1 epoch(s) and 6 step(s)" in again.stdout
  _assert_ends_as_reference(model_dir, _state(tmp_path / "state.json"), reference)


def test_finished_run_extended_trains_exactly_the_added_epochs(task, reference, tmp_path):
  model_dir = tmp_path / "model"
  first = run_worker(task, model_dir, tmp_path / "state.json", "--export-best", "--epochs", 2)
  assert first.returncode == 0, first.stderr[-3000:]
  more = run_worker(task, model_dir, tmp_path / "state.json", "--export-best", "--epochs", 3)
  assert more.returncode == 0, more.stderr[-3000:]
  assert "2 epoch(s) and 12 step(s) done, continuing at epoch 3 of 3" in more.stdout
  state = _state(tmp_path / "state.json")
  assert state["epochs"] == [2]
  _assert_ends_as_reference(model_dir, state, reference)
  fewer = run_worker(task, model_dir, tmp_path / "state.json", "--export-best", "--epochs", 2)
  assert fewer.returncode == 0, fewer.stderr[-3000:]
  assert "3 epoch(s) and 18 step(s) done, nothing left to train" in fewer.stdout
  assert _state(tmp_path / "state.json")["epochs"] == []


def test_truncated_newest_checkpoint_is_skipped_and_the_run_ends_as_uninterrupted(
    task, reference, tmp_path):
  model_dir = tmp_path / "model"
  shutil.copytree(reference["dir"], model_dir)
  data = next((model_dir / "checkpoints").glob("ckpt-3.data-*"))
  data.write_bytes(data.read_bytes()[:1000])
  again = run_worker(task, model_dir, tmp_path / "state.json", "--export-best")
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Skipping checkpoint {model_dir / 'checkpoints' / 'ckpt-3'}: {data} holds 1000 bytes" in (
      again.stdout)
  assert "Resumed from" in again.stdout and "ckpt-2: 2 epoch(s)" in again.stdout
  # ckpt-1 and ckpt-2 are kept: only the rotation of a new save removes a checkpoint.
  assert (model_dir / "checkpoints" / "ckpt-2.index").exists()
  _assert_ends_as_reference(model_dir, _state(tmp_path / "state.json"), reference)


def test_no_complete_checkpoint_refuses_naming_each_and_removes_nothing(task, reference, tmp_path):
  model_dir = tmp_path / "model"
  shutil.copytree(reference["dir"] / "checkpoints", model_dir / "checkpoints")
  for path in (model_dir / "checkpoints").glob("*.manifest.json"):
    path.unlink()
  before = sorted(os.listdir(model_dir / "checkpoints"))
  refused = run_worker(task, model_dir, tmp_path / "state.json")
  assert refused.returncode == 2
  assert "error: no checkpoint in" in refused.stderr and "can be restored" in refused.stderr
  assert "ckpt-3: its manifest" in refused.stderr and "ckpt-1: its manifest" in refused.stderr
  assert sorted(os.listdir(model_dir / "checkpoints")) == before


def _tmpfs(path, size: str) -> bool:
  path.mkdir(parents=True)
  done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                         str(path)], capture_output=True, check=False)
  return done.returncode == 0


# The disk fills after epoch 2's validation: the best-model export (when on) or the checkpoint
# is the write that fails.
@pytest.mark.parametrize("write", ["export", "checkpoint"])
def test_full_disk_during_a_save_exits_2_and_the_rerun_ends_as_uninterrupted(
    task, reference, tmp_path, write):
  disk = tmp_path / "disk"
  if not _tmpfs(disk, "16m"):
    pytest.skip("needs a tmpfs mount (root) for a real ENOSPC")
  try:
    model_dir = disk / "model"
    filler = disk / f"filler-{uuid.uuid4().hex[:6]}"
    best = ["--export-best"] if write == "export" else []
    full = run_worker(task, model_dir, tmp_path / "state.json", *best, "--fill-disk-at",
                      f"1:{filler}")
    assert full.returncode == 2, full.stderr[-3000:]
    what = ("export best_model_by_metric to {}/export/best_model_by_metric: No space left on "
            "device; the previous export there is intact" if best else
            "checkpoint ckpt-2 to {}/checkpoints: No space left on device; the previous "
            "checkpoint ckpt-1 is intact")
    assert f"error: cannot write {what.format(model_dir)}" in full.stderr, full.stderr[-2000:]
    filler.unlink()
    latest, _, skipped = checkpoints_lib.restorable_checkpoint(str(model_dir / "checkpoints"))
    assert latest.endswith("ckpt-1") and manifest.problem(latest) is None, skipped
    again = run_worker(task, model_dir, tmp_path / "state.json", *best)
    assert again.returncode == 0, again.stderr[-3000:]
    _assert_ends_as_reference(model_dir, _state(tmp_path / "state.json"), reference, bool(best))
  finally:
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_checkpoint_of_other_tables_is_refused_naming_what_differs(task, reference, tmp_path):
  tables = [dataclasses.replace(lib.TABLES[0], dim=lib.TABLES[0].dim * 2), *lib.TABLES[1:]]
  hparams = pipeline_lib.PipelineHparams(model_dir=str(reference["dir"]), num_epochs=3, seed=7)
  pipe = pipeline_lib.SimplePipeline(
      lib.model_builder(tables=tables),
      lib.dataset_builder(str(task / "train.tfrecord"), str(task / "valid.tfrecord")), hparams)
  name, dim = lib.TABLES[0].name, lib.TABLES[0].dim
  with pytest.raises(
      checkpoints_lib.CheckpointError,
      match=rf"ckpt-3 was written with another config: table '{name}' dim "
      rf"{dim} -> {2 * dim}"):
    pipe.train_and_validate()


def _as_workers_checkpoint(checkpoints, model_dir, number: int = 3) -> pathlib.Path:
  """A copy of `checkpoints`; ckpt-`number`'s manifest says its tables were on 2 workers."""
  shutil.copytree(checkpoints, model_dir / "checkpoints")
  path = model_dir / "checkpoints" / f"ckpt-{number}.manifest.json"
  record = json.loads(path.read_text())
  assert record["run"]["placement"] == {"tables": "one_host", "replicas": 1}
  record["run"]["placement"] = {"tables": "workers", "replicas": 2}
  path.write_text(json.dumps(record))
  return path


def _saved_tables(directory, optimizer) -> dict:
  """Table name -> everything of it in a `shards-N` directory: keys, rows, slots, counters."""
  return {
      name: checkpoint_lib.read_all_shards(str(directory), name, [optimizer])
      for name in (t.name for t in lib.TABLES)
  }


@pytest.mark.parametrize("sparse_optimizer", ["lazy_adam", "adagrad", "ftrl"])
def test_checkpoint_of_another_placement_moves_every_table_by_key(sparse_optimizer, task, tmp_path,
                                                                  capsys):
  """As a 2-worker run's checkpoint (its manifest says so): restored from its shards-N by key.

  Every table's keys, rows, optimizer slots, step count and admission state,
  the dense model and its optimizer come back: saved again, the shards equal
  the checkpoint's, and the validation metrics equal the run's own.
  """
  train, valid = str(task / "train.tfrecord"), str(task / "valid.tfrecord")
  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp_path / "source"), num_epochs=1,
                                         num_train_steps=4, seed=7,
                                         sparse_optimizer=sparse_optimizer)
  source = pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                       hparams)
  trained = source.train_and_validate()
  steps = int(source.model.optimizer.iterations.numpy())
  initialize.terminate_config_initializer()
  model_dir = tmp_path / "model"
  _as_workers_checkpoint(tmp_path / "source" / "checkpoints", model_dir, number=1)
  capsys.readouterr()

  pipe = pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                     dataclasses.replace(hparams, model_dir=str(model_dir)))
  metrics = pipe.train_and_validate()  # Nothing left to train: restore, validate, export.
  out = capsys.readouterr().out
  assert re.search(
      r"Moved checkpoint .*ckpt-1 from workers \(MultiWorkerMirroredStrategy "
      r"shards\) to one host", out), out
  optimizer = pipe.model.sparse_optimizer
  for table in initialize.get_config_initializer().tables.values():
    checkpoint_lib.save_table(str(tmp_path / "again"), table, [optimizer])
  saved = _saved_tables(tmp_path / "source" / "checkpoints" / "shards-1", optimizer)
  again = _saved_tables(tmp_path / "again", optimizer)
  for name, arrays in saved.items():
    assert arrays["keys"].size > 0, name
    assert arrays.keys() == again[name].keys()
    for field, values in arrays.items():
      np.testing.assert_array_equal(values, again[name][field], err_msg=f"{name}/{field}")
  assert int(pipe.model.optimizer.iterations.numpy()) == steps == 4
  assert metrics == pytest.approx(trained, abs=1e-6)


def test_checkpoint_of_another_placement_without_table_shards_is_refused(task, reference, tmp_path):
  """What a version before placement moves wrote on one host: tables only in ckpt-N."""
  model_dir = tmp_path / "model"
  path = _as_workers_checkpoint(reference["dir"] / "checkpoints", model_dir)
  record = json.loads(path.read_text())
  record["shards"] = {}
  path.write_text(json.dumps(record))
  shutil.rmtree(model_dir / "checkpoints" / "shards-3")
  hparams = pipeline_lib.PipelineHparams(model_dir=str(model_dir), num_epochs=4, seed=7)
  pipe = pipeline_lib.SimplePipeline(
      lib.model_builder(),
      lib.dataset_builder(str(task / "train.tfrecord"), str(task / "valid.tfrecord")), hparams)
  with pytest.raises(
      checkpoints_lib.CheckpointError,
      match=r"ckpt-3 holds tables placed on workers \(MultiWorkerMirroredStrategy "
      r"shards\); this run places them on one host .*no table shards .*resume it on workers"):
    pipe.train_and_validate()


def test_checkpoint_of_an_earlier_version_with_export_state_still_resumes(task, tmp_path, capsys):
  """What versions before manifests wrote: no manifest, no best metric, serving_rows tracked."""
  train, valid = str(task / "train.tfrecord"), str(task / "valid.tfrecord")
  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp_path / "first"), num_epochs=1,
                                         num_train_steps=2, seed=7)
  pipe = pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                     hparams)
  pipe.train_and_validate()
  layer = pipe.model._sparse_layers[0]  # pylint: disable=protected-access
  layer.serving_rows = tf.Variable(tf.zeros([3, 4]))  # Tracked, as export.py once did.
  old = checkpoints_lib.training_checkpoint(pipe.model, epoch=tf.Variable(1, dtype=tf.int64))
  prefix = old.save(str(tmp_path / "old" / "checkpoints" / "ckpt"))  # ckpt-1, as the manager
  assert any("serving_rows" in n for n, _ in tf.train.list_variables(prefix))
  initialize.terminate_config_initializer()
  capsys.readouterr()

  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp_path / "old"), num_epochs=2,
                                         num_train_steps=4, seed=7, export_best_model=True)
  pipe = pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                     hparams)
  pipe.train_and_validate()
  assert "Resumed from" in capsys.readouterr().out
  assert (tmp_path / "old" / "export" / "best_model_by_metric" / "saved_model.pb").exists()
  assert manifest.problem(str(tmp_path / "old" / "checkpoints" / "ckpt-2")) is None


def _one_epoch(task, model_dir, **hparams) -> pipeline_lib.SimplePipeline:
  """One epoch of 4 steps of the task in this process; its pipeline (tables still registered)."""
  train, valid = str(task / "train.tfrecord"), str(task / "valid.tfrecord")
  pipe = pipeline_lib.SimplePipeline(
      lib.model_builder(), lib.dataset_builder(train, valid),
      pipeline_lib.PipelineHparams(model_dir=str(model_dir), num_epochs=1, num_train_steps=4,
                                   seed=7, **hparams))
  pipe.train_and_validate()
  return pipe


def _table_state(pipe) -> dict:
  """Table name -> (keys, rows, values, slots m, v) of the run's tables, by key, NumPy."""
  out = {}
  for name, table in initialize.get_config_initializer().tables.items():
    keys, rows = (t.numpy() for t in table.key_index.export())
    keys, rows = keys[np.argsort(keys)], rows[np.argsort(keys)]
    slots = table.slot_variables(pipe.model.sparse_optimizer)
    out[name] = [keys, rows, table.variable.numpy()[rows]] + [slots[s].numpy()[rows] for s in "mv"]
  return out


def test_a_one_host_checkpoint_holds_the_used_keys_not_the_capacity(task, tmp_path):
  """Flat tables only in shards-1 (keys on their rows); ckpt-1 holds no [capacity, dim] tensor."""
  _one_epoch(task, tmp_path / "model")
  checkpoints = tmp_path / "model" / "checkpoints"
  assert json.loads((checkpoints / "ckpt-1.manifest.json").read_text())["format"] == 3
  capacity = {(t.device_vocabulary_size, t.dim) for t in lib.TABLES}
  saved = tf.train.list_variables(str(checkpoints / "ckpt-1"))
  assert not [n for n, shape in saved if tuple(shape) in capacity]
  assert [n for n, _ in saved if n.startswith("dense_model/")]
  for table in initialize.get_config_initializer().tables.values():
    keys, rows = (t.numpy() for t in table.key_index.export())
    bundle = str(checkpoints / "shards-1" / table.table_name / "shard-0-of-1")
    order = np.argsort(keys)
    np.testing.assert_array_equal(tf.train.load_variable(bundle, "keys"), keys[order])
    np.testing.assert_array_equal(tf.train.load_variable(bundle, "rows"), rows[order])
  initialize.terminate_config_initializer()


def test_a_checkpoint_of_format_2_still_resumes_with_its_tables(task, tmp_path, capsys):
  """What the version before format 3 wrote on one host: every table inside ckpt-N."""
  pipe = _one_epoch(task, tmp_path / "first")
  before = _table_state(pipe)
  best = checkpoints_lib.BestMetric()
  old = checkpoints_lib.training_checkpoint(pipe.model, epoch=tf.Variable(1, dtype=tf.int64),
                                            **best.trackables())
  prefix = old.save(str(tmp_path / "old" / "checkpoints" / "ckpt"))  # ckpt-1, as the manager
  assert prefix.endswith("ckpt-1")
  path = pathlib.Path(manifest.write(prefix, pipe.run_info()))
  record = json.loads(path.read_text())
  path.write_text(json.dumps(record | {"format": 2}))
  initialize.terminate_config_initializer()
  capsys.readouterr()

  again = _one_epoch(task, tmp_path / "old")  # Nothing left to train: restore, validate, export.
  assert "1 epoch(s) and 4 step(s) done, nothing left to train" in capsys.readouterr().out
  after = _table_state(again)
  for name, arrays in before.items():
    for saved, restored in zip(arrays, after[name]):
      np.testing.assert_array_equal(saved, restored, err_msg=name)
  initialize.terminate_config_initializer()


def test_delta_checkpoints_between_full_ones_resume_and_export_as_full_ones(
    task, reference, tmp_path):
  """full_every_epochs 2: ckpt-1 full, ckpt-2 a delta on it, ckpt-3 full.

  Killed first while saving the delta (its shards written, ckpt-2 not): the
  rerun resumes from full ckpt-1. Killed again in epoch 3: ckpt-2 (a delta)
  exports as the reference's full ckpt-2, and the last rerun resumes from its
  chain and ends as the uninterrupted run.
  """
  model_dir = tmp_path / "model"
  args = ("--export-best", "--full-every", "2")
  killed = run_worker(task, model_dir, tmp_path / "state.json", *args,
                      env={"MXREC_FAULT": "checkpoint_shards:2"})
  assert killed.returncode == -9, killed.stderr[-3000:]
  shards = model_dir / "checkpoints"
  assert (shards / "shards-2" / "user").is_dir() and not list(shards.glob("ckpt-2.*"))
  killed = run_worker(task, model_dir, tmp_path / "state.json", *args,
                      env={"MXREC_FAULT": "train_batch:9"})  # Epoch 3's 3rd batch.
  assert killed.returncode == -9, killed.stderr[-3000:]
  assert "Resumed from" in killed.stdout and "ckpt-1: 1 epoch(s) and 6 step(s)" in killed.stdout
  # Each chain.json names the chain and the step of its full save (keras/save_schedule.py).
  assert json.loads(
      (shards / "shards-1" / "chain.json").read_text()) == {"chain": [1], "full_step": 6}
  assert json.loads(
      (shards / "shards-2" / "chain.json").read_text()) == {"chain": [1, 2], "full_step": 6}
  names = [
      n for n, _ in tf.train.list_variables(str(shards / "shards-2" / "user" / "shard-0-of-1"))
  ]
  assert "deleted_keys" in names  # A delta bundle.
  # The export of the delta checkpoint (`mxrec-pipeline export --checkpoint 2`) equals the
  # export of the reference's full ckpt-2.
  train, valid = str(task / "train.tfrecord"), str(task / "valid.tfrecord")
  for source, out in ((shards, "exported"), (reference["dir"] / "checkpoints", "reference")):
    pipe = pipeline_lib.SimplePipeline(
        lib.model_builder(), lib.dataset_builder(train, valid),
        pipeline_lib.PipelineHparams(model_dir=str(model_dir), num_epochs=3, seed=7))
    initialize.init()
    try:
      model = pipe.restore_for_export(str(source / "ckpt-2"))
      pipe.export_saved_model(model, str(tmp_path / out))
    finally:
      initialize.terminate_config_initializer()
  _exports_equal(tmp_path / "exported", tmp_path / "reference")

  again = run_worker(task, model_dir, tmp_path / "state.json", *args)  # From ckpt-2's chain.
  assert again.returncode == 0, again.stderr[-3000:]
  _assert_ends_as_reference(model_dir, _state(tmp_path / "state.json"), reference)
  assert json.loads((shards / "shards-3" / "chain.json").read_text())["chain"] == [3]  # Full.


def test_a_checkpoint_schedule_in_steps_and_seconds_resumes_from_its_last_save(
    task, reference, tmp_path):
  """`pipeline.checkpoint` {full_every_steps 12, delta_every_s 3600, keep_full 1}, 6 steps/epoch.

  Epoch 1 saves in full (a run's first save); epoch 2 saves nothing (no
  hour since the last save, no full save due); killed in epoch 3, the same
  command resumes from ckpt-1 and retrains epoch 2; epoch 3 (step 18, 12 past
  the chain's full save) saves in full, and keep_full 1 removes ckpt-1's
  chain. The run ends as the uninterrupted reference.
  """
  model_dir = tmp_path / "model"
  args = ("--export-best", "--checkpoint",
          json.dumps({"full_every_steps": 12, "delta_every_s": 3600, "keep_full": 1}))
  killed = run_worker(task, model_dir, tmp_path / "state.json", *args,
                      env={"MXREC_FAULT": "train_batch:15"})  # Epoch 3's 3rd batch.
  assert killed.returncode == -9, killed.stderr[-3000:]
  shards = model_dir / "checkpoints"
  assert sorted(p.name for p in shards.glob("ckpt-*.index")) == ["ckpt-1.index"]
  again = run_worker(task, model_dir, tmp_path / "state.json", *args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "ckpt-1: 1 epoch(s) and 6 step(s) done, continuing at epoch 2 of 3" in again.stdout
  _assert_ends_as_reference(model_dir, _state(tmp_path / "state.json"), reference)
  assert sorted(p.name for p in shards.glob("ckpt-*.index")) == ["ckpt-3.index"]
  assert sorted(p.name for p in shards.glob("shards-*")) == ["shards-3"]
  record = json.loads((shards / "shards-3" / "chain.json").read_text())
  assert record["chain"] == [3] and record["full_step"] == 18 and record["full_time"] > 0
  assert tf.train.get_checkpoint_state(
      str(shards)).all_model_checkpoint_paths == [str(shards / "ckpt-3")]
