"""SGD, Adagrad and Adam, as in tf.tpu.experimental.embedding, on the sparse core.

The classes hold TPUEmbedding's optimizer parameters (same names, order and
defaults as tensorflow/python/tpu/tpu_embedding_v2_utils.py). `Embedding` turns
each one into a HashOptimizer of the sparse core (mxrec_pipeline.optimizers)
with TPUEmbedding's row math (tensorflow/core/protobuf/tpu/
optimization_parameters.proto): updates touch only the rows a step looked up,
after the replicas' gradients are summed; float32 tables run them as one pass
of the fused native ops (MxSgdRows, MxAdagradRows, MxLazyAdamRows), other
dtypes and non-lazy Adam as TF ops.

Parameters of every class: `clipvalue` clips the summed gradient,
`clip_weight_min/max` the updated rows; `use_gradient_accumulation` and
`low_dimensional_packing_status` (TPU precision/memory-layout switches) have no
effect, gradients are always summed exactly in float32; `weight_decay_factor`
and `slot_variable_creation_fn` raise NotImplementedError. Adam has no bias
correction, as on TPU: a callable learning rate `lr * sqrt(1 - b2^t) /
(1 - b1^t)` gives it. See docs/tpu-embedding.md#optimizers for the updates.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Callable

import tensorflow as tf

from mxrec_pipeline import ops
from mxrec_pipeline.optimizers.base import HashOptimizer

LearningRate = float | Callable[[], float]
ClipValue = float | tuple | None


class Optimizer:
  """Base of SGD, Adagrad and Adam: the parameters every optimizer has.

  Subclasses are frozen dataclasses (compared and hashed by value, as
  TensorFlow's) and implement `build_hash_optimizer`.
  """

  learning_rate: LearningRate
  use_gradient_accumulation: bool
  clip_weight_min: float | None
  clip_weight_max: float | None
  weight_decay_factor: float | None
  multiply_weight_decay_factor_by_learning_rate: bool | None
  clipvalue: ClipValue
  low_dimensional_packing_status: bool
  slot_variable_creation_fn: Callable | None = None

  def build_hash_optimizer(self, name: str) -> HashOptimizer:
    """The sparse-core optimizer applying this one's updates."""
    raise NotImplementedError

  def _check_common(self) -> None:
    kind = type(self).__name__
    lr = self.learning_rate
    if not callable(lr) and (isinstance(lr, bool) or not isinstance(lr, numbers.Real) or
                             not lr > 0):
      raise ValueError(f"{kind}: `learning_rate` must be a positive float or a callable, "
                       f"got {lr!r}")
    if not self.use_gradient_accumulation and self.clipvalue is not None:
      raise ValueError(f"{kind}: when `use_gradient_accumulation` is False, gradient clipping "
                       f"cannot be used and `clipvalue` must be None, got {self.clipvalue!r}")
    _clip_range(kind, "clipvalue", self.clipvalue)
    lo, hi = self.clip_weight_min, self.clip_weight_max
    if lo is not None and hi is not None and lo > hi:
      raise ValueError(f"{kind}: `clip_weight_min` ({lo}) must not exceed `clip_weight_max` "
                       f"({hi})")
    if self.weight_decay_factor:
      raise NotImplementedError(f"{kind}: `weight_decay_factor` is not available; leave it "
                                f"None (got {self.weight_decay_factor})")
    if self.slot_variable_creation_fn is not None:
      raise NotImplementedError(f"{kind}: `slot_variable_creation_fn` is not available: slots "
                                "are created by the sparse core's optimizer; leave it None")

  def _options(self) -> dict:
    return dict(learning_rate=self.learning_rate,
                clip_gradient=_clip_range(type(self).__name__, "clipvalue", self.clipvalue),
                clip_weight=(self.clip_weight_min, self.clip_weight_max))


@dataclasses.dataclass(frozen=True)
class SGD(Optimizer):
  """Stochastic gradient descent (tf.tpu.experimental.embedding.SGD).

  Attributes:
    learning_rate: Positive float, or a callable of no arguments giving it
      (read every step). See the module docstring for the other parameters.

  Raises:
    ValueError: a non-positive learning rate, bad clipping limits.
    NotImplementedError: weight_decay_factor.
  """

  learning_rate: LearningRate = 0.01
  use_gradient_accumulation: bool = True
  clip_weight_min: float | None = None
  clip_weight_max: float | None = None
  weight_decay_factor: float | None = None
  multiply_weight_decay_factor_by_learning_rate: bool | None = None
  clipvalue: ClipValue = None
  low_dimensional_packing_status: bool = False

  def __post_init__(self):
    self._check_common()

  def build_hash_optimizer(self, name: str) -> HashOptimizer:
    """See `Optimizer`."""
    return _SgdRows(name=name, **self._options())


@dataclasses.dataclass(frozen=True)
class Adagrad(Optimizer):
  """Adagrad (tf.tpu.experimental.embedding.Adagrad); slot `accumulators`.

  Attributes:
    learning_rate: Positive float or callable.
    initial_accumulator_value: Initial value of every row's accumulator, > 0.
    See the module docstring for the other parameters.

  Raises:
    ValueError: a non-positive learning rate or initial_accumulator_value.
    NotImplementedError: weight_decay_factor, slot_variable_creation_fn.
  """

  learning_rate: LearningRate = 0.001
  initial_accumulator_value: float = 0.1
  use_gradient_accumulation: bool = True
  clip_weight_min: float | None = None
  clip_weight_max: float | None = None
  weight_decay_factor: float | None = None
  multiply_weight_decay_factor_by_learning_rate: bool | None = None
  slot_variable_creation_fn: Callable | None = None
  clipvalue: ClipValue = None
  low_dimensional_packing_status: bool = False

  def __post_init__(self):
    self._check_common()
    if not self.initial_accumulator_value > 0:
      raise ValueError(f"Adagrad: `initial_accumulator_value` must be a positive float, "
                       f"got {self.initial_accumulator_value}")

  def build_hash_optimizer(self, name: str) -> HashOptimizer:
    """See `Optimizer`."""
    return _AdagradRows(name=name, initial_accumulator_value=self.initial_accumulator_value,
                        **self._options())


@dataclasses.dataclass(frozen=True)
class Adam(Optimizer):
  """Adam (tf.tpu.experimental.embedding.Adam), lazy by default.

  Slots `momenta` and `velocities`. No bias correction, as TPUEmbedding's (see
  the module docstring).

  Attributes:
    learning_rate: Positive float or callable.
    beta_1, beta_2: Decay rates of the moments, in [0, 1).
    epsilon: > 0.
    lazy_adam: True: only the looked-up rows and their slots change. False:
      every row's moments decay and every row moves, every step.
    sum_inside_sqrt: m / sqrt(v + eps^2) (True) or m / (sqrt(v) + eps).
    See the module docstring for the other parameters.

  Raises:
    ValueError: betas outside [0, 1), epsilon <= 0, lazy_adam=False without
      gradient accumulation (TPUEmbedding's rules).
    NotImplementedError: weight_decay_factor, slot_variable_creation_fn.
  """

  learning_rate: LearningRate = 0.001
  beta_1: float = 0.9
  beta_2: float = 0.999
  epsilon: float = 1e-07
  lazy_adam: bool = True
  sum_inside_sqrt: bool = True
  use_gradient_accumulation: bool = True
  clip_weight_min: float | None = None
  clip_weight_max: float | None = None
  weight_decay_factor: float | None = None
  multiply_weight_decay_factor_by_learning_rate: bool | None = None
  slot_variable_creation_fn: Callable | None = None
  clipvalue: ClipValue = None
  low_dimensional_packing_status: bool = False

  def __post_init__(self):
    self._check_common()
    for arg in ("beta_1", "beta_2"):
      if not 0.0 <= getattr(self, arg) < 1.0:
        raise ValueError(f"Adam: `{arg}` must be >= 0 and < 1, got {getattr(self, arg)}")
    if not self.epsilon > 0:
      raise ValueError(f"Adam: `epsilon` must be positive, got {self.epsilon}")
    if not self.use_gradient_accumulation and not self.lazy_adam:
      raise ValueError("Adam: with `lazy_adam=False`, gradient accumulation must be used; set "
                       "`use_gradient_accumulation=True`")

  def build_hash_optimizer(self, name: str) -> HashOptimizer:
    """See `Optimizer`."""
    return _AdamRows(name=name, beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon,
                     lazy=self.lazy_adam, sum_inside_sqrt=self.sum_inside_sqrt, **self._options())


SUPPORTED = (SGD, Adagrad, Adam)


def check_optimizer(optimizer, where: str) -> None:
  """Raises ValueError unless `optimizer` is None or one of SUPPORTED.

  Args:
    optimizer: The object given as an optimizer.
    where: What it was given to, for the message.
  """
  if optimizer is None or isinstance(optimizer, SUPPORTED):
    return
  hint = ""
  if type(optimizer).__module__.startswith("tensorflow.python.tpu"):
    hint = (f"; replace tf.tpu.experimental.embedding.{type(optimizer).__name__} with "
            f"mxrec_pipeline.embedding.{type(optimizer).__name__}")
  raise ValueError(
      f"{where}: {type(optimizer).__name__} is an unsupported optimizer class. Pass an instance "
      f"of one of {[c.__name__ for c in SUPPORTED]} from mxrec_pipeline.embedding{hint}")


def _clip_range(kind: str, arg: str, value: ClipValue) -> tuple:
  """(low, high) of a clip argument: None, a positive float c (-c, c) or a pair."""
  if value is None:
    return (None, None)
  if isinstance(value, tuple) and len(value) == 2:
    lo, hi = value
    if lo is not None and hi is not None and lo > hi:
      raise ValueError(f"{kind}: `{arg}` must be (min, max) with min <= max, got {value}")
    return (lo, hi)
  if isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0:
    return (-float(value), float(value))
  raise ValueError(f"{kind}: `{arg}` must be None, a positive float or a (min, max) tuple, "
                   f"got {value!r}")


class _TpuRows(HashOptimizer):
  """HashOptimizer with TPUEmbedding's learning rate and clipping options.

  Subclasses give `slot_initial_values` and `_step_rows`, the row math.

  Attributes:
    learning_rate: Float, or a callable read at every step.
    clip_gradient_min, clip_gradient_max: Limits of the summed row gradients.
    clip_weight_min, clip_weight_max: Limits of the updated rows.
  """

  # Non-lazy Adam moves every row, so its weight clipping covers every row.
  moves_all_rows = False

  def __init__(self, name: str, learning_rate: LearningRate, clip_gradient: tuple,
               clip_weight: tuple):
    # The base checks a float rate; a callable one is read at every step.
    super().__init__(1.0 if callable(learning_rate) else learning_rate, name)
    self.learning_rate = learning_rate
    self.clip_gradient_min, self.clip_gradient_max = clip_gradient
    self.clip_weight_min, self.clip_weight_max = clip_weight

  def _update_rows(self, var, slots, rows, grad, step):
    del step  # TPUEmbedding's optimizers have no step-dependent terms.
    lr = self.learning_rate() if callable(self.learning_rate) else self.learning_rate
    lr = tf.cast(lr, var.dtype)
    grad = _clip(grad, self.clip_gradient_min, self.clip_gradient_max)
    updates = self._step_rows(var, slots, rows, grad, lr)
    if self.clip_weight_min is None and self.clip_weight_max is None:
      return updates
    with tf.control_dependencies(updates):
      if self.moves_all_rows:
        clipped = var.assign(_clip(var.read_value(), self.clip_weight_min, self.clip_weight_max))
      else:
        clipped = var.scatter_update(
            tf.IndexedSlices(
                _clip(tf.gather(var, rows), self.clip_weight_min, self.clip_weight_max), rows))
    return updates + [clipped]

  def _step_rows(self, var, slots, rows, grad, lr):
    """Update ops of `rows` ([n] int64) given their summed `grad` ([n, dim])."""
    raise NotImplementedError


class _SgdRows(_TpuRows):
  slot_initial_values = {}

  def _step_rows(self, var, slots, rows, grad, lr):
    if var.dtype == tf.float32:
      return [
          ops.load().mx_sgd_rows(var.handle, tf.cast(rows, tf.int64), grad, lr,
                                 tf.constant(0.0, tf.float32))
      ]
    return [var.scatter_sub(tf.IndexedSlices(lr * grad, rows))]


class _AdagradRows(_TpuRows):

  def __init__(self, initial_accumulator_value: float, **kwargs):
    super().__init__(**kwargs)
    self.slot_initial_values = {"accumulators": float(initial_accumulator_value)}

  def _step_rows(self, var, slots, rows, grad, lr):
    acc = slots["accumulators"]
    if var.dtype == tf.float32:
      return [ops.load().mx_adagrad_rows(var.handle, acc.handle, tf.cast(rows, tf.int64), grad, lr)]
    acc_rows = tf.gather(acc, rows) + tf.square(grad)
    return [
        acc.scatter_update(tf.IndexedSlices(acc_rows, rows)),
        var.scatter_sub(tf.IndexedSlices(lr * grad * tf.math.rsqrt(acc_rows), rows))
    ]


class _AdamRows(_TpuRows):
  slot_initial_values = {"momenta": 0.0, "velocities": 0.0}

  def __init__(self, beta_1: float, beta_2: float, epsilon: float, lazy: bool,
               sum_inside_sqrt: bool, **kwargs):
    super().__init__(**kwargs)
    self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
    self.lazy, self.sum_inside_sqrt = lazy, sum_inside_sqrt
    self.moves_all_rows = not lazy

  def _step(self, m, v, grad, lr):
    """New (m, v, weight delta) from old moments and the gradient."""
    m = self.beta_1 * m + (1 - self.beta_1) * grad
    v = self.beta_2 * v + (1 - self.beta_2) * tf.square(grad)
    if self.sum_inside_sqrt:
      delta = lr * m * tf.math.rsqrt(v + self.epsilon**2)
    else:
      delta = lr * m / (tf.sqrt(v) + self.epsilon)
    return m, v, delta

  def _step_rows(self, var, slots, rows, grad, lr):
    m, v = slots["momenta"], slots["velocities"]
    if not self.lazy:
      dense_grad = tf.scatter_nd(tf.expand_dims(rows, -1), grad, tf.shape(var, out_type=tf.int64))
      m_new, v_new, delta = self._step(m.read_value(), v.read_value(), dense_grad, lr)
      return [m.assign(m_new), v.assign(v_new), var.assign_sub(delta)]
    if var.dtype == tf.float32:
      return [
          ops.load().mx_lazy_adam_rows(
              var.handle, m.handle, v.handle, tf.cast(rows, tf.int64), grad, lr,
              *(tf.constant(value, tf.float32)
                for value in (self.beta_1, self.beta_2, self.epsilon)),
              epsilon_inside_sqrt=self.sum_inside_sqrt)
      ]
    m_rows, v_rows, delta = self._step(tf.gather(m, rows), tf.gather(v, rows), grad, lr)
    return [
        m.scatter_update(tf.IndexedSlices(m_rows, rows)),
        v.scatter_update(tf.IndexedSlices(v_rows, rows)),
        var.scatter_sub(tf.IndexedSlices(delta, rows))
    ]


def _clip(x: tf.Tensor, low: float | None, high: float | None) -> tf.Tensor:
  """x clipped to [low, high]; a None limit is no limit."""
  if low is not None:
    x = tf.maximum(x, tf.cast(low, x.dtype))
  if high is not None:
    x = tf.minimum(x, tf.cast(high, x.dtype))
  return x
