"""Benchmark of the Book-Crossing job against what a stock TF-Ranking user would write.

Issue #36, item 3 (its first part): configs/book_crossing_listwise.yaml
trained by our pipeline (sparse-core tables, lazy Adam; builders/book_crossing.py)
against the same model on stock TF-Ranking, on the same ELWC files, with the
same features, scorer, loss, labels, batch size, learning rate and epochs:

  (a) "dense_adam": every table a `tf.keras.layers.Embedding` indexed by a
      `StringLookup` / `IntegerLookup` over the training split's ids
      (builders/movielens_dense.py's `DenseTable` and `table_vocabularies`),
      one Keras Adam for every variable (dense slots: every row's m and v
      decay each step), trained by `tfr.keras.pipeline.SimplePipeline`;
  (b) "dense_adagrad": the same with Keras Adagrad (sparse updates of the
      Embedding rows through IndexedSlices), at its own learning rate
      (ADAGRAD_LEARNING_RATE: one untuned setting, not a search);
  (c) "hashing_adagrad": (b) without vocabularies: each table a
      `tf.keras.layers.Hashing` into HASHING_BINS_PER_ID x its distinct
      training ids bins (one setting, not a search), then an Embedding
      (builders/movielens_dense.HashedTable).

Beside them, "sparse_tiered": ours with each table's device rows at 10 % of its
rows, 20 % in host memory and the rest on SSD (TIERED; docs/tiers.md), against
which the tiered peak RSS and examples/s are compared with ours all on the device.

Per variant, each in its own child process (so peak RSS does not mix):
training examples/s (batch x mean list length / median step wall time,
steps after the first WARMUP_STEPS; and over every step), process CPU
seconds of the training steps and of the whole child (resource.getrusage),
peak RSS of the child, bytes of the training checkpoint (weights and
optimizer slots: ours its `checkpoints` directory, stock a
`tf.train.Checkpoint(model, optimizer)` written after training), bytes of the
exported SavedModel (`export/latest_model`, each pipeline's own export) and
validation NDCG@10 (whole validation split), and for (a) and (b) the bytes
of the vocabulary files their checkpoints need to resume (`write_vocabularies`;
ours saves its keys in the checkpoint). Ratios against the sparse core
and the issue's goals are printed at the end.

Usage:
  python benchmarks/bench_book_crossing.py                 # seed 1, all variants (~10 min)
  python benchmarks/bench_book_crossing.py --seeds 1 2 3
  python benchmarks/bench_book_crossing.py --variants sparse dense_adam --json out.json
  python benchmarks/bench_book_crossing.py --variants sparse --profile 30   # where a step goes
  python benchmarks/bench_book_crossing.py --variants sparse sparse_tiered   # host and SSD tiers
  python benchmarks/bench_pipeline.py --only book_crossing  # the same, through bench_pipeline
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import resource
import statistics
import sys
import tempfile
import time

from bench_pipeline import run_child

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "book_crossing_listwise.yaml"
VARIANTS = ("sparse", "sparse_tiered", "dense_adam", "dense_adagrad", "hashing_adagrad")
OURS = ("sparse", "sparse_tiered")
# "sparse_tiered": ours with each table's device rows at 10 % of its rows, 20 % in host memory and
# the rest on SSD (model.device_fraction / host_fraction; docs/tiers.md).
TIERED = ("model.device_fraction=0.1", "model.host_fraction=0.2")
TIERED_RSS_GOAL = 0.5  # tiered peak RSS / all on the device, at most (issue #36).
WARMUP_STEPS = 20  # Steps left out of the median (tracing, first inserts).
ADAGRAD_LEARNING_RATE = 0.05  # (b)'s learning rate: Adagrad needs a larger one than Adam.
HASHING_BINS_PER_ID = 2.0  # (c)'s bins per distinct training id of a table.

# Issue #36's goals.
SPEEDUP_VS_ADAM = 3.0  # ours / (a) examples/s, at least.
SPEEDUP_VS_SPARSE_UPDATES = 1.0  # ours / (b) examples/s, at least.


def _rusage_cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def _bytes_under(path: str) -> int:
  return sum(p.stat().st_size for p in pathlib.Path(path).rglob("*") if p.is_file())


def write_vocabularies(vocabularies: dict[str, list], directory: str) -> int:
  """Writes each table's vocabulary as a StringLookup vocabulary file; returns their bytes.

  What a stock user keeps beside (a)'s or (b)'s checkpoint to resume it: the
  checkpoint holds the Embedding rows and slots by vocabulary index, not the
  ids (Keras' lookup layers leave their tables out of `tf.train.Checkpoint`),
  so the rows mean nothing without the id of each index. Ours saves the keys
  in the checkpoint. One id per line, as `StringLookup(vocabulary=path)` reads.
  """
  os.makedirs(directory, exist_ok=True)
  for name, ids in vocabularies.items():
    with open(os.path.join(directory, f"{name}.txt"), "wb") as f:
      f.writelines((i if isinstance(i, bytes) else str(i).encode()) + b"\n" for i in ids)
  return _bytes_under(directory)


def _step_timer():
  """A Keras callback: each training step's wall time and the steps' CPU time."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  class StepTimer(tf.keras.callbacks.Callback):
    """Wall seconds of each training step; CPU seconds from the first step to the last."""

    def __init__(self):
      super().__init__()
      self.step_seconds: list[float] = []
      self.cpu_start = self.cpu_end = 0.0
      self._last = None

    def on_epoch_begin(self, epoch, logs=None):
      self._last = time.perf_counter()
      if epoch == 0:
        self.cpu_start = _rusage_cpu()

    def on_train_batch_end(self, batch, logs=None):
      now = time.perf_counter()
      self.step_seconds.append(now - self._last)
      self._last = now
      self.cpu_end = _rusage_cpu()

    def on_train_end(self, logs=None):
      self.trained_model = self.model

  return StepTimer()


def child_train(variant: str, seed: int, model_dir: str, profile_steps: int = 0) -> dict:
  """Trains one variant on the Book-Crossing job; returns its figures.

  With `profile_steps` > 0 (ours only), that many steps after WARMUP_STEPS are
  traced by tf.profiler and the result's "profile" holds their time by stage
  (step_profile.summarize); the traced steps run slower, so such a run's
  examples/s are not figures.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import tensorflow_ranking as tfr  # pylint: disable=import-outside-toplevel
  from bench_pipeline import _count_lists_and_examples  # pylint: disable=import-outside-toplevel
  from builders import book_crossing, movielens_dense  # pylint: disable=import-outside-toplevel
  from builders.base import MASK_FEATURE  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import config as config_lib  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import evaluation  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.data import book_crossing_lists  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.keras import pipeline as pipeline_lib  # pylint: disable=import-outside-toplevel

  overrides = [f"pipeline.model_dir={model_dir}", f"pipeline.seed={seed}"]
  if variant == "sparse_tiered":
    os.makedirs(os.path.join(model_dir, "ssd"), exist_ok=True)
    overrides += [*TIERED, f"model.ssd_data_path=[{os.path.join(model_dir, 'ssd')}]"]
  config = config_lib.load(str(CONFIG), overrides)
  hparams = config.pipeline
  hparams.export_best_model = False  # Both: one export, the pipeline's final one.
  ranker = book_crossing.BookCrossingListwise()
  paths = ranker.prepare_data(config.data)
  stats = json.loads((pathlib.Path(paths.train).parent /
                      book_crossing_lists.STATS_FILE).read_text(encoding="utf-8"))
  num_lists, num_examples = stats["train"]["lists"], stats["train"]["examples"]
  batch = config.dataset.train_batch_size
  steps_per_epoch = math.ceil(num_lists / batch)
  timer = _step_timer()
  tf.keras.utils.set_random_seed(seed)
  features, tables = ranker.sparse_features(config.model)
  checkpoint_dir = os.path.join(model_dir, "checkpoints")
  export_dir = os.path.join(model_dir, "export", "latest_model")
  table_rows = None
  vocabulary_bytes = 0

  if variant in OURS:

    profiler = None
    if profile_steps:
      import step_profile  # pylint: disable=import-outside-toplevel
      profiler = step_profile.profile_callback(f"{model_dir}/profile", epoch=0, steps=profile_steps,
                                               skip=WARMUP_STEPS)

    class Pipeline(pipeline_lib.SimplePipeline):

      def build_callbacks(self, model):
        return super().build_callbacks(model) + [timer] + ([profiler] if profiler else [])

    model_builder = ranker.build_model_builder(config.model, seed)
    dataset_builder = ranker.build_dataset_builder(paths, config.dataset, config.model)
    metrics = Pipeline(model_builder, dataset_builder, hparams).train_and_validate()
    metrics.pop("loss")
  else:
    optimizer, learning_rate = {
        "dense_adam": ("adam", hparams.learning_rate),
        "dense_adagrad": ("adagrad", ADAGRAD_LEARNING_RATE),
        "hashing_adagrad": ("adagrad", ADAGRAD_LEARNING_RATE)
    }[variant]
    context, example = ranker.model_feature_specs(config.model)
    vocabularies = movielens_dense.table_vocabularies(paths.train, features, tables,
                                                      ranker.feature_specs()[:2])
    if variant == "hashing_adagrad":
      table_rows = {
          name: max(1, round(HASHING_BINS_PER_ID * len(ids))) for name, ids in vocabularies.items()
      }
      layers = {
          t.name: movielens_dense.HashedTable(t, table_rows[t.name], seed, name=f"hashed_{t.name}")
          for t in tables
      }
    else:
      table_rows = {name: len(ids) + 1 for name, ids in vocabularies.items()}  # + OOV row.
      vocabulary_bytes = write_vocabularies(vocabularies, os.path.join(model_dir, "vocabulary"))
      layers = {
          t.name: movielens_dense.DenseTable(t, vocabularies[t.name], seed, name=f"dense_{t.name}")
          for t in tables
      }

    def embed(feature):
      return lambda ids: layers[feature.table](ids, combiner=feature.combiner)

    spec = {f.name: embed(f) for f in features}
    statistics_features = (book_crossing_lists.STATISTICS_FEATURES
                           if config.model.rating_statistics else ())
    spec.update({k: book_crossing.PREPROCESS_SPEC[k] for k in statistics_features})
    sparse_builder = ranker.build_model_builder(config.model, seed)
    model_builder = tfr.keras.model.ModelBuilder(
        input_creator=tfr.keras.model.FeatureSpecInputCreator(context, example),
        preprocessor=tfr.keras.model.PreprocessorWithSpec(spec),
        scorer=sparse_builder._scorer,  # pylint: disable=protected-access
        mask_feature_name=MASK_FEATURE,
        name="book_crossing_listwise_dense")
    dataset_builder = tfr.keras.pipeline.SimpleDatasetBuilder(
        context, example, MASK_FEATURE, book_crossing.LABEL_SPEC,
        tfr.keras.pipeline.DatasetHparams(train_input_pattern=paths.train,
                                          valid_input_pattern=paths.valid, train_batch_size=batch,
                                          valid_batch_size=config.dataset.valid_batch_size,
                                          list_size=config.dataset.list_size,
                                          valid_list_size=paths.valid_list_size))

    class Pipeline(tfr.keras.pipeline.SimplePipeline):

      def build_callbacks(self):
        return super().build_callbacks() + [timer]

    valid_lists, _ = _count_lists_and_examples(paths.valid)
    tfr_hparams = tfr.keras.pipeline.PipelineHparams(
        model_dir=model_dir, num_epochs=hparams.num_epochs, steps_per_epoch=steps_per_epoch,
        validation_steps=math.ceil(valid_lists / config.dataset.valid_batch_size),
        learning_rate=learning_rate, loss=hparams.loss, loss_reduction=hparams.loss_reduction,
        optimizer=optimizer, steps_per_execution=hparams.steps_per_execution,
        strategy=hparams.strategy, export_best_model=False)
    Pipeline(model_builder, dataset_builder, tfr_hparams).train_and_validate(verbose=0)
    model = timer.trained_model
    # What resumes training: the weights and the optimizer's slots.
    tf.train.Checkpoint(model=model,
                        optimizer=model.optimizer).write(os.path.join(checkpoint_dir, "ckpt"))
    valid = ranker.build_dataset_builder(paths, config.dataset,
                                         config.model).build_raw_valid_dataset()
    # In a tf.function: eager calls take about 1 s per batch here.
    score = tf.function(lambda f: model({k: f[k] for k in model.input_names}, training=False),
                        reduce_retracing=True)
    metrics = evaluation.evaluate_scores(valid, score)

  examples_per_step = batch * num_examples / num_lists
  steps = timer.step_seconds
  timed = steps[WARMUP_STEPS:]
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return {
      "variant": variant,
      "seed": seed,
      "metrics": metrics,
      "steps": len(steps),
      "examples_per_s": examples_per_step / statistics.median(timed),
      "examples_per_s_all_steps": len(steps) * examples_per_step / sum(steps),
      "train_steps_seconds": sum(steps),
      "train_cpu_seconds": timer.cpu_end - timer.cpu_start,
      "process_cpu_seconds": usage.ru_utime + usage.ru_stime,
      "peak_rss_bytes": usage.ru_maxrss * 1024,  # Linux: kilobytes.
      "checkpoint_bytes": _bytes_under(checkpoint_dir),
      # The ids a stock checkpoint's rows need to resume (write_vocabularies); ours: 0, the keys
      # are in its checkpoint.
      "vocabulary_bytes": vocabulary_bytes,
      "export_bytes": _bytes_under(export_dir),
      "examples_per_step": examples_per_step,
      "table_rows": table_rows,
      "profile": profiler.summary() if variant == "sparse" and profile_steps else None,
  }


def report(runs: list[dict], seconds: float) -> None:
  """Prints the table, the ratios against the sparse core and each goal's status."""
  variants = [v for v in VARIANTS if any(r["variant"] == v for r in runs)]
  by_variant = {v: [r for r in runs if r["variant"] == v] for v in variants}

  def mean(v, key):
    return statistics.mean(r[key] for r in by_variant[v])

  def ndcg(v):
    return statistics.mean(r["metrics"]["ndcg@10"] for r in by_variant[v])

  seeds = sorted({r["seed"] for r in runs})
  print(f"\n== Book-Crossing: ours vs stock TF-Ranking, seeds {seeds} (mean over seeds)")
  header = (f"{'variant':<15}{'ex/s (median)':>14}{'ex/s (all)':>12}{'train CPU s':>12}"
            f"{'proc CPU s':>11}{'peak RSS MB':>12}{'ckpt MB':>9}{'export MB':>10}{'NDCG@10':>9}")
  print(header)
  for v in variants:
    print(f"{v:<15}{mean(v, 'examples_per_s'):>14,.0f}{mean(v, 'examples_per_s_all_steps'):>12,.0f}"
          f"{mean(v, 'train_cpu_seconds'):>12.1f}{mean(v, 'process_cpu_seconds'):>11.1f}"
          f"{mean(v, 'peak_rss_bytes') / 1e6:>12.0f}{mean(v, 'checkpoint_bytes') / 1e6:>9.1f}"
          f"{mean(v, 'export_bytes') / 1e6:>10.1f}{ndcg(v):>9.4f}")
  if "sparse" in by_variant and "sparse_tiered" in by_variant:
    rss = mean("sparse_tiered", "peak_rss_bytes") / mean("sparse", "peak_rss_bytes")
    speed = mean("sparse_tiered", "examples_per_s") / mean("sparse", "examples_per_s")
    print(
        f"\ntiered ({', '.join(TIERED)}, the rest on SSD) / all on the device: peak RSS "
        f"{rss:.2f}x (goal <= {TIERED_RSS_GOAL}x: {'met' if rss <= TIERED_RSS_GOAL else 'NOT met'})"
        f", examples/s {speed:.2f}x, NDCG@10 {ndcg('sparse_tiered') - ndcg('sparse'):+.4f}")
  variants = [v for v in variants if v != "sparse_tiered"]
  if "sparse" not in by_variant or len(variants) < 2:
    print(f"\n{seconds:.0f} s")
    return
  print("\nratios ours / stock (examples/s: higher is better; CPU, RSS, bytes: lower is better)")
  print(f"{'vs':<15}{'ex/s':>8}{'ex/s all':>10}{'train CPU':>11}{'peak RSS':>10}{'ckpt':>8}"
        f"{'export':>8}{'dNDCG@10':>10}")
  for v in variants[1:]:
    cells = [
        mean("sparse", k) / mean(v, k)
        for k in ("examples_per_s", "examples_per_s_all_steps", "train_cpu_seconds",
                  "peak_rss_bytes", "checkpoint_bytes", "export_bytes")
    ]
    print(f"{v:<15}" + "".join(f"{c:>{w}.2f}x" for c, w in zip(cells, (7, 9, 10, 9, 7, 7))) +
          f"{ndcg('sparse') - ndcg(v):>+10.4f}")
  print("\ngoals (issue #36):")
  stock = variants[1:]
  if "dense_adam" in by_variant:
    ratio = mean("sparse", "examples_per_s") / mean("dense_adam", "examples_per_s")
    print(f"  examples/s ours / (a) dense_adam = {ratio:.2f}x (goal >= {SPEEDUP_VS_ADAM}x): "
          f"{'met' if ratio >= SPEEDUP_VS_ADAM else 'NOT met'}")
  fastest = [v for v in ("dense_adagrad", "hashing_adagrad") if v in by_variant]
  if fastest:
    fastest = max(fastest, key=lambda v: mean(v, "examples_per_s"))
    ratio = mean("sparse", "examples_per_s") / mean(fastest, "examples_per_s")
    print(f"  examples/s ours / fastest of (b), (c) ({fastest}) = {ratio:.2f}x "
          f"(goal >= {SPEEDUP_VS_SPARSE_UPDATES}x): "
          f"{'met' if ratio >= SPEEDUP_VS_SPARSE_UPDATES else 'NOT met'}")
  best = max(stock, key=ndcg)
  print(f"  NDCG@10 ours {ndcg('sparse'):.4f} vs best stock ({best}) {ndcg(best):.4f}: "
        f"{'met' if ndcg('sparse') >= ndcg(best) else 'NOT met'} (goal: at least)")
  for key, label in (("checkpoint_bytes", "checkpoint"), ("export_bytes", "export")):
    smallest = min(mean(v, key) for v in stock)
    print(f"  {label} ours {mean('sparse', key) / 1e6:.1f} MB vs smallest stock "
          f"{smallest / 1e6:.1f} MB: {'met' if mean('sparse', key) <= smallest else 'NOT met'} "
          "(goal: no larger)")
  # What resumes a run: ours holds its keys, a stock checkpoint needs its vocabulary files too.
  resumable = {v: mean(v, "checkpoint_bytes") + mean(v, "vocabulary_bytes") for v in variants}
  print("  checkpoint + the vocabulary it needs to resume: " +
        ", ".join(f"{v} {resumable[v] / 1e6:.1f} MB" for v in variants) +
        f": {'met' if resumable['sparse'] <= min(resumable[v] for v in stock) else 'NOT met'} "
        "(no larger than the smallest stock)")
  print(f"\n{seconds:.0f} s; load average {os.getloadavg()[0]:.1f} at end")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[1])
  parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
  parser.add_argument("--json", help="also write the figures to this file")
  parser.add_argument(
      "--profile", type=int, default=0, metavar="STEPS",
      help="trace STEPS steps of ours after the warm-up with tf.profiler and print where a "
      "step's time goes (step_profile.py); that run's examples/s are not figures")
  parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    out, _, params = args.child
    pathlib.Path(out).write_text(json.dumps(child_train(**json.loads(params))))
    return 0
  start = time.perf_counter()
  print(
      f"bench_book_crossing: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
      "at start", flush=True)
  runs = []
  with tempfile.TemporaryDirectory(prefix="bench_book_crossing_") as tmp:
    for seed in args.seeds:
      for variant in args.variants:
        params = {
            "variant": variant, "seed": seed, "model_dir": f"{tmp}/{variant}_{seed}",
            "profile_steps": args.profile if variant == "sparse" else 0
        }
        r = run_child(["train", json.dumps(params)], script=__file__)
        runs.append(r)
        print(
            f"  seed {seed} {variant:>13}: ndcg@10 {r['metrics']['ndcg@10']:.4f}  "
            f"{r['examples_per_s']:,.0f} examples/s  peak RSS {r['peak_rss_bytes'] / 1e6:,.0f} MB",
            flush=True)
  report(runs, time.perf_counter() - start)
  for r in runs:
    if r.get("profile"):
      profile = r["profile"]
      print(f"\nseed {r['seed']} {r['variant']}: {profile['steps']} traced steps, wall "
            f"{profile['wall_ms']:.1f} ms (median), op time by stage (ms per step):")
      for stage, ms in profile["stages"].items():
        print(f"  {stage:<20}{ms:>7.2f}")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(runs, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
