"""Restarts: a killed run resumes exactly, seeded runs reproduce, untrained keys serve as unseen.

The runs train keras_testlib's task in processes of their own (resume_worker.py)
so that a run can SIGKILL itself mid-epoch, as a preempted job dies.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import keras_testlib as lib
from mxrec_pipeline import cli as cli_lib
from mxrec_pipeline import jobs
from mxrec_pipeline.data import elwc
from mxrec_pipeline.distributed import shard_files
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.optimizers import factory
from mxrec_pipeline.util import initialize

# Spawns subprocess trainings (killed and resumed).
pytestmark = pytest.mark.slow

HERE = pathlib.Path(__file__).parent
WORKER_TIMEOUT_S = 300  # A guard against a hung worker; nothing asserts on time.


def run_worker(task_dir, model_dir, out_json, *args, env=None) -> subprocess.CompletedProcess:
  """resume_worker.py in a process of its own; `env`: variables added to this one's."""
  return subprocess.run([
      sys.executable,
      str(HERE / "resume_worker.py"),
      str(task_dir),
      str(model_dir),
      str(out_json), *map(str, args)
  ], capture_output=True, text=True, cwd=HERE, timeout=WORKER_TIMEOUT_S, check=False,
                        env={**os.environ, **(env or {})})


def assert_same_state(a: dict, b: dict) -> None:
  """Keys, rows, row values, slots, dense weights and step counts are equal."""
  assert a["iterations"] == b["iterations"]
  assert a["sparse_iterations"] == b["sparse_iterations"]
  assert a["tables"].keys() == b["tables"].keys()
  for name, table in a["tables"].items():
    other = b["tables"][name]
    assert table["keys"] == other["keys"], name
    assert table["rows"] == other["rows"], name
    np.testing.assert_array_equal(table["values"], other["values"], err_msg=name)
    for slot in ("m", "v"):
      np.testing.assert_array_equal(table["slots"][slot], other["slots"][slot],
                                    err_msg=f"{name}/{slot}")
  assert len(a["dense"]) == len(b["dense"])
  for x, y in zip(a["dense"], b["dense"]):
    np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("resume_task")
  lib.write_task(tmp)
  return tmp


@pytest.fixture(scope="module")
def uninterrupted(task, tmp_path_factory):
  """Three epochs of 6 steps in one process: the reference run."""
  tmp = tmp_path_factory.mktemp("uninterrupted")
  done = run_worker(task, tmp / "model", tmp / "state.json")
  assert done.returncode == 0, done.stderr[-3000:]
  return {"dir": tmp / "model", "state": json.loads((tmp / "state.json").read_text())}


def test_epoch_steps_make_num_train_steps_the_total():
  assert pipeline_lib.epoch_steps(2, 8) == [4, 4]
  assert pipeline_lib.epoch_steps(3, 8) == [3, 3, 2]
  assert pipeline_lib.epoch_steps(20, 1) == [1]
  assert pipeline_lib.epoch_steps(3, 3) == [1, 1, 1]
  assert pipeline_lib.epoch_steps(3, None) == [None, None, None]
  for epochs in range(1, 7):
    for steps in range(1, 30):
      assert sum(pipeline_lib.epoch_steps(epochs, steps)) == steps


def test_epoch_seeds_differ_by_epoch_and_need_a_seed():
  assert pipeline_lib.epoch_seed(None, 3) is None
  seeds = [pipeline_lib.epoch_seed(7, e) for e in range(100)]
  assert len(set(seeds)) == 100
  assert pipeline_lib.epoch_seed(7, 5) == (7 * 1_000_003 + 5) % 2**31


@pytest.mark.parametrize("kill_at", ["1:2", "2:4"])
def test_sigkilled_run_resumes_to_the_uninterrupted_state(task, uninterrupted, tmp_path, kill_at):
  killed = run_worker(task, tmp_path / "model", tmp_path / "state.json", "--kill-at", kill_at)
  assert killed.returncode == -9, killed.stderr[-3000:]
  epochs_done = int(kill_at.split(":")[0])
  latest = tf.train.latest_checkpoint(str(tmp_path / "model" / "checkpoints"))
  assert latest.endswith(f"ckpt-{epochs_done}")
  resumed = run_worker(task, tmp_path / "model", tmp_path / "state.json")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert (f"Resumed from {latest}: {epochs_done} epoch(s) and {6 * epochs_done} step(s) done"
          in resumed.stdout)
  state = json.loads((tmp_path / "state.json").read_text())
  assert state["epochs"] == list(range(epochs_done, 3))
  reference = uninterrupted["state"]
  # The losses of the epochs the resumed run trained equal the reference's.
  assert state["loss"] == reference["loss"][epochs_done:]
  assert state["metrics"] == reference["metrics"]
  assert_same_state(state, reference)
  # It wrote its own checkpoints after the restored one and kept that one.
  names = sorted(p.name for p in (tmp_path / "model" / "checkpoints").glob("ckpt-*.index"))
  assert names == [f"ckpt-{e}.index" for e in range(1, 4)]


def test_tiered_table_resumes_to_the_uninterrupted_state(task, tmp_path):
  """The item table caches 12 rows on the device, 4 on the host, the rest on SSD.

  The killed run saves its tables' shards as deltas between full saves
  (`full_every_epochs` 2): its ckpt-2 holds each table's delta on ckpt-1,
  whose chain equals the uninterrupted run's full save.
  """
  states = {}
  for run, kill in (("uninterrupted", None), ("killed", "1:5")):
    ssd = tmp_path / run / "ssd"
    ssd.mkdir(parents=True)
    args = ["--epochs", 2, "--tiered-ssd-dir", ssd] + (["--full-every", 2] if kill else [])
    out = tmp_path / run / "state.json"
    if kill:
      killed = run_worker(task, tmp_path / run / "model", out, *args, "--kill-at", kill)
      assert killed.returncode == -9, killed.stderr[-3000:]
    done = run_worker(task, tmp_path / run / "model", out, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    states[run] = json.loads(out.read_text())
  assert states["killed"]["epochs"] == [1]
  assert states["killed"]["loss"] == states["uninterrupted"]["loss"][1:]
  stats = states["uninterrupted"]["tables"]["item"]["tier_stats"]
  assert stats["swap_outs"] > 0 and stats["ssd_rows_used"] > 0  # The tiers were used.
  assert states["killed"]["tables"]["item"]["tier_stats"] == stats
  assert_same_state(states["killed"], states["uninterrupted"])
  checkpoints = [tmp_path / run / "model" / "checkpoints" for run in ("killed", "uninterrupted")]
  assert table_checkpoints.chain(str(checkpoints[0]), 2) == [1, 2]
  optimizers = [factory.get_optimizer(pipeline_lib.PipelineHparams.sparse_optimizer, 0.05)]
  for table in states["uninterrupted"]["tables"]:  # Keys, rows, slots, admission state.
    with table_checkpoints.full_shards(str(checkpoints[0]), 2, [table], optimizers) as merged:
      chain = shard_files.read_all_shards(merged, table, optimizers)
    full = shard_files.read_all_shards(str(checkpoints[1] / "shards-2"), table, optimizers)
    assert chain.keys() == full.keys() and full["keys"].size > 0
    for name, value in full.items():
      np.testing.assert_array_equal(chain[name], value, err_msg=f"{table}/{name}")


def test_seeded_runs_export_bit_identical_models(task, uninterrupted, tmp_path):
  again = run_worker(task, tmp_path / "model", tmp_path / "state.json")
  assert again.returncode == 0, again.stderr[-3000:]
  assert_same_state(json.loads((tmp_path / "state.json").read_text()), uninterrupted["state"])
  exports = [d / "export" / "latest_model" for d in (uninterrupted["dir"], tmp_path / "model")]
  readers = [tf.train.load_checkpoint(str(e / "variables" / "variables")) for e in exports]
  names = readers[0].get_variable_to_shape_map()
  assert names == readers[1].get_variable_to_shape_map()
  for name in names:
    if name != "_CHECKPOINTABLE_OBJECT_GRAPH":
      np.testing.assert_array_equal(readers[0].get_tensor(name), readers[1].get_tensor(name),
                                    err_msg=name)
  serialized = tf.constant(
      [r.SerializeToString() for r in elwc.read_elwc_tfrecord(str(task / "valid.tfrecord"))])
  scores = [
      tf.saved_model.load(
          str(e)).signatures["serving_default"](examples=serialized)["scores"].numpy()
      for e in exports
  ]
  np.testing.assert_array_equal(scores[0], scores[1])


def test_finished_run_resumes_without_training(task, uninterrupted, tmp_path):
  leftover = uninterrupted["dir"] / "checkpoints" / "ckpt-4_temp"  # A save killed mid-write.
  leftover.mkdir()
  (leftover / "part-00000-of-00001.index").write_text("partial")
  again = run_worker(task, uninterrupted["dir"], tmp_path / "state.json")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "Resumed from" in again.stdout and "3 epoch(s) and 18 step(s) done" in again.stdout
  assert not leftover.exists()
  state = json.loads((tmp_path / "state.json").read_text())
  assert state["epochs"] == []
  assert_same_state(state, uninterrupted["state"])


def test_resume_false_refuses_a_model_dir_with_a_checkpoint(task, uninterrupted, tmp_path):
  refused = run_worker(task, uninterrupted["dir"], tmp_path / "state.json", "--no-resume")
  assert refused.returncode == 3
  assert "holds checkpoint ckpt-3" in refused.stderr and "--fresh" in refused.stderr
  assert not (tmp_path / "state.json").exists()


def test_num_train_steps_is_the_total_over_epochs(tmp_path):
  train, valid = lib.write_task(tmp_path)
  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp_path / "model"), num_epochs=3,
                                         num_train_steps=5, learning_rate=0.05, seed=3)
  pipe = pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                     hparams)
  pipe.train_and_validate()
  assert int(pipe.model.optimizer.iterations.numpy()) == 5
  assert int(pipe.model.sparse_optimizer.iterations.numpy()) == 5
  assert pipe.history.epoch == [0, 1, 2]
  hparams.num_epochs, hparams.num_train_steps = 20, 1
  initialize.terminate_config_initializer()
  pipe = pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                     hparams)
  hparams.model_dir = str(tmp_path / "model_1_step")
  pipe.train_and_validate()
  assert int(pipe.model.optimizer.iterations.numpy()) == 1
  assert pipe.history.epoch == [0]


def test_keys_of_untrained_batches_take_no_row_and_serve_as_unseen(tmp_path):
  """48 lists, one user each; 2 steps of 8 lists train at most 16 users, the rest stay unseen.

  With insertion running ahead of training, batches past the last step used to
  insert their users too (prefetch), which then served their initial rows.
  """
  train, valid = str(tmp_path / "train.tfrecord"), str(tmp_path / "valid.tfrecord")
  elwc.write_elwc_tfrecord(train, lib.make_lists(48, seed=0, first_user=100))
  elwc.write_elwc_tfrecord(valid, lib.make_lists(4, seed=1))
  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp_path / "model"), num_epochs=1,
                                         num_train_steps=2, learning_rate=0.05, seed=11)
  pipe = pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                     hparams)
  pipe.train_and_validate()
  keys, _ = initialize.get_config_initializer().tables["user"].key_index.export()
  trained = set(keys.numpy().tolist())
  # (tfr shuffles the repeated stream, so a list may come twice in 2 steps.)
  assert 8 <= len(trained) <= 16 and trained <= set(range(100, 148))
  untrained = sorted(set(range(100, 148)) - trained)
  serve = tf.saved_model.load(os.path.join(hparams.model_dir, "export", "latest_model"))

  def score(user):
    lst = elwc.make_elwc({"user_id": user, "city": "c0"},
                         [{"item_id": 3, "price": 0.3, "tags": ["t0"], "label": 1.0},
                          {"item_id": 4, "price": 0.4, "tags": ["t1"], "label": 0.0}])
    return serve.signatures["serving_default"](
        examples=tf.constant([lst.SerializeToString()]))["scores"].numpy()

  never_seen = score(10_000)
  for user in untrained[:3]:
    np.testing.assert_array_equal(score(user), never_seen)
  assert not np.array_equal(score(min(trained)), never_seen)


def test_clear_run_outputs_removes_only_run_outputs(tmp_path):
  for name in ("checkpoints", "logs", "export/latest_model"):
    (tmp_path / name).mkdir(parents=True)
    (tmp_path / name / "f").write_text("x")
  (tmp_path / "metrics.json").write_text("{}")
  (tmp_path / "config.yaml").write_text("a: 1")
  (tmp_path / "notes.txt").write_text("mine")
  removed = jobs.clear_run_outputs(str(tmp_path))
  assert sorted(
      os.path.basename(p) for p in removed) == ["checkpoints", "export", "logs", "metrics.json"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "notes.txt"]
  assert jobs.clear_run_outputs(str(tmp_path)) == []


def test_checkpoint_of_another_model_is_refused_naming_it(task, uninterrupted, tmp_path):
  other = lib.model_builder(hidden_layer_dims=[16])
  hparams = pipeline_lib.PipelineHparams(model_dir=str(uninterrupted["dir"]), num_epochs=3, seed=7)
  pipe = pipeline_lib.SimplePipeline(
      other, lib.dataset_builder(str(task / "train.tfrecord"), str(task / "valid.tfrecord")),
      hparams)
  with pytest.raises(ValueError, match=r"checkpoint .*ckpt-3 does not match this model"):
    pipe.train_and_validate()


def test_export_of_a_checkpoint_lacking_a_variable_is_refused(task, uninterrupted):
  """A config with an extra layer would serve that layer's random initial weights."""
  builder = model_lib.ModelBuilder(
      input_creator=model_lib.FeatureSpecInputCreator(lib.CONTEXT_SPEC, lib.EXAMPLE_SPEC),
      preprocessor={}, mask_feature_name=lib.MASK, sparse_features=lib.SPARSE_FEATURES,
      tables=lib.TABLES, seed=1, scorer=model_lib.DNNScorer(hidden_layer_dims=[8], output_units=1,
                                                            input_batch_norm=True))
  hparams = pipeline_lib.PipelineHparams(model_dir=str(uninterrupted["dir"]), num_epochs=3, seed=7)
  pipe = pipeline_lib.SimplePipeline(
      builder, lib.dataset_builder(str(task / "train.tfrecord"), str(task / "valid.tfrecord")),
      hparams)
  latest = tf.train.latest_checkpoint(str(uninterrupted["dir"] / "checkpoints"))
  initialize.init()
  try:
    with pytest.raises(
        ValueError, match=r"ckpt-3: the model built from this config has "
        r"variables the checkpoint lacks .*: \d+ unbound, e\.g\. \S+/\S+:0"):
      pipe.restore_for_export(latest)
  finally:
    initialize.terminate_config_initializer()


def test_cli_resumes_extends_exports_refuses_and_starts_fresh(tmp_path, capsys):
  """The main job's config (best-model export on) on MovieLens, through the CLI.

  Trainings run as subprocesses, as a user runs them; the commands that stop
  at a check run in this process (`cli.main`, the same exit status and
  stderr). LambdaMART, not the subject here, is off.
  """
  repo = HERE.parents[1]
  model_dir = tmp_path / "run"
  config = str(repo / "configs" / "movielens_listwise.yaml")
  sets = [
      f"pipeline.model_dir={model_dir}", "pipeline.num_epochs=2", "pipeline.num_train_steps=2",
      "pipeline.num_valid_steps=1", "pipeline.strategy=null", "lambdamart.enabled=false"
  ]
  set_args = [a for s in sets for a in ("--set", s)]

  def in_process(*args) -> tuple[int, str]:
    """`mxrec-pipeline ARGS` in this process: (exit status, stderr)."""
    capsys.readouterr()
    code = cli_lib.main(list(args))
    return code, capsys.readouterr().err

  base = [sys.executable, "-m", "mxrec_pipeline.cli", "train", config, "--verbose", "0", *set_args]

  def cli(*args, command=None):
    return subprocess.run([*(command or base), *args], capture_output=True, text=True, cwd=repo,
                          timeout=WORKER_TIMEOUT_S, check=False)

  first = cli()
  assert first.returncode == 0, first.stderr[-3000:]
  assert "Resumed" not in first.stdout
  again = cli()
  assert again.returncode == 0, again.stderr[-3000:]
  assert "Resumed from" in again.stdout and "2 epoch(s) and 2 step(s) done" in again.stdout
  # Two more epochs: the step count is the sum, the best-model export works after a resume.
  more = cli("--set", "pipeline.num_epochs=4", "--set", "pipeline.num_train_steps=4")
  assert more.returncode == 0, more.stderr[-3000:]
  assert "2 epoch(s) and 2 step(s) done, continuing at epoch 3 of 4" in more.stdout
  assert "Traceback" not in more.stderr
  for index in (model_dir / "checkpoints").glob("ckpt-*.index"):
    names = [n for n, _ in tf.train.list_variables(str(index)[:-len(".index")])]
    assert not [n for n in names if "serving_rows" in n], index
  record = json.loads((model_dir / "export" / "best_model_by_metric" / "assets.extra" /
                       "mxrec_pipeline.json").read_text())
  assert record["run"]["config"]["pipeline"]["num_epochs"] == 4
  assert record["run"]["tables"]["user"]["dim"] == 16
  # Any kept checkpoint exports and serves in plain TF.
  out = tmp_path / "ckpt-3_export"
  exported = cli("--checkpoint", "3", "--out", str(out), *set_args,
                 command=[sys.executable, "-m", "mxrec_pipeline.cli", "export", config])
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert exported.stdout.strip().endswith(str(out))
  assert "serving_default" in tf.saved_model.load(str(out)).signatures
  code, err = in_process("export", config, "--checkpoint", "9", *set_args)
  assert code == 2
  assert "no checkpoint" in err and "ckpt-9" in err
  assert "'ckpt-2', 'ckpt-3', 'ckpt-4'" in err
  # A live job's claim on the model_dir refuses a second job, naming the holder.
  holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
  try:
    (model_dir / ".mxrec_lock.json").write_text(
        json.dumps({"host": socket.gethostname(), "pid": holder.pid, "heartbeat": time.time()}))
    code, err = in_process("train", config, "--verbose", "0", *set_args)
    assert code == 2
    assert f"is in use by another job (host {socket.gethostname()}, pid {holder.pid}" in err
  finally:
    holder.kill()
    holder.wait()
  code, err = in_process("train", config, "--verbose", "0", *set_args, "--set",
                         "pipeline.resume=false")
  assert code == 2
  assert "error:" in err and "holds checkpoint ckpt-4" in err
  fresh = cli("--fresh")
  assert fresh.returncode == 0, fresh.stderr[-3000:]
  assert f"--fresh: removed {model_dir / 'checkpoints'}" in fresh.stdout
  assert "Resumed" not in fresh.stdout
  assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith("ckpt-2")
  assert not (model_dir / ".mxrec_lock.json").exists()
