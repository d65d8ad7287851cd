"""String-keyed factory of the table (hash) optimizers."""

from __future__ import annotations

from mxrec_pipeline.optimizers import (adagrad, adagrad_by_addr, ftrl, gradient_descent,
                                       gradient_descent_by_addr, lazy_adam, lazy_adam_by_addr)
from mxrec_pipeline.optimizers.base import HashOptimizer
from mxrec_pipeline.optimizers.by_addr import ByAddressOptimizer
from mxrec_pipeline.optimizers.keys import SparseOptimizerKey, check_sparse_optimizer

_FACTORIES = {
    SparseOptimizerKey.LAZY_ADAM: lazy_adam.create_hash_optimizer,
    SparseOptimizerKey.ADAGRAD: adagrad.create_hash_optimizer,
    SparseOptimizerKey.SGD: gradient_descent.create_hash_optimizer,
    SparseOptimizerKey.FTRL: ftrl.create_hash_optimizer,
    SparseOptimizerKey.LAZY_ADAM_BY_ADDR: lazy_adam_by_addr.create_hash_optimizer_by_address,
    SparseOptimizerKey.ADAGRAD_BY_ADDR: adagrad_by_addr.create_hash_optimizer_by_address,
    SparseOptimizerKey.SGD_BY_ADDR: gradient_descent_by_addr.create_hash_optimizer_by_addr,
}


def get_optimizer(key: str, learning_rate: float, **kwargs) -> HashOptimizer | ByAddressOptimizer:
  """A table optimizer by name, e.g. `get_optimizer("lazy_adam", 0.01)`.

  Args:
    key: One of SparseOptimizerKey's values.
    learning_rate: Its learning rate, > 0.
    **kwargs: The optimizer's other arguments (e.g. beta1 for lazy_adam).

  Raises:
    ValueError: an unsupported key (named, with the supported ones).
  """
  check_sparse_optimizer(key)
  return _FACTORIES[key](learning_rate=learning_rate, **kwargs)
