"""Benchmark of distributed training: examples/s with N replicas and W workers, bytes per step.

`--only replicas`: configs/movielens_listwise.yaml trained by the Keras pipeline
under MirroredStrategy with 1 and with 2 replicas of this host (logical CPUs
when there is no GPU: `tf.config.set_logical_device_configuration` in a fresh
child process per trial). Same global batches (train_batch_size lists), so
the same work per step; examples/s = batch x mean list length / median step
time of the epochs after the first (which traces), validation excluded, and
examples per process CPU-second as a cross-check on a shared machine.

`--only workers`: the same MovieLens job through the command line, in one
process (`pipeline.strategy=null`) and with `--local-cluster workers=2`
(MultiWorkerMirroredStrategy, tables sharded by key over the 2 workers), the
same global batches; examples/s from Keras' per-epoch `ms/step` of the epochs
after the first and the examples per global batch of the training data.

`--only ps`: the same MovieLens job through the command line in one process
and under ParameterServerStrategy with `--local-cluster workers=1,ps=2` and
`workers=2,ps=2` (model.fit on the chief, tables sharded by key over the ps
tasks, keras/ps.py), validation cut to one batch so that Keras' per-epoch
`ms/step` is training: steps/s of the epochs after the first; the CPU seconds
each task (chief, workers, ps) spent over those epochs (/proc, from the line "Epoch
2/" of the chief to its last epoch's line), per step; and the bytes a step
ships to and from each ps, counted from the tensors of the step on the
job's real batches (distributed/ps_table.step_bytes per sparse feature, plus
the dense variables read and their gradients sent).

`--only sidecar`: the same job under `workers=2,ps=2` validated by the
coordinator after each epoch (whole validation split) and with
`evaluator=1` (mxrec_pipeline/sidecar.py: the chief validates no epoch):
training examples/s over epochs 2..N with what validation costs the workers.

`--only zipf`: a synthetic job of 10M keys drawn from Zipf(1.2) ids (a
`--zipf-batch`-example global batch of 8 ids each, dim 16, one table, lazy
Adam, score = sum of the embeddings, squared error), the same global batches
(a) with 1 and 2 replicas of this host (mx_rec API in `strategy.run`, global
batch inserted once and split per replica, core/asc/replicas.py) and (b) with
1 and 2 workers (MultiWorkerMirroredStrategy processes on localhost, the table
sharded by key: benchmarks/bench_sharded_exchange.py, both routings), with
the bytes each worker receives per step, measured beside
`exchange.bytes_per_step_formula`.

Usage:
  python benchmarks/bench_distributed.py --only replicas               # 1 and 2 replicas
  python benchmarks/bench_distributed.py --only replicas --replicas 1 2 4 --epochs 3
  python benchmarks/bench_distributed.py --only workers  # MovieLens: 1 process, 2 workers
  python benchmarks/bench_distributed.py --only ps       # MovieLens: 1 process, 1/2 workers + 2 ps
  python benchmarks/bench_distributed.py --only sidecar  # PS: coordinator vs sidecar validation
  python benchmarks/bench_distributed.py --only zipf     # 10M keys: 1/2 replicas, 1/2 workers
  python benchmarks/bench_distributed.py --only restore  # 4M keys: peak memory of a restore
  python benchmarks/bench_distributed.py --only restore_export  # ... of a restore and an export
  python benchmarks/bench_distributed.py --only restore_export --placement ps --restore-keys 400000

`--only restore` / `restore_export`: benchmarks/bench_restore.py (a table
sharded over MultiWorkerMirrored workers) and benchmarks/bench_restore_ps.py
(over the ps tasks of a local ParameterServerStrategy cluster); `--placement`
picks one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import bench_pipeline  # benchmarks/: the Keras step timer.

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
  timer = bench_pipeline.step_timer()
  pipe = pipeline_lib.SimplePipeline(
      ranker.build_model_builder(config.model, config.pipeline.seed),
      ranker.build_dataset_builder(paths, config.dataset, config.model), config.pipeline,
      strategy=strategy)
  metrics = pipe.train_and_validate(callbacks=[timer])
  lists, examples_per_step = _training_lists(ranker, paths, config)
  steps = timer.step_seconds
  return {
      "replicas": num_replicas, "devices": list(strategy.extended.worker_devices
                                               ), "ndcg@10": metrics["ndcg@10"],
      "steps": len(steps), "steps_per_epoch": math.ceil(lists / config.dataset.train_batch_size),
      "examples_per_step": examples_per_step,
      "examples_per_s": examples_per_step / statistics.median(steps),
      "examples_per_cpu_s": len(steps) * examples_per_step / timer.cpu_seconds
  }


ZIPF_IDS, ZIPF_DIM, ZIPF_S = 8, 16, 1.2


def zipf_batches(keys: int, global_batch: int, steps: int, seed: int = 0) -> list:
  """`steps` global batches: ids [global_batch, ZIPF_IDS] int64 (Zipf), labels [global_batch]."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  return [(np.minimum(rng.zipf(ZIPF_S, (global_batch, ZIPF_IDS)),
                      keys).astype(np.int64), rng.normal(size=global_batch).astype(np.float32))
          for _ in range(steps)]


def child_zipf_replicas(num_replicas: int, keys: int, global_batch: int, steps: int) -> dict:
  """examples/s of the Zipf job with `num_replicas` replicas of this host (mx_rec API)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] *
                                             num_replicas)
  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core.asc import replicas
  from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
  from mxrec_pipeline.core.asc.helper import get_asc_insert_func
  from mxrec_pipeline.core.asc.manager import start_asc_pipeline
  from mxrec_pipeline.core.embedding import create_table, sparse_lookup
  from mxrec_pipeline.optimizers.lazy_adam import create_hash_optimizer
  from mxrec_pipeline.util import initialize

  # pylint: enable=import-outside-toplevel
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  strategy = tf.distribute.MirroredStrategy(devices)
  initialize.init()
  with strategy.scope():
    table = create_table(tf.int64, ZIPF_DIM, "item", device_vocabulary_size=keys,
                         emb_initializer=tf.keras.initializers.Constant(0.01))
    optimizer = create_hash_optimizer(learning_rate=0.01)
  spec = FeatureSpec("ids", table_name="item")
  batches = zipf_batches(keys, global_batch, steps + 1)
  arrays = {
      "ids": np.concatenate([b[0] for b in batches]),
      "label": np.concatenate([b[1] for b in batches])
  }
  dataset = tf.data.Dataset.from_tensor_slices(arrays).batch(global_batch).map(
      get_asc_insert_func([spec], is_training=True)).prefetch(2)
  start_asc_pipeline()
  iterator = iter(replicas.distribute_dataset(strategy, dataset, [spec]))

  def replica_step(batch):
    with tf.GradientTape() as tape:
      scores = tf.reduce_sum(sparse_lookup(table, spec, batch=batch), axis=[1, 2])
      loss = tf.reduce_sum(tf.square(scores - batch["label"])) / global_batch
    optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])
    return loss

  @tf.function
  def step():
    return strategy.reduce(tf.distribute.ReduceOp.SUM,
                           strategy.run(replica_step, args=(next(iterator),)), axis=None)

  step()  # Traces.
  start, cpu_start = time.perf_counter(), time.process_time()
  for _ in range(steps):
    loss = step()
  float(loss)
  seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
  return {
      "replicas": num_replicas, "keys": keys, "global_batch": global_batch, "steps": steps,
      "examples_per_s": global_batch * steps / seconds,
      "examples_per_cpu_s": global_batch * steps / cpu_seconds
  }


def run_child(kind: str, params: dict) -> dict:
  """Runs `--child OUT KIND PARAMS` in a fresh process; returns its JSON result."""
  with tempfile.NamedTemporaryFile(suffix=".json") as out:
    cmd = [sys.executable, __file__, "--child", out.name, kind, json.dumps(params)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
      raise RuntimeError(f"child {kind} {params} failed:\n{proc.stderr[-4000:]}")
    return json.loads(pathlib.Path(out.name).read_text())


def movielens_examples_per_step(model_dir: str) -> float:
  """Mean examples (unpadded documents) per global batch of the MovieLens job's training data.

  Reads the training ELWC files of the job that trained in `model_dir` (its
  config.yaml) in a child process, as `child_replicas` counts them.
  """
  return run_child("examples_per_step", {"model_dir": model_dir})["examples_per_step"]


def child_examples_per_step(model_dir: str) -> dict:
  """See `movielens_examples_per_step`."""
  import builders  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import config as config_lib  # pylint: disable=import-outside-toplevel

  config = config_lib.load(os.path.join(model_dir, "config.yaml"), [])
  ranker = builders.get_builder(config.builder)
  _, examples_per_step = _training_lists(ranker, ranker.prepare_data(config.data), config)
  return {"examples_per_step": examples_per_step}


def _training_lists(ranker, paths, config) -> tuple[int, float]:
  """(lists, mean examples per global batch) of the job's training ELWC files.

  Examples are the unpadded documents (label >= 0); a global batch holds
  `train_batch_size` lists.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import tensorflow_ranking as tfr  # pylint: disable=import-outside-toplevel
  label_name, label_spec = ranker.feature_specs()[2]
  lists = examples = 0
  for serialized in tf.data.TFRecordDataset(paths.train).batch(512):
    labels = tfr.data.parse_from_example_list(serialized,
                                              example_feature_spec={label_name: label_spec
                                                                   })[label_name]
    lists += int(labels.shape[0])
    examples += int(tf.reduce_sum(tf.cast(labels >= 0, tf.int32)))
  return lists, config.dataset.train_batch_size * examples / lists


def run_workers(epochs: int, tmp: str) -> list[dict]:
  """examples/s of the MovieLens job in one process and on 2 local workers (CLI)."""
  rows = []
  for workers in (1, 2):
    model_dir = f"{tmp}/workers_{workers}"
    cmd = [
        sys.executable, "-m", "mxrec_pipeline.cli", "train",
        str(CONFIG), "--set", f"pipeline.model_dir={model_dir}", "--set",
        f"pipeline.num_epochs={epochs}", "--set", "pipeline.export_best_model=false"
    ] + (["--local-cluster", f"workers={workers}"]
         if workers > 1 else ["--set", "pipeline.strategy=null"])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    step_ms = [float(m) for m in re.findall(r"(\d+)ms/step", proc.stdout + proc.stderr)]
    if len(step_ms) != epochs:
      raise RuntimeError(f"expected {epochs} epochs' ms/step, got {step_ms}")
    per_step = movielens_examples_per_step(model_dir)
    ndcg = json.loads(pathlib.Path(model_dir, "metrics.json").read_text())["model"]["ndcg@10"]
    row = {
        "workers": workers, "step_ms": step_ms, "examples_per_step": per_step,
        "examples_per_s": per_step / (statistics.median(step_ms[1:]) / 1000), "wall_s": wall,
        "ndcg@10": ndcg
    }
    rows.append(row)
    print(
        f"  movielens {workers} worker(s){' (tables sharded)' if workers > 1 else ''}: "
        f"{row['examples_per_s']:,.0f} examples/s (median ms/step of epochs 2-{epochs}: "
        f"{statistics.median(step_ms[1:]):g}), {wall:.0f} s in all, ndcg@10 {ndcg:.4f}", flush=True)
  return rows


PS_TRIALS = (None, "workers=1,ps=2", "workers=2,ps=2")  # --local-cluster of each `ps` trial.
_TASK_LINE = re.compile(r"local cluster: (\w+ \d+) \(pid (\d+)\)")
_EPOCH_LINE = re.compile(r"^\s*\d+/\d+ - .*?(\d+(?:\.\d+)?)(ms|s)/step")


def _cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of process `pid` so far (/proc/<pid>/stat)."""
  fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_movielens(model_dir: str, epochs: int, spec: str | None, *sets:
                     str) -> tuple[list[str], subprocess.Popen]:
  """Starts `train` of the MovieLens job (`--local-cluster spec`, or one process for None)."""
  cmd = [
      sys.executable, "-m", "mxrec_pipeline.cli", "train",
      str(CONFIG), "--verbose=2", "--set", f"pipeline.model_dir={model_dir}", "--set",
      f"pipeline.num_epochs={epochs}"
  ] + [a for s in sets for a in ("--set", s)]
  cmd += ["--local-cluster", spec] if spec else ["--set", "pipeline.strategy=null"]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
  return cmd, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)


def run_ps(epochs: int, tmp: str) -> dict:
  """steps/s, task CPU per step and per-ps bytes per step of the MovieLens job (PS_TRIALS)."""
  rows = []
  for spec in PS_TRIALS:
    model_dir = f"{tmp}/ps_{spec or 'one_process'}".replace(",", "_").replace("=", "")
    cmd, proc = _start_movielens(model_dir, epochs, spec, "pipeline.export_best_model=false",
                                 "pipeline.num_valid_steps=1")
    tasks, step_ms, cpu, text = {}, [], {}, []
    for line in proc.stdout:
      text.append(line)
      if match := _TASK_LINE.search(line):
        tasks[match.group(1)] = int(match.group(2))
      if line.startswith("Epoch 2/"):
        cpu["start"] = {name: _cpu_seconds(pid) for name, pid in tasks.items()}
      if match := _EPOCH_LINE.search(line):
        step_ms.append(float(match.group(1)) * (1 if match.group(2) == "ms" else 1000))
        if len(step_ms) == epochs:
          cpu["end"] = {name: _cpu_seconds(pid) for name, pid in tasks.items()}
    if proc.wait() != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{''.join(text)[-4000:]}")
    if len(step_ms) != epochs:
      raise RuntimeError(f"expected {epochs} epochs' ms/step, got {step_ms}")
    if not rows:  # The same batches in every trial.
      steps = run_child("ps_bytes", {"model_dir": model_dir, "num_ps": 2})
    timed_steps = steps["steps_per_epoch"] * (epochs - 1)
    row = {
        "cluster": spec or "one process", "step_ms": step_ms,
        "steps_per_s": 1000 / statistics.median(step_ms[1:]), "cpu_s_per_step": {
            name: (cpu["end"][name] - cpu["start"][name]) / timed_steps for name in tasks
        }
    }
    rows.append(row)
    cpu_text = ", ".join(
        f"{name} {seconds * 1000:.0f} ms" for name, seconds in row["cpu_s_per_step"].items())
    print(
        f"  movielens {row['cluster']}: {row['steps_per_s']:.2f} steps/s (median ms/step of epochs "
        f"2-{epochs}: {statistics.median(step_ms[1:]):g})" +
        (f"; CPU per step: {cpu_text}" if cpu_text else ""), flush=True)
  for i, (to_ps, from_ps) in enumerate(steps["bytes_per_step"]):
    print(
        f"  ps {i} of 2 per step (mean over an epoch of {steps['steps_per_epoch']} steps): "
        f"{to_ps / 1e3:,.1f} kB in, {from_ps / 1e3:,.1f} kB out (tables "
        f"{steps['table_bytes_per_step'][i][0] / 1e3:,.1f} / "
        f"{steps['table_bytes_per_step'][i][1] / 1e3:,.1f} kB)", flush=True)
  return {"trials": rows, "bytes": steps}


SIDECAR_TRIALS = ("workers=2,ps=2", "workers=2,ps=2,evaluator=1")


def run_sidecar(epochs: int, tmp: str) -> dict:
  """Training examples/s of the PS MovieLens job validated by the coordinator or by an evaluator.

  Full validation after every epoch (no `num_valid_steps`), so that the
  coordinator's validation is the real one; the timed window runs from the
  chief's "Epoch 2/" line to its last epoch's line (epochs 2..N with the
  validation between them, as the workers see them).
  """
  rows = []
  for spec in SIDECAR_TRIALS:
    model_dir = f"{tmp}/sidecar_{spec}".replace(",", "_").replace("=", "")
    cmd, proc = _start_movielens(model_dir, epochs, spec, "pipeline.export_best_model=true")
    start = end = None
    epoch_lines, text = 0, []
    for line in proc.stdout:
      text.append(line)
      if line.startswith("Epoch 2/"):
        start = time.perf_counter()
      if _EPOCH_LINE.search(line):
        epoch_lines += 1
        if epoch_lines == epochs:
          end = time.perf_counter()
    if proc.wait() != 0 or start is None or end is None:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{''.join(text)[-4000:]}")
    if not rows:
      examples = movielens_examples_per_step(model_dir)
      steps = run_child("ps_bytes", {"model_dir": model_dir, "num_ps": 2})["steps_per_epoch"]
    log = pathlib.Path(model_dir, "validation.jsonl")
    validated = len(log.read_text().splitlines()) if "evaluator" in spec else epochs
    row = {
        "cluster": spec, "wall_s": end - start,
        "examples_per_s": steps * (epochs - 1) * examples / (end - start), "validated": validated
    }
    rows.append(row)
    print(
        f"  movielens {spec}: {row['examples_per_s']:,.0f} training examples/s over epochs "
        f"2-{epochs} with their validation ({row['wall_s']:.1f} s); checkpoints validated: "
        f"{validated}", flush=True)
  print(
      f"  sidecar / coordinator validation: "
      f"{rows[1]['examples_per_s'] / rows[0]['examples_per_s']:.2f}x examples/s", flush=True)
  return {"trials": rows}


def child_ps_bytes(model_dir: str, num_ps: int) -> dict:
  """Bytes a training step of the job in `model_dir` ships to/from each of `num_ps` ps tasks.

  Tables: ps_table.step_bytes of every sparse feature's ids (each
  ShardedLookup looks its feature up on its own), over the batches of the
  job's first epoch, raw ids as the ps pipeline reads them. Dense: every
  dense variable is read from its ps and its gradient sent there each step;
  ParameterServerStrategy places them round-robin in creation order (model
  variables first), which is taken as the per-ps split.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import builders  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import config as config_lib  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core import key_index  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import ps_table  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.keras import pipeline as pipeline_lib  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.util import initialize  # pylint: disable=import-outside-toplevel

  config = config_lib.load(os.path.join(model_dir, "config.yaml"), [])
  ranker = builders.get_builder(config.builder)
  paths = ranker.prepare_data(config.data)
  model_builder = ranker.build_model_builder(config.model, config.pipeline.seed)
  dataset_builder = ranker.build_dataset_builder(paths, config.dataset, config.model)
  dataset_builder.keep_raw_ids = True
  dims = {name: spec.dim for name, spec in model_builder.tables.items()}
  tables = np.zeros([num_ps, 2], np.int64)
  steps = 0
  for features, _ in dataset_builder.build_train_epoch(0, config.pipeline.num_train_steps,
                                                       config.pipeline.seed):
    steps += 1
    for feature in dataset_builder.sparse_features:
      ids = features[feature.name]
      flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
      tables += ps_table.step_bytes(key_index.to_keys(flat).numpy(), num_ps, dims[feature.table])
  initialize.init()
  pipe = pipeline_lib.SimplePipeline(model_builder, dataset_builder, config.pipeline)
  model = pipe.build_compiled_model()
  table_ids = {id(v) for v in model.table_variables}
  dense = np.zeros([num_ps, 2], np.int64)
  for i, variable in enumerate(v for v in model.trainable_variables if id(v) not in table_ids):
    size = variable.shape.num_elements() * variable.dtype.size
    dense[i % num_ps] += (size, size)  # Its gradient in, its value out.
  tables = tables / steps
  return {
      "steps_per_epoch": steps, "table_bytes_per_step": tables.tolist(),
      "dense_bytes_per_step": dense.tolist(), "bytes_per_step": (tables + dense).tolist()
  }


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


def _json_objects(text: str) -> list[dict]:
  """Every top-level JSON object in `text`, in order."""
  decoder, out, i = json.JSONDecoder(), [], text.find("{")
  while i >= 0:
    obj, end = decoder.raw_decode(text, i)
    out.append(obj)
    i = text.find("{", end)
  return out


def run_zipf(keys: int, global_batch: int, steps: int, tmp: str) -> dict:
  """The Zipf job with 1 and 2 replicas, and with 1 and 2 sharded workers (both routings)."""
  del tmp
  out = {"replicas": [], "workers": []}
  for n in (1, 2):
    row = run_child("zipf_replicas",
                    {"num_replicas": n, "keys": keys, "global_batch": global_batch, "steps": steps})
    out["replicas"].append(row)
    print(
        f"  zipf {keys:,} keys, {n} replica(s): {row['examples_per_s']:,.0f} examples/s, "
        f"{row['examples_per_cpu_s']:,.0f} examples/CPU-s", flush=True)
  script = ROOT / "benchmarks" / "bench_sharded_exchange.py"
  for workers, routing in ((1, "all_gather"), (2, "all_gather"), (2, "all_to_all")):
    cmd = [
        sys.executable,
        str(script), "--workers",
        str(workers), "--batch",
        str(global_batch // workers), "--keys",
        str(keys), "--ids",
        str(ZIPF_IDS), "--dim",
        str(ZIPF_DIM), "--zipf",
        str(ZIPF_S), "--steps",
        str(steps), "--routing", routing
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    rows = _json_objects(proc.stdout)  # The workers' lines, possibly run together.
    if len(rows) != workers:
      raise RuntimeError(f"expected {workers} worker results, got:\n{proc.stdout[-4000:]}")
    total = sum(r["examples_per_s"] for r in rows)
    measured = statistics.mean(r["measured_total"] for r in rows)
    formula = statistics.mean(r["formula_total"] for r in rows)
    out["workers"].append({
        "workers": workers, "routing": routing, "examples_per_s": total,
        "bytes_per_step_per_worker": measured, "formula_bytes": formula, "per_worker": rows
    })
    print(
        f"  zipf {keys:,} keys, {workers} worker(s) sharded, {routing}: {total:,.0f} examples/s "
        f"(all workers), {measured:,.0f} bytes received per step per worker (formula "
        f"{formula:,.0f})", flush=True)
  return out


def run_restore(restore_only: bool, keys: int, placement: str, json_path: str | None) -> int:
  """bench_restore.py (workers) and/or bench_restore_ps.py (ps tasks): restores, and exports."""
  import bench_restore  # pylint: disable=import-outside-toplevel
  import bench_restore_ps  # pylint: disable=import-outside-toplevel
  common = ["--part", "restore" if restore_only else "both", "--keys", str(keys)]
  code = 0
  if placement in ("workers", "both"):
    code = bench_restore.main(common + (["--json", json_path] if json_path else []))
  if placement in ("ps", "both") and code == 0:
    if json_path and placement == "both":
      json_path = str(pathlib.Path(json_path).with_suffix(".ps.json"))
    code = bench_restore_ps.main(common + (["--json", json_path] if json_path else []))
  return code


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
      "--only",
      choices=("replicas", "workers", "ps", "sidecar", "zipf", "restore", "restore_export"),
      action="append", help="which trials to run (repeatable; default: all but restore and "
      "restore_export, which are benchmarks/bench_restore.py and bench_restore_ps.py)")
  parser.add_argument("--zipf-keys", type=int, default=10_000_000, help="keys of the Zipf job")
  parser.add_argument("--zipf-batch", type=int, default=1024,
                      help="global batch (examples) of the Zipf job")
  parser.add_argument("--zipf-steps", type=int, default=20, help="timed steps of the Zipf job")
  parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2],
                      help="replica counts of the replicas trials")
  parser.add_argument("--epochs", type=int, default=4,
                      help="epochs per trial; the first (tracing) is not timed")
  parser.add_argument("--restore-keys", type=int, default=4_000_000,
                      help="keys of the table of restore and restore_export")
  parser.add_argument(
      "--placement", choices=("workers", "ps", "both"), default="both",
      help="restore and restore_export: the table sharded over MultiWorkerMirrored workers "
      "(bench_restore.py), over ps tasks (bench_restore_ps.py), or both")
  parser.add_argument(
      "--json", help="also write the figures to this file (restore and restore_export with "
      "both placements: the ps figures to FILE with the suffix .ps.json)")
  parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    out, kind, params = args.child
    result = {
        "replicas": child_replicas, "zipf_replicas": child_zipf_replicas,
        "examples_per_step": child_examples_per_step, "ps_bytes": child_ps_bytes
    }[kind](**json.loads(params))
    pathlib.Path(out).write_text(json.dumps(result))
    return 0
  if args.only in (["restore"], ["restore_export"]):
    return run_restore(args.only == ["restore"], args.restore_keys, args.placement, args.json)
  if args.epochs < 2:
    parser.error("--epochs must be >= 2 (the first epoch is not timed)")
  load = os.getloadavg()
  print(f"bench_distributed: {os.cpu_count()} CPUs, load average {load[0]:.1f} at start",
        flush=True)
  results = {}
  with tempfile.TemporaryDirectory(prefix="bench_distributed_") as tmp:
    only = args.only or ["replicas", "workers", "ps", "zipf"]
    if "replicas" in only:
      results["replicas"] = run_replicas(args.replicas, args.epochs, tmp)
    if "workers" in only:
      results["workers"] = run_workers(max(args.epochs, 3), tmp)
    if "ps" in only:
      results["ps"] = run_ps(max(args.epochs, 3), tmp)
    if "sidecar" in only:
      results["sidecar"] = run_sidecar(max(args.epochs, 3), tmp)
    if "zipf" in only:
      results["zipf"] = run_zipf(args.zipf_keys, args.zipf_batch, args.zipf_steps, tmp)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
