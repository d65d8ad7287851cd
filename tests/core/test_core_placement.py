"""Tests of core/placement.py: rows live where the kernels that update them are registered.

The device list and the kernel registry are faked, so the GPU cases run on a
CPU-only machine; the real registry is checked for the fact the rule rests on
(the native row ops have CPU kernels only).
"""

import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import placement
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init

CPU_ONLY = ["/device:CPU:0"]
WITH_GPU = ["/device:CPU:0", "/device:GPU:0"]


def _kernels(gpu_ops=()):
  """A fake registry: every op has a CPU kernel; those in `gpu_ops` a GPU one too."""

  def device_types(op_name, value_dtype):
    del value_dtype
    return {"CPU", "GPU"} if op_name in gpu_ops else {"CPU"}

  return device_types


ALL_FLOAT32_OPS = placement.table_ops(tf.float32)


def test_cpu_only_machine_places_rows_on_the_host():
  assert placement.table_device("t", visible_devices=CPU_ONLY,
                                kernel_device_types=_kernels(ALL_FLOAT32_OPS)) == "/CPU:0"


def test_gpu_visible_with_cpu_only_kernels_places_rows_on_the_host():
  assert placement.table_device("t", visible_devices=WITH_GPU,
                                kernel_device_types=_kernels(placement.STOCK_ROW_OPS)) == "/CPU:0"


def test_gpu_kernel_for_every_needed_op_places_rows_on_the_gpu():
  assert placement.table_device("t", visible_devices=WITH_GPU,
                                kernel_device_types=_kernels(ALL_FLOAT32_OPS)) == "/GPU:0"


@pytest.mark.parametrize("without", ALL_FLOAT32_OPS)
def test_one_op_without_a_gpu_kernel_keeps_rows_on_the_host(without):
  gpu_ops = [op for op in ALL_FLOAT32_OPS if op != without]
  assert placement.table_device("t", visible_devices=WITH_GPU,
                                kernel_device_types=_kernels(gpu_ops)) == "/CPU:0"


def test_the_real_registry_has_cpu_kernels_only_for_the_row_ops():
  for op_name in placement.FUSED_ROW_OPS + placement.EXPANSION_ROW_OPS:
    assert placement.registered_device_types(op_name) == {"CPU"}, op_name
  # So a (faked) visible GPU keeps float32 rows on the host with the real registry.
  assert placement.table_device("t", visible_devices=WITH_GPU) == "/CPU:0"


def test_dtype_constraints_of_the_real_registry_are_honoured():
  assert "CPU" in placement.registered_device_types("ResourceScatterSub", tf.float64)
  assert placement.registered_device_types("ResourceScatterSub", tf.bool) == frozenset()


def test_rows_of_other_dtypes_need_only_tf_ops():
  assert placement.table_ops(tf.float64) == placement.STOCK_ROW_OPS
  assert placement.table_device("t", value_dtype=tf.float64, visible_devices=WITH_GPU,
                                kernel_device_types=_kernels(placement.STOCK_ROW_OPS)) == "/GPU:0"


def test_expansion_rows_need_the_row_store_ops():
  assert placement.table_device("t", expansion=True, visible_devices=WITH_GPU,
                                kernel_device_types=_kernels(ALL_FLOAT32_OPS)) == "/CPU:0"


@pytest.mark.parametrize("requested, expected", [
    ("/CPU:0", "/device:CPU:0"),
    ("/cpu:0", "/device:CPU:0"),
    ("/GPU:0", "/device:GPU:0"),
    ("/device:GPU:0", "/device:GPU:0"),
    ("/job:worker/task:1/device:GPU:3", "/job:worker/task:1/device:GPU:3"),
])
def test_explicit_device_with_kernels_is_accepted(requested, expected):
  assert placement.table_device("t", requested, visible_devices=WITH_GPU,
                                kernel_device_types=_kernels(ALL_FLOAT32_OPS)) == expected


def test_explicit_host_device_overrides_a_gpu_the_rule_would_pick():
  assert placement.table_device("t", "/CPU:0", visible_devices=WITH_GPU,
                                kernel_device_types=_kernels(ALL_FLOAT32_OPS)) == "/device:CPU:0"


def test_explicit_gpu_without_a_gpu_kernel_names_table_device_and_op():
  with pytest.raises(
      ValueError, match=r"table 'item': device '/GPU:0' has no kernel for "
      r"MxLazyAdamRows, .*registered for \['CPU'\]"):
    placement.table_device("item", "/GPU:0", visible_devices=WITH_GPU,
                           kernel_device_types=_kernels(placement.STOCK_ROW_OPS))


def test_explicit_gpu_with_the_real_registry_fails():
  with pytest.raises(ValueError, match=r"table 'item': device '/GPU:0' has no kernel for "
                     r"MxLazyAdamRows"):
    placement.table_device("item", "/GPU:0", visible_devices=WITH_GPU)


def test_explicit_device_that_is_not_visible():
  with pytest.raises(
      ValueError, match=r"table 't': device '/GPU:1' is not visible; this "
      r"process sees \['/device:CPU:0', '/device:GPU:0'\]"):
    placement.table_device("t", "/GPU:1", visible_devices=WITH_GPU,
                           kernel_device_types=_kernels(ALL_FLOAT32_OPS))


@pytest.mark.parametrize("requested, message", [
    ("foo", r"must be a device string .* got 'foo'"),
    ("/CPU:x", r"must be a device string .* got '/CPU:x'"),
    ("/job:ps/task:0", r"must name a device type, .* got '/job:ps/task:0'"),
    (3, r"must be a device string such as '/CPU:0', got 3"),
])
def test_bad_device_string(requested, message):
  with pytest.raises(ValueError, match=rf"table 't': `device` {message}"):
    placement.table_device("t", requested, visible_devices=CPU_ONLY, kernel_device_types=_kernels())


def test_create_table_places_rows_and_slots_by_the_rule():
  init()
  table = embedding.create_table(key_dtype=tf.int64, dim=4, name="t", device_vocabulary_size=8,
                                 emb_initializer=tf.zeros_initializer())
  assert table.variable.device.endswith("/device:CPU:0")
  optimizer = lazy_adam.create_hash_optimizer(0.1)
  optimizer.build([table.variable])
  for slot in ("m", "v"):
    assert optimizer.get_slot("t", slot).device == table.variable.device


def test_create_table_checks_its_device():
  init()
  with pytest.raises(ValueError, match=r"table 't': `device` must be a device string"):
    embedding.create_table(key_dtype=tf.int64, dim=4, name="t", device_vocabulary_size=8,
                           emb_initializer=tf.zeros_initializer(), device="gpu0")
  with pytest.raises(ValueError, match=r"table 't': device '/GPU:0' is not visible"):
    embedding.create_table(key_dtype=tf.int64, dim=4, name="t", device_vocabulary_size=8,
                           emb_initializer=tf.zeros_initializer(), device="/GPU:0")


def test_strategy_on_host_devices_passes_the_check():
  placement.check_strategy_devices("t", ["/job:localhost/replica:0/task:0/device:CPU:0"],
                                   kernel_device_types=_kernels())
  placement.check_strategy_devices("t", ["/device:GPU:0", "/device:GPU:1"],
                                   kernel_device_types=_kernels(ALL_FLOAT32_OPS))


def test_strategy_over_gpus_without_gpu_kernels_names_table_device_and_fix():
  with pytest.raises(
      ValueError, match=r"table 't': the distribution strategy places its rows on "
      r"/device:GPU:0, where MxLazyAdamRows .*pipeline.strategy: null"):
    placement.check_strategy_devices("t", ["/device:GPU:0"], kernel_device_types=_kernels())


def test_create_table_under_a_host_strategy_is_checked_and_passes():
  init()
  strategy = tf.distribute.MirroredStrategy(["/CPU:0"])
  with strategy.scope():
    table = embedding.create_table(key_dtype=tf.int64, dim=4, name="t", device_vocabulary_size=8,
                                   emb_initializer=tf.zeros_initializer())
  assert "CPU" in table.variable.device
