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
