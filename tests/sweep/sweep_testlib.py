"""Sweep configs over the real MovieLens job, shrunk to a few steps, and study access."""

import contextlib
import os
import pathlib
import sqlite3
import subprocess
import sys
import time

import optuna
import sqlalchemy
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
SWEEP_CONFIG = REPO / "configs" / "sweep_movielens.yaml"
# A trial trains 2 steps in each of 2 epochs and validates on one batch per
# epoch (metrics.json is still on the whole validation split).
TINY = {
    "pipeline.num_epochs": 2, "pipeline.num_train_steps": 2, "pipeline.num_valid_steps": 1,
    "pipeline.strategy": None, "pipeline.export_best_model": False, "dataset.valid_batch_size": 256
}
POLL_S = 0.2
HANG_GUARD_S = 600  # Only a guard against a hung test; nothing asserts on time.


def write_config(tmp_path, name="sweep", **changes) -> pathlib.Path:
  """configs/sweep_movielens.yaml with sweep_dir in tmp_path, TINY overrides and `changes`."""
  raw = yaml.safe_load(SWEEP_CONFIG.read_text())
  raw["base_config"] = str(REPO / "configs" / "movielens_listwise.yaml")
  raw["sweep_dir"] = str(tmp_path / name)
  raw["study_name"] = name
  raw["overrides"] = {**raw["overrides"], **TINY}
  raw.update(changes)
  path = tmp_path / f"{name}.yaml"
  path.write_text(yaml.safe_dump(raw, sort_keys=False))
  return path


def sweep_command(config_path, *args) -> list[str]:
  return [sys.executable, "-m", "mxrec_pipeline.cli", "sweep", str(config_path), *map(str, args)]


def run_sweep(config_path, *args) -> subprocess.CompletedProcess:
  return subprocess.run(sweep_command(config_path, *args), capture_output=True, text=True, cwd=REPO,
                        timeout=HANG_GUARD_S, check=False)


def sqlite_url(config_path) -> str:
  sweep_dir = yaml.safe_load(pathlib.Path(config_path).read_text())["sweep_dir"]
  return f"sqlite:///{os.path.join(sweep_dir, 'study.db')}"


def load_study(url: str, name: str) -> optuna.Study:
  return optuna.load_study(study_name=name, storage=url)


def _sqlite_has_study(path: str, name: str) -> bool:
  """Whether the SQLite file holds study `name`, read without writing anything.

  optuna.load_study creates and stamps the schema when it is missing; an
  observer doing that while the sweep creates it races the sweep, so the
  test looks (read-only) before it loads.
  """
  if not os.path.exists(path):
    return False
  try:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
      return db.execute("SELECT 1 FROM studies WHERE study_name = ?",
                        (name,)).fetchone() is not None
  except sqlite3.OperationalError:  # No studies table yet, or the sweep holds a write lock.
    return False


def study_if_created(url: str, name: str) -> optuna.Study | None:
  """The study, or None while the sweep has not created it (nor its SQLite file)."""
  if url.startswith("sqlite:///") and not _sqlite_has_study(url.removeprefix("sqlite:///"), name):
    return None
  try:
    return load_study(url, name)
  except (KeyError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError):
    # IntegrityError: this observer opened the storage while the sweep was still
    # creating its schema (both stamp the alembic version); the sweep's own
    # workers create it under the sweep's lock.
    return None


def states(study: optuna.Study) -> dict[int, str]:
  return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def wait_for(predicate, what: str, process: subprocess.Popen | None = None):
  """Polls predicate() until it returns a truthy value; fails if the process exits first."""
  deadline = time.monotonic() + HANG_GUARD_S
  while time.monotonic() < deadline:
    result = predicate()
    if result:
      return result
    if process is not None and process.poll() is not None:
      _, stderr = process.communicate() if process.stderr else (None, None)
      raise AssertionError(f"sweep exited ({process.returncode}) before {what}; "
                           f"its stderr ends: {(stderr or '(not captured)')[-3000:]}")
    time.sleep(POLL_S)
  raise AssertionError(f"hung waiting for {what}")
