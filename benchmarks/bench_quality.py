"""Ranking quality over seeds: each ranker against its simple baseline and LambdaMART.

Every (data set, ranker, seed) is one `mxrec-pipeline train CONFIG --fresh`
in a child process (`python -m mxrec_pipeline.cli`, with `--set
pipeline.seed=S`; LambdaMART's seed follows it), whose metrics.json gives the
validation NDCG@1/5/10 and MRR of the model, of the builder's simple baseline
and of LightGBM's LambdaMART (same validation batches, tfr's metrics,
mxrec_pipeline/evaluation.py), and their wall seconds (`wall_s`: the model's
train_and_validate, i.e. training, per-epoch validation and export; the
baseline's and LambdaMART's fit + scoring); the child's total wall time too.

Data sets:
  mslr_5k    the pinned MSLR-WEB Fold1 5k-line subsets (43 train / 43 test
             queries; the LETOR rankers' default data), with --rankers.
  movielens  MovieLens-100k, the main job, with --movielens-rankers
             (default configs/movielens_listwise.yaml).
  --letor NAME=TRAIN,VALID  (repeatable) a LETOR train/valid pair, given to
             --rankers as data.train_path / data.valid_path (plus --letor-set).
A ranker is configs/<name>.yaml, or NAME@KEY=VALUE[@KEY=VALUE..] for that
config with overrides (a variant, e.g. letor_leaves@model.encoding=disjoint);
a missing one is skipped with a message.
The baseline and LambdaMART rows of a data set come from the jobs of its
first ranker (the others' train the same trees on the same file).

Prints, per data set, mean, sample std and [min, max] over the seeds, every
seed's values, and the wall seconds; `--json PATH` saves every run.

Usage:
  python benchmarks/bench_quality.py                       # mslr_5k + movielens, seeds 1,2,3
  python benchmarks/bench_quality.py --rankers mslr_dnn,letor_dasalc --only mslr_5k
  python benchmarks/bench_quality.py --only none --letor mine=/d/train.txt,/d/vali.txt \\
      --letor-set data.baseline_feature=5
  python benchmarks/bench_quality.py --seeds 1 --epochs 2  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
METRICS = ("ndcg@1", "ndcg@5", "ndcg@10", "mrr")
ROWS = ("model", "baseline", "lambdamart")
DEFAULT_RANKERS = "mslr_dnn,letor_dasalc,letor_leaves,letor_leaves@model.encoding=disjoint"
DEFAULT_MOVIELENS_RANKERS = "movielens_listwise"
BUILTIN = ("mslr_5k", "movielens")


def train_job(config: pathlib.Path, overrides: list[str], model_dir: pathlib.Path,
              timeout_s: float) -> dict:
  """Trains one job in a child process; its metrics.json plus "job_s", or {"error": ..}."""
  cmd = [
      sys.executable, "-m", "mxrec_pipeline.cli", "train",
      str(config), "--fresh", "--verbose", "0"
  ]
  for override in overrides + [f"pipeline.model_dir={model_dir}"]:
    cmd += ["--set", override]
  model_dir.mkdir(parents=True, exist_ok=True)
  log = model_dir / "train.log"
  start = time.perf_counter()
  with open(log, "w", encoding="utf-8") as out:
    try:
      code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=_env(),
                            timeout=timeout_s, check=False).returncode
    except subprocess.TimeoutExpired:
      return {"error": f"timed out after {timeout_s:g} s (log: {log})"}
  job_s = time.perf_counter() - start
  if code != 0:
    tail = "\n".join(log.read_text(encoding="utf-8").splitlines()[-5:])
    return {"error": f"exit {code} (log: {log}):\n{tail}"}
  result = json.loads((model_dir / "metrics.json").read_text(encoding="utf-8"))
  result.pop("data", None)
  return {**result, "job_s": job_s}


def _env() -> dict:
  """This process's environment with the repository first on PYTHONPATH."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
  return env


def jobs_of(args) -> list[tuple[str, str, pathlib.Path, list[str]]]:
  """(data set, ranker, config, overrides) of every job, without the seed; prints skips."""
  only = set(BUILTIN) if args.only is None else {n for n in args.only.split(",") if n}
  unknown = only - set(BUILTIN) - {"none"}
  if unknown:
    raise SystemExit(f"--only: unknown {sorted(unknown)}; known {list(BUILTIN)} or none")
  rankers = [r for r in args.rankers.split(",") if r]
  data_sets = []
  if "mslr_5k" in only:
    data_sets.append(("mslr_5k", rankers, []))
  if "movielens" in only:
    data_sets.append(("movielens", [r for r in args.movielens_rankers.split(",") if r], []))
  for spec in args.letor:
    name, sep, pair = spec.partition("=")
    train, comma, valid = pair.partition(",")
    if not (sep and comma and name and train and valid):
      raise SystemExit(f"--letor {spec!r}: expected NAME=TRAIN,VALID")
    data_sets.append(
        (name, rankers,
         [f"data.train_path={train}", f"data.valid_path={valid}"] + list(args.letor_set)))
  jobs = []
  for name, names, data_overrides in data_sets:
    for ranker in names:
      config_name, *variant = ranker.split("@")
      config = CONFIGS / f"{config_name}.yaml"
      if not config.is_file():
        print(f"skipped {name}/{ranker}: no {config.relative_to(ROOT)}", flush=True)
        continue
      epochs = [f"pipeline.num_epochs={args.epochs}"] if args.epochs else []
      jobs.append((name, ranker, config, data_overrides + epochs + list(args.set) + variant))
  return jobs


def summarize(values: list[float]) -> str:
  """"mean ± std [min, max]" (sample std; 0 for one value)."""
  std = statistics.stdev(values) if len(values) > 1 else 0.0
  return f"{statistics.mean(values):.4f} ± {std:.4f} [{min(values):.4f}, {max(values):.4f}]"


def report(runs: list[dict]) -> str:
  """The tables of every data set: summary rows, then every seed's values."""
  lines = []
  for data_set in dict.fromkeys(r["data_set"] for r in runs):
    lines.append(f"\n## {data_set}")
    rows = []  # (label, [run, ...], key in the run)
    first = None
    for ranker in dict.fromkeys(r["ranker"] for r in runs if r["data_set"] == data_set):
      ok = [r for r in runs if (r["data_set"], r["ranker"]) == (data_set, ranker) and "model" in r]
      failed = [
          r for r in runs if (r["data_set"], r["ranker"]) == (data_set, ranker) and "error" in r
      ]
      for run in failed:
        lines.append(f"{ranker} seed {run['seed']}: FAILED {run['error']}")
      if not ok:
        continue
      rows.append((ranker, ok, "model"))
      first = first or ok
    if first is None:
      continue
    rows.append(("baseline", first, "baseline"))
    if all(r["lambdamart"] is not None for r in first):
      rows.append(("lambdamart", first, "lambdamart"))
    else:
      reasons = {r["lambdamart_info"].get("reason") for r in first if r["lambdamart"] is None}
      lines.append(f"lambdamart: not scored: {sorted(reasons)}")
    seeds = [r["seed"] for r in first]
    lines.append(f"mean ± std [min, max] over seeds {seeds}")
    lines.append(f"{'':<20}" + "".join(f"{m:>34}" for m in METRICS[:3]) + f"{'wall s':>10}")
    for label, group, key in rows:
      wall = statistics.mean(r["wall_s"][key] for r in group)
      lines.append(f"{label:<20}" +
                   "".join(f"{summarize([r[key][m] for r in group]):>34}" for m in METRICS[:3]) +
                   f"{wall:>10.1f}")
    lines.append("every seed: ndcg@1 / ndcg@5 / ndcg@10 / mrr, wall s (job s)")
    for label, group, key in rows:
      for run in group:
        values = " / ".join(f"{run[key][m]:.4f}" for m in METRICS)
        lines.append(f"  {label:<18} seed {run['seed']}: {values}, {run['wall_s'][key]:.1f} s"
                     f" ({run['job_s']:.0f} s)")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rankers", default=DEFAULT_RANKERS,
                      help=f"LETOR ranker configs (configs/NAME.yaml), default {DEFAULT_RANKERS}")
  parser.add_argument("--movielens-rankers", default=DEFAULT_MOVIELENS_RANKERS,
                      help=f"MovieLens ranker configs, default {DEFAULT_MOVIELENS_RANKERS}")
  parser.add_argument(
      "--only", help=f"built-in data sets, comma-separated: {','.join(BUILTIN)} "
      "(default both) or none")
  parser.add_argument("--letor", action="append", default=[], metavar="NAME=TRAIN,VALID",
                      help="a LETOR train/valid pair for the LETOR rankers (repeatable)")
  parser.add_argument("--letor-set", action="append", default=[], metavar="KEY=VALUE",
                      help="config override for the --letor jobs, e.g. data.baseline_feature=5")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config override for every job")
  parser.add_argument("--seeds", default="1,2,3", help="pipeline.seed of each run, default 1,2,3")
  parser.add_argument("--epochs", type=int, help="pipeline.num_epochs (default: the configs')")
  parser.add_argument("--timeout-s", type=float, default=1800.0, help="per job")
  parser.add_argument(
      "--out-dir", help="model_dirs and logs (default: a temporary directory, "
      "removed at the end)")
  parser.add_argument("--json", help="write every run's metrics here")
  args = parser.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",") if s]
  jobs = jobs_of(args)
  out_dir = pathlib.Path(args.out_dir or tempfile.mkdtemp(prefix="bench_quality_"))
  runs = []
  start = time.perf_counter()
  try:
    for data_set, ranker, config, overrides in jobs:
      for seed in seeds:
        result = train_job(config, overrides + [f"pipeline.seed={seed}"],
                           out_dir / data_set / ranker / f"seed{seed}", args.timeout_s)
        runs.append({"data_set": data_set, "ranker": ranker, "seed": seed, **result})
        done = result.get("model", {}).get("ndcg@10")
        print(
            f"{data_set}/{ranker} seed {seed}: " +
            (f"ndcg@10 {done:.4f}, {result['job_s']:.0f} s" if done is not None else result.get(
                "error", "?")), flush=True)
  finally:
    if args.out_dir is None:
      shutil.rmtree(out_dir, ignore_errors=True)
  print(report(runs))
  print(f"\ntotal {time.perf_counter() - start:.0f} s")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(runs, indent=2, sort_keys=True), encoding="utf-8")
  return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
  sys.exit(main())
