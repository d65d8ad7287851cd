"""Names of the table (hash) optimizers, TensorFlow-free (config validation uses them)."""

from __future__ import annotations


class SparseOptimizerKey:
  """Names accepted by `factory.get_optimizer`."""

  LAZY_ADAM = "lazy_adam"
  ADAGRAD = "adagrad"
  SGD = "sgd"
  FTRL = "ftrl"
  # Dynamic-expansion tables (init(use_dynamic_expansion=True)).
  LAZY_ADAM_BY_ADDR = "lazy_adam_by_addr"
  ADAGRAD_BY_ADDR = "adagrad_by_addr"
  SGD_BY_ADDR = "sgd_by_addr"


SPARSE_OPTIMIZER_KEYS = frozenset(
    v for k, v in vars(SparseOptimizerKey).items() if not k.startswith("_"))


def check_sparse_optimizer(key: str) -> None:
  """Raises ValueError unless `key` is a SparseOptimizerKey value.

  Raises:
    ValueError: naming the unsupported key and listing the supported ones.
  """
  if key not in SPARSE_OPTIMIZER_KEYS:
    raise ValueError(f"unsupported sparse optimizer '{key}'; "
                     f"supported: {sorted(SPARSE_OPTIMIZER_KEYS)}")
