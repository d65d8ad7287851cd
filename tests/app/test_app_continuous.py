"""`mxrec-pipeline train --continuous` end to end on tiny MovieLens day partitions.

Each partition trained once, in order, scored before training (checked against the
export that was trained on the days before it), numbered exports, reruns that train
only what is new (late partitions trained or skipped), bad partitions named, and a
job killed mid-partition and rerun with the same command, then stopped by SIGTERM.
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline import cli
from mxrec_pipeline import serving
from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import partitions
from mxrec_pipeline.data import split_by_day
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.util import initialize

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "movielens_continuous.yaml")
_DAY = 86400
_START = 874713600  # 1997-09-20 00:00 UTC.
DAYS = [f"day=1997-09-{20 + d}" for d in range(5)]
TINY = [
    "model.hidden_layer_dims=[8]", "model.id_dim=4", "model.attribute_dim=4",
    "model.device_vocabulary_size=300", "continuous.poll_s=0"
]


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
  """Five day partitions of a tiny MovieLens (4 users a day, 4 movies each), not yet published."""
  root = tmp_path_factory.mktemp("continuous")
  rng = np.random.default_rng(0)
  data_dir = root / "ml"
  data_dir.mkdir()
  inter = ["user_id:token\titem_id:token\trating:float\ttimestamp:float\n"]
  for day in range(5):
    for user in rng.choice(np.arange(1, 11), 4, replace=False):
      for k, item in enumerate(rng.choice(np.arange(1, 21), 4, replace=False)):
        inter.append(f"{user}\t{item}\t{rng.integers(1, 6)}\t{_START + day * _DAY + 60 * k}\n")
  (data_dir / "ml-100k.inter").write_text("".join(inter))
  (data_dir / "ml-100k.user").write_text(
      "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n" +
      "".join(f"{u}\t{20 + u}\t{'MF'[u % 2]}\tjob{u % 3}\t{10000 + u}\n" for u in range(1, 11)))
  (data_dir / "ml-100k.item").write_text(
      "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n" +
      "".join(f"{i}\tMovie {i}\t{1980 + i}\t{('Drama', 'Comedy')[i % 2]}\n" for i in range(1, 21)))
  split_by_day.split_by_day(data_dir, root / "staged", log=lambda _: None)
  return root / "staged"


def _publish(staged, target, *names):
  for name in names:
    shutil.copytree(staged / name, target / name)


def _train(capsys, model_dir, days, *extra):
  """One CLI run, as in a new process: the previous run's init() ended first."""
  initialize.terminate_config_initializer()
  tf.keras.backend.clear_session()
  args = ["train", CONFIG, "--continuous", "--verbose", "0"]
  for override in TINY + [
      f"pipeline.model_dir={model_dir}", f"continuous.partitions_dir={days}", *extra
  ]:
    args += ["--set", override]
  code = cli.main(args)
  out, err = capsys.readouterr()
  return code, out, err


def _lines(model_dir):
  text = (pathlib.Path(model_dir) / "metrics.jsonl").read_text()
  return [json.loads(row) for row in text.splitlines()]


def _ndcg10(export_dir, data_file):
  """tfr's NDCG@10 of an exported model on a partition's lists (graded labels: rating - 1)."""
  scores = serving.predict_file(str(export_dir), str(data_file))
  labels = [[e.features.feature["rating"].float_list.value[0] - 1.0 for e in proto.examples]
            for proto in elwc.read_elwc_tfrecord(data_file)]
  size = max(map(len, labels))
  pad = lambda rows, value: [row + [value] * (size - len(row)) for row in rows]  # noqa: E731
  metric = tfr.keras.metrics.NDCGMetric(topn=10)
  metric.update_state(tf.constant(pad(labels, -1.0)), tf.constant(pad(scores, 0.0)))
  return float(metric.result())


def test_each_partition_once_in_order_scored_before_training_exported_by_version(
    staged, tmp_path, capsys):
  days, model_dir = tmp_path / "days", tmp_path / "model"
  days.mkdir()
  _publish(staged, days, *DAYS[:3])
  code, out, err = _train(capsys, model_dir, days, "continuous.exports_to_keep=2")
  assert code == 0, err[-3000:]
  lines = _lines(model_dir)
  assert [line["partition"] for line in lines] == DAYS[:3]
  assert [line["checkpoint"] for line in lines] == [1, 2, 3]
  assert lines[0]["baseline"] is None  # Nothing trained yet to build it from.
  for line in lines:
    assert 0 <= line["model"]["ndcg@10"] <= 1 and line["steps"] == 1
  assert all(0 <= line["baseline"]["ndcg@10"] <= 1 for line in lines[1:])
  # TF Serving's layout: numbered versions, the newest 2 kept.
  assert sorted(os.listdir(model_dir / "export")) == ["2", "3"]
  saved = manifest.read(str(model_dir / "checkpoints" / "ckpt-3"))["state"]
  assert saved["cursor"]["trained"] == DAYS[:3]
  assert "export version 3: has seen 3 partition(s), the newest day=1997-09-22" in out
  # Scored before training on it: day 3's figure is the model that had seen days 1 and 2.
  expected = _ndcg10(model_dir / "export" / "2", days / DAYS[2] / "data.tfrecord")
  assert lines[2]["model"]["ndcg@10"] == pytest.approx(expected, abs=1e-5)


def test_a_rerun_trains_only_what_is_new_and_a_late_partition_as_configured(
    staged, tmp_path, capsys):
  """Days 1, 2 and 4 arrive; 2 runs train them; then day 3 (late) and 5: `late_partitions`
  train trains day 3 after 4, skip leaves it (the same run continued in two copies)."""
  days, model_dir = tmp_path / "days", tmp_path / "model"
  days.mkdir()
  _publish(staged, days, DAYS[0], DAYS[1], DAYS[3])  # Day 3 is late.
  code, _, err = _train(capsys, model_dir, days, "continuous.max_partitions=2")
  assert code == 0, err[-3000:]
  assert [line["partition"] for line in _lines(model_dir)] == [DAYS[0], DAYS[1]]
  code, out, err = _train(capsys, model_dir, days)
  assert code == 0, err[-3000:]
  assert "Resumed from" in out and "2 epoch(s)" in out
  _publish(staged, days, DAYS[2], DAYS[4])
  shutil.copytree(model_dir, tmp_path / "model_skip")
  for late in ("train", "skip"):
    run_dir = model_dir if late == "train" else tmp_path / "model_skip"
    code, out, err = _train(capsys, run_dir, days, f"continuous.late_partitions={late}")
    assert code == 0, err[-3000:]
    trained = [line["partition"] for line in _lines(run_dir)]
    if late == "train":
      assert trained == [DAYS[0], DAYS[1], DAYS[3], DAYS[2], DAYS[4]]
    else:
      assert trained == [DAYS[0], DAYS[1], DAYS[3], DAYS[4]]
      assert f"partition {DAYS[2]} arrived late (older than {DAYS[3]}): skipped" in out
    assert [line["checkpoint"] for line in _lines(run_dir)] == list(range(1, len(trained) + 1))


def test_a_partition_without_data_is_named_and_trained_once_fixed(staged, tmp_path, capsys):
  days, model_dir = tmp_path / "days", tmp_path / "model"
  days.mkdir()
  _publish(staged, days, DAYS[0])
  (days / DAYS[1]).mkdir()
  (days / DAYS[1] / partitions.SUCCESS_MARKER).write_text("")
  code, _, err = _train(capsys, model_dir, days)
  assert code == 2
  assert f"partition {days / DAYS[1]} has a _SUCCESS marker but no ELWC files" in err
  assert [line["partition"] for line in _lines(model_dir)] == [DAYS[0]]
  shutil.copy(staged / DAYS[1] / "data.tfrecord", days / DAYS[1])
  code, _, err = _train(capsys, model_dir, days)
  assert code == 0, err[-3000:]
  assert [line["partition"] for line in _lines(model_dir)] == [DAYS[0], DAYS[1]]


def test_a_corrupt_partition_is_named_and_nothing_is_trained(staged, tmp_path, capsys):
  days, model_dir = tmp_path / "days", tmp_path / "model"
  _publish(staged, days, DAYS[0])
  data = days / DAYS[0] / "data.tfrecord"
  data.write_bytes(data.read_bytes()[:-7])  # Truncated.
  code, _, err = _train(capsys, model_dir, days)
  assert code == 2
  assert f"partition {days / DAYS[0]}: " in err and "truncated record" in err
  assert not (model_dir / "metrics.jsonl").exists()


@pytest.mark.parametrize("args, match", [
    (["--continuous", "--set", "continuous.partitions_dir=null"
     ], "continuous.partitions_dir: required"),
    (["--poll-s", "1"], "--poll-s goes with --continuous"),
    (["--continuous", "--local-cluster", "workers=2", "--set", "continuous.partitions_dir=x"
     ], "drop --local-cluster"),
    (["--continuous", "--set", "continuous.late_partitions=later"], "late_partitions"),
    (["--continuous", "--set", "continuous.partitions_dir=/nonexistent/days"
     ], "partitions directory /nonexistent/days does not exist"),
    ([
        "--continuous", "--set", "continuous.partitions_dir=.", "--set",
        "pipeline.checkpoint={full_every_steps: 4, delta_every_steps: 2}"
    ], "`pipeline.checkpoint.delta_every_steps`: a continuous run saves a checkpoint after every "
     "partition"),
    ([
        "--continuous", "--set", "continuous.partitions_dir=.", "--set",
        "pipeline.early_stopping={patience: 2}"
    ], "`pipeline.early_stopping`: a continuous run trains every partition"),
])
def test_bad_continuous_arguments_are_named(tmp_path, capsys, args, match):
  code = cli.main(["train", CONFIG, "--set", f"pipeline.model_dir={tmp_path}", *args])
  assert code == 2
  assert match in capsys.readouterr().err


def test_killed_mid_partition_the_same_command_resumes_and_sigterm_stops_cleanly(staged, tmp_path):
  """A user's restart: SIGKILL while training day 3, the same command again, then SIGTERM.

  With delta checkpoints (every other save full), day 3 resumes from day 2's delta.
  """
  days, model_dir = tmp_path / "days", tmp_path / "model"
  days.mkdir()
  _publish(staged, days, *DAYS[:4])
  argv = [
      sys.executable, "-m", "mxrec_pipeline.cli", "train", CONFIG, "--continuous", "--verbose", "0",
      "--poll-s", "30"
  ]
  for override in TINY[:-1] + [
      f"pipeline.model_dir={model_dir}", f"continuous.partitions_dir={days}",
      "pipeline.checkpoint={full_every_epochs: 2}"
  ]:
    argv += ["--set", override]
  env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
  killed = subprocess.run(argv, cwd=ROOT, env={**env, "MXREC_FAULT": "train_batch:3"},
                          capture_output=True, text=True, timeout=300, check=False)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert [line["partition"] for line in _lines(model_dir)] == DAYS[:2]
  assert table_checkpoints.chain(str(model_dir / "checkpoints"), 2) == [1, 2]  # A delta.
  with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True) as job:
    deadline = time.monotonic() + 240
    while len(_lines(model_dir)) < 4 and time.monotonic() < deadline and job.poll() is None:
      time.sleep(0.5)
    job.send_signal(signal.SIGTERM)  # While it polls for day 5.
    out, _ = job.communicate(timeout=120)
  assert job.returncode == 0, out[-3000:]
  assert "continuous training stopped: stop requested" in out
  assert "Resumed from" in out and "ckpt-2" in out
  assert [line["partition"] for line in _lines(model_dir)] == DAYS[:4]  # None twice.
  assert sorted(os.listdir(model_dir / "export"))[-1] == "4"


def test_a_partition_without_a_relevant_list_is_trained_and_not_scored(staged, tmp_path, capsys):
  """Under skip_queries_without_relevant, a day rated 1 star throughout has nothing to score."""
  days, model_dir = tmp_path / "days", tmp_path / "model"
  _publish(staged, days, DAYS[0])
  lists = list(elwc.read_elwc_tfrecord(days / DAYS[0] / "data.tfrecord"))
  for proto in lists:
    for example in proto.examples:
      example.features.feature["rating"].float_list.value[:] = [1.0]  # Label 0.
  elwc.write_elwc_tfrecord(days / DAYS[0] / "data.tfrecord", lists)
  code, out, err = _train(capsys, model_dir, days, "metrics.skip_queries_without_relevant=true")
  assert code == 0, err[-3000:]
  (line,) = _lines(model_dir)
  assert (line["lists"], line["model"], line["baseline"], line["steps"]) == (0, None, None, 1)
  assert "no list to score" in out
