"""`mxrec-pipeline --help` and config errors answer without importing TensorFlow."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]

# Runs the CLI in this process, then reports its exit status and whether
# anything imported TensorFlow (or tfr, or a ranker module).
WRAPPER = """
import json, sys
from mxrec_pipeline import cli
try:
  code = cli.main(sys.argv[1:])
except SystemExit as e:
  code = e.code
heavy = sorted(m for m in ("tensorflow", "tensorflow_ranking", "builders.movielens",
                           "builders.mslr", "builders.movielens_dcn") if m in sys.modules)
print(json.dumps({"code": code, "imported": heavy}))
"""


def _run_cli(tmp_path, *args):
  env = {
      **os.environ, "PYTHONPATH": os.pathsep.join(
          [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
  }
  process = subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
  result = json.loads(process.stdout.strip().splitlines()[-1])
  return result["code"], result["imported"], process.stdout, process.stderr


def test_help_does_not_import_tensorflow(tmp_path):
  code, imported, out, _ = _run_cli(tmp_path, "--help")
  assert (code, imported) == (0, [])
  assert "train" in out and "sweep" in out


@pytest.mark.parametrize("raw, overrides, message", [
    ({"builder": "movielens_listwise", "pipeline": {"model_dir": "/x", "learnin_rate": 1}
     }, [], "pipeline.learnin_rate"),
    ({"builder": "movielens_dcn", "pipeline": {"model_dir": "/x"}
     }, ["model.combiner=max"], "model.combiner must be one of"),
    ({"builder": "mslr_dnn", "pipeline": {"model_dir": "/x"}
     }, ["pipeline.sparse_optimizer=nope"], "unsupported sparse optimizer 'nope'"),
    ({"builder": "movielens_listwise", "pipeline": {"model_dir": "/x", "loss": "nope"}
     }, [], "`loss` must be a tfr loss key"),
])
def test_bad_train_config_exits_2_without_tensorflow(tmp_path, raw, overrides, message):
  path = tmp_path / "bad.yaml"
  path.write_text(yaml.safe_dump(raw))
  args = ["train", str(path)] + [a for o in overrides for a in ("--set", o)]
  code, imported, _, err = _run_cli(tmp_path, *args)
  assert (code, imported) == (2, [])
  assert message in err


def test_bad_sweep_config_exits_2_without_tensorflow(tmp_path):
  path = tmp_path / "sweep.yaml"
  path.write_text(
      yaml.safe_dump({
          "base_config": str(REPO / "configs" / "movielens_listwise.yaml"),
          "sweep_dir": str(tmp_path / "sweep"),
          "search_space": {"model.nope": {"type": "int", "low": 1, "high": 2}}
      }))
  code, imported, _, err = _run_cli(tmp_path, "sweep", str(path), "--set", "pipeline.num_epochs=1")
  assert (code, imported) == (2, [])
  assert "search_space.model.nope: not a key of the movielens_listwise job config" in err
