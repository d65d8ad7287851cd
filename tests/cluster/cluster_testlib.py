"""Helpers of the cluster tests: the processes a test started (by an environment marker), runs."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import tensorflow as tf

from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.optimizers import factory

MARKER_VAR = "MXREC_CLUSTER_TEST_MARKER"
REPO = pathlib.Path(__file__).resolve().parents[2]
MOVIELENS_CONFIG = str(REPO / "configs" / "movielens_listwise.yaml")
MOVIELENS_TABLES = ("user", "item", "user_attribute", "zip", "genre", "title_token")
TIMEOUT_S = 240  # A guard against a hung cluster only.
sys.path.insert(0, str(REPO / "tests" / "builders"))
import builders_testlib  # pylint: disable=wrong-import-position  # noqa: E402


def marked_env(**extra: str) -> tuple[dict[str, str], str]:
  """os.environ plus a fresh marker (inherited by every process started with it), and the marker."""
  marker = uuid.uuid4().hex
  return {**os.environ, MARKER_VAR: marker, **extra}, marker


def marked_pids(marker: str) -> list[int]:
  """Live (non-zombie) processes whose environment holds `marker`, read from /proc."""
  pids = []
  for proc in pathlib.Path("/proc").iterdir():
    if not proc.name.isdigit():
      continue
    try:
      environ = (proc / "environ").read_bytes()
      state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:  # Gone, or not ours.
      continue
    if f"{MARKER_VAR}={marker}".encode() in environ.split(b"\0") and state != "Z":
      pids.append(int(proc.name))
  return pids


def kill_marked(marker: str) -> None:
  """SIGKILLs every live process holding `marker` (a test's cleanup in `finally`)."""
  for pid in marked_pids(marker):
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


def wait_for_text(path: pathlib.Path, text: str, timeout_s: float, process=None) -> None:
  """Returns once the file at `path` holds `text`; fails after `timeout_s` or if `process` ends.

  Polls (every 0.05 s): the writer is another process whose progress shows only in its log.
  """
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if path.exists() and text in path.read_text(errors="replace"):
      return
    if process is not None and process.poll() is not None:
      tail = path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"
      raise AssertionError(
          f"process ended with {process.returncode} before {path} held {text!r}; its end:\n{tail}")
    time.sleep(0.05)
  raise AssertionError(f"{path} did not hold {text!r} within {timeout_s} s")


def write_tiny_movielens(data_dir: pathlib.Path) -> pathlib.Path:
  """16 users x 10 ratings of 20 items (builders_testlib.write_movielens): 16 validation lists."""
  return builders_testlib.write_movielens(data_dir, num_users=16, ratings_per_user=10, num_items=20)


def movielens_overrides(tmp_path, data_dir, model_dir, **pipeline) -> list[str]:
  """`--set` arguments of a tiny MovieLens job comparable with one process across processes.

  Zero initial rows (random ones are drawn per shard, docs/distributed.md),
  no dropout, tfr's mean squared loss (a softmax loss leaves the output bias
  to Adam's steps of rounding noise), batches of 4 lists, 2 epochs of 3 steps;
  `pipeline` adds `pipeline.<key>=<value>` overrides.
  """
  sets = [
      f"data.data_dir={data_dir}", f"data.elwc_dir={tmp_path / 'elwc'}",
      f"pipeline.model_dir={model_dir}", "model.device_vocabulary_size=200",
      "model.hidden_layer_dims=[8]", "model.dropout=0.0", "model.table_initializer=zeros",
      "dataset.train_batch_size=4", "dataset.valid_batch_size=4", "pipeline.num_epochs=2",
      "pipeline.num_train_steps=6", "pipeline.loss=mean_squared_loss", "pipeline.seed=1",
      "pipeline.export_best_model=false"
  ] + [f"pipeline.{k}={v}" for k, v in pipeline.items()]
  return [a for s in sets for a in ("--set", s)]


# What a run prints of where its tables live (callbacks._PLACEMENTS), by `train_on`'s spec.
PLACEMENT_NAMES = {
    "one": "one host (no sharding)",
    "workers": "workers (MultiWorkerMirroredStrategy shards)",
    "ps": "ps tasks (ParameterServerStrategy shards)",
}


def placement_name(spec: str) -> str:
  """PLACEMENT_NAMES of a `train_on` spec: "one", "workers=N" or "workers=N,ps=M"."""
  return PLACEMENT_NAMES["one" if spec == "one" else "ps" if "ps=" in spec else "workers"]


def train_on(spec: str, tmp_path, data_dir, model_dir, epochs: int,
             **pipeline) -> subprocess.CompletedProcess:
  """`train` of the tiny MovieLens job, `epochs` epochs of 3 steps, on `spec`, to its end.

  `spec`: "one" (one process, no strategy) or a `--local-cluster` spec.
  """
  env, marker = marked_env()
  placement = ["--local-cluster", spec] if spec != "one" else []
  if spec == "one":
    pipeline.setdefault("strategy", "null")
  try:
    done = subprocess.run([
        sys.executable, "-m", "mxrec_pipeline.cli", "train", MOVIELENS_CONFIG, "--verbose=0",
        *placement, *movielens_overrides(tmp_path, data_dir, model_dir, collective_timeout_s=60,
                                         num_epochs=epochs, num_train_steps=3 * epochs, **pipeline)
    ], env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert marked_pids(marker) == []  # The launcher stopped every task.
  finally:
    kill_marked(marker)
  return done


def epoch_losses(model_dir: pathlib.Path) -> list[float]:
  """The chief's `epoch_loss` TensorBoard scalars of a run, in step order."""
  return scalars(model_dir, "train", "epoch_loss")


def scalars(model_dir: pathlib.Path, subdir: str, tag: str) -> list[float]:
  """The chief's TensorBoard scalars `tag` in `logs/<subdir>`, in step order."""
  found = {}
  for path in (model_dir / "logs" / subdir).glob("events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        if value.tag == tag:
          found[event.step] = float(tf.make_ndarray(value.tensor))
  return [found[step] for step in sorted(found)]


# Scores of an exported model, by a fresh process importing nothing but TensorFlow.
SERVE = """
import sys
import numpy as np
import tensorflow as tf
lists = tf.constant(list(tf.data.TFRecordDataset(sys.argv[2]).as_numpy_iterator()))
scores = tf.saved_model.load(sys.argv[1]).signatures["serving_default"](examples=lists)["scores"]
assert not any(m.startswith("mxrec_pipeline") for m in sys.modules), "served with the project"
np.save(sys.argv[3], scores.numpy())
"""


def serve_in_fresh_process(export_dir: pathlib.Path, valid: pathlib.Path,
                           out: pathlib.Path) -> np.ndarray:
  """The serving_default scores of every list of `valid` (ELWC TFRecords), by plain TF."""
  subprocess.run([sys.executable, "-c", SERVE,
                  str(export_dir),
                  str(valid), str(out)], check=True, timeout=TIMEOUT_S,
                 env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
  return np.load(out)


def _export_command(tmp_path, data_dir, model_dir, out: pathlib.Path, *args, **pipeline):
  """`mxrec-pipeline export` of a sharded run's checkpoint to `out`, a fresh process."""
  return subprocess.run([
      sys.executable, "-m", "mxrec_pipeline.cli", "export", MOVIELENS_CONFIG, "--out",
      str(out), *movielens_overrides(tmp_path, data_dir, model_dir, **pipeline), *args
  ], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def check_export_of_sharded_checkpoint(tmp_path: pathlib.Path, data_dir, model_dir: pathlib.Path,
                                       **pipeline) -> None:
  """`export` of a sharded run's checkpoint serves as the run's own export; bad shards refused.

  Exports the run's latest checkpoint in one process (no cluster), then
  scores the validation lists with both SavedModels in a fresh process with
  plain TF. Then, on a copy of the checkpoints whose newest misses one shard
  file of the "item" table, `export --checkpoint` of it exits 2 naming the
  file, writing nothing, and `export` skips it (naming the file) for the
  checkpoint before. A config with one more hidden layer than the run's
  (hidden_layer_dims [8, 1] for [8]: the output layer finds no weights in the
  checkpoint, no shape differs) is refused, naming one, writing nothing.
  """
  out = tmp_path / f"{model_dir.name}_exported"
  done = _export_command(tmp_path, data_dir, model_dir, out, **pipeline)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip().endswith(str(out))
  valid = tmp_path / "elwc" / "valid.tfrecord"
  served = [
      serve_in_fresh_process(d, valid, tmp_path / f"{model_dir.name}_{i}.npy")
      for i, d in enumerate([model_dir / "export" / "latest_model", out])
  ]
  assert served[0].shape[0] == 16
  np.testing.assert_allclose(served[1], served[0], atol=1e-6)

  broken = tmp_path / f"{model_dir.name}_broken"
  shutil.copytree(model_dir / "checkpoints", broken / "checkpoints")
  latest = tf.train.latest_checkpoint(str(broken / "checkpoints")).rsplit("-", 1)[1]
  shard = next((broken / "checkpoints" / f"shards-{latest}" / "item").glob("shard-1-of-*.index"))
  shard.unlink()
  out = tmp_path / f"{model_dir.name}_not_exported"
  done = _export_command(tmp_path, data_dir, broken, out, "--checkpoint", latest, **pipeline)
  assert done.returncode == 2, done.stderr[-3000:]
  assert f"ckpt-{latest} cannot be exported: {shard} is missing" in done.stderr, done.stderr
  assert not out.exists() and not (broken / "export").exists()
  done = _export_command(tmp_path, data_dir, broken, out, **pipeline)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"Skipping checkpoint {broken / 'checkpoints' / f'ckpt-{latest}'}: {shard} is missing" in (
      done.stderr)
  assert tf.saved_model.load(str(out)).signatures["serving_default"] is not None

  extra = tmp_path / f"{model_dir.name}_extra_layer"
  done = _export_command(tmp_path, data_dir, model_dir, extra, "--set",
                         "model.hidden_layer_dims=[8,1]", **pipeline)
  assert done.returncode == 2, done.stderr[-3000:]
  assert re.search(r"variables the checkpoint lacks .*: \d+ unbound, e\.g\. \S+",
                   done.stderr), (done.stderr[-3000:])
  assert not extra.exists()


def assert_moved(done: subprocess.CompletedProcess, model_dir: pathlib.Path, before: str, now: str,
                 epochs_done: int) -> None:
  """`done` (a `train_on` run on `now`) finished, resuming ckpt-`epochs_done` saved on `before`."""
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  prefix = model_dir / "checkpoints" / f"ckpt-{epochs_done}"
  assert (f"Moved checkpoint {prefix} from {placement_name(before)} to "
          f"{placement_name(now)}") in done.stdout, done.stdout[-3000:]
  assert f"{epochs_done} epoch(s) and {3 * epochs_done} step(s) done" in done.stdout


def assert_ends_as(model_dir: pathlib.Path, reference: pathlib.Path, epochs: int,
                   sparse_optimizer: str = "lazy_adam") -> None:
  """A run ends as `reference` (one process, same epochs): losses, metrics, rows and slots by key.

  Compares the per-epoch losses, validation metrics, the latest export's rows
  of every key and the last checkpoint's keys, rows, optimizer slots and step
  count by key (its shards-N, whatever placement wrote them).
  """
  runs = (model_dir, reference)
  losses = [epoch_losses(d) for d in runs]
  assert len(losses[0]) == epochs
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
  metrics = [json.loads((d / "metrics.json").read_text())["model"] for d in runs]
  np.testing.assert_allclose([metrics[0][k] for k in sorted(metrics[1])],
                             [metrics[1][k] for k in sorted(metrics[1])], atol=1e-5)
  assert 0.0 < metrics[0]["ndcg@1"] < 1.0  # Validation that can tell models apart.
  exports = [tf.saved_model.load(str(d / "export" / "latest_model")) for d in runs]
  optimizer = factory.get_optimizer(sparse_optimizer, 0.01)
  slots = [f"slot/{optimizer.optimizer_name}/{s}" for s in optimizer.slot_initial_values]
  for table in MOVIELENS_TABLES:
    rows = [e.serving_rows[table].numpy() for e in exports]
    assert rows[0].shape == rows[1].shape and np.abs(rows[1][:-1]).max() > 0, table
    np.testing.assert_allclose(rows[0], rows[1], atol=1e-5, err_msg=table)
    saved = []
    for d in runs:  # Each shard's keys in order: by key over all of them.
      whole = checkpoint_lib.read_all_shards(str(d / "checkpoints" / f"shards-{epochs}"), table,
                                             [optimizer])
      order = np.argsort(whole["keys"])
      saved.append(
          {n: v[order] if v.ndim and v.shape[0] == order.size else v for n, v in whole.items()})
    np.testing.assert_array_equal(saved[0]["keys"], saved[1]["keys"], err_msg=table)
    for field in ("values", *slots):
      np.testing.assert_allclose(saved[0][field], saved[1][field], atol=1e-5,
                                 err_msg=f"{table}/{field}")
    name = f"iterations/{optimizer.optimizer_name}"
    assert saved[0][name] == saved[1][name] == 3 * epochs, table
