"""Storage through tf.io.gfile: util/model_files.py on ram://, no POSIX-only calls on model paths.

The modules that read or write a run's storage (checkpoints, table shards,
export staging, exports, manifests, metrics.json, the resolved config) must
not call Python's file functions (`open`, `os.replace`/`makedirs`/`listdir`/
`path.exists`..., `shutil`, `glob`), which reach the local disk only: an AST
walk of each module fails on any such call.
"""

import ast
import pathlib
import uuid

import pytest
import tensorflow as tf

from mxrec_pipeline.util import model_files

PACKAGE = pathlib.Path(__file__).parents[2] / "mxrec_pipeline"
STORAGE_MODULES = [
    "distributed/checkpoint.py",
    "distributed/shard_files.py",
    "distributed/export.py",
    "keras/table_checkpoints.py",
    "keras/callbacks.py",
    "keras/manifest.py",
    "keras/export.py",
    "keras/pipeline.py",
    "keras/exporting.py",
    "keras/training.py",
    "keras/continuous.py",
    "saver/saver.py",
    "jobs.py",
    "evaluation.py",
    "sidecar.py",
    "util/atomic_dir.py",
    "util/model_files.py",
]
OS_FILE_FUNCTIONS = {
    "replace", "rename", "remove", "unlink", "makedirs", "mkdir", "listdir", "scandir", "stat",
    "rmdir", "walk", "open"
}
OS_PATH_FILE_FUNCTIONS = {"exists", "isdir", "isfile", "getsize", "getmtime", "lexists"}


def _posix_file_calls(path: pathlib.Path) -> list[str]:
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if not isinstance(node, ast.Call):
      continue
    name = ast.unparse(node.func)
    parts = name.split(".")
    if (name == "open" or parts[0] in ("shutil", "glob") or
        (parts[0] == "os" and len(parts) == 2 and parts[1] in OS_FILE_FUNCTIONS) or
        (parts[:2] == ["os", "path"] and parts[-1] in OS_PATH_FILE_FUNCTIONS)):
      found.append(f"{path.name}:{node.lineno} {name}()")
  return found


@pytest.mark.parametrize("module", STORAGE_MODULES)
def test_storage_modules_use_only_the_tf_filesystem_layer(module):
  assert _posix_file_calls(PACKAGE / module) == []


def test_the_check_finds_posix_calls(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("import os, shutil\nos.replace(a, b)\nshutil.rmtree(c)\nos.path.exists(d)\n"
                 "open(e)\nos.path.join(f, g)\ntf.io.gfile.exists(h)\n")
  assert _posix_file_calls(bad) == [
      "bad.py:2 os.replace()", "bad.py:3 shutil.rmtree()", "bad.py:4 os.path.exists()",
      "bad.py:5 open()"
  ]


def test_model_files_on_ram():
  root = f"ram://model-files-{uuid.uuid4().hex}"
  model_files.write_text_atomically(f"{root}/a/config.yaml", "x: 1\n")  # Parent created by TF.
  assert model_files.read_text(f"{root}/a/config.yaml") == "x: 1\n"
  model_files.write_text_atomically(f"{root}/a/config.yaml", "x: 2\n")  # Replaced.
  assert model_files.read_text(f"{root}/a/config.yaml") == "x: 2\n"
  assert tf.io.gfile.listdir(f"{root}/a") == ["config.yaml"]  # No temporary left.
  tf.io.gfile.makedirs(f"{root}/a/shards-1/item")
  model_files.write_text_atomically(f"{root}/a/shards-1/item/x", "rows")
  model_files.write_text_atomically(f"{root}/a/ckpt-1_temp/y", "partial")
  model_files.copy_tree(f"{root}/a", f"{root}/b", ignore=["*_temp*"])
  assert sorted(tf.io.gfile.listdir(f"{root}/b")) == ["config.yaml", "shards-1"]
  assert model_files.read_text(f"{root}/b/shards-1/item/x") == "rows"
  assert model_files.remove(f"{root}/b") and not tf.io.gfile.exists(f"{root}/b")
  assert model_files.remove(f"{root}/a/config.yaml")
  assert not model_files.remove(f"{root}/a/config.yaml")
  assert model_files.is_local("/tmp/x") and model_files.is_local("file:///tmp/x")
  assert not model_files.is_local(root) and not model_files.is_local("gs://bucket/run")


def test_json_lines_are_appended_whole_on_ram():
  path = f"ram://{uuid.uuid4().hex}/log.jsonl"  # No append mode needed: object stores lack it.
  assert model_files.read_json_lines(path) == []
  model_files.append_json_line(path, {"checkpoint": 1, "b": 0.5})
  model_files.append_json_line(path, {"checkpoint": 2})
  assert model_files.read_json_lines(path) == [{"checkpoint": 1, "b": 0.5}, {"checkpoint": 2}]
  assert model_files.read_text(path) == '{"b": 0.5, "checkpoint": 1}\n{"checkpoint": 2}\n'
