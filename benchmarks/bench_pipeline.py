"""Benchmark of the MovieLens pipeline against the same model on stock TF-Ranking.

The "Done when" comparisons of issue 3, in one run, ratios printed next to
their goals:

1. Quality parity. configs/movielens_listwise.yaml trained by our pipeline
   (sparse-core tables, lazy Adam; builders/movielens.py) and the same model
   with dense `tf.keras.layers.Embedding` tables behind stock
   IntegerLookup/StringLookup over the training vocabulary, one Keras Adam,
   trained by stock `tfr.keras.pipeline.SimplePipeline`
   (builders/movielens_dense.py). Same features, scorer, loss, labels,
   batching, learning rate, steps and seeds. Mean validation NDCG@10 (whole
   validation split, tfr's metric) over the seeds; goal: |difference| <= 0.01.
   The item-mean-rating baseline is printed for reference.
2. Throughput at MovieLens scale: training examples/s of both, measured in the
   runs of 1 (epochs after the first, which traces; validation excluded):
   batch x mean list length / median step time, median over seeds; examples
   per process CPU-second as a cross-check on a shared machine. Goal: ours
   >= 1.0x the dense pipeline (issue #16).
3. Crossover as the id space grows: a synthetic ELWC data set of the same
   schema whose item ids are Zipf(1.1) over N distinct ids (N = 1e4 ... 5e6),
   written to a temporary directory; both item tables (ours and the dense
   Embedding) are sized to the id space N; examples/s of both at each N.

Both pipelines run under the config's strategy (MirroredStrategy), with
steps_per_execution 1 and their own per-step ranking metrics; only their
checkpoint, TensorBoard and export callbacks are left out, in both, since
those run between epochs and are not timed.

Every trial runs in its own child process (`--child`), one after another,
so trials do not share TensorFlow state or compete for the 2 cores.

Results and their reading: docs/benchmarks.md, "Pipeline (MovieLens)".

Usage:
  python benchmarks/bench_pipeline.py            # full: 3 seeds, N up to 5e6 (~6 min)
  python benchmarks/bench_pipeline.py --quick    # 1 seed, 2 epochs, N in {1e4, 1e6} (< 2 min)
  python benchmarks/bench_pipeline.py --set pipeline.strategy=null   # config overrides
  python benchmarks/bench_pipeline.py --only movielens --json out.json   # also save figures
  python benchmarks/bench_pipeline.py --only movielens --profile 40   # + time by stage
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
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

NDCG_GOAL = 0.01  # |mean NDCG@10 ours - dense|, at most.
THROUGHPUT_GOAL = 1.0  # ours / dense examples/s at MovieLens scale, at least (issue #16).
PROFILE_TOP_OPS = 15  # Largest ops printed per variant with --profile.

ZIPF_A = 1.1
KEY_SALT = 0x2545F4914F6CDD1D  # Fixed: the id space is the same in every run.
SEED = 20241122


@dataclasses.dataclass(frozen=True)
class Plan:
  """What one benchmark run does.

  Attributes:
    seeds: Seeds of the MovieLens trials (each trains both variants).
    epochs: Training epochs of a MovieLens trial; None: the config's.
    id_spaces: Distinct item ids N of the synthetic trials.
    zipf_lists: Training lists of the synthetic data set.
    zipf_list_size: Examples per synthetic list.
    zipf_epochs: Epochs of a synthetic trial (the first is not timed).
    zipf_steps_per_epoch: Steps per synthetic epoch.
  """

  seeds: tuple[int, ...]
  epochs: int | None
  id_spaces: tuple[int, ...]
  zipf_lists: int
  zipf_list_size: int
  zipf_epochs: int
  zipf_steps_per_epoch: int


FULL = Plan(seeds=(1, 2, 3), epochs=None, id_spaces=(10_000, 100_000, 1_000_000, 5_000_000),
            zipf_lists=1280, zipf_list_size=50, zipf_epochs=3, zipf_steps_per_epoch=30)
QUICK = Plan(seeds=(1,), epochs=2, id_spaces=(10_000, 1_000_000), zipf_lists=320, zipf_list_size=50,
             zipf_epochs=2, zipf_steps_per_epoch=8)

# ----------------------------------------------------------------------------
# Children (TensorFlow imported inside).
# ----------------------------------------------------------------------------


def zipf_ids(rng, num_ids: int, id_space: int):
  """`num_ids` int64 ids: Zipf(ZIPF_A) ranks in [1, id_space], spread.

  Ranks are drawn by inverting the CDF of the Zipf law truncated to
  `id_space` ranks (exact), then mapped by `rank_to_id`.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  cdf = np.cumsum(np.arange(1, id_space + 1, dtype=np.float64)**-ZIPF_A)
  ranks = np.searchsorted(cdf, rng.uniform(0, cdf[-1], num_ids), side="right") + 1
  return rank_to_id(np.minimum(ranks, id_space))


def rank_to_id(ranks):
  """MurmurHash3's fmix64 (a bijection of 64-bit words) of `ranks ^ KEY_SALT`.

  Distinct ranks are distinct ids spread over the int64 range, not small
  consecutive ints, as raw ids are. Returns an int64 numpy array.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  z = np.asarray(ranks).astype(np.uint64) ^ np.uint64(KEY_SALT)
  z ^= z >> np.uint64(33)
  z *= np.uint64(0xFF51AFD7ED558CCD)
  z ^= z >> np.uint64(33)
  z *= np.uint64(0xC4CEB9FE1A85EC53)
  z ^= z >> np.uint64(33)
  return z.view(np.int64)


def child_zipf_data(out_dir: str, id_space: int, num_lists: int, list_size: int) -> dict:
  """Writes train/valid ELWC files of MovieLens's schema with Zipf item ids.

  `num_lists` training lists (and 32 validation ones) of `list_size` movies;
  item ids Zipf(ZIPF_A) over `id_space` ids, users uniform over 10k ids, the
  other features uniform over MovieLens-like vocabularies, ratings uniform.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.data import elwc  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(SEED)
  genres = [
      g.encode() for g in ("Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
                           "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical",
                           "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western", "unknown")
  ]
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  distinct = set()
  for split, lists_in_split in (("train", num_lists), ("valid", 32)):
    n = list_size
    items = zipf_ids(rng, lists_in_split * n, id_space).reshape(lists_in_split, n)
    tokens = rng.zipf(1.2, size=(lists_in_split, n, 4)) % 5000
    lists = []
    for i in range(lists_in_split):
      if split == "train":
        distinct.update(items[i].tolist())
      context = {
          "user_id": int(rng.integers(1, 10_000)), "age": int(rng.integers(10, 70)),
          "gender": b"MF"[i % 2:i % 2 + 1], "occupation": f"job{rng.integers(21)}".encode(),
          "zip": f"z{rng.integers(1000)}".encode()
      }
      examples = [{
          "item_id": int(items[i, j]), "year": int(rng.integers(1930, 1999)),
          "genres": [genres[g] for g in rng.choice(19, rng.integers(1, 4), False)],
          "title_tokens": [f"t{t}".encode() for t in tokens[i, j, :rng.integers(1, 5)]],
          "timestamp": 0, "rating": float(rng.integers(1, 6))
      } for j in range(n)]
      lists.append(elwc.make_elwc(context, examples))
    elwc.write_elwc_tfrecord(out / f"{split}.tfrecord", lists)
  return {"distinct_train_items": len(distinct)}


def step_timer():
  """A Keras callback timing the training steps of epochs after the first.

  Records the wall time between consecutive training steps (validation and
  epoch-end callbacks excluded: an epoch's first step is timed from the
  epoch's start, so it carries the iterator's start-up), and the CPU time the
  process (every thread: the step and tf.data's) spent meanwhile; the CPU
  time of each epoch's first step also on its own (`first_cpu_seconds`); and
  the wall and CPU time from the second epoch's start to the end of training
  (`later_epochs_seconds`, `later_epochs_cpu_seconds`: steps, validation,
  callbacks and whatever starts each epoch's data).
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  class TrainTimer(tf.keras.callbacks.Callback):
    """Step durations (wall and process CPU seconds) after the first epoch."""

    def __init__(self):
      super().__init__()
      self.step_seconds: list[float] = []
      self.cpu_seconds = 0.0
      self.first_cpu_seconds = 0.0  # Of the epochs' first steps (iterator start-up).
      self._epoch = 0
      self._first = True
      self._last = self._last_cpu = None
      self._later_start = None
      self.later_epochs_seconds = self.later_epochs_cpu_seconds = 0.0

    def on_epoch_begin(self, epoch, logs=None):
      self._epoch, self._last, self._last_cpu = epoch, time.perf_counter(), time.process_time()
      self._first = True
      if epoch == 1:
        self._later_start = (self._last, self._last_cpu)

    def on_train_batch_end(self, batch, logs=None):
      now, now_cpu = time.perf_counter(), time.process_time()
      if self._epoch >= 1:
        self.step_seconds.append(now - self._last)
        self.cpu_seconds += now_cpu - self._last_cpu
        if self._first:
          self.first_cpu_seconds += now_cpu - self._last_cpu
      self._last, self._last_cpu, self._first = now, now_cpu, False

    def on_train_end(self, logs=None):
      self.trained_model = self.model
      if self._later_start is not None:
        self.later_epochs_seconds = time.perf_counter() - self._later_start[0]
        self.later_epochs_cpu_seconds = time.process_time() - self._later_start[1]

  return TrainTimer()


def _count_lists_and_examples(pattern: str) -> tuple[int, int]:
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import tensorflow_ranking as tfr  # pylint: disable=import-outside-toplevel
  from builders import movielens  # pylint: disable=import-outside-toplevel
  name, spec = movielens.LABEL_SPEC
  lists = examples = 0
  for serialized in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern)).batch(512):
    labels = tfr.data.parse_from_example_list(serialized, example_feature_spec={name: spec})[name]
    lists += int(labels.shape[0])
    examples += int(tf.reduce_sum(tf.cast(labels >= 0, tf.int32)))
  return lists, examples


def child_train(variant: str, seed: int, epochs: int | None, steps_per_epoch: int | None,
                data_dir: str | None, id_space: int | None, model_dir: str,
                with_baseline: bool = False, overrides: tuple[str, ...] = (),
                profile_steps: int = 0) -> dict:
  """Trains one variant ("sparse" or "dense"); returns metrics and examples/s.

  With `data_dir` (a synthetic data set), the item table of both variants has
  `id_space` rows and validation is one batch (metrics not reported). With
  `with_baseline`, also scores the item-mean-rating baseline on the validation
  split (MovieLens only). `overrides` are `--set` overrides of the config.
  With `profile_steps` > 0, the first that many steps of the second epoch are
  traced by tf.profiler and the result's "profile" holds their time by stage
  (step_profile.summarize).
  """
  import step_profile  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import tensorflow_ranking as tfr  # pylint: disable=import-outside-toplevel
  from builders import movielens, movielens_dense  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import config as config_lib  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import evaluation  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.keras import pipeline as pipeline_lib  # pylint: disable=import-outside-toplevel

  config = config_lib.load(str(CONFIG),
                           [*overrides, f"pipeline.model_dir={model_dir}", f"pipeline.seed={seed}"])
  if epochs is not None:
    config.pipeline.num_epochs = epochs
  synthetic = data_dir is not None

  class Ranker(movielens.MovieLensListwise):
    """The MovieLens ranker, with an item table of `id_space` rows on synthetic data."""

    def sparse_features(self, model):
      features, tables = super().sparse_features(model)
      if synthetic:
        tables = [
            dataclasses.replace(t, device_vocabulary_size=id_space) if t.name == "item" else t
            for t in tables
        ]
      return features, tables

  ranker = Ranker()
  if synthetic:
    paths = movielens.MovieLensPaths(str(pathlib.Path(data_dir) / "train.tfrecord"),
                                     str(pathlib.Path(data_dir) / "valid.tfrecord"),
                                     relevance=config.data.relevance)
  else:
    paths = ranker.prepare_data(config.data)
  num_lists, num_examples = _count_lists_and_examples(paths.train)
  batch = config.dataset.train_batch_size
  steps_per_epoch = steps_per_epoch or math.ceil(num_lists / batch)
  valid_lists, _ = _count_lists_and_examples(paths.valid)
  valid_steps = 1 if synthetic else math.ceil(valid_lists / config.dataset.valid_batch_size)
  # Both pipelines take exactly steps_per_epoch steps of `batch` lists (the
  # data repeats), so examples per step are batch * the mean list length.
  config.pipeline.num_train_steps = steps_per_epoch * config.pipeline.num_epochs
  config.pipeline.export_best_model = False
  timer = step_timer()
  callbacks = [timer]
  if profile_steps:
    profiler = step_profile.profile_callback(f"{model_dir}/profile", epoch=1, steps=profile_steps)
    callbacks.append(profiler)
  tf.keras.utils.set_random_seed(seed)
  features, tables = ranker.sparse_features(config.model)

  if variant == "sparse":
    if synthetic:
      config.pipeline.num_valid_steps = valid_steps

    class Pipeline(pipeline_lib.SimplePipeline):

      def build_callbacks(self, model):
        return callbacks

      def export_saved_model(self, model, export_to):
        return export_to

    model_builder = ranker.build_model_builder(config.model, seed)
    dataset_builder = ranker.build_dataset_builder(paths, config.dataset, config.model)
    metrics = Pipeline(model_builder, dataset_builder, config.pipeline).train_and_validate()
    metrics.pop("loss")
    table_rows = {t.name: t.device_vocabulary_size for t in tables}
  else:
    hparams = config.pipeline
    if hparams.sparse_learning_rate not in (None, hparams.learning_rate):
      raise ValueError("the dense twin has one optimizer: the config's sparse_learning_rate "
                       f"({hparams.sparse_learning_rate}) must be null or learning_rate")
    vocabularies = movielens_dense.table_vocabularies(paths.train, features, tables)
    if synthetic:  # The dense item table holds the whole id space.
      vocabularies["item"] = rank_to_id(np.arange(1, id_space + 1))
    table_rows = {name: len(ids) + 1 for name, ids in vocabularies.items()}  # + OOV row.
    model_builder = movielens_dense.DenseModelBuilder(config.model, vocabularies, features, tables,
                                                      seed=seed)
    dataset_builder = movielens_dense.build_dataset_builder(paths, config.dataset,
                                                            relevance=config.data.relevance)

    class Pipeline(tfr.keras.pipeline.SimplePipeline):

      def build_callbacks(self):
        return callbacks

      def export_saved_model(self, model, export_to, checkpoint=None):
        pass

    tfr_hparams = tfr.keras.pipeline.PipelineHparams(
        model_dir=model_dir, num_epochs=hparams.num_epochs, steps_per_epoch=steps_per_epoch,
        validation_steps=valid_steps, learning_rate=hparams.learning_rate, loss=hparams.loss,
        loss_reduction=hparams.loss_reduction, optimizer=hparams.optimizer,
        steps_per_execution=hparams.steps_per_execution, strategy=hparams.strategy)
    Pipeline(model_builder, dataset_builder, tfr_hparams).train_and_validate(verbose=0)
    model = timer.trained_model
    metrics = None
    if not synthetic:  # Same validation batches and labels as the sparse run's.
      valid = ranker.build_dataset_builder(paths, config.dataset,
                                           config.model).build_raw_valid_dataset()
      metrics = evaluation.evaluate_scores(
          valid, lambda f: model({k: f[k] for k in model.input_names}, training=False))

  baseline = None
  if with_baseline:
    valid = ranker.build_dataset_builder(paths, config.dataset,
                                         config.model).build_raw_valid_dataset()
    baseline = evaluation.evaluate_scores(valid, ranker.build_baseline(paths, config.data))
  examples_per_step = batch * num_examples / num_lists
  steps = timer.step_seconds
  return {
      "variant": variant,
      "baseline": baseline,
      "seed": seed,
      "metrics": None if synthetic else metrics,
      "steps": len(steps),
      "seconds": sum(steps),
      # The median step is robust to other processes' bursts on a shared machine.
      "examples_per_s": examples_per_step / statistics.median(steps),
      "examples_per_s_mean": len(steps) * examples_per_step / sum(steps),
      # Less sensitive to other processes than wall time: CPU work per example.
      "examples_per_cpu_s": len(steps) * examples_per_step / timer.cpu_seconds,
      # The same without each epoch's first step (which moves the iterator to
      # the next epoch's data: ours builds each epoch's seeded data inside one
      # stream, the dense pipeline repeats one dataset), and that first step's
      # mean CPU milliseconds.
      "examples_per_cpu_s_later_steps":
          (len(steps) - (config.pipeline.num_epochs - 1)) * examples_per_step /
          (timer.cpu_seconds - timer.first_cpu_seconds),
      "first_step_cpu_ms": 1000 * timer.first_cpu_seconds / (config.pipeline.num_epochs - 1),
      # Epochs 2..N whole (steps, validation, epoch starts), per epoch.
      "later_epoch_s": timer.later_epochs_seconds / (config.pipeline.num_epochs - 1),
      "later_epoch_cpu_s": timer.later_epochs_cpu_seconds / (config.pipeline.num_epochs - 1),
      "epochs": config.pipeline.num_epochs,
      "steps_per_epoch": steps_per_epoch,
      "examples_per_step": examples_per_step,
      "table_rows": table_rows,
      "profile": profiler.summary() if profile_steps else None
  }


# ----------------------------------------------------------------------------
# Driver.
# ----------------------------------------------------------------------------


def run_child(args: list[str], script: str = __file__) -> dict:
  """Runs `script --child ARGS` in a fresh process; returns its JSON result."""
  with tempfile.NamedTemporaryFile(suffix=".json") as out:
    cmd = [sys.executable, script, "--child", out.name, *args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
      raise RuntimeError(f"child {args} failed:\n{proc.stderr[-4000:]}")
    return json.loads(pathlib.Path(out.name).read_text())


def _mean_std(values):
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="smoke run, < 2 minutes")
  parser.add_argument("--json", help="also write the figures to this file")
  parser.add_argument(
      "--set", action="append", default=[], metavar="KEY=VALUE",
      help="override a value of the config in every trial, e.g. "
      "pipeline.strategy=null")
  parser.add_argument(
      "--only", choices=("movielens", "zipf", "book_crossing"),
      help="run only the MovieLens trials (1, 2) or the Zipf ones (3); "
      "book_crossing: benchmarks/bench_book_crossing.py instead (issue #36)")
  parser.add_argument(
      "--profile", type=int, default=0, metavar="STEPS",
      help="also trace STEPS steps of the second epoch of each MovieLens trial with "
      "tf.profiler and print where a step's time goes (step_profile.py)")
  parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    out, kind, *rest = args.child
    params = json.loads(rest[0]) if rest else {}
    result = {"train": child_train, "zipf_data": child_zipf_data}[kind](**params)
    pathlib.Path(out).write_text(json.dumps(result))
    return 0

  if args.only == "book_crossing":
    import bench_book_crossing  # pylint: disable=import-outside-toplevel
    return bench_book_crossing.main(["--json", args.json] if args.json else [])
  plan = QUICK if args.quick else FULL
  start = time.perf_counter()
  load = os.getloadavg()
  print(
      f"bench_pipeline ({'quick' if args.quick else 'full'}): {os.cpu_count()} CPUs, "
      f"load average {load[0]:.1f} at start", flush=True)
  results: dict = {
      "plan": dataclasses.asdict(plan), "overrides": args.set, "movielens": [], "zipf": []
  }
  with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as tmp:
    for seed in plan.seeds if args.only != "zipf" else ():
      for variant in ("sparse", "dense"):
        first = not results["movielens"]
        r = run_child([
            "train",
            json.dumps({
                "variant": variant, "seed": seed, "epochs": plan.epochs, "steps_per_epoch": None,
                "data_dir": None, "id_space": None, "model_dir": f"{tmp}/ml_{variant}_{seed}",
                "with_baseline": first, "overrides": args.set, "profile_steps": args.profile
            })
        ])
        if first:
          results["baseline"] = r["baseline"]
        results["movielens"].append(r)
        print(
            f"  movielens seed {seed} {variant:>6}: ndcg@10 {r['metrics']['ndcg@10']:.4f}  "
            f"{r['examples_per_s']:,.0f} examples/s", flush=True)
    for id_space in plan.id_spaces if args.only != "movielens" else ():
      data_dir = f"{tmp}/zipf_{id_space}"
      info = run_child([
          "zipf_data",
          json.dumps({
              "out_dir": data_dir, "id_space": id_space, "num_lists": plan.zipf_lists,
              "list_size": plan.zipf_list_size
          })
      ])
      row = {"id_space": id_space, **info}
      for variant in ("sparse", "dense"):
        r = run_child([
            "train",
            json.dumps({
                "variant": variant, "seed": 1, "epochs": plan.zipf_epochs,
                "steps_per_epoch": plan.zipf_steps_per_epoch, "data_dir": data_dir,
                "id_space": id_space, "model_dir": f"{tmp}/zipf_{variant}_{id_space}",
                "overrides": args.set
            })
        ])
        row[variant] = r
      results["zipf"].append(row)
      print(
          f"  zipf N={id_space:>9,}: sparse {row['sparse']['examples_per_s']:,.0f}  "
          f"dense {row['dense']['examples_per_s']:,.0f} examples/s", flush=True)
  results["seconds"] = time.perf_counter() - start
  results["load_average_end"] = os.getloadavg()[0]
  report(results)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
  return 0


def report(results: dict) -> None:
  """Prints the summary and each goal's status."""
  if results["overrides"]:
    print(f"\nconfig overrides: {results['overrides']}")
  if results["movielens"]:
    _report_movielens(results)
    if results["movielens"][0]["profile"]:
      _report_profile(results["movielens"])
  if results["zipf"]:
    _report_zipf(results["zipf"])
  print(f"\n{results['seconds']:.0f} s; load average {results['load_average_end']:.1f} at end")


def _report_movielens(results: dict) -> None:
  by_variant = {
      v: [r for r in results["movielens"] if r["variant"] == v] for v in ("sparse", "dense")
  }
  print("\n== 1. Quality: validation metrics (whole split), mean ± stdev over seeds "
        f"{[r['seed'] for r in by_variant['sparse']]}")
  keys = list(results["baseline"])
  print(f"{'':<28}" + "".join(f"{k:>16}" for k in keys))
  for name, runs in (("ours (sparse core)", by_variant["sparse"]), ("stock tfr (dense Embedding)",
                                                                    by_variant["dense"])):
    cells = []
    for k in keys:
      mean, std = _mean_std([r["metrics"][k] for r in runs])
      cells.append(f"{mean:.4f} ± {std:.4f}")
    print(f"{name:<28}" + "".join(f"{c:>16}" for c in cells))
  print(f"{'item-mean baseline':<28}" + "".join(f"{results['baseline'][k]:>16.4f}" for k in keys))
  ours = statistics.mean(r["metrics"]["ndcg@10"] for r in by_variant["sparse"])
  dense = statistics.mean(r["metrics"]["ndcg@10"] for r in by_variant["dense"])
  diff = ours - dense
  print(f"NDCG@10 ours - dense = {diff:+.4f} (goal |diff| <= {NDCG_GOAL}): "
        f"{'met' if abs(diff) <= NDCG_GOAL else 'NOT met'}")
  print(f"NDCG@10 ours - item-mean baseline = {ours - results['baseline']['ndcg@10']:+.4f}, "
        f"dense - baseline = {dense - results['baseline']['ndcg@10']:+.4f}")

  print("\n== 2. Throughput at MovieLens scale: training examples/s (median step), "
        "median over seeds")
  rate = {v: statistics.median(r["examples_per_s"] for r in runs) for v, runs in by_variant.items()}
  cpu = {
      v: statistics.median(r["examples_per_cpu_s"] for r in runs) for v, runs in by_variant.items()
  }
  later = {
      v: statistics.median(r["examples_per_cpu_s_later_steps"] for r in runs)
      for v, runs in by_variant.items()
  }
  first = {
      v: statistics.median(r["first_step_cpu_ms"] for r in runs) for v, runs in by_variant.items()
  }
  ratio = rate["sparse"] / rate["dense"]
  for v, name in (("sparse", "ours"), ("dense", "dense")):
    per_seed = ", ".join(f"{r['examples_per_s']:,.0f}" for r in by_variant[v])
    print(f"{name:>6}: {rate[v]:>9,.0f} examples/s  ({per_seed});  "
          f"{cpu[v]:,.0f} examples per CPU-second ({later[v]:,.0f} without the epochs' first "
          f"steps, which take {first[v]:.0f} ms of CPU each)")
  print(f"ours / dense = {ratio:.2f}x (goal >= {THROUGHPUT_GOAL}x): "
        f"{'met' if ratio >= THROUGHPUT_GOAL else 'NOT met'};  "
        f"by CPU time {cpu['sparse'] / cpu['dense']:.2f}x "
        f"({later['sparse'] / later['dense']:.2f}x without the epochs' first steps)")
  epoch_s = {
      v: statistics.median(r["later_epoch_s"] for r in runs) for v, runs in by_variant.items()
  }
  epoch_cpu = {
      v: statistics.median(r["later_epoch_cpu_s"] for r in runs) for v, runs in by_variant.items()
  }
  print(f"whole epochs after the first (steps, validation, epoch starts), median over seeds: "
        f"ours {epoch_s['sparse']:.2f} s ({epoch_cpu['sparse']:.2f} CPU-s), dense "
        f"{epoch_s['dense']:.2f} s ({epoch_cpu['dense']:.2f} CPU-s) per epoch")


def _report_profile(runs: list[dict]) -> None:
  """Per-step milliseconds by stage of each variant, mean over its traced trials."""
  import step_profile  # pylint: disable=import-outside-toplevel
  by_variant = {v: [r["profile"] for r in runs if r["variant"] == v] for v in ("sparse", "dense")}
  steps = sum(p["steps"] for p in by_variant["sparse"])
  print(f"\n== Where a step's time goes (tf.profiler, {steps} steps of epoch 2 per variant "
        "over the seeds): ms per step; op times summed over threads")
  print(f"{'':<22}{'ours':>10}{'dense':>10}")

  rows = [(stage, lambda p, stage=stage: p["stages"][stage]) for stage in step_profile.STAGES]
  rows += [(label, lambda p, key=key: p[key])
           for label, key in (("all ops", "op_ms"), ("step waits for input", "input_wait_ms"),
                              ("step wall (median)", "wall_ms"))]
  for label, get in rows:
    cells = [statistics.mean(get(p) for p in by_variant[v]) for v in ("sparse", "dense")]
    print(f"{label:<22}" + "".join(f"{c:>10.2f}" for c in cells))
  for v, name in (("sparse", "ours"), ("dense", "dense")):
    # An op missing from a trial's top list counts 0 there.
    totals = collections.Counter()
    for p in by_variant[v]:
      for stage, op, ms in p["top_ops"]:
        totals[(stage, op)] += ms / len(by_variant[v])
    print(f"\nlargest ops of {name} (ms per step, mean over its trials):")
    for (stage, op), ms in totals.most_common(PROFILE_TOP_OPS):
      print(f"  {ms:>7.2f}  {stage:<18} {op}")


def _report_zipf(rows: list[dict]) -> None:
  print("\n== 3. Crossover: Zipf(1.1) item ids, both item tables sized to the id space N")
  print(f"{'N':>10} {'distinct in train':>18} {'ours ex/s':>12} {'dense ex/s':>12} "
        f"{'ratio':>7} {'by CPU':>7}")
  for row in rows:
    s, d = row["sparse"], row["dense"]
    print(f"{row['id_space']:>10,} {row['distinct_train_items']:>18,} "
          f"{s['examples_per_s']:>12,.0f} {d['examples_per_s']:>12,.0f} "
          f"{s['examples_per_s'] / d['examples_per_s']:>6.2f}x "
          f"{s['examples_per_cpu_s'] / d['examples_per_cpu_s']:>6.2f}x")


if __name__ == "__main__":
  sys.exit(main())
