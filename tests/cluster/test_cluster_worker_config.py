"""jobs.worker_config: the model_dir each worker of a MultiWorkerMirroredStrategy job writes."""

import json
import os
import pathlib
import tempfile

import pytest

from mxrec_pipeline import config as config_lib
from mxrec_pipeline import jobs

CONFIG = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "mslr_dnn.yaml")
CLUSTER = {"worker": ["localhost:1", "localhost:2"]}


def _config(model_dir, strategy="MultiWorkerMirroredStrategy"):
  return config_lib.load(CONFIG, [
      f"pipeline.model_dir={model_dir}", f"pipeline.strategy={strategy}",
      "pipeline.early_stopping=null"
  ])


def _set_task(monkeypatch, index):
  monkeypatch.setenv("TF_CONFIG",
                     json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": index}}))


def test_the_chief_and_single_process_jobs_keep_model_dir(tmp_path, monkeypatch):
  _set_task(monkeypatch, 0)
  config = _config(tmp_path / "run")
  with jobs.worker_config(config) as got:
    assert got is config
  _set_task(monkeypatch, 1)  # Ignored by other strategies.
  config = _config(tmp_path / "run", strategy="null")
  with jobs.worker_config(config) as got:
    assert got is config


@pytest.mark.parametrize("fresh", [False, True])
def test_a_worker_trains_in_a_temp_dir_with_the_chiefs_checkpoints(tmp_path, monkeypatch, fresh):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # gettempdir() caches $TMPDIR.
  (tmp_path / "tmp").mkdir()
  checkpoints = tmp_path / "run" / "checkpoints"
  (checkpoints / "ckpt-3_temp").mkdir(parents=True)  # A save in progress: not copied.
  for name in ("checkpoint", "ckpt-2.index", "ckpt-2.data-00000-of-00001"):
    (checkpoints / name).write_text(name)
  _set_task(monkeypatch, 1)
  with jobs.worker_config(_config(tmp_path / "run"), fresh=fresh) as got:
    temp_dir = pathlib.Path(got.pipeline.model_dir)
    assert temp_dir.parent == tmp_path / "tmp" and temp_dir.name.startswith("mxrec-worker-1-")
    copied = sorted(os.listdir(temp_dir / "checkpoints")) if not fresh else []
    assert copied == ([] if fresh else ["checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index"])
    assert os.listdir(temp_dir) == ([] if fresh else ["checkpoints"])
  assert os.listdir(tmp_path / "tmp") == []  # Deleted on exit.
  assert sorted(os.listdir(checkpoints)) == [
      "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index", "ckpt-3_temp"
  ]
