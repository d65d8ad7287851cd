"""DatasetConfig: batching of a ranker's data, TensorFlow-free (config validation uses it)."""

from __future__ import annotations

import dataclasses
import math

from mxrec_pipeline.data import validation


@dataclasses.dataclass
class DatasetConfig:
  """Batching of a task's ELWC data (tfr's DatasetHparams, minus the paths).

  Attributes:
    train_batch_size: Lists per training batch, > 0.
    valid_batch_size: Lists per validation batch, > 0.
    list_size: Examples per list (truncated or padded); None pads to the
      longest list of each batch.
    valid_list_size: list_size of validation (longer lists are cut, so
      metrics see only their first valid_list_size examples); None keeps
      whole lists (the longest validation list, found in the data).
  """

  train_batch_size: int = 32
  valid_batch_size: int = 32
  list_size: int | None = None
  valid_list_size: int | None = None

  def __post_init__(self):
    for name in ("train_batch_size", "valid_batch_size", "list_size", "valid_list_size"):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, int) or value <= 0):
        raise ValueError(f"dataset.{name} must be a positive int, got {value!r}")


def check_bad_record_options(on_bad_record: str, label_range, key: str) -> None:
  """Validates a DataConfig's `on_bad_record` and label range (`key`: e.g. data.label_range).

  Raises:
    ValueError: naming the key: an unknown policy, or a range that is not
      two finite numbers low <= high.
  """
  validation.check_on_bad_record(on_bad_record)
  if (not isinstance(label_range, (list, tuple)) or len(label_range) != 2 or
      not all(isinstance(v, (int, float)) and math.isfinite(v) for v in label_range) or
      label_range[0] > label_range[1]):
    raise ValueError(f"{key} must be [low, high], two finite numbers with low <= high, "
                     f"got {label_range!r}")


def check_dnn_options(hidden_layer_dims, dropout: float,
                      batch_norm_moment: float | None = None) -> None:
  """Validates a DNN scorer's `model.hidden_layer_dims`, `model.dropout` (and batch norm momentum).

  Args:
    hidden_layer_dims: Units of the hidden layers: a non-empty list of ints > 0.
    dropout: Dropout rate, in [0, 1).
    batch_norm_moment: Momentum of batch normalization's moving averages, in
      (0, 1); None when the scorer has no batch normalization.

  Raises:
    ValueError: naming the `model.` key and the value.
  """
  if not hidden_layer_dims or any(d <= 0 for d in hidden_layer_dims):
    raise ValueError(f"model.hidden_layer_dims must be positive ints, got {hidden_layer_dims}")
  if not 0.0 <= dropout < 1.0:
    raise ValueError(f"model.dropout must be in [0, 1), got {dropout}")
  if batch_norm_moment is not None and not 0.0 < batch_norm_moment < 1.0:
    raise ValueError(f"model.batch_norm_moment must be in (0, 1), got {batch_norm_moment}")
