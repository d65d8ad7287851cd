"""GPU check: one prepared run for a machine with one NVIDIA GPU (issue #37), in under 10 minutes.

Runs these parts in order, each in its own process with its own timeout, and
prints one summary. A failing part is reported and the next one runs; the exit
status says whether any failed.

  build     the op library against the installed TensorFlow
            (`make -f native/ops.mk`, what `make native` runs once the venv exists)
  devices   one training step of a small sparse + dense model, with no strategy
            and under the main job's MirroredStrategy, with
            `tf.debugging.set_log_device_placement`: the device of each variable
            class (table rows, their optimizer slots, dense variables, dense
            optimizer slots) and of each op class (key index, row gather, per-id
            read and gradient sum, fused row update, dense layer, dense
            optimizer), and the median step time
  tests     the sparse-core tests that exercise placement, lookups, gradients and
            the row optimizers (a fast subset of tests/core and tests/optimizers)
  data      `mxrec-pipeline data fetch movielens_100k` (a no-op when cached)
  train     the main job, configs/movielens_listwise.yaml, for 2 epochs
            (`mxrec-pipeline train ... --fresh`, LambdaMART off), which exports it
            (model_dir/export/latest_model)
  bench_sparse_core   `benchmarks/bench_sparse_core.py --quick`
  bench_pipeline      `benchmarks/bench_pipeline.py --quick --only movielens`
            (its quick plan is one seed, 2 epochs)
  train_no_strategy   the main job again with `--set pipeline.strategy=null`: the
            layout of core/placement.py (rows on the host, dense on the GPU), which
            MirroredStrategy, the main job's strategy, overrides by placing the rows

Without a GPU (neither `nvidia-smi` nor TensorFlow finds one) every part still
runs on the CPU, the summary says no GPU was found, and the exit status is 0 when
every part passed. A GPU that `nvidia-smi` lists but TensorFlow does not see is
a failure: TF 2.15 uses a GPU only with its CUDA 12.2 / cuDNN 8.9 libraries
(`pip install tensorflow[and-cuda]==2.15.1`).

The parts share one time budget (--budget-s, 570 s by default: the 10 minutes of
a device command less a margin): each part's timeout is cut to what is left,
and a part with under 20 s left is skipped, which counts as a failure. The
whole output of every part goes to OUT/gpu_check.log and the figures to
OUT/gpu_check.json (two files, so the run fits what a device command returns).

Usage:
  .venv/bin/python benchmarks/gpu_check.py --out "$OUT"
  .venv/bin/python benchmarks/gpu_check.py --skip bench_pipeline --budget-s 900
  .venv/bin/python benchmarks/gpu_check.py --budget-s 2400 --timeout-scale 3   # 2 CPU cores
  .venv/bin/python benchmarks/gpu_check.py --rebuild    # recompile every object (make -B)

The driver imports neither TensorFlow nor numpy; `--child devices-*` is the
devices part's own process. See docs/architecture.md, "What runs where".
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAIN_CONFIG = "configs/movielens_listwise.yaml"
TESTS = (
    "tests/core/test_core_placement.py",
    "tests/core/test_core_create_table.py",
    "tests/core/test_core_lookup.py",
    "tests/core/test_core_gradients.py",
    "tests/core/test_core_restore_sum.py",
    "tests/core/test_core_combiner.py",
    "tests/optimizers/test_optimizers_fused.py",
    "tests/optimizers/test_optimizers_hash.py",
    "tests/optimizers/test_optimizers_ftrl.py",
)
PARTS = ("build", "devices", "tests", "data", "train", "bench_sparse_core", "bench_pipeline",
         "train_no_strategy")
# Upper bounds on one machine with one GPU and 16 cores; the budget cuts them.
TIMEOUT_S = {
    "build": 300, "devices": 180, "tests": 240, "data": 120, "train": 420, "bench_sparse_core": 240,
    "bench_pipeline": 420, "train_no_strategy": 300
}
MIN_PART_S = 20  # A part with less time left is skipped.
DEVICE_MODES = ("none", "mirrored")  # devices: no strategy, the main job's MirroredStrategy.

# devices: op classes of the placement log, by op type (or name for the dense
# optimizer, whose ops are TF's generic variable updates).
OP_CLASSES = (
    ("key index insert (MxKeyIndex*)", lambda name, op: op.startswith("MxKeyIndex")),
    ("row gather (ResourceGather)", lambda name, op: op == "ResourceGather"),
    ("per-id read, gradient sum (MxGatherByRestore, MxSumByRestore)", lambda name, op: op in
     ("MxGatherByRestore", "MxSumByRestore")),
    ("fused row update (MxLazyAdamRows)", lambda name, op: op == "MxLazyAdamRows"),
    ("dense layer (MatMul, BiasAdd)", lambda name, op: op in ("MatMul", "BiasAdd", "BiasAddGrad")),
    ("dense optimizer (Keras Adam's Assign*VariableOp)",
     lambda name, op: "Adam/" in name and "LazyAdam" not in name and op.startswith("Assign")),
)
_PLACER_LINE = re.compile(r"placer\.cc:\d+\] (\S+): \((\w+)\): (\S+)")


@dataclasses.dataclass
class PartResult:
  """One part's outcome.

  Attributes:
    name: The part (PARTS).
    status: "ok", "failed", "timeout", "skipped (budget)" or "skipped (--skip)".
    wall_s: Its wall seconds.
    notes: One line for the summary table.
    error: The tail of its output when it did not pass.
    figures: What the summary reads from it (step times, NDCG@10, devices).
  """

  name: str
  status: str = "ok"
  wall_s: float = 0.0
  notes: str = ""
  error: str = ""
  figures: dict = dataclasses.field(default_factory=dict)

  @property
  def passed(self) -> bool:
    return self.status in ("ok", "skipped (--skip)")


# ----------------------------------------------------------------------------
# The devices part's child (TensorFlow imported inside).


def child_devices(mode: str, result_path: str) -> None:
  """One small sparse + dense training step under `mode`; writes devices and step times as JSON."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf.debugging.set_log_device_placement(True)
  from mxrec_pipeline.core import embedding  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core import placement  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.keras import pipeline  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.optimizers import lazy_adam  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.util import initialize  # pylint: disable=import-outside-toplevel

  result = {
      "mode": mode, "tf_version": tf.__version__, "built_with_cuda": tf.test.is_built_with_cuda(),
      "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
      "rule_device": placement.table_device("probe"), "row_op_kernels": {
          op: sorted(placement.registered_device_types(op)) for op in placement.FUSED_ROW_OPS
      }
  }
  initialize.init()
  strategy = (pipeline.get_strategy("MirroredStrategy")
              if mode == "mirrored" else tf.distribute.get_strategy())
  result["strategy"] = type(strategy).__name__
  batch, ids_per_example, rows, dim = 256, 8, 100_000, 16
  with strategy.scope():
    table = embedding.create_table(key_dtype=tf.int64, dim=dim, name="probe",
                                   device_vocabulary_size=rows,
                                   emb_initializer=tf.keras.initializers.RandomNormal(seed=1))
    dense = tf.keras.layers.Dense(1, name="dense")
    dense.build([None, dim])
    sparse_optimizer = lazy_adam.create_hash_optimizer(0.01)
    sparse_optimizer.build([table.variable])
    dense_optimizer = tf.keras.optimizers.Adam(0.01)
    dense_optimizer.build(dense.trainable_variables)

  def replica_step(ids):
    with tf.GradientTape() as tape:
      emb = embedding.sparse_lookup(table, ids, is_train=True)
      loss = tf.reduce_mean(tf.square(dense(tf.reduce_mean(emb, 1)) - 1.0))
    table_grad, *dense_grads = tape.gradient(loss, [table.variable] + dense.trainable_variables)
    sparse_optimizer.apply_gradients([(table_grad, table.variable)])
    dense_optimizer.apply_gradients(zip(dense_grads, dense.trainable_variables))
    return loss

  @tf.function
  def step(ids):
    return strategy.run(replica_step, args=(ids,))

  def devices(variables):  # Every copy of a mirrored variable.
    return sorted({v.device for var in variables for v in strategy.experimental_local_results(var)})

  result["variables"] = {
      "table rows": devices([table.variable]),
      "table optimizer slots": devices([sparse_optimizer.get_slot("probe", s) for s in ("m", "v")]),
      "dense variables": devices(dense.trainable_variables),
      "dense optimizer slots": devices(dense_optimizer.variables[1:]),
  }
  key_space = tf.random.Generator.from_seed(1)
  times = []
  try:
    for i in range(31):
      ids = key_space.uniform([batch, ids_per_example], 0, 10 * rows, dtype=tf.int64)
      start = time.perf_counter()
      loss = step(ids)
      float(strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None))
      if i == 0:
        tf.debugging.set_log_device_placement(False)
      else:
        times.append(time.perf_counter() - start)
    result["step_ms_median"] = 1000 * statistics.median(times)
    result["first_step_done"] = True
  except Exception as e:  # pylint: disable=broad-except
    # Reported, not raised: the placement log above still says what went where.
    result["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
  pathlib.Path(result_path).write_text(json.dumps(result))


# ----------------------------------------------------------------------------
# The driver.


class Runner:
  """Runs commands with a shared time budget, logging their whole output to one file."""

  def __init__(self, python: str, log_path: pathlib.Path, budget_s: float):
    self.python = python
    self.log = log_path.open("w", encoding="utf-8")
    self.deadline = time.monotonic() + budget_s
    self.env = dict(
        os.environ, PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))

  def time_left(self) -> float:
    return self.deadline - time.monotonic()

  def run(self, part: PartResult, cmd: list[str], timeout_s: float) -> str | None:
    """Runs `cmd` in its own process group; its output, or None (part marked) on failure."""
    self.log.write(f"\n===== {part.name}: {' '.join(cmd)} (timeout {timeout_s:.0f} s)\n")
    self.log.flush()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    try:
      output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      try:
        os.killpg(proc.pid, signal.SIGKILL)  # The part's own process group: its children too.
      except ProcessLookupError:
        pass
      output, _ = proc.communicate()
      part.status = "timeout"
      part.error = f"no result within {timeout_s:.0f} s; output tail:\n{_tail(output)}"
    self.log.write(output)
    self.log.write(f"\n===== {part.name}: exit {proc.returncode}\n")
    self.log.flush()
    if part.status == "timeout":
      return None
    if proc.returncode != 0:
      part.status = "failed"
      part.error = f"exit {proc.returncode}; output tail:\n{_tail(output)}"
      return None
    return output


def _tail(text: str, lines: int = 25) -> str:
  return "\n".join(text.strip().splitlines()[-lines:])


def _short_device(device: str) -> str:
  """'/job:localhost/replica:0/task:0/device:GPU:0' -> 'GPU:0'."""
  return device.rsplit("device:", 1)[-1] if "device:" in device else (device or "?")


def nvidia_gpus() -> list[str]:
  """The GPUs `nvidia-smi -L` lists (empty without the tool or a GPU)."""
  if shutil.which("nvidia-smi") is None:
    return []
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30,
                         check=False).stdout
  except (OSError, subprocess.TimeoutExpired):
    return []
  return [line.strip() for line in out.splitlines() if line.startswith("GPU ")]


def part_build(runner: Runner, part: PartResult, timeout_s: float, rebuild: bool) -> None:
  library = ROOT / "mxrec_pipeline" / "ops" / "_mxrec_ops.so"
  before = library.stat().st_mtime if library.exists() else None
  cmd = ["make", "-f", "native/ops.mk", f"-j{os.cpu_count() or 1}", f"PY={runner.python}"]
  if runner.run(part, cmd + (["-B"] if rebuild else []), timeout_s) is None:
    return
  after = library.stat().st_mtime if library.exists() else None
  part.notes = "built" if after != before else "up to date (nothing to compile)"


def part_devices(runner: Runner, part: PartResult, timeout_s: float, gpus_smi: list[str]) -> None:
  notes = []
  for mode in DEVICE_MODES:
    left = timeout_s - part.wall_s
    with tempfile.NamedTemporaryFile(suffix=".json") as result_file:
      start = time.monotonic()
      sub = PartResult(f"devices ({mode})")
      output = runner.run(
          sub,
          [runner.python, __file__, "--child", f"devices-{mode}", "--result", result_file.name],
          left)
      part.wall_s += time.monotonic() - start
      text = pathlib.Path(result_file.name).read_text() if output is not None else ""
    if output is None or not text:
      part.status, part.error = sub.status, f"{mode}: {sub.error}"
      return
    figures = json.loads(text)
    ops = collections.defaultdict(set)
    for name, op, device in _PLACER_LINE.findall(output):
      for label, matches in OP_CLASSES:
        if matches(name, op):
          ops[label].add(_short_device(device))
    figures["ops"] = {label: sorted(ops.get(label, ())) for label, _ in OP_CLASSES}
    figures["variables"] = {
        k: [_short_device(d) for d in v] for k, v in figures["variables"].items()
    }
    part.figures[mode] = figures
    if gpus_smi and not figures["gpus"] and "TensorFlow sees no GPU" not in part.error:
      part.status = "failed"
      part.error += ("TensorFlow sees no GPU although nvidia-smi lists one: install its CUDA "
                     "libraries (pip install 'tensorflow[and-cuda]==2.15.1')\n")
    if "error" in figures:
      part.status = "failed"
      part.error += f"{mode}: the training step failed: {figures['error']}\n"
      notes.append(f"{mode}: step failed")
    else:
      notes.append(f"{mode}: {figures['step_ms_median']:.2f} ms/step")
  part.notes = "; ".join(notes)


def part_tests(runner: Runner, part: PartResult, timeout_s: float) -> None:
  output = runner.run(part, [runner.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                      timeout_s)
  counts = re.findall(r"(\d+) (passed|failed|error|errors|skipped)", output or part.error)
  part.notes = ", ".join(f"{n} {what}" for n, what in counts)


def part_data(runner: Runner, part: PartResult, timeout_s: float) -> None:
  output = runner.run(
      part, [runner.python, "-m", "mxrec_pipeline.cli", "data", "fetch", "movielens_100k"],
      timeout_s)
  if output is not None:
    part.notes = output.strip().splitlines()[-1]


def part_train(runner: Runner, part: PartResult, timeout_s: float, model_dir: str,
               overrides: tuple[str, ...] = ()) -> None:
  cmd = [runner.python, "-m", "mxrec_pipeline.cli", "train", MAIN_CONFIG, "--fresh"]
  for override in ("pipeline.num_epochs=2", f"pipeline.model_dir={model_dir}",
                   "lambdamart.enabled=false", *overrides):
    cmd += ["--set", override]
  output = runner.run(part, cmd, timeout_s)
  if output is None:
    return
  # Keras fit verbose=2: one line per epoch, "43/43 - 1s - loss: ... - 802ms/epoch - 19ms/step"
  # (the epoch's wall time, validation included, over its training steps).
  step_ms = [
      float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
      for v, unit in re.findall(r"^\d+/\d+ - .* - ([\d.]+)(us|ms|s)/step\s*$", output, re.M)
  ]
  metrics = json.loads((pathlib.Path(model_dir) / "metrics.json").read_text())
  exported = (pathlib.Path(model_dir) / "export" / "latest_model" / "saved_model.pb").exists()
  part.figures = {
      "epoch_ms_per_step": step_ms, "ndcg@10": metrics["model"]["ndcg@10"],
      "baseline_ndcg@10": metrics["baseline"]
                          ["ndcg@10"], "exported": exported, "wall_s": metrics.get("wall_s", {})
  }
  if not exported:
    part.status, part.error = "failed", f"no SavedModel in {model_dir}/export/latest_model"
  part.notes = (f"NDCG@10 {part.figures['ndcg@10']:.4f}, "
                f"{' / '.join(f'{ms:.0f}' for ms in step_ms) or '?'} ms/step by epoch (Keras), "
                f"export {'ok' if exported else 'MISSING'}")


def part_bench_sparse_core(runner: Runner, part: PartResult, timeout_s: float, tmp: str) -> None:
  json_path = os.path.join(tmp, "bench_sparse_core.json")
  output = runner.run(
      part, [runner.python, "benchmarks/bench_sparse_core.py", "--quick", "--json", json_path],
      timeout_s)
  if output is None:
    return
  lines = [line.strip() for line in output.splitlines() if "ms/step" in line]
  part.figures = {"step_lines": lines}
  part.notes = lines[0] if lines else ""


def part_bench_pipeline(runner: Runner, part: PartResult, timeout_s: float, tmp: str) -> None:
  json_path = os.path.join(tmp, "bench_pipeline.json")
  output = runner.run(part, [
      runner.python, "benchmarks/bench_pipeline.py", "--quick", "--only", "movielens", "--json",
      json_path
  ], timeout_s)
  if output is None:
    return
  trials = json.loads(pathlib.Path(json_path).read_text())["movielens"]
  part.figures = {
      t["variant"]: {
          "ndcg@10": t["metrics"]["ndcg@10"], "ms_per_step_mean": 1000 * t["seconds"] / t["steps"],
          "examples_per_s": t["examples_per_s"]
      } for t in trials
  }
  part.notes = "; ".join(f"{v}: NDCG@10 {f['ndcg@10']:.4f}, {f['ms_per_step_mean']:.1f} ms/step"
                         for v, f in part.figures.items())


def summary(results: list[PartResult], gpus_smi: list[str], wall_s: float) -> str:
  """The one summary: GPUs, parts, devices by class, step times, NDCG@10, errors."""
  by_name = {r.name: r for r in results}
  devices = by_name.get("devices")
  tf_gpus = None
  if devices is not None and devices.figures:
    tf_gpus = next(iter(devices.figures.values()))["gpus"]
  lines = [f"===== gpu_check summary: {wall_s:.0f} s wall, {os.cpu_count()} CPUs ====="]
  if gpus_smi:
    lines.append(f"nvidia-smi: {'; '.join(gpus_smi)}")
  if tf_gpus:
    lines.append(f"TensorFlow sees: {', '.join(tf_gpus)}")
  elif gpus_smi and tf_gpus is not None:
    lines.append("TensorFlow sees NO GPU although nvidia-smi lists one (a failure, see errors)")
  elif not gpus_smi:
    lines.append("No GPU found (no nvidia-smi GPU, none in TensorFlow): the CPU parts ran only")
  if devices is not None and devices.figures:
    first = next(iter(devices.figures.values()))
    kernels = sorted({d for v in first["row_op_kernels"].values() for d in v})
    lines.append(f"TF {first['tf_version']} (built with CUDA: {first['built_with_cuda']}); fused "
                 f"row ops have kernels for: {', '.join(kernels)}; placement rule puts rows on "
                 f"{first['rule_device']}")
  lines.append("")
  lines.append(f"{'part':<19}{'status':<18}{'wall s':>8}  notes")
  for r in results:
    lines.append(f"{r.name:<19}{r.status:<18}{r.wall_s:>8.1f}  {r.notes}")
  if devices is not None:
    for mode, figures in devices.figures.items():
      lines.append("")
      step = (f"{figures['step_ms_median']:.2f} ms/step median of 30"
              if "step_ms_median" in figures else "step FAILED")
      lines.append(f"devices, {figures['strategy']} ({mode}): {step}")
      for label, where in figures["variables"].items():
        lines.append(f"  variable  {label:<62}{', '.join(where)}")
      for label, where in figures["ops"].items():
        lines.append(f"  op        {label:<62}{', '.join(where) or 'not seen'}")
  lines.append("")
  lines.append("step times and NDCG@10:")
  for name, what in (("train", "main job"), ("train_no_strategy", "main job, no strategy")):
    train = by_name.get(name)
    if train is not None and train.figures:
      lines.append(f"  {what} (2 epochs): {train.notes}; baseline (item mean) NDCG@10 "
                   f"{train.figures['baseline_ndcg@10']:.4f}")
  bench = by_name.get("bench_sparse_core")
  if bench is not None and bench.figures:
    lines += [f"  bench_sparse_core: {line}" for line in bench.figures["step_lines"]]
  pipe = by_name.get("bench_pipeline")
  if pipe is not None and pipe.figures:
    lines.append(f"  bench_pipeline (seed 1, 2 epochs): {pipe.notes}")
  failed = [r for r in results if not r.passed]
  lines.append("")
  lines.append("errors: " + ("none" if not failed else ""))
  for r in failed:
    lines.append(f"--- {r.name}: {r.status}\n{r.error}".rstrip())
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
      "--out", help="directory for gpu_check.log and gpu_check.json "
      "(default: a new temporary directory, printed)")
  parser.add_argument("--budget-s", type=float, default=570.0,
                      help="wall seconds for all parts together (default 570)")
  parser.add_argument("--timeout-scale", type=float, default=1.0,
                      help="multiply every part's timeout, e.g. 3 on a 2-core machine (default 1)")
  parser.add_argument("--skip", action="append", default=[], choices=PARTS,
                      help="leave a part out (repeatable)")
  parser.add_argument("--rebuild", action="store_true",
                      help="recompile every object of the op library (make -B)")
  parser.add_argument("--python", default=sys.executable,
                      help="the project's Python (default: this one)")
  parser.add_argument("--child", choices=[f"devices-{m}" for m in DEVICE_MODES],
                      help=argparse.SUPPRESS)
  parser.add_argument("--result", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    child_devices(args.child.split("-", 1)[1], args.result)
    return 0

  start = time.monotonic()
  out_dir = pathlib.Path(args.out or tempfile.mkdtemp(prefix="gpu_check_"))
  out_dir.mkdir(parents=True, exist_ok=True)
  runner = Runner(args.python, out_dir / "gpu_check.log", args.budget_s)
  gpus_smi = nvidia_gpus()
  print(f"gpu_check: {len(gpus_smi)} GPU(s) from nvidia-smi; logs in {out_dir}/gpu_check.log",
        flush=True)
  results = []
  with tempfile.TemporaryDirectory(prefix="gpu_check_run_") as tmp:
    for name in PARTS:
      part = PartResult(name)
      results.append(part)
      if name in args.skip:
        part.status = "skipped (--skip)"
        continue
      timeout_s = min(TIMEOUT_S[name] * args.timeout_scale, runner.time_left())
      if timeout_s < MIN_PART_S:
        part.status = "skipped (budget)"
        part.error = f"{runner.time_left():.0f} s of the --budget-s were left"
        continue
      print(f"gpu_check: {name} (timeout {timeout_s:.0f} s) ...", flush=True)
      part_start = time.monotonic()
      if name == "build":
        part_build(runner, part, timeout_s, args.rebuild)
      elif name == "devices":
        part_devices(runner, part, timeout_s, gpus_smi)
      elif name == "tests":
        part_tests(runner, part, timeout_s)
      elif name == "data":
        part_data(runner, part, timeout_s)
      elif name == "train":
        part_train(runner, part, timeout_s, os.path.join(tmp, "movielens_listwise"))
      elif name == "train_no_strategy":
        part_train(runner, part, timeout_s, os.path.join(tmp, "movielens_no_strategy"),
                   ("pipeline.strategy=null",))
      elif name == "bench_sparse_core":
        part_bench_sparse_core(runner, part, timeout_s, tmp)
      else:
        part_bench_pipeline(runner, part, timeout_s, tmp)
      part.wall_s = time.monotonic() - part_start
      print(f"gpu_check: {name}: {part.status} in {part.wall_s:.0f} s", flush=True)
  text = summary(results, gpus_smi, time.monotonic() - start)
  print(text, flush=True)
  runner.log.write("\n" + text + "\n")
  runner.log.close()
  (out_dir / "gpu_check.json").write_text(
      json.dumps({"nvidia_smi": gpus_smi, "parts": [dataclasses.asdict(r) for r in results]},
                 indent=2))
  return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
