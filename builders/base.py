"""RankerBuilder: a ready-made ranking task the CLI and sweeps can run.

A task bundles what TF-Ranking users otherwise wire by hand: where the data
comes from, the ELWC feature specs, the sparse id features and their tables,
the model builder, the dataset builder and a simple baseline scored on the same
validation split. Subclasses implement the abstract methods; see
builders/movielens.py for a complete one.

  class MyRanker(RankerBuilder):
    name = "my_ranker"
    DataConfig = MyDataConfig      # dataclasses, validated from YAML
    ModelConfig = MyModelConfig

    def prepare_data(self, data): ...          # -> DataPaths
    def feature_specs(self): ...               # -> (context, example, label_spec)
    def sparse_features(self, model): ...      # -> (features, tables)
    def build_model_builder(self, model, seed): ...
    def build_baseline(self, paths, data): ... # -> features -> scores
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable, ClassVar, Mapping

import tensorflow as tf
import tensorflow_ranking as tfr

from builders.base_config import DatasetConfig
from mxrec_pipeline.data import elwc
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.keras.layers import SparseFeature, TableSpec

MASK_FEATURE = "example_list_mask"


@dataclasses.dataclass(frozen=True)
class DataPaths:
  """ELWC TFRecord file patterns of a task's splits.

  Attributes:
    train: File pattern of the training ELWC TFRecords.
    valid: File pattern of the validation ELWC TFRecords.
    bad_records: Per split ("train", "valid"), what converting its source
      skipped (`mxrec_pipeline.data.validation.BadRecords.report()`); empty
      for data that was not converted. Logged and written to metrics.json.
    valid_list_size: Examples of the longest validation list, when the
      builder knows it (e.g. from converting the data); None:
      `build_dataset_builder` reads the validation files to find it.
    holdout: File pattern of training lists held out to validate on while
      training, for early stopping (`pipeline.early_stopping`; the lists are
      also in `train`), or None: the builder holds none out.
    train_without_holdout: File pattern of the training lists that are not
      in `holdout` (None with it).
  """

  train: str
  valid: str
  bad_records: Mapping[str, dict] = dataclasses.field(default_factory=dict, compare=False)
  valid_list_size: int | None = None
  holdout: str | None = None
  train_without_holdout: str | None = None

  def for_selection(self) -> "DataPaths":
    """These paths with `train_without_holdout` to train on and `holdout` to validate on.

    Raises:
      ValueError: no holdout.
    """
    if self.holdout is None or self.train_without_holdout is None:
      raise ValueError("these data paths hold no training lists out")
    return dataclasses.replace(self, train=self.train_without_holdout, valid=self.holdout,
                               valid_list_size=None, holdout=None, train_without_holdout=None)


class RankerBuilder(abc.ABC):
  """A ranking task: data, features, model, baseline. See the module docstring."""

  name: ClassVar[str]
  DataConfig: ClassVar[type]
  ModelConfig: ClassVar[type]

  @abc.abstractmethod
  def prepare_data(self, data) -> DataPaths:
    """Fetches and converts the data to ELWC if needed; returns its paths.

    Conversion checks every value once (mxrec_pipeline.data.validation,
    `data.on_bad_record`); the job CRC-checks the ELWC files before training.
    """

  @abc.abstractmethod
  def feature_specs(self) -> tuple[dict, dict, tuple[str, tf.io.FixedLenFeature]]:
    """(context_feature_spec, example_feature_spec, label_spec) of the ELWC files."""

  def sparse_features(self, model) -> tuple[list[SparseFeature], list[TableSpec]]:
    """The sparse id features and their tables; none by default."""
    del model
    return [], []

  @abc.abstractmethod
  def build_model_builder(self, model, seed: int | None):
    """A tfr-style model builder (mxrec_pipeline.keras.model.ModelBuilder)."""

  @abc.abstractmethod
  def build_baseline(self, paths: DataPaths, data) -> Callable[[dict], tf.Tensor]:
    """A simple scorer (raw features -> [batch_size, list_size] scores)."""

  def partition_paths(self, pattern: str, data) -> DataPaths:
    """The paths of one data partition of a continuous job (`train --continuous`).

    Args:
      pattern: The partition's ELWC files (a tf.io.gfile.glob pattern),
        already in the task's format: both splits read them.
      data: The job's DataConfig.
    """
    del data
    return DataPaths(pattern, pattern)

  def baseline_means(self, data) -> "ItemMeans | None":
    """The baseline as an `ItemMeans` to add partitions to (continuous jobs), or None.

    None (default): a continuous job rebuilds `build_baseline` from every
    partition trained so far, each time.
    """
    del data
    return None

  def build_dataset_builder(self, paths: DataPaths, dataset: DatasetConfig, model):
    """A SimpleDatasetBuilder over the task's ELWC files and sparse features.

    Validation keeps whole lists: its list size is `dataset.valid_list_size`,
    else the longest validation list (`paths.valid_list_size`, or one pass
    over the validation files with `elwc.longest_list`).
    """
    context, example, label = self.feature_specs()
    features, _ = self.sparse_features(model)
    return self.dataset_builder_class()(context, example, MASK_FEATURE, label,
                                        dataset_hparams(paths, dataset), sparse_features=features)

  def dataset_builder_class(self) -> type:
    """The dataset builder class; override to transform labels."""
    return pipeline_lib.SimpleDatasetBuilder


def dataset_hparams(paths: DataPaths, dataset: DatasetConfig) -> pipeline_lib.DatasetHparams:
  """tfr's DatasetHparams of a task's paths and `dataset:` section.

  The validation list size is `dataset.valid_list_size`, else the longest
  validation list (`paths.valid_list_size`, or one pass over the validation
  files with `elwc.longest_list`).
  """
  valid_list_size = (dataset.valid_list_size or paths.valid_list_size or
                     elwc.longest_list(paths.valid) or None)
  return pipeline_lib.DatasetHparams(train_input_pattern=paths.train,
                                     valid_input_pattern=paths.valid,
                                     train_batch_size=dataset.train_batch_size,
                                     valid_batch_size=dataset.valid_batch_size,
                                     list_size=dataset.list_size, valid_list_size=valid_list_size)


class ItemMeans:
  """Each item's mean rating over the ELWC files added so far: the item-mean baseline.

  `add(pattern)` reads more files (one pass each); `scorer()` ranks by the
  means of everything added. A continuous job adds each partition once it is
  trained (mxrec_pipeline/continuous_job.py), so its baseline never re-reads
  a partition.

  Args:
    item_feature: The example feature naming the item (e.g. "item_id", "isbn").
    item_spec: Its tf.io.FixedLenFeature spec.
    label_spec: (label name, its spec); padding labels (< 0) are left out.
  """

  def __init__(self, item_feature: str, item_spec, label_spec: tuple):
    self._item_feature = item_feature
    self._item_spec = item_spec
    self._label = label_spec[0]
    self._spec = {item_feature: item_spec, label_spec[0]: label_spec[1]}
    self.totals: dict = {}  # item (int or bytes) -> [sum of ratings, count]

  def add(self, pattern: str | list[str]) -> None:
    """Adds the ratings of the ELWC files of `pattern` (a glob pattern or a list of them)."""
    dataset = tf.data.TFRecordDataset(tf.io.gfile.glob(pattern)).batch(
        256).map(lambda serialized: tfr.data.parse_from_example_list(
            serialized, example_feature_spec=self._spec))
    for batch in dataset:
      for item, rating in zip(batch[self._item_feature].numpy().ravel(),
                              batch[self._label].numpy().ravel()):
        if rating >= 0:
          total = self.totals.setdefault(item.item() if hasattr(item, "item") else item, [0.0, 0])
          total[0] += float(rating)
          total[1] += 1

  def means(self) -> tuple[dict, float]:
    """({item: mean rating}, the global mean); raises ValueError when nothing was rated."""
    if not self.totals:
      raise ValueError("no rated item")
    means = {item: total / count for item, (total, count) in self.totals.items()}
    count = sum(n for _, n in self.totals.values())
    return means, sum(total for total, _ in self.totals.values()) / count

  def scorer(self) -> Callable[[dict], tf.Tensor]:
    """features -> [batch, list_size] float32 scores: the item's mean, else the global mean.

    Raises:
      ValueError: nothing was rated.
    """
    means, global_mean = self.means()
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(list(means), self._item_spec.dtype),
                                            tf.constant(list(means.values()), tf.float32)),
        default_value=global_mean)
    feature = self._item_feature
    return lambda features: tf.squeeze(table.lookup(features[feature]), -1)


def item_mean_baseline(train_pattern: str | list[str], item_feature: str, item_spec,
                       label_spec: tuple):
  """A baseline scorer: each item's mean training rating, else the global mean.

  The simple baseline of the MovieLens and Book-Crossing jobs (`ItemMeans`
  over the training files).

  Args:
    train_pattern: The training ELWC files (a tf.io.gfile.glob pattern, or a
      list of them).
    item_feature, item_spec, label_spec: As `ItemMeans`.

  Returns:
    (score, means, global_mean): `score(features)` gives [batch, list_size]
    float32 scores from `features[item_feature]`; `means` maps each rated
    item (int or bytes) to its mean rating.

  Raises:
    ValueError: no rated item in the files (naming them).
  """
  item_means = ItemMeans(item_feature, item_spec, label_spec)
  item_means.add(train_pattern)
  if not item_means.totals:
    raise ValueError(f"{train_pattern}: no rated item")
  means, global_mean = item_means.means()
  return item_means.scorer(), means, global_mean
