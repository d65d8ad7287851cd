"""The mxRec workflows end to end, through the ported examples, in fresh processes.

Session (FeatureSpec mode and automatic graph modification) and Estimator
(with GraphModifierHook) train the same model on the same MovieLens batches
with the same seeds: their training losses must agree to float tolerance.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

# Runs the ported mxRec examples as subprocess trainings.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "mxrec_quickstart" / "main.py"
ESTIMATOR = ROOT / "examples" / "mxrec_estimator" / "main.py"
STEPS = 20

_DRIVER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("example_main", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print("RESULT " + json.dumps(module.main(sys.argv[2:])))
"""


def run_example(script, tmp_path, modify_graph, *args):
  env = dict(os.environ, USE_MODIFY_GRAPH=str(int(modify_graph)),
             PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = subprocess.run(
      [sys.executable, "-c", _DRIVER, str(script), *args], cwd=tmp_path, env=env,
      capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")][-1]
  return json.loads(result[len("RESULT "):]), out.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("workflows")
  results = {}
  for modify_graph in (False, True):
    results["session", modify_graph] = run_example(QUICKSTART, tmp, modify_graph, "--steps",
                                                   str(STEPS), "--model-dir",
                                                   str(tmp / f"session{int(modify_graph)}"))[0]
    results["estimator", modify_graph] = run_example(ESTIMATOR, tmp, modify_graph, "--steps",
                                                     str(STEPS), "--model-dir",
                                                     str(tmp / f"estimator{int(modify_graph)}"))[0]
  return results


def test_session_and_estimator_reach_the_same_loss(runs):
  reference = runs["session", False]["train_loss"]
  for key, result in runs.items():
    assert result["step"] == STEPS, key
    assert result["train_loss"] == pytest.approx(reference, abs=1e-5), key


def test_quickstart_restores_and_continues(tmp_path):
  model_dir = str(tmp_path / "saved-model")
  first, _ = run_example(QUICKSTART, tmp_path, True, "--steps", "10", "--saving-interval", "10",
                         "--model-dir", model_dir)
  assert first["step"] == 10
  second, stdout = run_example(QUICKSTART, tmp_path, True, "--steps", "10", "--saving-interval",
                               "10", "--model-dir", model_dir)
  assert "restored" in stdout and second["step"] == 20
  assert (tmp_path / "export_graph" / "modified_graph.pbtxt").exists()
  assert sorted(p.name for p in (tmp_path / "saved-model").glob("sparse-*")) == [
      "sparse-model-0-10", "sparse-model-0-20"
  ]


@pytest.mark.parametrize("modify_graph", [False, True])
def test_quickstart_with_dynamic_expansion_matches_plain_tables(runs, tmp_path, modify_graph,
                                                                monkeypatch):
  monkeypatch.setenv("USE_DYNAMIC_EXPANSION", "1")
  result, _ = run_example(QUICKSTART, tmp_path, modify_graph, "--steps", str(STEPS), "--model-dir",
                          str(tmp_path / "expansion"))
  assert result["train_loss"] == pytest.approx(runs["session", False]["train_loss"], abs=1e-5)
