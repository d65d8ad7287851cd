"""Shared fixtures: every test starts and ends without an mxRec run.

Also puts the sparse-core test helpers (`sparse_testlib`: NumPy references,
tables of known rows, in tests/core) on sys.path for the tests of every package
that uses them (core, optimizers, saver, util, mxrec).
"""

import pathlib
import sys

import pytest

from mxrec_pipeline.util import initialize

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "core"))


@pytest.fixture(autouse=True)
def _no_run_leaks():
  """Ends any run a test started with init(), even when the test fails."""
  initialize.terminate_config_initializer()
  yield
  initialize.terminate_config_initializer()


def _module_rank(items) -> dict:
  """Test file -> 0 (holds cluster tests), 1 (slow tests) or 2 (neither)."""
  rank = {}
  for item in items:
    marks = {mark.name for mark in item.iter_markers()}
    own = 0 if "cluster" in marks else 1 if "slow" in marks else 2
    rank[item.path] = min(rank.get(item.path, 2), own)
  return rank


def pytest_collection_modifyitems(items):
  """Runs the files with the longest tests first, each file's tests together and in order.

  Under pytest-xdist (`make test`) the processes then finish on short tests
  instead of one waiting for another's cluster run; a file's module fixtures
  are still set up once per process.
  """
  rank = _module_rank(items)
  items.sort(key=lambda item: rank[item.path])  # Stable: file and test order kept.
