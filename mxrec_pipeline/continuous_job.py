"""The job of `mxrec-pipeline train CONFIG --continuous` (docs/continuous.md).

`train_continuous(config)` builds the config's ranker as `jobs.train` does,
then hands keras/continuous.ContinuousTrainer what is specific to the task:
the dataset builder of a partition (`RankerBuilder.partition_paths`: its ELWC
files are both splits) and the baseline, rebuilt from the partitions trained
so far and scored on the new partition before the model trains on it, as
the model is: an item-mean baseline adds each partition once
(`RankerBuilder.baseline_means`), any other is rebuilt by `build_baseline`.
The model_dir is claimed for the run (jobs.claim) and its resolved config
written, as `jobs.train` does.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import tensorflow as tf
import yaml

import builders
from mxrec_pipeline import config as config_lib
from mxrec_pipeline import evaluation
from mxrec_pipeline import jobs
from mxrec_pipeline.data import partitions as partitions_lib
from mxrec_pipeline.keras import continuous
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import model_files


def train_continuous(
    config: config_lib.JobConfig, verbose: int = 0, fresh: bool = False,
    callbacks: Sequence[tf.keras.callbacks.Callback] = ()) -> dict:
  """Trains `config` on its partitions as they arrive; see keras/continuous.py.

  Args:
    config: The job; its `continuous` section says where the partitions are
      and how to poll, stop and export.
    verbose: Keras fit verbosity.
    fresh: Start over: first remove an earlier run's outputs
      (jobs.clear_run_outputs, metrics.jsonl included).
    callbacks: Extra Keras callbacks of each partition's model.fit.

  Returns:
    ContinuousTrainer.run's summary.

  Raises:
    As ContinuousTrainer.run; FileExistsError: another job holds model_dir.
  """
  model_dir = config.pipeline.model_dir
  with jobs.claim(config):
    if fresh:
      for path in jobs.clear_run_outputs(model_dir):
        print(f"--fresh: removed {path}", flush=True)
    tf.io.gfile.makedirs(model_dir)
    model_files.write_text_atomically(os.path.join(model_dir, jobs.RESOLVED_CONFIG),
                                      yaml.safe_dump(config.to_dict(), sort_keys=False))
    ranker = builders.get_builder(config.builder)

    def partition_data(partition: partitions_lib.Partition):
      paths = ranker.partition_paths(partition.data_pattern, config.data)
      data = ranker.build_dataset_builder(paths, config.dataset, config.model)
      data.skip_lists_without_relevant = config.metrics.skip_queries_without_relevant
      return data

    score_baseline = _Baseline(ranker, config)
    # The pipeline's own builder gives the features' specs (export) and the sparse features;
    # every partition's batches come from its own builder.
    specs_only = dataclasses.replace(
        ranker.partition_paths(
            os.path.join(config.continuous.partitions_dir or "", "*", partitions_lib.DATA_GLOB),
            config.data), valid_list_size=1)
    pipeline = pipeline_lib.SimplePipeline(
        ranker.build_model_builder(config.model, config.pipeline.seed),
        ranker.build_dataset_builder(specs_only, config.dataset, config.model), config.pipeline,
        run_config=config.to_dict())
    trainer = continuous.ContinuousTrainer(pipeline, config.continuous, partition_data,
                                           score_baseline, callbacks=callbacks, verbose=verbose)
    return trainer.run()


class _Baseline:
  """The job's baseline over the partitions trained so far, scored on a partition's lists."""

  def __init__(self, ranker, config: config_lib.JobConfig):
    self._ranker = ranker
    self._data_config = config.data
    self._means = ranker.baseline_means(config.data)
    self._added: set[str] = set()  # Partitions in `_means`.

  def __call__(self, data, trained: Sequence[partitions_lib.Partition]) -> dict | None:
    """RANKING_METRICS of the baseline on `data`'s validation lists; None before any partition."""
    if not trained:
      return None  # Nothing to build it from yet.
    try:
      score = self._scorer(trained)
    except ValueError:  # e.g. no rated item yet.
      return None
    return evaluation.evaluate_scores(data.build_raw_valid_dataset(), score)

  def _scorer(self, trained: Sequence[partitions_lib.Partition]):
    if self._means is None:
      patterns = [p.data_pattern for p in trained]
      paths = self._ranker.partition_paths(patterns[0], self._data_config)
      return self._ranker.build_baseline(dataclasses.replace(paths, train=patterns),
                                         self._data_config)
    for partition in trained:
      if partition.name not in self._added:
        self._means.add(partition.data_pattern)
        self._added.add(partition.name)
    return self._means.scorer()
