"""Where a Keras pipeline's tables live (keras/strategies.py), decided in one place."""

import ast
import pathlib
from unittest import mock

import pytest
import tensorflow as tf

from mxrec_pipeline.core import placement
from mxrec_pipeline.keras import datasets
from mxrec_pipeline.keras import strategies
from mxrec_pipeline.keras.layers import SparseFeature

Placement = strategies.TablePlacement
PACKAGE = pathlib.Path(strategies.__file__).resolve().parents[1]
# Every decision on a strategy's type in the package (docs/architecture.md lists them): the
# tables' placement and the hash optimizer's gradient route, both in core/placement.py.
STRATEGY_DECISIONS = {
    ("core/placement.py", "table_placement"),
    ("core/placement.py", "gradient_route"),
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


def _strategy_type_checks(tree: ast.AST) -> set[str]:
  """Names of the functions of `tree` that test a strategy's type (isinstance, issubclass,
  type(...) compared, a class name compared)."""
  found = set()

  def visit(node, function):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      function = node.name
    text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Compare)) else ""
    if isinstance(node, ast.Call) and getattr(node.func, "id",
                                              None) in ("isinstance", "issubclass"):
      if "Strategy" in ast.unparse(node.args[1]):
        found.add(function)
    elif isinstance(node, ast.Compare) and "Strategy" in text and ("type(" in text or
                                                                   "__name__" in text):
      found.add(function)
    for child in ast.iter_child_nodes(node):
      visit(child, function)

  visit(tree, "<module>")
  return found


def test_strategy_types_are_decided_only_in_the_placement_module():
  """A new strategy-type branch belongs in core/placement.py, at most three decisions in all."""
  found = set()
  for path in PACKAGE.rglob("*.py"):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found |= {(path.relative_to(PACKAGE).as_posix(), f) for f in _strategy_type_checks(tree)}
  assert found == STRATEGY_DECISIONS
  assert len(found) <= 3


def test_the_strategy_check_finder_sees_each_form():
  source = """
def a(s): return isinstance(s, tf.distribute.MirroredStrategy)
def b(s): return type(s) is tf.distribute.experimental.ParameterServerStrategy
def c(s): return type(s).__name__ == "MultiWorkerMirroredStrategy"
def d(s): return isinstance(s, (int, tf.distribute.OneDeviceStrategy))
def e(v): return isinstance(v, tf.distribute.DistributedValues)
"""
  assert _strategy_type_checks(ast.parse(source)) == {"a", "b", "c", "d"}
