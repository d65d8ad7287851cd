"""DNN ranker on MSLR-WEB: TF-Ranking's DNN pipeline example, on the sparse core's pipeline.

The seed example (tensorflow_ranking/examples/keras/keras_dnn_tfrecord.py): each
query is a list of documents, each document `num_features` dense float features
`custom_features_1` .. `custom_features_<num_features>` (the width comes from
the data or `data.num_features`), the label "utility" the graded relevance
0-4. Features are joined and go through `sign(x) * log1p(|x|)` (the example's
`use_log1p`), then tfr's DNNScorer with batch normalization of its inputs and
hidden layers. There are no id features, so no table: the pipeline trains
every variable with the dense optimizer. The context holds no feature: "qid"
is an arbitrary query number, useless to a univariate scorer.

Data: LETOR text files, by default the pinned MSLR-WEB Fold1 5k-line subsets
(`mxrec-pipeline data fetch mslr_5k`, a smoke check rather than a benchmark);
point `data.train_path` and `data.valid_path` at full MSLR-WEB10K/30K files
for the real thing. Baseline: BM25 of the whole document (MSLR feature 110).
Main name: `MslrDnn`. See
docs/data.md#letor-files-feature-names-ids-and-the-width.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import tensorflow as tf
import tensorflow_ranking as tfr

from builders.base import MASK_FEATURE, DataPaths, RankerBuilder
from builders.mslr_config import FETCHED, NUM_FEATURES, MslrDataConfig, MslrModelConfig
from mxrec_pipeline.data import fetch as fetch_lib
from mxrec_pipeline.data import letor
from mxrec_pipeline.data import letor_prep
from mxrec_pipeline.data import validation
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.util import model_files

FETCHED_TRAIN = "msn1.fold1.train.5k.txt"
FETCHED_VALID = "msn1.fold1.test.5k.txt"
LABEL_SPEC = (letor.LABEL_FEATURE, tf.io.FixedLenFeature([1], tf.float32, default_value=-1.0))


def example_feature_spec(num_features: int = NUM_FEATURES) -> dict[str, tf.io.FixedLenFeature]:
  """`custom_features_{i}`: [1] float32, default 0, for i in 1..num_features."""
  return {
      name: tf.io.FixedLenFeature([1], tf.float32, default_value=0.0)
      for name in letor.feature_names(num_features)
  }


def signed_log1p(t: tf.Tensor) -> tf.Tensor:
  """`sign(t) * log1p(|t|)`, elementwise: the log1p transform of tfr's DNN example."""
  return tf.sign(t) * tf.math.log1p(tf.abs(t))


class Log1pConcatPreprocessor(tfr.keras.model.Preprocessor):
  """Joins the dense example features into one, then applies `signed_log1p`.

  Same numbers as tfr's per-feature `PreprocessorWithSpec` of the DNN example
  (DNNScorer concatenates the features anyway), with one Keras op where that
  builds 4 per feature: the model has ~150 layers instead of ~820, so it
  traces, trains and exports several times faster.

  Args:
    feature_names: Example features to join, in this order; each
      [batch_size, list_size, 1] float32 (or [.., k]).
    output_name: Name of the joined feature.
    use_log1p: Apply `signed_log1p`; False only joins.
    moments: None, or (mean, std): [n] per joined column, subtracted and
      divided by after the transform (constants of the graph, so the export
      holds them); e.g. data/letor_prep.feature_moments.
    passthrough: Example features returned as they are, beside the joined one.
  """

  def __init__(self, feature_names, output_name: str = "features", use_log1p: bool = True,
               moments: tuple | None = None, passthrough=()):
    self._names = list(feature_names)
    self._output_name = output_name
    self._use_log1p = use_log1p
    self._moments = moments
    self._passthrough = list(passthrough)

  def __call__(self, context_inputs, example_inputs, mask):
    """See tfr's `Preprocessor`. Returns (context_inputs, {output_name: [B, L, n], passthrough})."""
    del mask
    joined = tf.concat([example_inputs[name] for name in self._names], axis=-1)
    x = signed_log1p(joined) if self._use_log1p else joined
    if self._moments is not None:
      mean, std = (tf.constant(v, tf.float32) for v in self._moments)
      x = (x - mean) / std
    return dict(context_inputs), {
        self._output_name: x, **{name: example_inputs[name] for name in self._passthrough}
    }


def dnn_scorer(model: MslrModelConfig) -> model_lib.DNNScorer:
  """tfr's DNNScorer of the model config: ReLU hidden layers, batch norm of inputs and layers."""
  return model_lib.DNNScorer(hidden_layer_dims=list(model.hidden_layer_dims), output_units=1,
                             activation=tf.nn.relu, input_batch_norm=model.use_batch_norm,
                             use_batch_norm=model.use_batch_norm,
                             batch_norm_moment=model.batch_norm_moment, dropout=model.dropout)


def cached_elwc(src: str | os.PathLike, elwc_dir: str | os.PathLike, num_features: int,
                label_range: tuple[float,
                                   float] = letor.LABEL_RANGE, on_bad_record: str = "error") -> str:
  """The ELWC conversion of a LETOR file, converted (and checked) on first use.

  The cache name holds a digest of the source's absolute path, size, mtime,
  `num_features`, `label_range` and `on_bad_record`, so an edited or replaced
  source, or other checks, convert again. Conversion is atomic (letor_to_elwc
  writes a temporary file, then renames); what it skipped is kept beside the
  ELWC file (`bad_records`).

  Returns:
    Path of the ELWC TFRecord file.

  Raises:
    ValueError: a bad LETOR line (see letor.iter_letor), or no line left.
  """
  src = pathlib.Path(src).resolve()
  key = _source_key(src, num_features, list(label_range), on_bad_record)
  out = pathlib.Path(elwc_dir) / f"{src.stem}.{key}.tfrecord"
  if not out.is_file():
    out.parent.mkdir(parents=True, exist_ok=True)
    skipped = validation.BadRecords(str(src), on_bad_record)
    letor.letor_to_elwc(src, out, num_features, tuple(label_range), skipped)
    _report_path(out).write_text(json.dumps(skipped.report()), encoding="utf-8")
  return str(out)


def cached_shape(src: str | os.PathLike, elwc_dir: str | os.PathLike) -> letor.LetorShape:
  """`letor.scan_letor(src)`, scanned on first use and kept beside the ELWC conversions.

  The cache name holds a digest of the source's absolute path, size and
  mtime, as `cached_elwc`'s: an edited or replaced source is scanned again.
  """
  src = pathlib.Path(src).resolve()
  out = pathlib.Path(elwc_dir) / f"{src.stem}.{_source_key(src)}.shape.json"
  if out.is_file():
    return letor.LetorShape.from_dict(json.loads(out.read_text(encoding="utf-8")))
  shape = letor.scan_letor(src)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_suffix(f".tmp{os.getpid()}")
  tmp.write_text(json.dumps(shape.to_dict()), encoding="utf-8")
  os.replace(tmp, out)
  return shape


def cached_holdout(train_elwc: str, elwc_dir: str | os.PathLike,
                   data: MslrDataConfig) -> tuple[str, str, list[int]] | None:
  """(rest, holdout, held-out qids): the converted training lists split by `data.holdout_*`.

  `cached_split` with the holdout settings.
  """
  return cached_split(train_elwc, elwc_dir, data.holdout_fraction, data.holdout_min_queries,
                      data.holdout_seed)


def cached_split(train_elwc: str, elwc_dir: str | os.PathLike, fraction: float, min_queries: int,
                 seed: int, part: str = "holdout") -> tuple[str, str, list[int]] | None:
  """(rest, part, qids of part): converted lists split by letor_prep.split_holdout's draw.

  Split once and kept beside the conversions, named by the converted file's
  name (which holds a digest of its source and checks), the settings and
  `part` (the split-off files' name); the qids file is written last, so a
  split killed halfway is redone. None: too few lists to split any off.
  """
  src = pathlib.Path(train_elwc)
  named = "" if part == "holdout" else f"|{part}"  # The holdout's names as before `part`.
  key = hashlib.sha256(
      f"{src.name}|{fraction}|{min_queries}|{seed}{named}".encode()).hexdigest()[:16]
  rest, held_file, qids = (pathlib.Path(elwc_dir) / f"{src.stem}.{key}.{name}"
                           for name in ("rest.tfrecord", f"{part}.tfrecord", f"{part}.json"))
  if not qids.is_file():
    held = letor_prep.split_holdout(src, rest, held_file, fraction, min_queries, seed)
    model_files.write_text_atomically(str(qids), json.dumps(held))
  held = json.loads(qids.read_text(encoding="utf-8"))
  return None if held is None else (str(rest), str(held_file), held)


def joined_letor(sources, elwc_dir: str | os.PathLike) -> str:
  """One LETOR file of the lines of `sources` in order, written once beside the conversions."""
  sources = [pathlib.Path(s).resolve() for s in sources]
  key = hashlib.sha256("|".join(_source_key(s) for s in sources).encode()).hexdigest()[:16]
  out = pathlib.Path(elwc_dir) / f"{sources[0].stem}.{key}.joined.txt"
  if not out.is_file():
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
      for source in sources:
        text = source.read_text(encoding="utf-8")
        f.write(text if text.endswith("\n") or not text else text + "\n")
    os.replace(tmp, out)
  return str(out)


def cached_moments(
    src: str | os.PathLike, elwc_dir: str | os.PathLike, num_features: int, data: MslrDataConfig,
    exclude_qids: list[int] = ()) -> tuple[list[float], list[float]]:
  """letor_prep.feature_moments of `src` without `exclude_qids`, computed once and kept."""
  src = pathlib.Path(src).resolve()
  key = _source_key(src, num_features, list(data.label_range), data.on_bad_record,
                    hashlib.sha256(json.dumps(sorted(exclude_qids)).encode()).hexdigest())
  out = pathlib.Path(elwc_dir) / f"{src.stem}.{key}.moments.json"
  if not out.is_file():
    mean, std = letor_prep.feature_moments([src], num_features, tuple(data.label_range),
                                           data.on_bad_record, exclude_qids)
    model_files.write_text_atomically(str(out),
                                      json.dumps({"mean": mean.tolist(), "std": std.tolist()}))
  moments = json.loads(out.read_text(encoding="utf-8"))
  return moments["mean"], moments["std"]


def check_baseline_feature(feature: int, num_features: int, train: letor.LetorShape,
                           train_path: str | os.PathLike) -> None:
  """Refuses a baseline feature outside the width or 0 on every training line.

  Raises:
    ValueError: naming `data.baseline_feature`, its feature name and the
      width or the training file.
  """
  name = f"{letor.FEATURE_NAME_PREFIX}{feature}"
  if not 1 <= feature <= num_features:
    raise ValueError(f"data.baseline_feature is {feature}, outside the data's width "
                     f"[1, {num_features}] (data.num_features, or the largest feature id of "
                     "the train and valid files)")
  if feature > train.num_features or feature in train.zero_features:
    raise ValueError(f"data.baseline_feature {feature} ({name}) is 0 on every line of the "
                     f"training data {train_path}: a baseline ranking by it would be random; "
                     "set data.baseline_feature to a feature of the data (docs/data.md)")


def bad_records(elwc_path: str) -> dict:
  """What the conversion to `elwc_path` skipped (`validation.BadRecords.report()`), or {}."""
  path = _report_path(pathlib.Path(elwc_path))
  return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _source_key(src: pathlib.Path, *options) -> str:
  """16 hex digits of a digest of `src`'s path, size and mtime, and `options`."""
  stat = src.stat()
  text = "|".join([str(src), str(stat.st_size), str(stat.st_mtime_ns)] + [str(o) for o in options])
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _report_path(elwc_path: pathlib.Path) -> pathlib.Path:
  return elwc_path.with_suffix(".bad_records.json")


class MslrDnn(RankerBuilder):
  """The seed example: see the module docstring.

  Any LETOR width: `prepare_data` sets `num_features` from `data.num_features`
  or the data (e.g. 46 for LETOR 4.0); the baseline feature is checked
  against it.

  Args:
    num_features: The width, when known without data (e.g. to build a model
      for given ELWC files); None: set by `prepare_data`.
  """

  name = "mslr_dnn"
  DataConfig = MslrDataConfig
  ModelConfig = MslrModelConfig

  def __init__(self, num_features: int | None = None):
    self.num_features = num_features
    # (mean, std) of each feature's log1p over the training lists outside the holdout.
    self.moments: tuple | None = None

  def prepare_data(self, data: MslrDataConfig) -> DataPaths:
    """See `RankerBuilder`; also sets `num_features` (the data's width).

    Raises:
      ValueError: a bad LETOR line (naming file:line; e.g. a feature id
        above `data.num_features`), or a `data.baseline_feature` outside
        the width or 0 on every training line.
    """
    if data.train_path is None:
      fetched = fetch_lib.fetch(FETCHED)
      train, valid = fetched / FETCHED_TRAIN, fetched / FETCHED_VALID
      elwc_dir = data.elwc_dir or fetched / "elwc"
    else:
      train, valid = data.train_path, data.valid_path
      elwc_dir = data.elwc_dir or fetch_lib.default_cache_dir("mslr_elwc")
    given = None  # (rest, holdout) LETOR files given by data.holdout_path.
    if data.holdout_path is not None:  # Train on both files after the selection.
      given = (train, data.holdout_path)
      train = joined_letor(given, elwc_dir)
    shapes = [cached_shape(src, elwc_dir) for src in (train, valid)]
    self.num_features = data.num_features or max(1, *(s.num_features for s in shapes))
    converted = [
        cached_elwc(src, elwc_dir, self.num_features, data.label_range, data.on_bad_record)
        for src in [train, valid, *(given or ())]
    ]
    check_baseline_feature(data.baseline_feature, self.num_features, shapes[0], train)
    if given is not None:  # rest, holdout: the given files' conversions.
      held, moments_of, held_qids = converted[2:], given[0], []
    else:
      holdout = (cached_holdout(converted[0], elwc_dir, data)
                 if data.holdout_fraction > 0.0 else None)
      held = holdout[:2] if holdout else None
      moments_of, held_qids = train, holdout[2] if holdout else []
    self.moments = cached_moments(moments_of, elwc_dir, self.num_features, data, held_qids)
    skipped = {split: bad_records(path) for split, path in zip(("train", "valid"), converted)}
    return DataPaths(converted[0], converted[1], bad_records=skipped,
                     valid_list_size=shapes[1].max_list_size,
                     train_without_holdout=held[0] if held else None,
                     holdout=held[1] if held else None)

  def feature_specs(self):
    """See `RankerBuilder`; `num_features` example features.

    Raises:
      ValueError: `num_features` unknown (neither given nor set by `prepare_data`).
    """
    if self.num_features is None:
      raise ValueError(f"{self.name}: the number of features is known after prepare_data "
                       "(or pass num_features)")
    return {}, example_feature_spec(self.num_features), LABEL_SPEC

  def standardizing(self, model) -> tuple | None:
    """The feature moments when `model.standardize`, else None.

    Raises:
      ValueError: `model.standardize` before `prepare_data` fitted them.
    """
    if not model.standardize:
      return None
    if self.moments is None:
      raise ValueError(f"{self.name}: model.standardize needs the training data's feature "
                       "moments, fitted by prepare_data")
    return self.moments

  def build_model_builder(self, model: MslrModelConfig, seed):
    del seed  # No table; dense initializers follow the pipeline's global seed.
    _, example_spec, _ = self.feature_specs()
    return model_lib.ModelBuilder(
        input_creator=model_lib.FeatureSpecInputCreator({}, example_spec),
        preprocessor=Log1pConcatPreprocessor(list(example_spec), use_log1p=model.use_log1p,
                                             moments=self.standardizing(model)),
        scorer=dnn_scorer(model), mask_feature_name=MASK_FEATURE, name="mslr_dnn")

  def build_baseline(self, paths: DataPaths, data: MslrDataConfig):
    """Ranks by one raw feature (BM25 of the whole document by default)."""
    del paths
    feature = f"{letor.FEATURE_NAME_PREFIX}{data.baseline_feature}"

    def score(features):
      return tf.squeeze(features[feature], -1)

    return score
