"""Benchmark of distributed training: examples/s of the MovieLens job with N replicas.

`--only replicas`: configs/movielens_listwise.yaml trained by the Keras pipeline
under MirroredStrategy with 1 and with 2 replicas of this host (logical CPUs
when there is no GPU: `tf.config.set_logical_device_configuration` in a fresh
child process per trial). Same global batches (train_batch_size lists), so
the same work per step; examples/s = batch x mean list length / median step
time of the epochs after the first (which traces), validation excluded, and
examples per process CPU-second as a cross-check on a shared machine.

Usage:
  python benchmarks/bench_distributed.py --only replicas               # 1 and 2 replicas
  python benchmarks/bench_distributed.py --only replicas --replicas 1 2 4 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "movielens_listwise.yaml"


def child_replicas(num_replicas: int, epochs: int, model_dir: str) -> dict:
  """Trains the MovieLens job with `num_replicas` replicas; returns examples/s."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if not tf.config.list_physical_devices("GPU"):
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] *
                                               num_replicas)
  import builders  # pylint: disable=import-outside-toplevel
  import tensorflow_ranking as tfr  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import config as config_lib  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.keras import pipeline as pipeline_lib  # pylint: disable=import-outside-toplevel

  config = config_lib.load(str(CONFIG), [
      f"pipeline.model_dir={model_dir}", f"pipeline.num_epochs={epochs}",
      "pipeline.export_best_model=false", "pipeline.strategy=MirroredStrategy"
  ])
  ranker = builders.get_builder(config.builder)
  paths = ranker.prepare_data(config.data)
  strategy = pipeline_lib.get_strategy("MirroredStrategy")
  assert strategy.num_replicas_in_sync == num_replicas, strategy.extended.worker_devices
  timer = _step_timer()
  pipe = pipeline_lib.SimplePipeline(
      ranker.build_model_builder(config.model, config.pipeline.seed),
      ranker.build_dataset_builder(paths, config.dataset, config.model), config.pipeline,
      strategy=strategy)
  metrics = pipe.train_and_validate(callbacks=[timer])
  lists = examples = 0
  label_name, label_spec = ranker.feature_specs()[2]
  for serialized in tf.data.TFRecordDataset(paths.train).batch(512):
    labels = tfr.data.parse_from_example_list(serialized,
                                              example_feature_spec={label_name: label_spec
                                                                   })[label_name]
    lists += int(labels.shape[0])
    examples += int(tf.reduce_sum(tf.cast(labels >= 0, tf.int32)))
  examples_per_step = config.dataset.train_batch_size * examples / lists
  steps = timer.step_seconds
  return {
      "replicas": num_replicas, "devices": list(strategy.extended.worker_devices
                                               ), "ndcg@10": metrics["ndcg@10"],
      "steps": len(steps), "steps_per_epoch": math.ceil(lists / config.dataset.train_batch_size),
      "examples_per_step": examples_per_step,
      "examples_per_s": examples_per_step / statistics.median(steps),
      "examples_per_cpu_s": len(steps) * examples_per_step / timer.cpu_seconds
  }


def _step_timer():
  """A Keras callback timing the training steps of the epochs after the first.

  Wall and process CPU seconds between consecutive training steps; an epoch's
  first step is timed from the epoch's start.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  class StepTimer(tf.keras.callbacks.Callback):
    """Step durations (wall and process CPU seconds) after the first epoch."""

    def __init__(self):
      super().__init__()
      self.step_seconds: list[float] = []
      self.cpu_seconds = 0.0
      self._epoch = 0
      self._last = self._last_cpu = 0.0

    def on_epoch_begin(self, epoch, logs=None):
      self._epoch, self._last, self._last_cpu = epoch, time.perf_counter(), time.process_time()

    def on_train_batch_end(self, batch, logs=None):
      now, now_cpu = time.perf_counter(), time.process_time()
      if self._epoch >= 1:
        self.step_seconds.append(now - self._last)
        self.cpu_seconds += now_cpu - self._last_cpu
      self._last, self._last_cpu = now, now_cpu

  return StepTimer()


def run_child(kind: str, params: dict) -> dict:
  """Runs `--child OUT KIND PARAMS` in a fresh process; returns its JSON result."""
  with tempfile.NamedTemporaryFile(suffix=".json") as out:
    cmd = [sys.executable, __file__, "--child", out.name, kind, json.dumps(params)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
      raise RuntimeError(f"child {kind} {params} failed:\n{proc.stderr[-4000:]}")
    return json.loads(pathlib.Path(out.name).read_text())


def run_replicas(replica_counts, epochs: int, tmp: str) -> list[dict]:
  """examples/s of the MovieLens job per replica count, one child process each."""
  rows = []
  for n in replica_counts:
    row = run_child("replicas",
                    {"num_replicas": n, "epochs": epochs, "model_dir": f"{tmp}/replicas_{n}"})
    rows.append(row)
    print(
        f"  movielens {n} replica(s): {row['examples_per_s']:,.0f} examples/s (median step), "
        f"{row['examples_per_cpu_s']:,.0f} examples/CPU-s, ndcg@10 {row['ndcg@10']:.4f}, "
        f"{row['steps']} timed steps", flush=True)
  return rows


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--only", choices=("replicas",), default="replicas",
                      help="which trials to run (today: replicas)")
  parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2],
                      help="replica counts of the replicas trials")
  parser.add_argument("--epochs", type=int, default=4,
                      help="epochs per trial; the first (tracing) is not timed")
  parser.add_argument("--json", help="also write the figures to this file")
  parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    out, kind, params = args.child
    result = {"replicas": child_replicas}[kind](**json.loads(params))
    pathlib.Path(out).write_text(json.dumps(result))
    return 0
  if args.epochs < 2:
    parser.error("--epochs must be >= 2 (the first epoch is not timed)")
  load = os.getloadavg()
  print(f"bench_distributed: {os.cpu_count()} CPUs, load average {load[0]:.1f} at start",
        flush=True)
  results = {}
  with tempfile.TemporaryDirectory(prefix="bench_distributed_") as tmp:
    if args.only == "replicas":
      results["replicas"] = run_replicas(args.replicas, args.epochs, tmp)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
