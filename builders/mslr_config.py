"""The mslr_dnn ranker's DataConfig and ModelConfig, TensorFlow-free (see builders/mslr.py)."""

from __future__ import annotations

import dataclasses
import pathlib

from builders.base_config import check_bad_record_options, check_dnn_options

NUM_FEATURES = 136  # MSLR-WEB's width; other LETOR files have their own.
BM25_WHOLE_DOCUMENT = 110
FETCHED = "mslr_5k"


@dataclasses.dataclass
class MslrDataConfig:
  """Where the LETOR files come from.

  Attributes:
    train_path: LETOR text file of the training queries (e.g. MSLR-WEB10K
      Fold1/train.txt); None fetches the pinned 5k-line subset (`mslr_5k`).
    valid_path: LETOR text file of the validation queries (e.g. Fold1/vali.txt);
      required with train_path, None with it.
    elwc_dir: Directory of the cached ELWC conversions; None: `elwc/` beside
      the fetched files, or ~/.cache/mxrec_pipeline/mslr_elwc for given files.
    num_features: The width of the data: feature ids are 1..num_features
      (`custom_features_1` ..); an id above it in a file stops the job
      naming file:line, id and width. None: the largest id of the train and
      valid files (one scan of each, cached beside the ELWC conversion).
    baseline_feature: 1-based id of the feature the baseline ranks by, in
      [1, width] and not 0 on every training line (110: MSLR-WEB's BM25 of
      the whole document; 46-feature LETOR 4.0 files: e.g. 25, BM25 of the
      whole document). Checked against the data by `prepare_data`.
    label_range: [low, high]: the allowed labels, inclusive (MSLR-WEB's
      graded relevance 0-4).
    on_bad_record: "error" (a line with a non-finite feature or label, a
      label outside label_range or a malformed token stops the job, naming
      file:line) or "skip" (such lines are dropped and counted in the log
      and metrics.json).
    holdout_fraction: Fraction of the training queries held out to validate
      on while training (early stopping, `pipeline.early_stopping`), in
      [0, 0.5]; 0: none. The count is ceil(fraction x queries), at least
      `holdout_min_queries`, at most half the queries
      (data/letor_prep.holdout_size). Validated on only with early stopping;
      split (and converted) whenever > 0, and `model.standardize`'s moments
      are fitted on the other queries either way.
    holdout_min_queries: The fewest queries held out, > 0.
    holdout_seed: Seed of the draw of the held-out queries.
    holdout_path: A LETOR file of held-out queries to use instead of a draw
      from train_path (then the model trained after the selection trains on
      both files).
  """

  train_path: str | None = None
  valid_path: str | None = None
  elwc_dir: str | None = None
  num_features: int | None = None
  baseline_feature: int = BM25_WHOLE_DOCUMENT
  label_range: list[float] = dataclasses.field(default_factory=lambda: [0.0, 4.0])
  on_bad_record: str = "error"
  holdout_fraction: float = 0.1
  holdout_min_queries: int = 30
  holdout_seed: int = 0
  holdout_path: str | None = None

  def __post_init__(self):
    if (self.train_path is None) != (self.valid_path is None):
      missing = "valid_path" if self.valid_path is None else "train_path"
      raise ValueError(f"data.{missing} is required when the other of data.train_path and "
                       f"data.valid_path is set (leave both null to fetch {FETCHED})")
    for name in ("train_path", "valid_path", "holdout_path"):
      path = getattr(self, name)
      if path is not None and not pathlib.Path(path).is_file():
        raise ValueError(f"data.{name}: no such file: {path}")
    check_bad_record_options(self.on_bad_record, self.label_range, "data.label_range")
    if (isinstance(self.holdout_fraction, bool) or not isinstance(self.holdout_fraction,
                                                                  (int, float)) or
        not 0.0 <= self.holdout_fraction <= 0.5):
      raise ValueError(f"data.holdout_fraction must be in [0, 0.5], got {self.holdout_fraction!r}")
    if isinstance(
        self.holdout_min_queries,
        bool) or not isinstance(self.holdout_min_queries, int) or self.holdout_min_queries < 1:
      raise ValueError("data.holdout_min_queries must be a positive int, got "
                       f"{self.holdout_min_queries!r}")
    if self.holdout_path is not None and self.train_path is None:
      raise ValueError("data.holdout_path needs data.train_path and data.valid_path (the "
                       f"fetched {FETCHED} files are split by holdout_fraction)")
    if self.num_features is not None and self.num_features < 1:
      raise ValueError(f"data.num_features must be a positive int, got {self.num_features}")
    width = self.num_features or float("inf")
    if not 1 <= self.baseline_feature <= width:
      raise ValueError(f"data.baseline_feature must be in [1, {self.num_features or 'width'}], "
                       f"got {self.baseline_feature}")


@dataclasses.dataclass
class MslrModelConfig:
  """tfr's DNNScorer, as in its DNN example.

  Attributes:
    hidden_layer_dims: Units of the hidden layers, each > 0.
    dropout: Dropout rate after each hidden layer, in [0, 1).
    use_batch_norm: Batch normalization of the inputs and hidden layers.
    batch_norm_moment: Momentum of the batch normalization's moving averages.
    use_log1p: Apply `sign(x) * log1p(|x|)` to every feature first.
    standardize: Then subtract each feature's mean and divide by its
      standard deviation, both of the training lists outside the holdout
      (data/letor_prep.feature_moments), constants of the model and its
      export. A missing feature of a LETOR line is 0 before the transform.
  """

  hidden_layer_dims: list[int] = dataclasses.field(default_factory=lambda: [64, 32, 16])
  dropout: float = 0.5
  use_batch_norm: bool = True
  batch_norm_moment: float = 0.99
  use_log1p: bool = True
  standardize: bool = False

  def __post_init__(self):
    check_dnn_options(self.hidden_layer_dims, self.dropout, self.batch_norm_moment)
    if self.standardize and not self.use_log1p:
      raise ValueError("model.standardize needs model.use_log1p: the moments are those of the "
                       "log1p features")
