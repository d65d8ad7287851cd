"""Bad input to the command line: the cases, how to run one, how to classify its outcome.

Each case is (name, arguments, input files, expected exit status, expected
message fragment). Arguments and file contents may hold `{tmp}` (the case's
directory), `{model}` (tiny_model.py's SavedModel), `{repo}` and `{pg}` (a
PostgreSQL server's `host:port`). Config cases run `export` on a model_dir
that does not exist, and `train --local-cluster` cases stop at the bad value,
so they do not train; sweep cases stop before their first trial (`--timeout`),
on purpose or on the error. Data cases run `train` on tiny LETOR / MovieLens /
ELWC files (a file name may hold a directory, e.g. `ml/ml-100k.inter`); the
bad ones stop before training, the accepted ones (skipped records, no
relevant validation document) train one step, and METRICS says what their
metrics.json must hold.

Run alone (`python robustness_cases.py PYTHONPATH [NAME_PART]`) it prints
each case's outcome class (those whose name holds NAME_PART) for the code on
PYTHONPATH (e.g. an older checkout), without the PostgreSQL cases.
"""

import json
import os
import pathlib
import struct
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # A guard against a hung case only.

GOOD_LIST = {"context": {"user_id": 7}, "examples": [{"item_id": 1, "weight": 1.0}, {"item_id": 2}]}
JOB = ("builder: movielens_listwise\npipeline:\n  model_dir: {tmp}/run\n"
       "  learning_rate: 0.01\n")

# Bad data through `train`: tiny MSLR (LETOR text) and MovieLens (RecBole atomic files) sets,
# one step of training when the data is accepted.
_STEP = ("pipeline:\n  model_dir: {tmp}/run\n  num_epochs: 1\n  num_train_steps: 1\n"
         "  export_best_model: false\n  seed: 1\n")
MSLR_JOB = (
    "builder: mslr_dnn\ndata:\n  train_path: {tmp}/train.txt\n  valid_path: {tmp}/valid.txt\n"
    "  elwc_dir: {tmp}/elwc\n  baseline_feature: 5\nmodel:\n  hidden_layer_dims: [4]\n"
    "dataset:\n  train_batch_size: 2\n  valid_batch_size: 2\n  list_size: 4\n" + _STEP)
MOVIELENS_JOB = (
    "builder: movielens_listwise\ndata:\n  data_dir: {tmp}/ml\n  elwc_dir: {tmp}/elwc\n"
    "  max_list_size: null\nmodel:\n  hidden_layer_dims: [4]\n"
    "  device_vocabulary_size: 64\ndataset:\n  train_batch_size: 2\n"
    "  valid_batch_size: 2\n" + _STEP)
LETOR_LINES = ["2 qid:1 1:0.5 5:3", "0 qid:1 1:1.5 5:1", "1 qid:2 1:2 5:2", "0 qid:2 1:0 5:0"]
ML_USERS = ("user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
            "1\t24\tM\ttechnician\t85711\n2\t53\tF\tother\t94043\n")
ML_ITEMS = ("item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
            "1\tToy Story\t1995\tAnimation\n2\tGoldenEye\t1995\tAction\n"
            "3\tFour Rooms\t1995\tThriller\n")
# (user, item, rating, timestamp); each user's latest rating is validation.
ML_RATINGS = [("1", "1", "5", "100"), ("1", "2", "3", "101"), ("1", "3", "4", "102"),
              ("2", "1", "2", "100"), ("2", "2", "4", "101"), ("2", "3", "1", "102")]


def _letor(name, train, valid, code, fragment, *sets):
  """A mslr_dnn `train` case; train/valid are lists of lines (or None: LETOR_LINES)."""
  files = {"job.yaml": MSLR_JOB}
  for path, lines in (("train.txt", train), ("valid.txt", valid)):
    lines = LETOR_LINES if lines is None else lines
    files[path] = "".join(line + "\n" for line in lines)
  args = ["train", "{tmp}/job.yaml"] + [a for s in sets for a in ("--set", s)]
  return (name, args, files, code, fragment)


def _movielens(name, ratings, code, fragment, *sets, extra=None):
  """A movielens_listwise `train` case over ML_USERS, ML_ITEMS and `ratings` (or ML_RATINGS)."""
  ratings = ML_RATINGS if ratings is None else ratings
  inter = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n" + "".join(
      "\t".join(r) + "\n" for r in ratings)
  files = {
      "job.yaml": MOVIELENS_JOB, "ml/ml-100k.user": ML_USERS, "ml/ml-100k.item": ML_ITEMS,
      "ml/ml-100k.inter": inter, **(extra or {})
  }
  args = ["train", "{tmp}/job.yaml"] + [a for s in sets for a in ("--set", s)]
  return (name, args, files, code, fragment)


def _set(rows, index, column, value):
  """ML_RATINGS-like rows with row `index`'s `column` (0-3) replaced."""
  rows = [list(r) for r in rows]
  rows[index][column] = value
  return [tuple(r) for r in rows]


def _masked_crc32c(data: bytes) -> int:
  """TFRecord's masked CRC-32C (Castagnoli), in plain Python: small records only."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(records) -> bytes:
  """The TFRecord framing of `records` (bytes each): length, crc(length), data, crc(data)."""
  out = b""
  for data in records:
    length = struct.pack("<Q", len(data))
    out += (length + struct.pack("<I", _masked_crc32c(length)) + data +
            struct.pack("<I", _masked_crc32c(data)))
  return out


# Three ELWC records of 20 bytes (36 framed), each a context and 9 examples without features.
_ELWC = b"\x12\x00" + b"\x0a\x00" * 9
_GOOD_TFRECORD = tfrecord([_ELWC] * 3)
_BAD_DATA_CRC = _GOOD_TFRECORD[:36 + 12] + b"X" + _GOOD_TFRECORD[36 + 13:]  # Record 2's data.


def _elwc_given(name, train, code, fragment):
  """movielens_listwise with ELWC files already in elwc_dir (given directly): `train` bytes."""
  return _movielens(name, None, code, fragment,
                    extra={"elwc/train.tfrecord": train, "elwc/valid.tfrecord": _GOOD_TFRECORD})


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
    # Bad data (train): LETOR text of mslr_dnn.
    _letor("letor NaN feature", ["2 qid:1 1:nan 5:3"] + LETOR_LINES[1:], None, 2,
           "train.txt:1: feature 'custom_features_1' is nan"),
    _letor("letor inf feature", None, LETOR_LINES[:3] + ["0 qid:2 1:0 5:-inf"], 2,
           "valid.txt:4: feature 'custom_features_5' is -inf"),
    _letor("letor NaN label", LETOR_LINES[:1] + ["nan qid:1 1:1"] + LETOR_LINES[2:], None, 2,
           "train.txt:2: label 'utility' is nan"),
    _letor("letor label above range", LETOR_LINES[:2] + ["5 qid:2 1:2"] + LETOR_LINES[3:], None, 2,
           "train.txt:3: label 'utility' is 5, outside [0, 4]"),
    _letor("letor negative label", None, ["-1 qid:1 1:1"] + LETOR_LINES[1:], 2,
           "valid.txt:1: label 'utility' is -1, outside [0, 4]"),
    _letor("letor empty train file", [], None, 2, "train.txt: no records (empty file)"),
    _letor("letor empty valid file", None, ["# only a comment"], 2,
           "valid.txt: no records (empty file)"),
    _letor("letor all records skipped", ["9 qid:1 1:1", "nan qid:2 1:1"], None, 2,
           "train.txt: no records left after skipping 2 bad record(s)", "data.on_bad_record=skip"),
    _letor("letor skip bad records", LETOR_LINES + ["7 qid:3 1:1", "1 qid:3 1:inf"], None, 0,
           "train.txt: skipped 2 bad record(s)", "data.on_bad_record=skip"),
    _letor("letor no relevant validation", None, ["0 qid:1 1:1", "0 qid:1 1:2", "0 qid:2 1:3"], 0,
           "no validation list has a relevant document"),
    # Bad data (train): MovieLens atomic files of movielens_listwise.
    _movielens("movielens NaN rating", _set(ML_RATINGS, 1, 2, "nan"), 2,
               "ml-100k.inter:3: label 'rating' is nan"),
    _movielens("movielens rating above range", _set(ML_RATINGS, 4, 2, "7"), 2,
               "ml-100k.inter:6: label 'rating' is 7, outside [1, 5]"),
    _movielens("movielens zero rating", _set(ML_RATINGS, 0, 2, "0"), 2,
               "ml-100k.inter:2: label 'rating' is 0, outside [1, 5]"),
    _movielens("movielens inf timestamp", _set(ML_RATINGS, 2, 3, "inf"), 2,
               "ml-100k.inter:4: feature 'timestamp' is inf"),
    _movielens("movielens bad item id", _set(ML_RATINGS, 3, 1, "abc"), 2,
               "ml-100k.inter:5: feature 'item_id' is 'abc', expected an integer"),
    _movielens("movielens no ratings", [], 2, "ml-100k.inter: no records (empty file)"),
    _movielens("movielens empty validation", [ML_RATINGS[0], ML_RATINGS[3]], 2,
               "no validation list: every user has fewer than 2 ratings"),
    _movielens("movielens skip bad records", _set(ML_RATINGS, 1, 2, "-3"), 0,
               "ml-100k.inter: skipped 1 bad record(s)", "data.on_bad_record=skip"),
    _movielens("movielens no relevant validation", _set(_set(ML_RATINGS, 2, 2, "1"), 5, 2, "1"), 0,
               "no validation list has a relevant document"),
    # Tables: a tiered item table of 2 device + 1 host rows, 4 items in training.
    _movielens(
        "tiered table full",
        [("1", "1", "5", "100"), ("1", "2", "3", "101"), ("1", "3", "4", "102"),
         ("2", "4", "2", "100"), ("2", "3", "4", "101"), ("2", "1", "1", "102")], 2,
        "table 'item' is full: 3 rows in all (device_vocabulary_size=2 device-cache rows "
        "+ host_vocabulary_size=1 host rows + ssd_vocabulary_size=0 SSD rows), 2 used, and this "
        "batch brings 2 new keys. Nothing was inserted. Raise host_vocabulary_size or "
        "ssd_vocabulary_size", "model.id_device_vocabulary_size=2", "model.host_vocabulary_size=1",
        "dataset.train_batch_size=1", "pipeline.num_train_steps=null",
        extra={"ml/ml-100k.item": ML_ITEMS + "4\tCopycat\t1995\tCrime\n"}),
    # ELWC TFRecords given directly (in elwc_dir): the CRC pass before training.
    _elwc_given("elwc corrupt record", _BAD_DATA_CRC, 2,
                "train.tfrecord: record 2 at byte offset 36 is corrupt"),
    _elwc_given("elwc truncated file", _GOOD_TFRECORD[:-5], 2,
                "train.tfrecord: record 3 at byte offset 72 is truncated"),
    _elwc_given("elwc empty file", b"", 2, "train.tfrecord: no lists (empty file)"),
    _elwc_given("elwc not ELWC", tfrecord([b"\x00" * 20]), 2,
                "train.tfrecord: record 1 at byte offset 0 is not an ExampleListWithContext"),
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
    ("local cluster ps without workers",
     ["train", "{tmp}/job.yaml", "--local-cluster", "workers=0,ps=2"], {"job.yaml": JOB}, 2,
     "--local-cluster 'workers=0,ps=2': `workers` must be a positive int, got 0"),
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

# What metrics.json must say after these cases: (keys into metrics.json, value).
METRICS = {
    "letor skip bad records": (("data", "train", "bad_records", "by_reason"),
                               {"label out of range": 1, "non-finite feature": 1}),
    "movielens skip bad records": (("data", "train", "bad_records", "skipped"), 1),
    "letor no relevant validation": (("data", "valid", "lists_with_relevant"), 0),
    "movielens no relevant validation": (("data", "valid", "lists_with_relevant"), 0),
}


def fill(text: str, values: dict) -> str:
  """`text` with each `{name}` of `values` replaced."""
  for name, value in values.items():
    text = text.replace("{" + name + "}", value)
  return text


def _write_files(case, tmp: pathlib.Path, values: dict) -> list[str]:
  """Writes a case's input files under `tmp`; returns its arguments, filled in."""
  _, args, files, _, _ = case
  for name, content in files.items():
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
      path.write_bytes(content.replace(b"{tmp}", str(tmp).encode()))
    else:
      path.write_text(fill(content, values))
  return [fill(a, values) for a in args]


def run_case_in_process(case, tmp: pathlib.Path, model: str = "", pg: str = ""):
  """Runs a case's command as `cli.main` in this process, in `tmp`: (exit status, stdout, stderr).

  The same code as the subprocess (`run_case`) without a new interpreter and
  TensorFlow import; an exception that escapes `cli.main` becomes a
  "Traceback" in stderr, as the command would print it.
  """
  import contextlib  # pylint: disable=import-outside-toplevel
  import io  # pylint: disable=import-outside-toplevel
  import traceback  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import cli  # pylint: disable=import-outside-toplevel
  args = _write_files(case, tmp, {"tmp": str(tmp), "model": model, "repo": str(REPO), "pg": pg})
  out, err = io.StringIO(), io.StringIO()
  with contextlib.chdir(tmp), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      code = cli.main(args)
    except SystemExit as e:  # argparse's usage errors.
      code = e.code if isinstance(e.code, int) else 1
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()
      code = 1
  return code, out.getvalue(), err.getvalue()


def run_case(case, tmp: pathlib.Path, pythonpath: str, model: str = "", pg: str = ""):
  """Runs a case's command in a subprocess; returns (exit status, stdout, stderr)."""
  args = _write_files(case, tmp, {"tmp": str(tmp), "model": model, "repo": str(REPO), "pg": pg})
  env = {**os.environ, "PYTHONPATH": pythonpath, "TF_CPP_MIN_LOG_LEVEL": "3"}
  process = subprocess.run([sys.executable, "-m", "mxrec_pipeline.cli", *args], cwd=tmp, env=env,
                           capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
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
