"""A sweep worker process: runs trials of a study until the study has enough.

  python -m mxrec_pipeline.sweep.worker < SPEC   # {"config": SweepConfig.to_dict(),
                                                 #  "index": 0, "deadline": null}

`mxrec-pipeline sweep` starts `--n-jobs` of these (mxrec_pipeline.sweep.runner);
machines sharing a study each run their own. TensorFlow and the native tables
are process-wide state, so a trial never runs in the worker: each runs in its
own `python -m mxrec_pipeline.sweep.trial` process, started from
`study.optimize(objective, n_trials=1)`. The worker imports Optuna, never
TensorFlow, and outlives whatever happens to the trial process (an exception,
a segfault, the out-of-memory killer), so the trial is always told to the
study: COMPLETE, PRUNED, or FAIL with its error. The pruner runs in the
worker, answering the trial's per-epoch reports over a pipe.

Main names: `Worker`, `main`. Exit status: `ExitCode`.
See docs/sweeps.md#how-it-runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

import optuna

from mxrec_pipeline.sweep import config as config_lib
from mxrec_pipeline.sweep import space as space_lib
from mxrec_pipeline.sweep import storage as storage_lib
from mxrec_pipeline.sweep import trial as trial_lib

TRIALS_DIR = "trials"
# Trial user attributes (besides storage.WORKER_ATTR and ERROR_ATTR).
MODEL_DIR_ATTR = "model_dir"  # the trial's model_dir (on its worker's host)
OVERRIDES_ATTR = "overrides"  # its --set list over the base config
METRICS_ATTR = "metrics"  # its metrics.json "model" metrics
PID_ATTR = "trial_pid"  # pid of its trial process
POLL_S = 1.0  # while waiting for other workers' trials
STOP_GRACE_S = 30.0  # a trial process gets this long to exit on SIGTERM
TrialState = optuna.trial.TrialState


class ExitCode:
  """Exit statuses of a worker process."""

  DONE = 0  # the study has n_trials COMPLETE + PRUNED trials
  FAILURES = 3  # max_consecutive_failures of its trials failed in a row
  TIMEOUT = 4  # the deadline passed
  INTERRUPTED = 130  # SIGINT or SIGTERM


class TrialFailedError(Exception):
  """A trial failed; the message (also its "error" attribute) says why."""


def trial_dir(config: config_lib.SweepConfig, number: int) -> str:
  """model_dir of trial `number`: sweep_dir/trials/NNNN."""
  return os.path.join(config.sweep_dir, TRIALS_DIR, f"{number:04d}")


def worker_seed(seed: int | None, index: int, num_trials: int) -> int | None:
  """The sampler seed of a worker: from the config's seed, host, index and study size."""
  if seed is None:
    return None
  material = f"{seed}:{socket.gethostname()}:{index}:{num_trials}".encode()
  return int.from_bytes(hashlib.sha256(material).digest()[:4], "big")


def _brief(value) -> str:
  return f"{value:.4g}" if isinstance(value, float) else space_lib.flow_yaml(value)


def log(message: str) -> None:
  print(f"[sweep] {message}", file=sys.stderr, flush=True)


class Worker:
  """Runs trials of one study (see the module docstring).

  Each turn, under the study's trial-start lock (mxrec_pipeline.sweep.storage),
  the worker fails the trials of dead workers, counts the trials, and when
  COMPLETE + PRUNED + RUNNING < n_trials queues a trial that carries its owner
  (host, pid) and runs it; when the running ones would be enough it waits for
  them (one may fail). It stops when COMPLETE + PRUNED reaches n_trials, after
  `max_consecutive_failures` failures of its own trials in a row, at the
  deadline (--timeout: no trial starts after it), or on SIGINT/SIGTERM (the
  running trial's process is terminated and the trial marked FAIL, so the
  study is left with no RUNNING trial).

  Args:
    config: The sweep.
    index: This worker's index among those of its sweep command (0-based).
    deadline: time.time() after which no trial starts; None: none.
  """

  def __init__(self, config: config_lib.SweepConfig, index: int, deadline: float | None):
    self.config, self.index, self.deadline = config, index, deadline
    self.storage = storage_lib.open_storage(config)
    self.owner = storage_lib.worker_identity(index)
    self.lock = storage_lib.trial_start_lock(config.storage_url, config.study_name)
    num_trials = len(
        self.storage.get_all_trials(self.storage.get_study_id_from_name(config.study_name),
                                    deepcopy=False))
    self.study = optuna.load_study(
        study_name=config.study_name, storage=self.storage,
        sampler=config_lib.build_sampler(config.sampler,
                                         worker_seed(config.sampler.seed, index, num_trials)),
        pruner=config_lib.build_pruner(config.pruner))
    self.stop_requested = False
    self._process: subprocess.Popen | None = None

  def request_stop(self, signum=None, frame=None) -> None:
    """Signal handler: finish at once, terminating the running trial's process."""
    del signum, frame
    self.stop_requested = True
    if self._process is not None and self._process.poll() is None:
      self._process.terminate()

  def run(self) -> int:
    """Runs trials until done; returns an ExitCode."""
    failures = 0
    while not self.stop_requested:
      if self.deadline is not None and time.time() >= self.deadline:
        log(f"worker {self.index}: timeout, no new trial")
        return ExitCode.TIMEOUT
      state = None
      with self.lock:
        storage_lib.fail_dead_trials(self.study, self.storage)
        counts = storage_lib.count_states(self.study)
        if storage_lib.finished(counts) >= self.config.n_trials:
          return ExitCode.DONE
        room = storage_lib.finished(counts) + counts[TrialState.RUNNING] < self.config.n_trials
        if room and not self.stop_requested:
          if counts[TrialState.WAITING] == 0:
            self.study.enqueue_trial({}, user_attrs={storage_lib.WORKER_ATTR: self.owner})
          state = self._run_one_trial()
      if state is None:
        time.sleep(POLL_S)  # The running trials would be enough, unless one fails.
        continue
      failures = failures + 1 if state == TrialState.FAIL else 0
      if failures >= self.config.max_consecutive_failures and not self.stop_requested:
        log(f"worker {self.index}: stopping after {failures} failed trials in a row")
        return ExitCode.FAILURES
    return ExitCode.INTERRUPTED

  def _run_one_trial(self) -> TrialState:
    """study.optimize for one trial (the queued one); returns its final state."""
    finished = []
    self.study.optimize(self._objective, n_trials=1, catch=(TrialFailedError,),
                        callbacks=[lambda study, trial: finished.append(trial)],
                        gc_after_trial=False)
    trial = finished[0]
    if trial.state == TrialState.COMPLETE:
      log(f"trial {trial.number} COMPLETE: {self.config.objective.metric}={trial.value:.4f}")
    elif trial.state == TrialState.PRUNED:
      log(f"trial {trial.number} PRUNED after epoch {trial.last_step}")
    else:
      log(f"trial {trial.number} FAIL: {trial.user_attrs.get(storage_lib.ERROR_ATTR)}")
    return trial.state

  def _objective(self, trial: optuna.trial.Trial) -> float:
    """Samples the trial's parameters and runs its process (see `run_trial_process`)."""
    self.lock.release()  # The trial exists: other workers may count it now.
    try:
      trial.set_user_attr(storage_lib.WORKER_ATTR, self.owner)
      config = self.config
      params = {p.key: p.suggest(trial) for p in config.search_space}
      directory = trial_dir(config, trial.number)
      overrides = space_lib.to_overrides(
          {**config.overrides, **params, "pipeline.model_dir": directory})
      if os.path.exists(directory):
        log(f"trial {trial.number}: removing {directory}, left by an earlier study")
        shutil.rmtree(directory)
      os.makedirs(directory)
      with open(os.path.join(directory, trial_lib.SPEC_FILE), "w", encoding="utf-8") as f:
        json.dump(
            {
                "study": config.study_name, "number": trial.number,
                "base_config": config.base_config, "overrides": overrides,
                "metric": config.objective.metric, "params": params
            }, f, indent=2)
      trial.set_user_attr(MODEL_DIR_ATTR, directory)
      trial.set_user_attr(OVERRIDES_ATTR, overrides)
      log(f"trial {trial.number} started (worker {self.index}): " +
          ", ".join(f"{k}={_brief(v)}" for k, v in params.items()))

      def on_epoch(epoch: int, value: float) -> bool:
        trial.report(value, epoch)
        return trial.should_prune()

      outcome = self.run_trial_process(directory, lambda pid: trial.set_user_attr(PID_ATTR, pid),
                                       on_epoch)
    except Exception as e:  # pylint: disable=broad-except
      outcome = {"error": trial_lib.describe_error(e)}
    if self.stop_requested and "error" in outcome:
      outcome = {"error": "interrupted: the sweep was stopped (SIGINT/SIGTERM)"}
    if "pruned" in outcome:
      raise optuna.TrialPruned(f"pruned after epoch {outcome['pruned']}")
    if "done" in outcome:
      trial.set_user_attr(METRICS_ATTR, outcome["done"])
      value = outcome["done"].get(self.config.objective.metric)
      if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
      outcome = {"error": f"objective {self.config.objective.metric} is {value} (diverged?)"}
    trial.set_user_attr(storage_lib.ERROR_ATTR, outcome["error"])
    raise TrialFailedError(outcome["error"])

  def run_trial_process(self, directory: str, on_start: Callable[[int], None],
                        on_epoch: Callable[[int, float], bool]) -> dict:
    """Runs `python -m mxrec_pipeline.sweep.trial DIRECTORY` to its end.

    Its output goes to DIRECTORY/trial.log.

    Args:
      directory: The trial dir holding trial.json.
      on_start: Called with the process id once started.
      on_epoch: (epoch, value) -> prune?, for each epoch the process reports.

    Returns:
      The process's last message ({"done": metrics}, {"pruned": epoch} or
      {"error": text}); {"error": how it ended} when it died without one.
    """
    log_path = os.path.join(directory, trial_lib.LOG_FILE)
    report_r, report_w = os.pipe()
    control_r, control_w = os.pipe()
    try:
      with open(log_path, "ab") as log_file:
        self._process = subprocess.Popen(  # pylint: disable=consider-using-with
            [
                sys.executable, "-m", "mxrec_pipeline.sweep.trial", directory, "--report-fd",
                str(report_w), "--control-fd",
                str(control_r)
            ], stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            pass_fds=(report_w, control_r))
    except BaseException:
      for fd in (report_r, control_w):
        os.close(fd)
      raise
    finally:
      for fd in (report_w, control_r):
        os.close(fd)
    process = self._process
    if self.stop_requested:
      process.terminate()
    last = None
    try:
      on_start(process.pid)
      with os.fdopen(report_r, encoding="utf-8") as reports:
        for line in reports:
          message = json.loads(line)
          if "epoch" not in message:
            last = message
            continue
          answer = json.dumps({"prune": bool(on_epoch(message["epoch"], message["value"]))})
          try:
            os.write(control_w, (answer + "\n").encode())
          except BrokenPipeError:
            pass  # The process ended; its exit status tells how.
      code = process.wait()
    except BaseException:
      _stop(process)
      raise
    finally:
      os.close(control_w)
      self._process = None
    if last is not None and ("error" in last or code == 0):
      return last
    return {"error": describe_exit(code, log_path)}


def _stop(process: subprocess.Popen) -> None:
  """SIGTERM, then SIGKILL after STOP_GRACE_S; waits for the exit."""
  if process.poll() is None:
    process.terminate()
    try:
      process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


def describe_exit(code: int, log_path: str) -> str:
  """Why a trial process ended without a result, with its log's last line."""
  if code < 0:
    name = signal.Signals(-code).name
    what = f"trial process killed by {name}" + (" (out of memory? see dmesg)"
                                                if name == "SIGKILL" else "")
  else:
    what = f"trial process exited with status {code} without a result"
  try:
    with open(log_path, encoding="utf-8", errors="replace") as f:
      lines = [line.strip() for line in f.readlines()[-50:] if line.strip()]
  except OSError:
    lines = []
  tail = f"; last log line: {lines[-1][:300]}" if lines else ""
  return f"{what}{tail} (log: {log_path})"


def main() -> int:
  spec = json.load(sys.stdin)
  optuna.logging.set_verbosity(optuna.logging.ERROR)  # The worker logs trials itself.
  worker = Worker(config_lib.from_dict(spec["config"]), spec["index"], spec["deadline"])
  signal.signal(signal.SIGINT, worker.request_stop)
  signal.signal(signal.SIGTERM, worker.request_stop)
  return worker.run()


if __name__ == "__main__":
  sys.exit(main())
