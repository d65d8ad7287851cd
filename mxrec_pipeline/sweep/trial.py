"""One sweep trial in a process of its own: train a job config, report each epoch.

  python -m mxrec_pipeline.sweep.trial TRIAL_DIR --report-fd W --control-fd R

The worker (mxrec_pipeline.sweep.worker) writes TRIAL_DIR/trial.json: the base
job config, the trial's `--set` overrides and the objective metric. `main`
trains it with `jobs.train` (TRIAL_DIR gets config.yaml, checkpoints, exports
and metrics.json, as `mxrec-pipeline train BASE --set ...` would, without the
LambdaMART baseline) and talks to the worker over two pipes, one JSON object
a line:

  trial -> worker   {"epoch": 2, "value": 0.61}       after each epoch
  worker -> trial   {"prune": false}                   the pruner's answer
  trial -> worker   {"done": {"ndcg@10": ..., ...}}    the final metrics, or
                    {"pruned": 2}                      stopped by the pruner, or
                    {"error": "ConfigError: ..."}      failed (traceback in the log)

TensorFlow is imported only in `main`, so the worker imports this module's
names without it. See docs/sweeps.md#how-it-runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback

SPEC_FILE = "trial.json"
LOG_FILE = "trial.log"
_MAX_ERROR_CHARS = 2000


class WorkerGoneError(RuntimeError):
  """The worker closed its end of the pipes (it stopped or died)."""


class _Channel:
  """The trial's end of the two pipes."""

  def __init__(self, report_fd: int, control_fd: int):
    self._report = os.fdopen(report_fd, "w", encoding="utf-8")
    self._control = os.fdopen(control_fd, "r", encoding="utf-8")

  def send(self, message: dict) -> None:
    try:
      self._report.write(json.dumps(message) + "\n")
      self._report.flush()
    except BrokenPipeError as e:
      raise WorkerGoneError("the sweep worker is gone") from e

  def report_epoch(self, epoch: int, value: float) -> bool:
    """Sends an epoch's value; returns the worker's answer: prune or not."""
    self.send({"epoch": epoch, "value": value})
    line = self._control.readline()
    if not line:
      raise WorkerGoneError("the sweep worker is gone")
    return bool(json.loads(line)["prune"])


def read_spec(trial_dir: str) -> dict:
  with open(os.path.join(trial_dir, SPEC_FILE), encoding="utf-8") as f:
    return json.load(f)


def describe_error(e: BaseException) -> str:
  """`Type: message` on one line, for the study's "error" attribute.

  TensorFlow's "in user code:" messages carry a traceback of the traced
  function; its frames are left out (the full traceback is in trial.log).
  """
  kept, skip_code_line = [], False
  for line in (line.strip() for line in str(e).splitlines()):
    if skip_code_line or not line or line == "in user code:":
      skip_code_line = False
      continue
    if line.startswith('File "'):
      skip_code_line = True  # The frame's source line follows.
      continue
    kept.append(line)
  message = " ".join(kept)
  name = type(e).__name__
  text = message if message.startswith(name + ":") else f"{name}: {message}"
  return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + " [...]"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("trial_dir")
  parser.add_argument("--report-fd", type=int, required=True)
  parser.add_argument("--control-fd", type=int, required=True)
  args = parser.parse_args(argv)
  channel = _Channel(args.report_fd, args.control_fd)
  try:
    # pylint: disable=import-outside-toplevel
    from mxrec_pipeline import config as config_lib
    from mxrec_pipeline import jobs
    from mxrec_pipeline.keras import pipeline as pipeline_lib
    from mxrec_pipeline.sweep import reporter
    spec = read_spec(args.trial_dir)
    config = config_lib.load(spec["base_config"], spec["overrides"])
    # Trials differ in the ranker's hyperparameters only: LambdaMART's figure
    # (jobs.lambdamart_metrics) would be the same in each, so it is not refit.
    config = dataclasses.replace(config,
                                 lambdamart=dataclasses.replace(config.lambdamart, enabled=False))
    monitor = "val_" + pipeline_lib.metric_name(spec["metric"])
    try:
      result = jobs.train(config, verbose=2,
                          callbacks=[reporter.EpochReporter(monitor, channel.report_epoch)])
    except reporter.TrialPrunedError as e:
      print(f"trial pruned after epoch {e.epoch}", flush=True)
      channel.send({"pruned": e.epoch})
      return 0
    channel.send({"done": result["model"]})
    return 0
  except WorkerGoneError:
    print("the sweep worker is gone: stopping", file=sys.stderr, flush=True)
    return 1
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    sys.stderr.flush()
    try:
      channel.send({"error": describe_error(e)})
    except WorkerGoneError:
      pass
    return 1


if __name__ == "__main__":
  sys.exit(main())
