"""`mxrec-pipeline` command line: train, export, predict, sweep, data fetch.

  mxrec-pipeline train configs/movielens_listwise.yaml [--fresh] [--set pipeline.num_epochs=3 ...]
                 [--local-cluster workers=2[,ps=2[,evaluator=1]]]
  mxrec-pipeline train configs/movielens_continuous.yaml --continuous [--poll-s S]
                 [--max-partitions N]
  mxrec-pipeline export configs/movielens_listwise.yaml [--out DIR] [--checkpoint N]
  mxrec-pipeline predict MODEL_DIR --input lists.json|lists.tfrecord
  mxrec-pipeline sweep configs/sweep_movielens.yaml [--n-trials N] [--n-jobs J] [--timeout S]
                 [--storage URL] [--set pipeline.num_epochs=3 ...]
  mxrec-pipeline data fetch movielens_100k|mslr_5k|book_crossing
  mxrec-pipeline data split-by-day movielens_100k|DATA_DIR OUT_DIR [--period-days N]
                 [--arrive-every-s S]

Exit status 2 on a bad config or argument, an unusable checkpoint, a model_dir
in use by another job or a full disk, with the culprit named on stderr;
1 when another task of a multi-worker cluster failed (named on stderr).
`--help` and config errors answer without importing TensorFlow: each command
imports what it runs only once its config is valid.
"""

from __future__ import annotations

import argparse
import os
import sys

from mxrec_pipeline import config as config_lib
from mxrec_pipeline import hparams
from mxrec_pipeline.cluster import tf_config
from mxrec_pipeline.util.storage import StorageFullError as StorageFull

# Where `train --local-cluster` writes the logs of the workers other than the chief.
LOCAL_CLUSTER_LOGS = "local_cluster"


def _train(args) -> int:
  overrides = list(args.set)
  for flag, key in (("poll_s", "continuous.poll_s"), ("max_partitions",
                                                      "continuous.max_partitions")):
    if getattr(args, flag) is not None:
      if not args.continuous:
        raise ValueError(f"--{flag.replace('_', '-')} goes with --continuous")
      overrides.append(f"{key}={getattr(args, flag)}")
  config = config_lib.load(args.config, overrides)  # Before jobs imports TensorFlow.
  if args.continuous:
    return _train_continuous(args, config)
  if args.local_cluster is not None:
    return _train_local_cluster(args, config)
  on_ps = config.pipeline.strategy == hparams.PARAMETER_SERVER
  cluster = tf_config.from_environment() if on_ps else None
  if cluster is not None and cluster.is_evaluator:
    return _evaluate_sidecar(args, config)
  from mxrec_pipeline import jobs  # pylint: disable=import-outside-toplevel
  result = jobs.train(config, verbose=args.verbose, fresh=args.fresh)
  print(f"validation metrics ({config.pipeline.model_dir}/metrics.json):")
  print(jobs.format_metrics(result))
  return 0


def _evaluate_sidecar(args, config: config_lib.JobConfig) -> int:
  """`train` as a TF_CONFIG "evaluator" task: validates the chief's checkpoints (sidecar.py)."""
  if not config.pipeline.sidecar_evaluator:
    raise config_lib.ConfigError(
        "pipeline.sidecar_evaluator: must be true in every task when the cluster has an "
        "evaluator task (this one): the chief then leaves validation to it")
  from mxrec_pipeline import sidecar  # pylint: disable=import-outside-toplevel
  records = sidecar.evaluate_checkpoints(config, fresh=args.fresh)
  print(f"sidecar evaluator: validated {len(records)} checkpoint(s); per-checkpoint metrics in "
        f"{config.pipeline.model_dir}/{sidecar.VALIDATION_LOG}")
  return 0


def _train_continuous(args, config: config_lib.JobConfig) -> int:
  """`train --continuous`: each partition of `continuous.partitions_dir` once, as it arrives."""
  if args.local_cluster is not None:
    raise ValueError("--continuous trains on one host: drop --local-cluster")
  if not config.continuous.partitions_dir:
    raise config_lib.ConfigError("continuous.partitions_dir: required with --continuous (the "
                                 "directory of the data partitions)")
  from mxrec_pipeline import continuous_job  # pylint: disable=import-outside-toplevel
  summary = continuous_job.train_continuous(config, verbose=args.verbose, fresh=args.fresh)
  print(f"trained {len(summary['trained'])} partition(s); exported versions "
        f"{summary['exported'] or 'none'}; per-partition metrics in "
        f"{config.pipeline.model_dir}/metrics.jsonl")
  return 0


def _train_local_cluster(args, config: config_lib.JobConfig) -> int:
  """`train --local-cluster workers=N[,ps=M[,evaluator=1]]`: a local cluster running this command.

  workers=N: N copies under MultiWorkerMirroredStrategy. With ps=M: the chief
  runs it under ParameterServerStrategy (the coordinator), N worker and M ps
  tasks run mxrec_pipeline.cluster.ps_server; evaluator=1: an evaluator task
  runs it too, with `pipeline.sidecar_evaluator=true` (mxrec_pipeline/sidecar.py).
  TensorFlow-free.
  """
  from mxrec_pipeline.cluster import local  # pylint: disable=import-outside-toplevel
  spec = local.parse_spec(args.local_cluster)
  strategy = hparams.PARAMETER_SERVER if spec.ps else hparams.MULTI_WORKER_MIRRORED
  overrides = [*args.set, f"pipeline.strategy={strategy}"]
  if spec.evaluator:  # The chief then skips validation; the evaluator validates.
    overrides.append("pipeline.sidecar_evaluator=true")
  config_lib.load(args.config, overrides)  # A config the tasks would refuse is refused once, here.
  argv = [
      sys.executable, "-m", "mxrec_pipeline.cli", "train", args.config, f"--verbose={args.verbose}"
  ] + (["--fresh"] if args.fresh else [])
  for override in overrides:
    argv += ["--set", override]
  log_dir = os.path.join(config.pipeline.model_dir, LOCAL_CLUSTER_LOGS)
  return local.run(lambda task: argv, spec, log_dir)


def _export(args) -> int:
  config = config_lib.load(args.config, args.set)
  from mxrec_pipeline import jobs  # pylint: disable=import-outside-toplevel
  print(jobs.export(config, args.out, args.checkpoint))
  return 0


def _predict(args) -> int:
  from mxrec_pipeline import serving  # pylint: disable=import-outside-toplevel
  text, warnings = serving.to_json(serving.predict_file(args.model_dir, args.input))
  for warning in warnings:
    print(f"mxrec-pipeline predict: warning: {warning}", file=sys.stderr)
  print(text)
  return 0


def _sweep(args) -> int:
  try:
    from mxrec_pipeline.sweep import runner  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    if "`sweep` extra" not in str(e):
      raise
    print(f"mxrec-pipeline sweep: error: {e}", file=sys.stderr)
    return 2
  return runner.run_sweep(args.config, n_trials=args.n_trials, n_jobs=args.n_jobs,
                          timeout_s=args.timeout, storage=args.storage, overrides=args.set)


def _fetch(args) -> int:
  from mxrec_pipeline.data import fetch  # pylint: disable=import-outside-toplevel
  print(fetch.fetch(args.name))
  return 0


def _split_by_day(args) -> int:
  from mxrec_pipeline.data import fetch  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.data import split_by_day  # pylint: disable=import-outside-toplevel
  data_dir = fetch.fetch(args.data_dir) if args.data_dir == "movielens_100k" else args.data_dir
  report = split_by_day.split_by_day(data_dir, args.out_dir, args.period_days, args.max_list_size,
                                     arrival_interval_s=args.arrive_every_s)
  new = sum(1 for *_, written in report.partitions if written)
  print(f"{args.out_dir}: {len(report.partitions)} partitions ({new} written now, the others "
        "were complete)")
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="mxrec-pipeline", description=__doc__.split("\n")[0])
  commands = parser.add_subparsers(dest="command", required=True)
  for name, fn, help_text in (("train", _train, "train, validate and export a config"),
                              ("export", _export,
                               "export a trained config's latest checkpoint (sharded runs too, "
                               "in this process)")):
    sub = commands.add_parser(name, help=help_text)
    sub.add_argument("config", help="YAML job config, e.g. configs/movielens_listwise.yaml")
    sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config value, e.g. pipeline.learning_rate=0.01")
    sub.set_defaults(fn=fn)
  commands.choices["train"].add_argument(
      "--fresh", action="store_true",
      help="start over: remove the checkpoints, logs, exports and metrics of an earlier run in "
      "model_dir (default: resume from its latest checkpoint)")
  commands.choices["train"].add_argument("--verbose", type=int, default=2,
                                         help="Keras fit verbosity (0, 1, 2)")
  commands.choices["train"].add_argument(
      "--continuous", action="store_true",
      help="train on the data partitions of continuous.partitions_dir as they arrive (each "
      "once, in order, scored before it is trained on), exporting numbered versions to "
      "model_dir/export/ (docs/continuous.md)")
  commands.choices["train"].add_argument(
      "--poll-s", type=float, help="with --continuous: seconds between looks for new "
      "partitions; 0: stop once every arrived one is trained (default: the config's)")
  commands.choices["train"].add_argument(
      "--max-partitions", type=int,
      help="with --continuous: stop after training this many partitions")
  commands.choices["train"].add_argument(
      "--local-cluster", metavar="workers=N[,ps=M[,evaluator=1]]",
      help="train on a cluster of N local processes under MultiWorkerMirroredStrategy, each "
      "with TF_CONFIG on free localhost ports; streams the chief's output (worker 0), logs the "
      f"others to model_dir/{LOCAL_CLUSTER_LOGS}/ and stops them all when one fails; with ps=M "
      "under ParameterServerStrategy: a chief (this command, the coordinator), N workers and M "
      "ps tasks, the tables sharded over the ps tasks, a worker that dies started again at its "
      "address; evaluator=1 adds a sidecar evaluator task that validates each checkpoint "
      "instead of the chief (docs/distributed.md)")
  commands.choices["export"].add_argument("--out", help="export directory")
  commands.choices["export"].add_argument(
      "--checkpoint", metavar="N|PATH",
      help="a kept checkpoint to export: its number (2, ckpt-2) or path prefix (default: the "
      "newest complete one)")
  predict = commands.add_parser("predict", help="score lists with an exported SavedModel")
  predict.add_argument("model_dir", help="SavedModel directory (e.g. .../export/latest_model)")
  predict.add_argument(
      "--input", required=True, help="JSON file of lists ([{'context': {..}, 'examples': [{..}]}]) "
      "or an ELWC TFRecord file")
  predict.set_defaults(fn=_predict)
  sweep = commands.add_parser(
      "sweep", help="hyperparameter sweep of a job config on Optuna (docs/sweeps.md)")
  sweep.add_argument("config", help="sweep config, e.g. configs/sweep_movielens.yaml")
  sweep.add_argument("--n-trials", type=int,
                     help="COMPLETE + PRUNED trials the study ends with (default: the config's)")
  sweep.add_argument("--n-jobs", type=int, default=1,
                     help="worker processes on this machine, each running one trial at a time")
  sweep.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="start no trial after this many seconds")
  sweep.add_argument(
      "--storage", metavar="URL",
      help="SQLAlchemy URL of the study, shared by every machine of the sweep "
      "(default: the config's, else sqlite in the sweep dir)")
  sweep.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a value of the base job config in every trial")
  sweep.set_defaults(fn=_sweep)
  data = commands.add_parser("data", help="data sets").add_subparsers(dest="action", required=True)
  fetch = data.add_parser("fetch", help="fetch a data set into the cache, print its directory")
  fetch.add_argument("name", help="movielens_100k, mslr_5k or book_crossing")
  fetch.set_defaults(fn=_fetch)
  split = data.add_parser(
      "split-by-day", help="write interactions with timestamps as one partition per day, each "
      "with its _SUCCESS marker, for train --continuous")
  split.add_argument(
      "data_dir", help="movielens_100k (fetched) or a directory of RecBole "
      "atomic files ml-100k.{inter,user,item}")
  split.add_argument("out_dir", help="the partitions directory (continuous.partitions_dir)")
  split.add_argument("--period-days", type=int, default=1, help="days per partition")
  split.add_argument("--max-list-size", type=int, default=100,
                     help="a user's longer list of one period is cut into lists of this size")
  split.add_argument("--arrive-every-s", type=float, default=0.0,
                     help="seconds between two partitions' markers: replays the data as a stream")
  split.set_defaults(fn=_split_by_day)
  return parser


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  try:
    return args.fn(args)
  except (config_lib.ConfigError, FileNotFoundError, FileExistsError, ValueError, StorageFull) as e:
    print(f"mxrec-pipeline {args.command}: error: {e}", file=sys.stderr)
    return 2
  except tf_config.PeerError as e:  # Another task of the cluster failed.
    print(f"mxrec-pipeline {args.command}: error: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())
