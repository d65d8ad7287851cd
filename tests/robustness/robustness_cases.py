"""Bad input to the command line: the cases, how to run one, how to classify its outcome.

Each case is (name, arguments, input files, expected exit status, expected
message fragment). Arguments and file contents may hold `{tmp}` (the case's
directory), `{model}` (tiny_model.py's SavedModel), `{repo}` and `{pg}` (a
PostgreSQL server's `host:port`). Config cases run `export` on a model_dir
that does not exist, and `train --local-cluster` cases stop at the bad value,
so no case trains; sweep cases stop before their first trial (`--timeout`),
on purpose or on the error.

Run alone (`python robustness_cases.py PYTHONPATH [NAME_PART]`) it prints
each case's outcome class (those whose name holds NAME_PART) for the code on
PYTHONPATH (e.g. an older checkout), without the PostgreSQL cases.
"""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # A guard against a hung case only.

GOOD_LIST = {"context": {"user_id": 7}, "examples": [{"item_id": 1, "weight": 1.0}, {"item_id": 2}]}
JOB = ("builder: movielens_listwise\npipeline:\n  model_dir: {tmp}/run\n"
       "  learning_rate: 0.01\n")


def _lists(*changes):
  """JSON text of GOOD_LIST with `(list index, "context"|example index, feature, value)` set."""
  lists = [json.loads(json.dumps(GOOD_LIST)) for _ in range(2)]
  for index, where, name, value in changes:
    part = lists[index]["context"] if where == "context" else lists[index]["examples"][where]
    part[name] = value
  return json.dumps(lists)


def _predict(name, text, code, fragment, data_file="lists.json"):
  return (name, ["predict", "{model}", "--input",
                 "{tmp}/" + data_file], {data_file: text}, code, fragment)


def _config(name, text, code, fragment, *sets):
  args = ["export", "{tmp}/job.yaml"] + [a for s in sets for a in ("--set", s)]
  return (name, args, {"job.yaml": text}, code, fragment)


def _sweep(name, storage, code, fragment):
  sweep = ("base_config: {repo}/configs/movielens_listwise.yaml\nstudy_name: robust\n"
           "sweep_dir: {tmp}/sweep\nsearch_space:\n"
           "  model.dropout: {type: float, low: 0.0, high: 0.3}\n")
  return (name, ["sweep", "{tmp}/sweep.yaml", "--timeout", "0.001", "--storage",
                 storage], {"sweep.yaml": sweep}, code, fragment)


CASES = [
    # predict: JSON structure and values.
    _predict("predict ok", _lists(), 0, '{"scores": [[1.0, 2.0], [1.0, 2.0]]}'),
    _predict("predict no lists", "[]", 0, '{"scores": []}'),
    _predict("predict no examples", json.dumps([{"examples": []}]), 0, '{"scores": [[]]}'),
    _predict("predict float id", _lists((0, "context", "user_id", 7.5)), 2,
             "list 0: feature 'user_id': got float values, the model expects int64"),
    _predict("predict string id", _lists((1, 0, "item_id", "abc")), 2,
             "list 1: feature 'item_id': got string values, the model expects int64"),
    _predict("predict two ids", _lists((0, "context", "user_id", [1, 2])), 2,
             "feature 'user_id': got 2 int64 values, the model expects shape [1]"),
    _predict("predict null", _lists((1, 1, "item_id", None)), 2,
             "list 1, example 1, feature 'item_id': expected a number, a string or an array"),
    _predict("predict nested", _lists((0, "context", "user_id", [[1]])), 2,
             "list 0, context, feature 'user_id'"),
    _predict("predict mixed", _lists((0, 0, "item_id", [1, "a"])), 2,
             "list 0, example 0, feature 'item_id': feature values must all be"),
    _predict("predict out of int64", _lists((0, 0, "item_id", 2**70)), 2,
             "list 0, example 0, feature 'item_id': Value out of range"),
    _predict("predict not JSON", "[{", 2, "lists.json: not valid JSON"),
    _predict("predict NaN literal", '[{"examples": [{"weight": NaN}]}]', 2,
             "NaN is not a JSON number"),
    _predict("predict object", '{"examples": []}', 2, "expected a JSON array of lists"),
    _predict("predict list not object", "[1]", 2, 'list 0: expected an object with "examples"'),
    _predict("predict no examples key", '[{"context": {}}]', 2, 'list 0: has no "examples"'),
    _predict("predict examples not array", '[{"examples": 3}]', 2,
             'list 0: "examples" must be an array of objects'),
    _predict("predict unknown list key", '[{"examples": [], "exmples": []}]', 2,
             "list 0: unknown keys ['exmples']"),
    _predict("predict not TFRecord", "not a record", 2, "lists.tfrecord: not an ELWC TFRecord file",
             "lists.tfrecord"),
    ("predict no model", ["predict", "{tmp}/nothing", "--input", "{tmp}/lists.json"],
     {"lists.json": _lists()}, 2, "nothing: not a SavedModel directory"),
    ("predict no input", ["predict", "{model}", "--input", "{tmp}/none.json"], {}, 2, "none.json"),
    _predict("predict NaN score", _lists((0, 1, "weight", -1.0)), 0,
             '{"scores": [[1.0, null], [1.0, 2.0]]}'),
    # Job configs.
    _config("config duplicate key", JOB + "  learning_rate: 0.02\n", 2,
            "duplicate key 'learning_rate' (lines 4 and 5)"),
    _config("config duplicate section", JOB + "pipeline:\n  model_dir: /x\n", 2,
            "duplicate key 'pipeline' (lines 2 and 5)"),
    _config("config infinite learning rate", JOB.replace("0.01", ".inf"), 2,
            "pipeline.learning_rate must be a finite number, got inf"),
    _config("config --set nan", JOB, 2, "pipeline.learning_rate must be a finite number, got nan",
            "pipeline.learning_rate=.nan"),
    _config("config --set overflow", JOB, 2, "pipeline.sparse_learning_rate must be a finite",
            "pipeline.sparse_learning_rate=1.0e+999"),
    _config("config --set bad YAML", JOB, 2,
            "--set pipeline.learning_rate: the value is not valid YAML",
            "pipeline.learning_rate=[1"),
    _config("config --set duplicate key", JOB, 2, "duplicate key 'a' (twice on line 1)",
            "model.x={a: 1, a: 2}"),
    _config("config unknown optimizer", JOB + "  optimizer: adamm\n", 2,
            "`optimizer` must be one of ['adadelta', 'adagrad', 'adam'"),
    _config("config unknown loss reduction", JOB + "  loss_reduction: mean\n", 2,
            "`loss_reduction` must be one of ['auto', 'none', 'sum', 'sum_over_batch_size']"),
    _config("config not UTF-8",
            JOB.encode() + b"# caf\xe9\n", 2, "job.yaml is not UTF-8 text: byte 0xe9 on line 5"),
    ("config missing file", ["export", "{tmp}/nope.yaml"], {}, 2, "cannot read config"),
    # `train --local-cluster` values (refused before any process starts).
    ("local cluster not an int", ["train", "{tmp}/job.yaml", "--local-cluster", "workers=two"],
     {"job.yaml": JOB}, 2, "--local-cluster 'workers=two': `workers` must be an int >= 0"),
    ("local cluster ps", ["train", "{tmp}/job.yaml", "--local-cluster", "workers=2,ps=1"],
     {"job.yaml": JOB}, 2, "ParameterServerStrategy is not supported yet"),
    # Sweep storage (none of these reaches a trial).
    _sweep("storage missing SQLite dir", "sqlite:///{tmp}/no/such/dir/study.db", 2,
           "the directory {tmp}/no/such/dir of the SQLite file does not exist"),
    _sweep("storage refused port", "postgresql://u:secret@127.0.0.1:1/db", 2,
           "storage postgresql://u:***@127.0.0.1:1/db: cannot connect"),
    _sweep("storage unresolvable host", "postgresql://u@no-such-host.invalid/db", 2,
           'could not translate host name "no-such-host.invalid"'),
    _sweep("storage missing driver", "mysql+pymysql://u:secret@127.0.0.1/db", 2,
           "the module 'pymysql' of the database driver 'mysql+pymysql' is not installed"),
    _sweep("storage unknown database", "nosuchdb://u@h/db", 2,
           "SQLAlchemy knows no database or driver 'nosuchdb'"),
    _sweep("storage bare postgresql", "postgresql://postgres@{pg}/postgres", 0,
           "study 'robust' in postgresql://postgres@{pg}/postgres"),
    _sweep("storage unknown role", "postgresql://nosuchrole:secret@{pg}/postgres", 2,
           'postgresql://nosuchrole:***@{pg}/postgres: cannot connect: connection to server'),
]


def fill(text: str, values: dict) -> str:
  """`text` with each `{name}` of `values` replaced."""
  for name, value in values.items():
    text = text.replace("{" + name + "}", value)
  return text


def run_case(case, tmp: pathlib.Path, pythonpath: str, model: str = "", pg: str = ""):
  """Runs a case's command in a subprocess; returns (exit status, stdout, stderr)."""
  _, args, files, _, _ = case
  values = {"tmp": str(tmp), "model": model, "repo": str(REPO), "pg": pg}
  for name, content in files.items():
    path = tmp / name
    if isinstance(content, bytes):
      path.write_bytes(content.replace(b"{tmp}", str(tmp).encode()))
    else:
      path.write_text(fill(content, values))
  env = {**os.environ, "PYTHONPATH": pythonpath, "TF_CPP_MIN_LOG_LEVEL": "3"}
  process = subprocess.run(
      [sys.executable, "-m", "mxrec_pipeline.cli", *(fill(a, values) for a in args)], cwd=tmp,
      env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
  return process.returncode, process.stdout, process.stderr


def classify(case, code, stdout, stderr, values) -> str:
  """"clear error" / "ok" as expected, else what went wrong."""
  _, _, _, expected_code, fragment = case
  fragment = fill(fragment, values)
  if "Traceback" in stderr:
    return "traceback"
  found = fragment in stdout + stderr
  if expected_code == 0:
    return "ok" if code == 0 and found else f"wrong (exit {code})"
  if code == 0 or "no checkpoint in" in stderr:  # Config cases: `export` got past the config.
    return "accepted"
  errors = [line for line in stderr.splitlines() if ": error: " in line]
  return "clear error" if code == expected_code and found and len(errors) == 1 else (
      f"unclear error (exit {code})")


if __name__ == "__main__":
  import collections  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  counts = collections.Counter()
  with tempfile.TemporaryDirectory() as base:
    model = os.path.join(base, "model")
    subprocess.run([sys.executable,
                    str(pathlib.Path(__file__).parent / "tiny_model.py"), model], check=True,
                   capture_output=True, timeout=TIMEOUT_S)
    for i, case in enumerate(CASES):
      if any("{pg}" in a for a in case[1]) or sys.argv[2:3] and sys.argv[2] not in case[0]:
        continue
      tmp = pathlib.Path(base, f"case{i}")
      tmp.mkdir()
      values = {"tmp": str(tmp), "model": model, "repo": str(REPO), "pg": ""}
      outcome = classify(case, *run_case(case, tmp, sys.argv[1], model), values)
      counts[outcome.split(" (")[0]] += 1
      print(f"{case[0]:40s} {outcome}", flush=True)
  print(dict(counts))
