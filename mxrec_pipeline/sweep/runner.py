"""`mxrec-pipeline sweep`: check the config, start the workers, report.

  mxrec-pipeline sweep configs/sweep_movielens.yaml [--n-trials N] [--n-jobs J]
      [--timeout S] [--storage URL] [--set key=value ...]

`run_sweep` (this process) validates the sweep config against its base job
config, prepares the data once, creates or resumes the study, marks FAIL the
trials its dead workers left RUNNING, starts J worker processes
(mxrec_pipeline.sweep.worker) and waits for them. Then it prints the trial
table and writes the best config, the best model and the plots
(mxrec_pipeline.sweep.reporting). Running it again resumes the study; other
machines join with the same --storage URL. Ctrl-C (or SIGTERM) stops the
workers, which mark their trials FAIL; the report is printed either way.

Exit status: 0 the study reached n_trials (or the timeout passed), 1 a worker
stopped on consecutive failures or crashed, 2 a bad config, 130 interrupted.
See docs/sweeps.md.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import typing
from typing import TextIO

import optuna

from mxrec_pipeline.sweep import config as config_lib
from mxrec_pipeline.sweep import reporting
from mxrec_pipeline.sweep import space as space_lib
from mxrec_pipeline.sweep import storage as storage_lib
from mxrec_pipeline.sweep import worker as worker_lib

STUDY_ATTR = "mxrec_sweep"  # study user attribute: the sweep's search space and objective
STOP_WAIT_S = 60.0  # for workers to stop after SIGTERM before SIGKILL
TrialState = optuna.trial.TrialState


def check_against_base(config: config_lib.SweepConfig):
  """Checks the sweep against its base job config; returns the job (fixed overrides applied).

  The objective must be a pipeline metric; the base config with the fixed
  overrides must be valid; every search-space key must be a key of it, and
  each bound and choice must give a valid config on its own.

  Raises:
    SweepConfigError: naming the key and the problem.
  """
  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import config as job_config
  from mxrec_pipeline.hparams import RANKING_METRICS
  if config.objective.metric not in RANKING_METRICS:
    raise config_lib.SweepConfigError(f"objective.metric must be one of {list(RANKING_METRICS)}, "
                                      f"got {config.objective.metric!r}")
  fixed = space_lib.to_overrides(
      {**config.overrides, "pipeline.model_dir": worker_lib.trial_dir(config, 0)})
  try:
    job = job_config.load(config.base_config, fixed)
  except job_config.ConfigError as e:
    raise config_lib.SweepConfigError(
        f"base_config {config.base_config} with the sweep's overrides: {e}") from e
  tree = job.to_dict()
  for param in config.search_space:
    node = tree
    for part in param.key.split("."):
      if not isinstance(node, dict) or part not in node:
        raise config_lib.SweepConfigError(
            f"search_space.{param.key}: not a key of the {job.builder} job config "
            f"(sections {sorted(tree)}; see docs/configuration.md)")
      node = node[part]
    values = (param.choices if param.type == space_lib.ParamType.CATEGORICAL else
              (param.low, param.high))
    for value in values:
      try:
        job_config.load(config.base_config, fixed + space_lib.to_overrides({param.key: value}))
      except job_config.ConfigError as e:
        raise config_lib.SweepConfigError(
            f"search_space.{param.key}: {value!r} gives an invalid config: {e}") from e
  return job


def open_study(config: config_lib.SweepConfig,
               storage: optuna.storages.BaseStorage) -> optuna.Study:
  """Creates the study, or loads it when it exists and holds the same sweep.

  Raises:
    SweepConfigError: the study exists with another search space, objective
      or direction (start a new study_name for those).
  """
  definition = json.loads(
      json.dumps({
          "search_space": {p.key: p.to_dict() for p in config.search_space},
          "objective": {"metric": config.objective.metric, "direction": config.objective.direction}
      }))
  study = optuna.create_study(study_name=config.study_name, storage=storage,
                              direction=config.objective.direction, load_if_exists=True)
  stored = study.user_attrs.get(STUDY_ATTR)
  if stored is None:
    study.set_user_attr(STUDY_ATTR, definition)
  elif stored != definition:
    changed = sorted(k for k in definition["search_space"].keys() | stored["search_space"].keys()
                     if definition["search_space"].get(k) != stored["search_space"].get(k))
    if stored["objective"] != definition["objective"]:
      changed.append("objective")
    raise config_lib.SweepConfigError(
        f"study '{config.study_name}' in {storage_lib.printable(config.storage_url)} holds a "
        f"sweep with another search space or objective (differs in {changed}); resume it with "
        "its own config or give this sweep a new study_name")
  return study


def _raise_interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


def run_sweep(path: str, *, n_trials: int | None = None, n_jobs: int = 1,
              timeout_s: float | None = None, storage: str | None = None,
              overrides: typing.Sequence[str] = (), out: TextIO = sys.stdout) -> int:
  """Runs (or resumes) a sweep and reports it; see the module docstring.

  Args:
    path: The sweep config.
    n_trials: COMPLETE + PRUNED trials to reach (default: the config's).
    n_jobs: Worker processes on this machine, > 0.
    timeout_s: No trial starts after this many seconds; None: no limit.
    storage: SQLAlchemy URL of the study (default: the config's, else SQLite
      in sweep_dir).
    overrides: --set key=value, added to the config's fixed overrides.
    out: Where the report goes.

  Returns:
    The exit status (see the module docstring).

  Raises:
    SweepConfigError: a bad sweep config (named key).
    StorageError: a storage URL that does not work (named, password masked).
    ValueError: bad n_jobs or timeout_s.
  """
  if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs <= 0:
    raise ValueError(f"--n-jobs must be a positive int, got {n_jobs!r}")
  if timeout_s is not None and not timeout_s > 0:
    raise ValueError(f"--timeout must be positive seconds, got {timeout_s!r}")
  optuna.logging.set_verbosity(optuna.logging.WARNING)  # Trials are logged by the workers.
  config = config_lib.load(path, n_trials=n_trials, storage=storage, overrides=overrides)
  job = check_against_base(config)
  if config.storage is not None:  # The default SQLite file in sweep_dir needs no check.
    storage_lib.check_storage(config.storage)
  import builders  # pylint: disable=import-outside-toplevel
  builders.get_builder(job.builder).prepare_data(job.data)  # Once, before the trials.
  storage_obj = storage_lib.open_storage(config)
  study = open_study(config, storage_obj)
  dead = storage_lib.fail_dead_trials(study, storage_obj)
  if dead:
    worker_lib.log(f"marked FAIL trials {dead}: their workers died")
  counts = storage_lib.count_states(study)
  worker_lib.log(f"study '{config.study_name}' in {storage_lib.printable(config.storage_url)}: "
                 f"{counts[TrialState.COMPLETE]} complete, {counts[TrialState.PRUNED]} pruned, "
                 f"{counts[TrialState.FAIL]} failed, {counts[TrialState.RUNNING]} running; target "
                 f"{config.n_trials} complete + pruned; {n_jobs} worker(s); trials in "
                 f"{config.sweep_dir}/{worker_lib.TRIALS_DIR}")
  deadline = None if timeout_s is None else time.time() + timeout_s
  # Ctrl-C (the whole process group gets SIGINT) and SIGTERM stop the sweep the
  # same way, even where the shell started this process with SIGINT ignored.
  previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
  workers, codes, interrupted = [], [], False
  try:
    try:
      for index in range(n_jobs):
        # The spec goes through stdin: a storage URL may hold a password.
        spec = {"config": config.to_dict(), "index": index, "deadline": deadline}
        workers.append(
            subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, "-m", "mxrec_pipeline.sweep.worker"], stdin=subprocess.PIPE,
                text=True))
        workers[-1].stdin.write(json.dumps(spec))
        workers[-1].stdin.close()
      codes = [w.wait() for w in workers]
    except KeyboardInterrupt:
      interrupted = True
      codes = _stop_workers(workers)
    storage_lib.fail_dead_trials(study, storage_obj)
    reporting.report(study, config, out)
  except KeyboardInterrupt:
    worker_lib.log("interrupted")
    return worker_lib.ExitCode.INTERRUPTED
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
  if interrupted or worker_lib.ExitCode.INTERRUPTED in codes:
    return worker_lib.ExitCode.INTERRUPTED
  if any(c not in (worker_lib.ExitCode.DONE, worker_lib.ExitCode.TIMEOUT) for c in codes):
    return 1
  return 0


def _stop_workers(workers: list[subprocess.Popen]) -> list[int]:
  """SIGTERM the workers, wait STOP_WAIT_S (or a second Ctrl-C), then SIGKILL."""
  worker_lib.log("stopping: the workers end their trials (Ctrl-C again to kill them)")
  for w in workers:
    if w.poll() is None:
      w.send_signal(signal.SIGTERM)
  deadline = time.time() + STOP_WAIT_S
  try:
    for w in workers:
      w.wait(max(0.0, deadline - time.time()))
  except (KeyboardInterrupt, subprocess.TimeoutExpired):
    for w in workers:
      if w.poll() is None:
        w.kill()
  return [w.wait() for w in workers]
