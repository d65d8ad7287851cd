"""Sweeps are an extra: without its packages `mxrec-pipeline sweep` exits 2 naming the extra."""

import pathlib
import sys

from mxrec_pipeline import cli

CONFIG = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "sweep_movielens.yaml")


def test_sweep_without_its_extra_exits_2_naming_it(monkeypatch, capsys):
  for name in [m for m in sys.modules if m.startswith("mxrec_pipeline.sweep")]:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.setitem(sys.modules, "optuna", None)  # As if not installed.
  monkeypatch.setitem(sys.modules, "plotly", None)
  assert cli.main(["sweep", CONFIG]) == 2
  err = capsys.readouterr().err
  assert ("mxrec-pipeline sweep: error: sweeps need the `sweep` extra: pip install "
          "'mxrec-pipeline[sweep]' (missing: optuna, plotly)") in err


def test_the_extra_is_installed_here():
  from mxrec_pipeline import sweep  # pylint: disable=import-outside-toplevel
  assert sweep.missing_packages() == []
