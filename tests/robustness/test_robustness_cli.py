"""Bad input through the command line: exit status 2 and one line naming the culprit.

The table is robustness_cases.CASES; each case runs `mxrec-pipeline`: sweep
cases in a subprocess, the others as `cli.main` in this process (the same
code, without a TensorFlow import per case; `python robustness_cases.py`
runs them all as subprocesses). Predict cases score with tiny_model.py's SavedModel (untrained);
the PostgreSQL cases use test_sweep_postgres's server; data cases train on tiny
files (robustness_cases.METRICS checks the metrics.json of those that train).
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf

import robustness_cases as cases
from test_sweep_postgres import postgres_url  # noqa: F401  pylint: disable=unused-import (a fixture)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
  path = tmp_path_factory.mktemp("tiny") / "model"
  subprocess.run([sys.executable,
                  str(pathlib.Path(__file__).parent / "tiny_model.py"),
                  str(path)], check=True, capture_output=True, timeout=cases.TIMEOUT_S,
                 env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  return str(path)


def _pythonpath():
  return os.pathsep.join([str(cases.REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.mark.parametrize("case", cases.CASES, ids=[c[0] for c in cases.CASES])
def test_case(case, tmp_path, request):
  _, args, _, expected_code, _ = case
  model = request.getfixturevalue("tiny_model") if args[0] == "predict" else ""
  pg = ""
  if any("{pg}" in a for a in args):
    pg = request.getfixturevalue("postgres_url").rsplit("@", 1)[1].split("/")[0]
  if any("pymysql" in a for a in args) and importlib.util.find_spec("pymysql"):
    pytest.skip("pymysql is installed: no missing driver to report")
  if args[0] == "sweep":  # Sweeps start worker processes and handle signals: a subprocess.
    code, out, err = cases.run_case(case, tmp_path, _pythonpath(), model, pg)
  else:
    code, out, err = cases.run_case_in_process(case, tmp_path, model, pg)
    tf.keras.backend.clear_session()
  values = {"tmp": str(tmp_path), "model": model, "repo": str(cases.REPO), "pg": pg}
  outcome = cases.classify(case, code, out, err, values)
  assert outcome == ("ok" if expected_code == 0 else "clear error"), (code, out, err[-2000:])
  if expected_code == 0 and args[0] == "predict":
    json.loads(out, parse_constant=pytest.fail)  # Strict JSON: no NaN.
  if "secret" in " ".join(args):
    assert "secret" not in out + err
  if case[0] in cases.METRICS:
    keys, value = cases.METRICS[case[0]]
    with open(tmp_path / "run" / "metrics.json", encoding="utf-8") as f:
      found = json.load(f)
    for key in keys:
      found = found[key]
    assert found == value


def test_a_missing_sqlite_directory_is_not_created(tmp_path):
  case = next(c for c in cases.CASES if c[0] == "storage missing SQLite dir")
  code, _, _ = cases.run_case(case, tmp_path, _pythonpath())
  assert code == 2 and not (tmp_path / "no").exists()


def test_nan_scores_are_printed_as_null_with_a_warning(tmp_path, tiny_model):
  case = next(c for c in cases.CASES if c[0] == "predict NaN score")
  code, _, err = cases.run_case(case, tmp_path, _pythonpath(), tiny_model)
  assert code == 0
  assert "warning: list 0, example 1: the model's score is nan; printed as null" in err
