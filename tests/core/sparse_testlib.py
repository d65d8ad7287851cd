"""Helpers shared by the sparse-core tests: tables of known rows, NumPy references."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import embedding

STRING_BUCKETS = 2**63 - 1


def constant_initializer(values: np.ndarray):
  """emb_initializer giving `values` ([rows, dim]) whatever shape it is asked for."""

  def init(shape, dtype):
    assert list(shape) == list(values.shape), (shape, values.shape)
    return tf.constant(values, dtype)

  return init


def make_table(name="t", dim=3, capacity=10, key_dtype=tf.int64, seed=0, **kwargs):
  """A table whose initial rows are `initial_rows(capacity, dim, seed)`."""
  return embedding.create_table(
      key_dtype=key_dtype, dim=dim, name=name, device_vocabulary_size=capacity,
      emb_initializer=constant_initializer(initial_rows(capacity, dim, seed)), **kwargs)


def initial_rows(capacity, dim, seed=0) -> np.ndarray:
  return np.random.RandomState(seed).uniform(-1, 1, [capacity, dim]).astype(np.float32)


def sorted_export(keys, rows) -> tuple[np.ndarray, np.ndarray]:
  """(keys, rows) of an export sorted by key, as NumPy arrays."""
  keys, rows = np.asarray(keys), np.asarray(rows)
  order = np.argsort(keys, kind="stable")
  return keys[order], rows[order]


def index_dict(table) -> dict[int, int]:
  """key -> row of an eager table's key index."""
  keys, rows = table.key_index.export()
  return dict(zip(keys.numpy().tolist(), rows.numpy().tolist()))


def hash_strings(strings) -> np.ndarray:
  """The int64 keys of string ids: stock TF's stable fingerprint."""
  return tf.strings.to_hash_bucket_fast(tf.constant(strings), STRING_BUCKETS).numpy()


def summed_row_grads(rows: np.ndarray, grads: np.ndarray):
  """Distinct rows and their summed gradients: rows [n], grads [n, dim]."""
  unique, position = np.unique(rows, return_inverse=True)
  summed = np.zeros([len(unique), grads.shape[-1]], np.float64)
  np.add.at(summed, position, grads)
  return unique, summed


class NumpyLazyAdam:
  """Reference lazy Adam (Kingma & Ba 2015, epsilon outside the sqrt, TF1 style)."""

  slot_names = ("m", "v")

  def __init__(self, lr, beta1=0.9, beta2=0.999, epsilon=1e-8):
    self.lr, self.beta1, self.beta2, self.epsilon = lr, beta1, beta2, epsilon

  def step(self, w, slots, rows, grad, t):
    m, v = slots["m"], slots["v"]
    lr_t = self.lr * np.sqrt(1 - self.beta2**t) / (1 - self.beta1**t)
    m[rows] = self.beta1 * m[rows] + (1 - self.beta1) * grad
    v[rows] = self.beta2 * v[rows] + (1 - self.beta2) * grad**2
    w[rows] -= lr_t * m[rows] / (np.sqrt(v[rows]) + self.epsilon)


class NumpySgd:
  slot_names = ()

  def __init__(self, lr):
    self.lr = lr

  def step(self, w, slots, rows, grad, t):
    del slots, t
    w[rows] -= self.lr * grad


class NumpyAdagrad:
  slot_names = ("accumulator",)

  def __init__(self, lr, initial_accumulator_value=0.1):
    self.lr, self.initial_accumulator_value = lr, initial_accumulator_value

  def step(self, w, slots, rows, grad, t):
    del t
    acc = slots["accumulator"]
    acc[rows] += grad**2
    w[rows] -= self.lr * grad / np.sqrt(acc[rows])


class NumpyFtrl:
  """Reference FTRL-Proximal (McMahan et al. 2013), as TF's ApplyFtrlV2."""

  slot_names = ("accum", "linear")

  def __init__(self, lr, lr_power=-0.5, initial_accumulator_value=0.1, l1=0.0, l2=0.0,
               l2_shrinkage=0.0):
    self.lr, self.power = lr, -lr_power
    self.initial_accumulator_value = initial_accumulator_value
    self.l1, self.l2, self.l2_shrinkage = l1, l2, l2_shrinkage

  def step(self, w, slots, rows, grad, t):
    del t
    n, z = slots["accum"], slots["linear"]
    n_new = n[rows] + grad**2
    z[rows] += (grad + 2 * self.l2_shrinkage * w[rows] -
                (n_new**self.power - n[rows]**self.power) / self.lr * w[rows])
    quadratic = n_new**self.power / self.lr + 2 * self.l2
    w[rows] = np.where(
        np.abs(z[rows]) > self.l1, (np.sign(z[rows]) * self.l1 - z[rows]) / quadratic, 0.0)
    n[rows] = n_new


class NumpySgdWeightDecay:
  """Reference SGD with L2 weight decay (mxRec's SGDByAddr)."""

  slot_names = ()

  def __init__(self, lr, weight_decay):
    self.lr, self.weight_decay = lr, weight_decay

  def step(self, w, slots, rows, grad, t):
    del slots, t
    w[rows] -= self.lr * (grad + self.weight_decay * w[rows])
