"""What a sweep leaves: a trial table, the best config and model, plots.

In sweep_dir:
  best_config.yaml   the best trial's job config, ready for `mxrec-pipeline train`
                     (pipeline.model_dir: sweep_dir/retrain_best)
  best_model/        copy of the best trial's export/latest_model (SavedModel),
                     when that trial ran on this machine
  best_trial.json    number, value, params, metrics, model_dir and host of the best trial
  trials.csv         the trial table
  plots/             optimization_history, param_importances, parallel_coordinate,
                     each as .html (plotly; plotly.min.js beside them) and .png
                     (optuna.visualization.matplotlib)
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import warnings
from typing import TextIO

import optuna
import yaml

from mxrec_pipeline.sweep import config as config_lib
from mxrec_pipeline.sweep import space as space_lib
from mxrec_pipeline.sweep import storage as storage_lib
from mxrec_pipeline.sweep import worker as worker_lib

BEST_CONFIG = "best_config.yaml"
BEST_MODEL = "best_model"
BEST_TRIAL = "best_trial.json"
TRIALS_CSV = "trials.csv"
PLOTS_DIR = "plots"
RETRAIN_DIR = "retrain_best"
EXPORT_SUBDIR = os.path.join("export", "latest_model")
_ERROR_WIDTH = 70
TrialState = optuna.trial.TrialState


def trial_rows(study: optuna.Study, config: config_lib.SweepConfig) -> list[dict]:
  """One dict per trial: number, state, value, epochs, duration_s, params, error."""
  rows = []
  for trial in study.get_trials(deepcopy=False):
    params = {}
    for key, stored in trial.params.items():
      try:
        params[key] = config.param(key).decode(stored)
      except (KeyError, ValueError):
        params[key] = stored  # A parameter of an earlier search space.
    error = trial.user_attrs.get(storage_lib.ERROR_ATTR)
    if trial.state == TrialState.FAIL and error is None:
      error = "no heartbeat: its worker's machine stopped or lost the database"
    rows.append({
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "epochs": len(trial.intermediate_values),
        "duration_s": trial.duration.total_seconds() if trial.duration else None,
        "params": params,
        "error": error,
    })
  return rows


def _short_names(keys: list[str]) -> dict[str, str]:
  """Last part of each dotted key, or the whole key where that is ambiguous."""
  last = [k.rsplit(".", 1)[-1] for k in keys]
  return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def _cell(value) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.4g}"
  return value if isinstance(value, str) else space_lib.flow_yaml(value)


def _csv_cell(value) -> str:
  return value if isinstance(value, str) else space_lib.flow_yaml(value)


def format_table(rows: list[dict], config: config_lib.SweepConfig) -> str:
  """The trial table as aligned text."""
  keys = [p.key for p in config.search_space]
  keys += sorted({k for row in rows for k in row["params"]} - set(keys))
  names = _short_names(keys)
  header = [
      "trial", "state", config.objective.metric, "epochs", "time_s", *(names[k] for k in keys),
      "error"
  ]
  table = [header]
  for row in rows:
    error = " ".join((row["error"] or "").split())
    table.append([
        str(row["number"]), row["state"],
        _cell(row["value"]),
        str(row["epochs"]), "-" if row["duration_s"] is None else f"{row['duration_s']:.0f}",
        *(_cell(row["params"].get(k)) for k in keys),
        error if len(error) <= _ERROR_WIDTH else error[:_ERROR_WIDTH - 3] + "..."
    ])
  widths = [max(len(r[i]) for r in table) for i in range(len(header))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table)


def write_trials_csv(rows: list[dict], path: str) -> None:
  keys = sorted({k for row in rows for k in row["params"]})
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["number", "state", "value", "epochs", "duration_s", *keys, "error"])
    for row in rows:
      writer.writerow([
          row["number"], row["state"], row["value"], row["epochs"], row["duration_s"],
          *(_csv_cell(row["params"][k]) if k in row["params"] else "" for k in keys),
          row["error"] or ""
      ])


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
  """The best COMPLETE trial, or None."""
  if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
    return None
  return study.best_trial


def write_best(study: optuna.Study, config: config_lib.SweepConfig) -> dict | None:
  """Writes best_config.yaml, best_trial.json and best_model/; returns best_trial.json's dict.

  best_config.yaml is the base config with the best trial's overrides (its
  parameters and the sweep's fixed overrides), validated, with model_dir
  sweep_dir/retrain_best.
  """
  from mxrec_pipeline import config as job_config  # pylint: disable=import-outside-toplevel
  best = best_trial(study)
  if best is None:
    return None
  params = {
      k: config.param(k).decode(v) for k, v in best.params.items()
      if k in {p.key for p in config.search_space}
  }
  recorded = best.user_attrs.get(worker_lib.OVERRIDES_ATTR)  # None: not run by a worker.
  overrides = [
      o for o in recorded or space_lib.to_overrides({**config.overrides, **params})
      if not o.startswith("pipeline.model_dir=")
  ]
  overrides.append(f"pipeline.model_dir={os.path.join(config.sweep_dir, RETRAIN_DIR)}")
  job = job_config.load(config.base_config, overrides)
  path = os.path.join(config.sweep_dir, BEST_CONFIG)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(f"# Best trial {best.number} of sweep study '{config.study_name}': "
            f"{config.objective.metric} = {best.value:.6g}.\n"
            f"# {os.path.basename(config.base_config)} with:\n")
    f.writelines(f"#   --set {o}\n" for o in overrides)
    f.write(f"# Train it: mxrec-pipeline train {path}\n")
    yaml.safe_dump(job.to_dict(), f, sort_keys=False)
  os.replace(path + ".tmp", path)

  owner = best.user_attrs.get(storage_lib.WORKER_ATTR, {})
  model_dir = best.user_attrs.get(worker_lib.MODEL_DIR_ATTR)
  summary = {
      "number": best.number,
      "value": best.value,
      "metric": config.objective.metric,
      "params": params,
      "metrics": best.user_attrs.get(worker_lib.METRICS_ATTR),
      "host": owner.get("host"),
      "model_dir": model_dir,
      "best_config": path,
      "best_model": None,
  }
  summary["best_model"] = _copy_best_model(config, summary)
  with open(os.path.join(config.sweep_dir, BEST_TRIAL), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2)
  return summary


def _copy_best_model(config: config_lib.SweepConfig, summary: dict) -> str | None:
  """Copies the best trial's SavedModel to sweep_dir/best_model when it is on this host."""
  export = os.path.join(summary["model_dir"] or "", EXPORT_SUBDIR)
  if summary["host"] != socket.gethostname() or not os.path.isdir(export):
    return None
  target = os.path.join(config.sweep_dir, BEST_MODEL)
  marker = os.path.join(target, "TRIAL")
  if os.path.exists(marker):
    with open(marker, encoding="utf-8") as f:
      if f.read().strip() == str(summary["number"]):
        return target
  staging = target + ".tmp"
  shutil.rmtree(staging, ignore_errors=True)
  shutil.copytree(export, staging)
  with open(os.path.join(staging, "TRIAL"), "w", encoding="utf-8") as f:
    f.write(f"{summary['number']}\n")
  shutil.rmtree(target, ignore_errors=True)
  os.replace(staging, target)
  return target


_PLOTS = ("optimization_history", "param_importances", "parallel_coordinate")


def write_plots(study: optuna.Study, config: config_lib.SweepConfig) -> tuple[list[str], dict]:
  """Writes the plots as HTML and PNG; returns (paths written, {plot: why skipped})."""
  # pylint: disable=import-outside-toplevel
  import matplotlib
  matplotlib.use("Agg")  # Files only; no display.
  from matplotlib import pyplot as plt
  import optuna.visualization as plotly_plots
  import optuna.visualization.matplotlib as mpl_plots
  out = os.path.join(config.sweep_dir, PLOTS_DIR)
  os.makedirs(out, exist_ok=True)
  written, skipped = [], {}
  verbosity = optuna.logging.get_verbosity()
  optuna.logging.set_verbosity(optuna.logging.ERROR)  # "no complete trials" and the like.
  try:
    for name in _PLOTS:
      path = os.path.join(out, name)
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Experimental-feature and few-trials warnings.
        try:
          figure = getattr(plotly_plots, f"plot_{name}")(study, target_name=config.objective.metric)
          figure.write_html(path + ".html", include_plotlyjs="directory")
          written.append(path + ".html")
          axes = getattr(mpl_plots, f"plot_{name}")(study, target_name=config.objective.metric)
          axes.figure.savefig(path + ".png", dpi=110, bbox_inches="tight")
          plt.close(axes.figure)
          written.append(path + ".png")
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
          skipped[name] = str(e)
  finally:
    optuna.logging.set_verbosity(verbosity)
  return written, skipped


def report(study: optuna.Study, config: config_lib.SweepConfig, out: TextIO) -> dict | None:
  """Prints the trial table and the best trial; writes every file of the module docstring.

  Returns:
    best_trial.json's dict; None when no trial completed; {} when the best
    config could not be built.
  """
  rows = trial_rows(study, config)
  os.makedirs(config.sweep_dir, exist_ok=True)
  write_trials_csv(rows, os.path.join(config.sweep_dir, TRIALS_CSV))
  counts = storage_lib.count_states(study)
  print(format_table(rows, config), file=out)
  print(
      f"\n{len(rows)} trials: {counts[TrialState.COMPLETE]} complete, "
      f"{counts[TrialState.PRUNED]} pruned, {counts[TrialState.FAIL]} failed, "
      f"{counts[TrialState.RUNNING]} running (target: {config.n_trials} complete + pruned)",
      file=out)
  try:
    summary = write_best(study, config)
  except ValueError as e:  # The base config no longer takes the best trial's values.
    print(f"best config: cannot be built: {e}", file=out)
    summary = {}
  if summary is None:
    print("no trial completed: no best config", file=out)
  elif summary:
    print(
        f"best: trial {summary['number']}, {summary['metric']} = {summary['value']:.4f}, " +
        ", ".join(f"{k}={_cell(v)}" for k, v in summary["params"].items()), file=out)
    print(f"best config: {summary['best_config']}", file=out)
    print(
        "best model: " +
        (summary["best_model"] or f"{summary['model_dir']}/{EXPORT_SUBDIR} on {summary['host']} "
         "(not found on this machine: not copied)"), file=out)
  written, skipped = write_plots(study, config)
  print(f"plots: {os.path.join(config.sweep_dir, PLOTS_DIR)} ({len(written)} files)", file=out)
  for name, why in skipped.items():
    print(f"  {name}: skipped ({why})", file=out)
  return summary
