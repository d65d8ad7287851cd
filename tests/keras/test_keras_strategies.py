"""Where a Keras pipeline's tables live (keras/strategies.py), decided in one place."""

import pathlib
import re
from unittest import mock

import pytest
import tensorflow as tf

from mxrec_pipeline.core import placement
from mxrec_pipeline.keras import datasets
from mxrec_pipeline.keras import strategies
from mxrec_pipeline.keras.layers import SparseFeature

Placement = strategies.TablePlacement
PACKAGE = pathlib.Path(strategies.__file__).resolve().parents[1]
# Every check of a strategy's type in the package (docs/architecture.md lists them):
# the pipeline's placement, the hash optimizer's update path, the PS table's devices.
STRATEGY_DECISIONS = {
    ("keras/strategies.py", "ParameterServerStrategy"),
    ("keras/strategies.py", "MultiWorkerMirroredStrategy"),
    ("optimizers/base.py", "MultiWorkerMirroredStrategy"),
    ("optimizers/base.py", "MirroredStrategy"),
    ("distributed/ps_table.py", "ParameterServerStrategy"),
}


def _fake(strategy_class, replicas: int):
  strategy = mock.create_autospec(strategy_class, instance=True)
  strategy.num_replicas_in_sync = replicas
  return strategy


@pytest.mark.parametrize("strategy, sparse, expected", [
    (_fake(tf.distribute.experimental.ParameterServerStrategy,
           2), True, Placement.PARAMETER_SERVERS),
    (_fake(tf.distribute.experimental.ParameterServerStrategy,
           2), False, Placement.PARAMETER_SERVERS),
    (_fake(tf.distribute.MultiWorkerMirroredStrategy, 2), True, Placement.WORKERS),
    (_fake(tf.distribute.MultiWorkerMirroredStrategy, 2), False, Placement.ONE_HOST),
    (_fake(tf.distribute.MultiWorkerMirroredStrategy, 1), True, Placement.ONE_HOST),
    (_fake(tf.distribute.MirroredStrategy, 4), True, Placement.ONE_HOST),
    (tf.distribute.get_strategy(), True, Placement.ONE_HOST),
])
def test_placement_follows_the_strategy(strategy, sparse, expected):
  assert strategies.placement_for(strategy, sparse) is expected
  assert expected.sharded == (expected is not Placement.ONE_HOST)


@pytest.mark.parametrize("replicas, placement, sparse, expected", [
    (4, Placement.ONE_HOST, True, True),
    (1, Placement.ONE_HOST, True, False),
    (4, Placement.ONE_HOST, False, False),
    (2, Placement.WORKERS, True, False),
])
def test_only_one_host_replicas_split_inserted_batches(replicas, placement, sparse, expected):
  strategy = _fake(tf.distribute.MirroredStrategy, replicas)
  assert strategies.splits_batches(strategy, placement, sparse) is expected


def test_placement_values_are_the_manifest_names():
  assert [p.value for p in Placement] == ["one_host", "workers", "parameter_servers"]


@pytest.mark.parametrize(
    "gpus, rows_on_gpu, expected",
    [
        ([], False, ["/device:CPU:0"]),
        (["/device:GPU:0"], False, []),  # One replica: no strategy, rows on the host.
        (["/device:GPU:0"], True, ["/device:GPU:0"]),
        (["/device:GPU:0", "/device:GPU:1"], False, ["/device:GPU:0", "/device:GPU:1"]),
    ])
def test_mirrored_devices(gpus, rows_on_gpu, expected):
  assert strategies.mirrored_devices(gpus, ["/device:CPU:0"], rows_on_gpu) == expected


def test_native_row_kernels_are_host_only_today():
  assert not placement.accelerator_holds_rows()


def test_unknown_strategy_name_is_named():
  with pytest.raises(ValueError, match="'TPUStrategy'"):
    strategies.get_strategy("TPUStrategy")


def test_raw_id_copy_leaves_the_given_builder_inserting():
  spec = {"item_id": tf.io.FixedLenFeature([1], tf.int64, default_value=0)}
  builder = datasets.SimpleDatasetBuilder(
      {}, spec, "mask", ("rating", tf.io.FixedLenFeature([1], tf.float32, default_value=-1.0)),
      datasets.DatasetHparams(train_input_pattern="t", valid_input_pattern="v", train_batch_size=2,
                              valid_batch_size=2),
      sparse_features=[SparseFeature("item_id", "item")])
  raw = builder.with_raw_ids()
  assert raw is not builder and raw.keep_raw_ids and not builder.keep_raw_ids
  assert raw._inserts() is False and builder._inserts() is True  # pylint: disable=protected-access
  assert raw.sparse_features == builder.sparse_features


def test_strategy_types_are_checked_only_where_listed():
  """A new strategy-type branch belongs in keras/strategies.py (or this list, with a reason)."""
  found = set()
  pattern = re.compile(
      r"isinstance\((?:[^()]|\([^()]*\))*?tf\.distribute\.(?:experimental\.)?(\w+Strategy)\)")
  for path in PACKAGE.rglob("*.py"):
    text = re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))
    for match in pattern.finditer(text):
      found.add((path.relative_to(PACKAGE).as_posix(), match.group(1)))
  assert found == STRATEGY_DECISIONS
