"""Where a table's rows and slots live: on the device whose kernels update them.

A table's rows and optimizer slots are resource variables that the fused row
optimizers (`MxLazyAdamRows`, ...) and TF's `ResourceGather` /
`ResourceScatterUpdate` read and update in place, and a kernel works only on a
resource on its own device. `table_device` asks TensorFlow's kernel registry at
run time: the native kernels are CPU-only today, so rows and slots stay on the
host even when a GPU is visible, while the dense model and scorer run on the
GPU (the "embeddings on host, dense on the accelerator" layout of TorchRec's
embedding offloading and HugeCTR's host-memory parameter server). Under a
`tf.distribute` strategy the strategy places the rows (see `create_table`).

Every decision on a strategy's type is made here (`table_placement`,
`gradient_route`); other modules branch on their results.

Example:
  >>> table_device("item")        # CPU-only kernels, GPU visible or not
  '/CPU:0'

See docs/architecture.md#what-runs-where.
"""

from __future__ import annotations

import enum
from typing import Callable, Iterable, Sequence

import tensorflow as tf
from tensorflow.python.framework import kernels

from mxrec_pipeline import ops

HOST_DEVICE = "/CPU:0"
ACCELERATOR_DEVICE = "/GPU:0"

# Ops that take a float32 table's rows or slots as a resource input: the fused
# row optimizers (any of them may train the table: the optimizer is chosen
# after create_table), TF's gather (lookups, tiers) and scatter (eviction
# resets freed rows; tiers move rows).
FUSED_ROW_OPS = ("MxLazyAdamRows", "MxAdagradRows", "MxFtrlRows", "MxSgdRows")
STOCK_ROW_OPS = ("ResourceGather", "ResourceScatterUpdate", "ResourceScatterSub")
# Dynamic-expansion tables keep their rows in the native host store.
EXPANSION_ROW_OPS = ("MxRowStoreLookup", "MxRowStoreApplyAdam", "MxRowStoreApplyAdagrad",
                     "MxRowStoreApplySgd")


class TablePlacement(str, enum.Enum):
  """Where a run's tables live; its value is what checkpoint manifests record."""

  ONE_HOST = "one_host"  # In this process; N > 1 replicas split each inserted batch.
  WORKERS = "workers"  # Sharded by key over the workers (MultiWorkerMirroredStrategy, N > 1).
  PARAMETER_SERVERS = "parameter_servers"  # Sharded over the ps tasks (ParameterServerStrategy).

  @property
  def sharded(self) -> bool:
    """Whether the tables are sharded over tasks (the model then takes raw ids)."""
    return self is not TablePlacement.ONE_HOST


def table_placement(strategy: tf.distribute.Strategy | None,
                    sparse_features: bool = True) -> TablePlacement:
  """Where the tables of a run under `strategy` live: the one decision on its type.

  Args:
    strategy: The run's strategy, or None (no strategy: one host).
    sparse_features: Whether the run has sparse id features; without them a
      multi-worker run has nothing to shard and trains as one host's.

  Returns:
    PARAMETER_SERVERS under ParameterServerStrategy; WORKERS under
    MultiWorkerMirroredStrategy with more than one worker and sparse features;
    ONE_HOST otherwise.
  """
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    return TablePlacement.PARAMETER_SERVERS
  if (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and
      strategy.num_replicas_in_sync > 1 and sparse_features):
    return TablePlacement.WORKERS
  return TablePlacement.ONE_HOST


class GradientRoute(enum.Enum):
  """How a hash optimizer applies table gradients it gets in a replica context."""

  LOCAL = "local"  # A worker's own shard: its gradient is complete, no aggregation.
  CONCAT = "concat"  # One host's replicas: their rows concatenated in merge_call.
  ALL_REDUCE = "all_reduce"  # Any other strategy: all-reduced, then applied once.


def gradient_route(strategy: tf.distribute.Strategy, mirrored_variables: bool) -> GradientRoute:
  """The GradientRoute of table gradients under `strategy` (in its replica context).

  Args:
    strategy: The strategy of the replica context.
    mirrored_variables: Whether any of the table variables is a
      tf.distribute.DistributedValues (created in the strategy's scope).
      MultiWorkerMirroredStrategy with plain variables means a ShardedTable's
      worker shards (distributed/sharded_table.py); under MirroredStrategy a
      plain variable is shared by the replicas, whose gradients still sum.

  MirroredStrategy concatenates rather than all-reduces: its collective
  all-reduce of IndexedSlices fails inside a tf.while_loop once the number of
  rows changes between iterations (TensorFlow fixes a collective's shape for
  the whole function call).
  """
  if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and not mirrored_variables:
    return GradientRoute.LOCAL
  if isinstance(strategy, tf.distribute.MirroredStrategy):
    return GradientRoute.CONCAT
  return GradientRoute.ALL_REDUCE


def table_ops(value_dtype: tf.DType = tf.float32, *, expansion: bool = False) -> tuple[str, ...]:
  """The ops that read or update a table's rows and slots in place.

  Args:
    value_dtype: The rows' dtype: float32 rows are updated by the fused native
      row optimizers, other dtypes by TF's scatter ops.
    expansion: A dynamic-expansion table (init(use_dynamic_expansion=True)),
      whose rows live in the native row store.

  Returns:
    Op names, as registered with TensorFlow.
  """
  if expansion:
    return EXPANSION_ROW_OPS
  if tf.as_dtype(value_dtype) == tf.float32:
    return FUSED_ROW_OPS + STOCK_ROW_OPS
  return STOCK_ROW_OPS


def registered_device_types(op_name: str, value_dtype: tf.DType = tf.float32) -> frozenset[str]:
  """The device types ("CPU", "GPU", ...) with a kernel of `op_name` for `value_dtype` rows.

  Reads TensorFlow's kernel registry; a kernel counts when it has no `dtype`
  constraint or allows `value_dtype`. Loads the native op library first: its
  kernels register when it loads.

  Raises:
    ImportError: the native library is missing or stale (how to rebuild it).
  """
  ops.load()
  dtype_enum = tf.as_dtype(value_dtype).as_datatype_enum
  types = set()
  for kernel in kernels.get_registered_kernels_for_op(op_name).kernel:
    allowed = [c.allowed_values.list.type for c in kernel.constraint if c.name == "dtype"]
    if all(dtype_enum in values for values in allowed):
      types.add(kernel.device_type)
  return frozenset(types)


def table_device(
    table_name: str, requested: str | None = None, *, value_dtype: tf.DType = tf.float32,
    expansion: bool = False, visible_devices: Sequence[str] | None = None,
    kernel_device_types: Callable[[str, tf.DType], Iterable[str]] | None = None) -> str:
  """The device of a table's rows and slots: THE placement rule of the sparse core.

  Without `requested`: `/GPU:0` when a GPU is visible and every op of
  `table_ops` has a GPU kernel, else `/CPU:0` (with today's CPU-only native
  kernels: `/CPU:0`, GPU or not). With `requested`: that device, checked.

  Args:
    table_name: The table, named in errors.
    requested: create_table's / TableSpec's `device`, e.g. "/CPU:0",
      "/GPU:1", "/job:worker/task:0/device:CPU:0"; None: the rule above.
    value_dtype, expansion: The table's, as for `table_ops`.
    visible_devices: Names of the local logical devices (e.g.
      "/device:GPU:0"); None: `tf.config.list_logical_devices()`. Tests fake it.
    kernel_device_types: (op name, value_dtype) -> the device types with a
      kernel of it; None: TensorFlow's kernel registry
      (`registered_device_types`). Tests fake it.

  Returns:
    A device string for `tf.device`: "/CPU:0" or "/GPU:0" by default, the
    normalized `requested` (e.g. "/device:GPU:0") otherwise.

  Raises:
    ValueError: `requested` is not a device string, names no device type, names a
      local device that is not visible, or a device type without a kernel for
      one of the table's ops (naming the table, the device and the op).
    ImportError: the native op library is missing (only without
      `kernel_device_types`).
  """
  if visible_devices is None:
    visible_devices = [d.name for d in tf.config.list_logical_devices()]
  if kernel_device_types is None:
    kernel_device_types = registered_device_types
  value_dtype = tf.as_dtype(value_dtype)
  needed = table_ops(value_dtype, expansion=expansion)

  def kernel_types(op_name: str) -> set[str]:
    return set(kernel_device_types(op_name, value_dtype))

  if requested is None:
    visible_types = {tf.DeviceSpec.from_string(d).device_type for d in visible_devices}
    if "GPU" in visible_types and not _missing_kernel("GPU", needed, kernel_types):
      return ACCELERATOR_DEVICE
    return HOST_DEVICE
  spec = _parse(table_name, requested)
  if spec.job is None and not any(_matches(spec, d) for d in visible_devices):
    raise ValueError(f"table '{table_name}': device {requested!r} is not visible; this process "
                     f"sees {sorted(visible_devices)}")
  missing = _missing_kernel(spec.device_type, needed, kernel_types)
  if missing:
    raise ValueError(
        f"table '{table_name}': device {requested!r} has no kernel for {missing}, which "
        f"reads or updates the table's rows in place (kernels of {missing} are registered for "
        f"{sorted(kernel_types(missing)) or 'no device'}); place the table on "
        f"{HOST_DEVICE!r} or leave `device` unset")
  return spec.to_string()


def accelerator_holds_rows(value_dtype: tf.DType = tf.float32) -> bool:
  """Whether a GPU has a kernel for every op that updates a `value_dtype` table in place."""
  return _missing_kernel("GPU", table_ops(value_dtype),
                         lambda op: set(registered_device_types(op, value_dtype))) is None


def strategy_variable_devices() -> tuple[str, ...]:
  """Where the current strategy places a variable created in its scope.

  `parameter_devices` of Mirrored and MultiWorkerMirrored strategies (every
  replica's device); () for strategies that do not say (ParameterServerStrategy
  places variables on its ps tasks' CPUs).
  """
  try:
    return tuple(tf.distribute.get_strategy().extended.parameter_devices)
  except (NotImplementedError, RuntimeError, AttributeError):
    return ()


def check_strategy_devices(
    table_name: str, devices: Sequence[str], *, value_dtype: tf.DType = tf.float32,
    expansion: bool = False,
    kernel_device_types: Callable[[str, tf.DType], Iterable[str]] | None = None) -> None:
  """Checks that a strategy's replica devices can hold the table's rows.

  Under a `tf.distribute` strategy the strategy places the rows (a mirrored
  variable on every replica device), so the ops that update them in place
  must have kernels there: with today's CPU-only native kernels, a
  MirroredStrategy over GPUs cannot train a table.

  Args:
    table_name: The table, named in the error.
    devices: Where the strategy places variables (`strategy_variable_devices`).
    value_dtype, expansion, kernel_device_types: As for `table_device`.

  Raises:
    ValueError: a device type without a kernel for one of the table's ops,
      naming the table, the device and the op, and what to do instead.
  """
  if kernel_device_types is None:
    kernel_device_types = registered_device_types
  needed = table_ops(value_dtype, expansion=expansion)
  for device in devices:
    device_type = tf.DeviceSpec.from_string(device).device_type or "CPU"
    missing = _missing_kernel(device_type, needed,
                              lambda op: set(kernel_device_types(op, value_dtype)))
    if missing:
      raise ValueError(
          f"table '{table_name}': the distribution strategy places its rows on {device}, where "
          f"{missing} (which updates them in place) has no kernel; the native kernels run on "
          f"{sorted(kernel_device_types(missing, value_dtype)) or 'no device'}. Train without a "
          "strategy (pipeline.strategy: null: rows on the host, the dense model on the GPU) or "
          "give the strategy host devices")


def _parse(table_name: str, requested) -> tf.DeviceSpec:
  where = f"table '{table_name}': `device`"
  if not isinstance(requested, str):
    raise ValueError(f"{where} must be a device string such as '/CPU:0', got {requested!r}")
  try:
    spec = tf.DeviceSpec.from_string(requested)
  except ValueError as e:
    raise ValueError(f"{where} must be a device string such as '/CPU:0' or '/GPU:0', "
                     f"got {requested!r} ({e})") from e
  if spec.device_type is None:
    raise ValueError(f"{where} must name a device type, such as '/CPU:0' or '/GPU:0', "
                     f"got {requested!r}")
  return spec


def _matches(spec: tf.DeviceSpec, device_name: str) -> bool:
  """Whether a visible device is the one `spec` asks for (any index with "GPU:*")."""
  device = tf.DeviceSpec.from_string(device_name)
  return (device.device_type == spec.device_type and
          spec.device_index in (None, device.device_index))


def _missing_kernel(device_type: str, op_names: Sequence[str],
                    kernel_types: Callable[[str], set[str]]) -> str | None:
  """The first of `op_names` with no kernel for `device_type`, or None."""
  for name in op_names:
    if device_type not in kernel_types(name):
      return name
  return None
