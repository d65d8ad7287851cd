"""Benchmark of continuous training: MovieLens-100k replayed day by day, killed and restarted.

What issue 33 asks to measure, in one run of the user's own commands:

1. `mxrec-pipeline data split-by-day movielens_100k` writes the 213 day
   partitions into a staging directory; a publisher thread here moves them
   into the partitions directory one every `--interval-s` seconds, each
   completed by its `_SUCCESS` marker (a live stream).
2. `mxrec-pipeline train configs/movielens_continuous.yaml --continuous
   --poll-s 0.5` trains them as they arrive, in a child process. Once
   `--kill-after` partitions are in metrics.jsonl it is SIGKILLed (a
   preemption, mid-partition when it is busy) and the same command is run
   again; once every partition is trained it gets SIGTERM (a clean stop).
3. From metrics.jsonl: every partition trained exactly once (printed: the
   partitions trained twice and those missing, both must be empty), train
   and scoring seconds per partition, export lag (marker written ->
   numbered version renamed in), and progressive NDCG@10 of the model and
   of the item-mean baseline (both scored on each day before training on
   it), per day and averaged; ratio model / baseline.
4. `--svg PATH` writes the per-day NDCG@10 plot (7-day moving means).

Usage:
  python benchmarks/bench_continuous.py                       # all 213 days, ~12 min
  python benchmarks/bench_continuous.py --days 40 --kill-after 15 --interval-s 2
  python benchmarks/bench_continuous.py --svg docs/continuous_ndcg.svg --json out.json

Results: docs/benchmarks.md, "Continuous training".
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "movielens_continuous.yaml"
MARKER = "_SUCCESS"


def _lines(model_dir: pathlib.Path) -> list[dict]:
  path = model_dir / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(row) for row in path.read_text().splitlines() if row.strip()]


def _publish(staging: pathlib.Path, target: pathlib.Path, names: list[str], interval_s: float,
             published: dict, stop: threading.Event) -> None:
  """Moves each staged partition in (without its marker), then writes the marker."""
  for name in names:
    if stop.is_set():
      return
    shutil.copytree(staging / name, target / name, ignore=shutil.ignore_patterns(MARKER))
    (target / name / MARKER).write_text("")
    published[name] = time.time()
    stop.wait(interval_s)


def _train(model_dir: pathlib.Path, partitions: pathlib.Path, log,
           overrides: list[str]) -> subprocess.Popen:
  argv = [
      sys.executable, "-m", "mxrec_pipeline.cli", "train",
      str(CONFIG), "--continuous", "--poll-s", "0.5", "--verbose", "0", "--set",
      f"pipeline.model_dir={model_dir}", "--set", f"continuous.partitions_dir={partitions}"
  ]
  for override in overrides:
    argv += ["--set", override]
  return subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _p90(values: list[float]) -> float:
  return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def _moving_mean(values: list[float], window: int = 7) -> list[float]:
  return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def _svg(path: str, days: list[str], model: list[float], baseline: list[float]) -> None:
  width, height, pad = 720, 320, 40
  low = min(model + baseline) - 0.02
  high = max(model + baseline) + 0.02
  x = lambda i: pad + i * (width - 2 * pad) / max(1, len(days) - 1)  # noqa: E731
  y = lambda v: height - pad - (v - low) * (height - 2 * pad) / (high - low)  # noqa: E731
  line = lambda vs: " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(vs))  # noqa: E731
  ticks = "".join(
      f'<text x="4" y="{y(v) + 4:.1f}" font-size="11">{v:.2f}</text>'
      f'<line x1="{pad}" x2="{width - pad}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
      for v in [low + k * (high - low) / 4 for k in range(5)])
  text = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
          f'<rect width="100%" height="100%" fill="white"/>{ticks}'
          f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{line(model)}"/>'
          f'<polyline fill="none" stroke="#ff7f0e" stroke-width="2" points="{line(baseline)}"/>'
          f'<text x="{pad}" y="16" font-size="12">Progressive NDCG@10 per day, 7-day moving mean '
          f'(blue: model, orange: item-mean baseline)</text>'
          f'<text x="{pad}" y="{height - 8}" font-size="11">{days[0]}</text>'
          f'<text x="{width - pad - 90}" y="{height - 8}" font-size="11">{days[-1]}</text></svg>')
  pathlib.Path(path).write_text(text + "\n")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--days", type=int, default=None, help="replay only the first N days")
  parser.add_argument("--interval-s", type=float, default=3.0, help="seconds between arrivals")
  parser.add_argument("--kill-after", type=int, default=100,
                      help="SIGKILL the job once this many partitions are trained (0: never)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a value of configs/movielens_continuous.yaml")
  parser.add_argument("--svg", help="write the per-day NDCG@10 plot here")
  parser.add_argument("--json", help="write the figures here")
  args = parser.parse_args()
  work = pathlib.Path(tempfile.mkdtemp(prefix="bench-continuous-"))
  staging, partitions, model_dir = work / "staging", work / "days", work / "model"
  partitions.mkdir()
  subprocess.run([
      sys.executable, "-m", "mxrec_pipeline.cli", "data", "split-by-day", "movielens_100k",
      str(staging)
  ], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
  names = sorted((p.name for p in staging.iterdir()), key=str)[:args.days]
  published, stop = {}, threading.Event()
  publisher = threading.Thread(target=_publish, daemon=True,
                               args=(staging, partitions, names, args.interval_s, published, stop))
  log_path = work / "train.log"
  start = time.time()
  with open(log_path, "w") as log:
    publisher.start()
    job, runs, killed_at = _train(model_dir, partitions, log, args.set), 1, None
    while True:
      time.sleep(0.5)
      done = len(_lines(model_dir))
      if job.poll() is not None:
        print(f"the job ended early (exit {job.returncode}); its log: {log_path}")
        return 1
      if killed_at is None and args.kill_after and done >= args.kill_after:
        time.sleep(1.0)  # Into the next partition when there is one.
        job.send_signal(signal.SIGKILL)
        job.wait()
        killed_at = len(_lines(model_dir))
        job, runs = _train(model_dir, partitions, log, args.set), runs + 1
      if done >= len(names):
        job.send_signal(signal.SIGTERM)
        code = job.wait(timeout=120)
        break
  stop.set()
  wall_s = time.time() - start
  lines = _lines(model_dir)
  trained = [line["partition"] for line in lines]
  twice = sorted({n for n in trained if trained.count(n) > 1})
  missing = sorted(set(names) - set(trained))
  scored_lines = [line for line in lines if line.get("model") and line.get("baseline")]
  scored = [(line["model"]["ndcg@10"], line["baseline"]["ndcg@10"]) for line in scored_lines]
  lags = [line["export_lag_s"] for line in lines if "export_lag_s" in line]
  lag_from_publish = [
      line["export_lag_s"] for line in lines
      if "export_lag_s" in line and line["partition"] in published
  ]
  figures = {
      "partitions": len(names),
      "runs": runs,
      "killed_with_lines": killed_at,
      "sigterm_exit": code,
      "trained_twice": twice,
      "missing": missing,
      "wall_s": round(wall_s, 1),
      "train_s_median": statistics.median(line["train_s"] for line in lines),
      "train_s_p90": _p90([line["train_s"] for line in lines]),
      "eval_s_median": statistics.median(line["eval_s"] for line in lines),
      "checkpoint_s_median": statistics.median(line.get("checkpoint_s", 0) for line in lines),
      "export_s_median": statistics.median(line["export_s"] for line in lines if "export_s" in line
                                          ),
      "steps_median": statistics.median(line["steps"] for line in lines),
      "export_lag_s_median": statistics.median(lag_from_publish or lags),
      "export_lag_s_p90": _p90(lag_from_publish or lags),
      "ndcg10_model_mean": statistics.fmean(m for m, _ in scored),
      "ndcg10_baseline_mean": statistics.fmean(b for _, b in scored),
      "days_model_above_baseline": sum(m > b for m, b in scored),
      "days_scored": len(scored),
  }
  half = scored[len(scored) // 2:]
  figures["ndcg10_model_mean_second_half"] = statistics.fmean(m for m, _ in half)
  figures["ndcg10_baseline_mean_second_half"] = statistics.fmean(b for _, b in half)
  for key, value in figures.items():
    print(f"{key:>36}: {value:.4f}" if isinstance(value, float) else f"{key:>36}: {value}")
  ratio_all = figures["ndcg10_model_mean"] / figures["ndcg10_baseline_mean"]
  ratio_half = (figures["ndcg10_model_mean_second_half"] /
                figures["ndcg10_baseline_mean_second_half"])
  print(f"{'model / baseline NDCG@10':>36}: {ratio_all:.3f}x (all days), {ratio_half:.3f}x "
        "(second half)")
  print("per day (partition, steps, train s, NDCG@10 model, baseline):")
  for line in lines:
    m, b = ((line.get(who) or {}).get("ndcg@10") for who in ("model", "baseline"))
    print(f"  {line['partition']} {line['steps']:>3} {line['train_s']:>6.2f} "
          f"{'-' if m is None else f'{m:.4f}'} {'-' if b is None else f'{b:.4f}'}")
  if args.svg:
    _svg(args.svg, [line["partition"][4:] for line in scored_lines],
         _moving_mean([m for m, _ in scored]), _moving_mean([b for _, b in scored]))
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps({**figures, "lines": lines}, indent=1))
  shutil.rmtree(work, ignore_errors=True)
  return 0 if not twice and not missing and code == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
