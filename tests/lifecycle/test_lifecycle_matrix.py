"""The lifecycle matrix (`make test-lifecycle`): every shipped config x fault point, by the CLI.

Each case runs `mxrec-pipeline train CONFIG` on tiny data (3 epochs of 2
steps, best-model export on, seeded) with MXREC_FAULT set, so the process
dies at that point; then the same command with nothing set; the run must end
with the same metrics.json model metrics and the same latest and best exports
(every variable, bit for bit) as the config's uninterrupted run. One more case
per config kills at a training batch drawn from LIFECYCLE_SEED (printed).
Cluster cases run the main job on 2 workers, worker 1 killed. Not part of
`make test` (marker `lifecycle`); docs/restarts.md holds the last results.
"""

import json
import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "builders"))
sys.path.insert(0, str(REPO / "tests" / "cluster"))
import builders_testlib  # pylint: disable=wrong-import-position  # noqa: E402
import cluster_testlib  # pylint: disable=wrong-import-position  # noqa: E402
from mxrec_pipeline.distributed import checkpoint as checkpoint_lib  # noqa: E402  # pylint: disable=wrong-import-position
from mxrec_pipeline.optimizers import factory  # noqa: E402  # pylint: disable=wrong-import-position

pytestmark = [pytest.mark.lifecycle, pytest.mark.slow]

TIMEOUT_S = 600
SEED = int(os.environ.get("LIFECYCLE_SEED", "0"))
# 3 epochs x 2 steps: train_batch:3 is the first batch of epoch 2 (epoch 1 checkpointed and
# exported before it); validation:2 and the others hit epoch 2 too.
FAULTS = ["train_batch:3", "validation:2", "checkpoint_files:2", "export:2"]
CONFIGS = ["movielens_listwise", "movielens_tiered", "movielens_dcn", "mslr_dnn", "letor_dasalc"]


def _random_fault() -> str:
  return f"train_batch:{random.Random(SEED).randint(1, 6)}"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("lifecycle_data")
  return {
      "movielens": cluster_testlib.write_tiny_movielens(tmp / "ml"),
      "letor": (builders_testlib.write_letor(tmp / "train.txt", 16, 6, first_qid=1, seed=1),
                builders_testlib.write_letor(tmp / "vali.txt", 8, 6, first_qid=100,
                                             seed=2)), "tmp": tmp
  }


def _sets(config: str, data, model_dir: pathlib.Path) -> list[str]:
  sets = [
      f"pipeline.model_dir={model_dir}", "pipeline.num_epochs=3", "pipeline.num_train_steps=6",
      "pipeline.num_valid_steps=null", "pipeline.strategy=null", "pipeline.seed=1",
      "pipeline.export_best_model=true", "pipeline.best_exporter_metric=loss",
      "pipeline.best_exporter_metric_higher_better=false", "lambdamart.enabled=false",
      "dataset.train_batch_size=4", "dataset.valid_batch_size=4", "pipeline.early_stopping=null"
  ]
  if config.startswith("movielens"):
    sets += [
        f"data.data_dir={data['movielens']}", f"data.elwc_dir={data['tmp'] / 'ml_elwc'}",
        "model.device_vocabulary_size=200"
    ]
  else:
    train, valid = data["letor"]
    sets += [
        f"data.train_path={train}", f"data.valid_path={valid}",
        f"data.elwc_dir={data['tmp'] / 'letor_elwc'}", builders_testlib.LETOR_BASELINE_SET
    ]
  if config == "movielens_tiered":
    sets += [
        "model.id_device_vocabulary_size=24", "model.host_vocabulary_size=8",
        "model.ssd_vocabulary_size=100", f"model.ssd_data_path=[{model_dir.parent / 'ssd'}]"
    ]
  return [a for s in sets for a in ("--set", s)]


def _train(config: str, data, model_dir: pathlib.Path, fault: str = "", *extra):
  (model_dir.parent / "ssd").mkdir(parents=True, exist_ok=True)
  return subprocess.run([
      sys.executable, "-m", "mxrec_pipeline.cli", "train",
      str(REPO / "configs" / f"{config}.yaml"), "--verbose=0", *extra,
      *_sets(config, data, model_dir)
  ], capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT_S, check=False,
                        env={**os.environ, "MXREC_FAULT": fault})


def _variables(export: pathlib.Path) -> dict:
  reader = tf.train.load_checkpoint(str(export / "variables" / "variables"))
  return {
      name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
      if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
  }


def _assert_same_end(model_dir: pathlib.Path, reference: pathlib.Path) -> None:
  metrics = [json.loads((d / "metrics.json").read_text())["model"] for d in (model_dir, reference)]
  assert metrics[0] == metrics[1]
  for export in ("latest_model", "best_model_by_metric"):
    ours, theirs = (_variables(d / "export" / export) for d in (model_dir, reference))
    assert ours.keys() == theirs.keys(), export
    for name, value in ours.items():
      np.testing.assert_array_equal(value, theirs[name], err_msg=f"{export}: {name}")


_references: dict[str, pathlib.Path] = {}


def _reference(config: str, data) -> pathlib.Path:
  if config not in _references:
    model_dir = data["tmp"] / f"reference_{config}" / "model"
    done = _train(config, data, model_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    _references[config] = model_dir
  return _references[config]


@pytest.mark.parametrize("fault", FAULTS + ["random"])
@pytest.mark.parametrize("config", CONFIGS)
def test_killed_then_the_same_command_ends_as_uninterrupted(config, fault, data, tmp_path):
  reference = _reference(config, data)
  fault = _random_fault() if fault == "random" else fault
  print(f"LIFECYCLE_SEED={SEED}: {config} killed at {fault}")
  model_dir = tmp_path / "model"
  killed = _train(config, data, model_dir, fault)
  assert killed.returncode == -9, killed.stderr[-3000:]
  again = _train(config, data, model_dir)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "Traceback" not in again.stderr
  _assert_same_end(model_dir, reference)


@pytest.mark.cluster
@pytest.mark.parametrize(
    "fault",
    ["train_batch:3@worker:1", "checkpoint_shards:2@worker:0", "checkpoint_files:2@worker:0"])
def test_two_workers_killed_then_the_same_command_finishes(fault, data, tmp_path):
  """The main job on 2 workers: every epoch counted once, the export serves."""
  env, marker = cluster_testlib.marked_env()
  model_dir = tmp_path / "model"
  outputs = []
  for this_fault in (fault, ""):
    try:
      done = subprocess.run([
          sys.executable, "-m", "mxrec_pipeline.cli", "train",
          str(REPO / "configs" / "movielens_listwise.yaml"), "--verbose=0", "--local-cluster",
          "workers=2", "--set", "pipeline.collective_timeout_s=60", "--set",
          "model.table_initializer=zeros", *_sets("movielens_listwise", data, model_dir)
      ], capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT_S, check=False,
                            env={**env, "MXREC_FAULT": this_fault})
      assert cluster_testlib.marked_pids(marker) == []
    finally:
      cluster_testlib.kill_marked(marker)
    outputs.append(done)
  assert outputs[0].returncode != 0
  assert outputs[1].returncode == 0, outputs[1].stderr[-3000:]
  assert "continuing at epoch" in outputs[1].stdout
  assert len(cluster_testlib.epoch_losses(model_dir)) == 3  # Each epoch logged once.
  assert tf.saved_model.load(str(model_dir / "export" / "best_model_by_metric")) is not None


# Placement moves: epoch 1 on `before`, then the same command with 2 epochs on `after`; the end
# equals one process's 2 epochs by key (cluster_testlib.assert_ends_as).
MOVES = [("one", "workers=2", "lazy_adam"), ("workers=2", "one", "lazy_adam"),
         ("workers=2", "workers=3", "lazy_adam"), ("workers=1,ps=2", "workers=1,ps=1", "lazy_adam"),
         ("one", "workers=1,ps=2", "lazy_adam"), ("workers=1,ps=2", "one", "lazy_adam"),
         ("workers=1,ps=2", "workers=2", "lazy_adam"), ("workers=2", "workers=1,ps=2", "lazy_adam"),
         ("one", "workers=2", "adagrad"), ("workers=2", "one", "adagrad"),
         ("one", "workers=1,ps=2", "ftrl"), ("workers=2", "one", "ftrl")]


@pytest.fixture(scope="module")
def one_process_runs(data):
  """Sparse optimizer -> the model_dir of one process's 2 epochs of the tiny MovieLens job."""
  runs = {}

  def run(sparse_optimizer: str) -> pathlib.Path:
    if sparse_optimizer not in runs:
      model_dir = data["tmp"] / f"one_process_{sparse_optimizer}"
      done = cluster_testlib.train_on("one", data["tmp"], data["movielens"], model_dir, 2,
                                      sparse_optimizer=sparse_optimizer)
      assert done.returncode == 0, done.stderr[-3000:]
      runs[sparse_optimizer] = model_dir
    return runs[sparse_optimizer]

  return run


@pytest.mark.cluster
@pytest.mark.parametrize("before, after, sparse_optimizer", MOVES)
def test_moved_between_placements_ends_as_one_process(before, after, sparse_optimizer, data,
                                                      one_process_runs, tmp_path):
  reference = one_process_runs(sparse_optimizer)
  model_dir = tmp_path / "model"
  first = cluster_testlib.train_on(before, data["tmp"], data["movielens"], model_dir, 1,
                                   sparse_optimizer=sparse_optimizer)
  assert first.returncode == 0, first.stderr[-3000:]
  moved = cluster_testlib.train_on(after, data["tmp"], data["movielens"], model_dir, 2,
                                   sparse_optimizer=sparse_optimizer)
  if before.split(",")[-1].split("=")[0] == after.split(",")[-1].split("=")[0]:  # Re-sharded.
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert "1 epoch(s) and 3 step(s) done" in moved.stdout
  else:
    cluster_testlib.assert_moved(moved, model_dir, before, after, 1)
  if after == "workers=3":
    # 3 replicas cannot split a batch of 4 lists evenly: their mean loss weighs the lists unlike
    # one process's, so the end differs in arithmetic. The state moved: no key was lost.
    optimizer = factory.get_optimizer(sparse_optimizer, 0.01)
    for table in cluster_testlib.MOVIELENS_TABLES:
      keys = [
          checkpoint_lib.read_all_shards(str(model_dir / "checkpoints" / f"shards-{n}"), table,
                                         [optimizer])["keys"] for n in (1, 2)
      ]
      assert keys[0].size and np.isin(keys[0], keys[1]).all(), table
    np.testing.assert_allclose(cluster_testlib.epoch_losses(model_dir),
                               cluster_testlib.epoch_losses(reference), rtol=0.01)
    return
  cluster_testlib.assert_ends_as(model_dir, reference, epochs=2, sparse_optimizer=sparse_optimizer)


@pytest.mark.cluster
def test_a_tiered_table_cannot_move_onto_workers_and_says_where_it_can(data, tmp_path):
  model_dir = tmp_path / "model"
  done = _train("movielens_tiered", data, model_dir)
  assert done.returncode == 0, done.stderr[-3000:]
  env, marker = cluster_testlib.marked_env()
  try:
    moved = subprocess.run([
        sys.executable, "-m", "mxrec_pipeline.cli", "train",
        str(REPO / "configs" / "movielens_tiered.yaml"), "--verbose=0", "--local-cluster",
        "workers=2", *_sets("movielens_tiered", data, model_dir), "--set", "pipeline.num_epochs=4",
        "--set", "pipeline.num_train_steps=8"
    ], capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT_S, check=False, env=env)
  finally:
    cluster_testlib.kill_marked(marker)
  assert moved.returncode != 0
  assert ("tiered tables (host_vocabulary_size > 0) cannot be sharded over "
          "MultiWorkerMirroredStrategy workers yet; use ParameterServerStrategy") in (
              moved.stdout + moved.stderr), moved.stderr[-3000:]
  assert "Traceback" not in moved.stdout + moved.stderr
