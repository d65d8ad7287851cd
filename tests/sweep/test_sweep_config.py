"""Sweep config validation, the search space, dead-trial detection, the lock, the reporter."""

import fcntl
import os
import socket
import subprocess
import sys

import numpy as np
import optuna
import pytest
import sqlalchemy
import tensorflow as tf
import yaml

import sweep_testlib as lib
from mxrec_pipeline import cli
from mxrec_pipeline import config as job_config
from mxrec_pipeline.sweep import config as config_lib
from mxrec_pipeline.sweep import reporter
from mxrec_pipeline.sweep import runner
from mxrec_pipeline.sweep import space as space_lib
from mxrec_pipeline.sweep import storage as storage_lib
from mxrec_pipeline.sweep import trial as trial_lib

BASE = {
    "base_config": str(lib.REPO / "configs" / "movielens_listwise.yaml"), "study_name": "s",
    "search_space": {
        "pipeline.learning_rate": {"type": "float", "low": 1e-4, "high": 0.1, "log": True}
    }
}


def _load(tmp_path, raw, **kwargs):
  path = tmp_path / "sweep.yaml"
  path.write_text(yaml.safe_dump({"sweep_dir": str(tmp_path / "out"), **raw}))
  return config_lib.load(str(path), **kwargs)


def test_shipped_config_loads_with_defaults_resolved():
  config = config_lib.load(str(lib.SWEEP_CONFIG))
  assert config.base_config == str(lib.REPO / "configs" / "movielens_listwise.yaml")
  assert os.path.isabs(config.sweep_dir)
  assert config.storage_url == f"sqlite:///{config.sweep_dir}/study.db"
  assert {p.key for p in config.search_space} >= {
      "pipeline.learning_rate", "model.id_dim", "model.attribute_dim", "pipeline.loss",
      "model.hidden_layer_dims"
  }
  assert config_lib.from_dict(config.to_dict()) == config
  runner.check_against_base(config)


def test_command_line_values_replace_the_files(tmp_path):
  config = _load(tmp_path, BASE, n_trials=7, storage="postgresql://u@h/db",
                 overrides=["pipeline.num_epochs=3", "model.hidden_layer_dims=[8]"])
  assert config.n_trials == 7 and config.storage_url == "postgresql://u@h/db"
  assert config.overrides == {"pipeline.num_epochs": 3, "model.hidden_layer_dims": [8]}
  assert config.study_name == "s"


@pytest.mark.parametrize("change, message", [
    ({"extra": 1}, r"unknown sweep config keys \['extra'\]"),
    ({"search_space": {"pipeline.learning_rate": {"type": "normal"}}
     }, r"search_space\.pipeline\.learning_rate: `type` must be one of"),
    ({"search_space": {"pipeline.learning_rate": {"type": "float", "low": 0.1, "high": 0.01}}
     }, r"search_space\.pipeline\.learning_rate: `low` must be <= `high`, got low=0.1, high=0.01"),
    ({
        "search_space":
            {"pipeline.learning_rate": {"type": "float", "low": 0, "high": 1, "log": True}}
    }, r"`log` needs `low` > 0"),
    ({"search_space": {"model.id_dim": {"type": "int", "low": 8.5, "high": 32}}
     }, r"search_space\.model\.id_dim: `low` must be an int, got 8.5"),
    ({"search_space": {"pipeline.loss": {"type": "categorical", "choices": []}}
     }, r"search_space\.pipeline\.loss: `choices` must be a non-empty list"),
    ({"search_space": {"pipeline.loss": {"type": "categorical", "choices": ["a"], "lo": 1}}
     }, r"search_space\.pipeline\.loss: unknown fields \['lo'\]"),
    ({"search_space": {"learning_rate": {"type": "float", "low": 1, "high": 2}}
     }, r"dotted job-config keys"),
    ({"search_space": {"pipeline.model_dir": {"type": "categorical", "choices": ["/a"]}}
     }, r"pipeline\.model_dir is set by the sweep"),
    ({"overrides": {"pipeline.learning_rate": 0.1}
     }, r"\['pipeline\.learning_rate'\] are both in `search_space` and `overrides`"),
    ({"sampler": {"name": "grid"}}, r"unsupported sampler 'grid'; supported: \['random', 'tpe'\]"),
    ({"sampler": {"name": "tpe", "options": {"n_startup": 3}}
     }, r"sampler\.options \['n_startup'\]"),
    ({"sampler": {"name": "tpe", "options": {"seed": 3}}}, r"use sampler\.seed"),
    ({"pruner": {"name": "asha"}
     }, r"unsupported pruner 'asha'; supported: \['hyperband', 'median', 'none'\]"),
    ({"pruner": {"name": "median", "options": {"warmup": 1}}}, r"pruner\.options \['warmup'\]"),
    ({"objective": {"direction": "up"}}, r"objective: `direction` must be 'maximize' or"),
    ({"n_trials": 0}, r"`n_trials` must be a positive int, got 0"),
    ({"storage": "sqlite://"}, r"in-memory SQLite database"),
    ({"storage": "not a url"}, r"`storage` must be an SQLAlchemy URL"),
])
def test_bad_sweep_configs_name_the_key(tmp_path, change, message):
  with pytest.raises(config_lib.SweepConfigError, match=message):
    _load(tmp_path, {**BASE, **change})


@pytest.mark.parametrize("param, message", [
    ({"model.nope": {"type": "int", "low": 1, "high": 2}
     }, r"search_space\.model\.nope: not a key of the movielens_listwise job config"),
    ({"model.dropout": {"type": "categorical", "choices": [0.0, 1.5]}
     }, r"search_space\.model\.dropout: 1\.5 gives an invalid config: .*model\.dropout must be in"),
    ({"pipeline.loss": {"type": "categorical", "choices": ["softmax_loss", "nope_loss"]}
     }, r"search_space\.pipeline\.loss: 'nope_loss' gives an invalid config"),
])
def test_search_space_is_checked_against_the_base_config(tmp_path, param, message):
  config = _load(tmp_path, {**BASE, "search_space": param})
  with pytest.raises(config_lib.SweepConfigError, match=message):
    runner.check_against_base(config)


def test_objective_must_be_a_pipeline_metric(tmp_path):
  config = _load(tmp_path, {**BASE, "objective": {"metric": "auc"}})
  with pytest.raises(config_lib.SweepConfigError, match=r"objective\.metric must be one of"):
    runner.check_against_base(config)


def test_cli_exits_2_naming_the_key(tmp_path, capsys):
  path = tmp_path / "sweep.yaml"
  path.write_text(yaml.safe_dump({**BASE, "pruner": {"name": "asha"}}))
  assert cli.main(["sweep", str(path)]) == 2
  assert "unsupported pruner 'asha'" in capsys.readouterr().err
  assert cli.main(["sweep", str(tmp_path / "missing.yaml")]) == 2
  assert "cannot read sweep config" in capsys.readouterr().err


def test_sampled_values_become_overrides_of_a_valid_job(tmp_path):
  config = _load(
      tmp_path, {
          **BASE, "search_space": {
              "pipeline.learning_rate": {"type": "float", "low": "1e-4", "high": 0.1, "log": True},
              "model.attribute_dim": {"type": "int", "low": 4, "high": 16, "step": 4},
              "model.hidden_layer_dims": {"type": "categorical", "choices": [[64, 32], [16]]},
              "pipeline.loss":
                  {"type": "categorical", "choices": ["softmax_loss", "list_mle_loss"]}
          }
      })
  assert config.param("pipeline.learning_rate").low == 1e-4  # YAML's "1e-4" is a string.
  study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
  for _ in range(8):
    trial = study.ask()
    values = {p.key: p.suggest(trial) for p in config.search_space}
    assert values["model.hidden_layer_dims"] in ([64, 32], [16])
    assert trial.params["model.hidden_layer_dims"] in ("[64, 32]", "[16]")  # As Optuna stores it.
    assert values["model.attribute_dim"] in (4, 8, 12, 16)
    job = job_config.load(config.base_config,
                          space_lib.to_overrides({**values, "pipeline.model_dir": "/m"}))
    assert job.model.hidden_layer_dims == values["model.hidden_layer_dims"]
    assert job.pipeline.learning_rate == values["pipeline.learning_rate"]
    assert job.pipeline.loss == values["pipeline.loss"]
    hidden = config.param("model.hidden_layer_dims")
    assert hidden.decode(trial.params[hidden.key]) == values[hidden.key]
    study.tell(trial, 0.0)


def _dead_pid() -> int:
  process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
  return int(process.stdout)


def test_running_trials_of_dead_workers_on_this_host_are_failed(tmp_path):
  config = _load(tmp_path, {**BASE, "heartbeat_interval_s": None})
  storage = storage_lib.open_storage(config)
  study = optuna.create_study(study_name="s", storage=storage)
  host = socket.gethostname()
  owners = {
      "dead": {"host": host, "pid": _dead_pid(), "start_ticks": 1, "index": 0},
      "alive": storage_lib.worker_identity(0),
      "reused pid": {**storage_lib.worker_identity(0), "start_ticks": -5},
      "elsewhere": {"host": host + "-other", "pid": _dead_pid(), "index": 0},
  }
  for owner in owners.values():
    study.enqueue_trial({}, user_attrs={storage_lib.WORKER_ATTR: owner})
    study.ask()
  assert storage_lib.fail_dead_trials(study, storage) == [0, 2]
  trials = study.get_trials()
  assert [t.state.name for t in trials] == ["FAIL", "RUNNING", "FAIL", "RUNNING"]
  assert "died while the trial ran" in trials[0].user_attrs[storage_lib.ERROR_ATTR]
  assert storage_lib.fail_dead_trials(study, storage) == []


def test_sqlite_trial_start_lock_excludes_other_holders(tmp_path):
  lock = storage_lib.trial_start_lock(f"sqlite:///{tmp_path}/study.db", "s")
  with open(tmp_path / "study.db.lock", "a", encoding="utf-8") as other:
    with lock:
      with pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.release()  # A second release is harmless.
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_epoch_reporter_feeds_epochs_and_stops_a_pruned_fit():
  model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
  model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
  x, y = np.ones((8, 2), np.float32), np.zeros((8, 1), np.float32)
  seen = []

  def report(epoch, value):
    seen.append((epoch, value))
    return epoch == 2

  with pytest.raises(reporter.TrialPrunedError, match="pruned after epoch 2"):
    model.fit(x, y, validation_data=(x, y), epochs=5, verbose=0,
              callbacks=[reporter.EpochReporter("val_mae", report)])
  assert [e for e, _ in seen] == [1, 2]
  with pytest.raises(KeyError, match="'val_ndcg_10' is not in the logs"):
    model.fit(x, y, validation_data=(x, y), epochs=1, verbose=0,
              callbacks=[reporter.EpochReporter("val_ndcg_10", report)])


def test_errors_are_one_line_without_tensorflow_traced_frames():
  message = ('in user code:\n\n    File "/x/training.py", line 1401, in train_function  *\n'
             '        return step_function(self, iterator)\n\n'
             "    ValueError: `keys` must be a vector, got shape [2,2]\n")
  assert trial_lib.describe_error(
      ValueError(message)) == ("ValueError: `keys` must be a vector, got shape [2,2]")
  assert trial_lib.describe_error(KeyError("a")) == "KeyError: 'a'"


def test_a_study_resumes_only_with_its_own_search_space_and_objective(tmp_path):
  config = _load(tmp_path, BASE)
  storage = storage_lib.open_storage(config)
  runner.open_study(config, storage)
  assert runner.open_study(config, storage).study_name == "s"  # Resumed.
  wider = _load(
      tmp_path, {
          **BASE, "search_space":
              {"pipeline.learning_rate": {"type": "float", "low": 1e-5, "high": 0.1, "log": True}}
      })
  with pytest.raises(config_lib.SweepConfigError,
                     match=r"differs in \['pipeline\.learning_rate'\].*new study_name"):
    runner.open_study(wider, storage)
  minimize = _load(tmp_path, {**BASE, "objective": {"direction": "minimize"}})
  with pytest.raises(config_lib.SweepConfigError, match=r"differs in \['objective'\]"):
    runner.open_study(minimize, storage)


@pytest.mark.parametrize("message, retried", [("table studies already exists", True),
                                              ("database is locked", False)])
def test_storage_created_by_another_process_at_the_same_moment_is_opened(
    tmp_path, monkeypatch, message, retried):
  config = _load(tmp_path, BASE)
  real, calls = optuna.storages.RDBStorage, []

  def racing(*args, **kwargs):  # The first create loses SQLite's race (or fails otherwise).
    calls.append(1)
    if len(calls) == 1:
      raise sqlalchemy.exc.OperationalError("CREATE TABLE studies", {}, Exception(message))
    return real(*args, **kwargs)

  monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
  if retried:
    assert storage_lib.open_storage(config) is not None and len(calls) == 2
  else:
    with pytest.raises(sqlalchemy.exc.OperationalError, match="database is locked"):
      storage_lib.open_storage(config)
