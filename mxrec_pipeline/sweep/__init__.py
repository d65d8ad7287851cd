"""Hyperparameter sweeps of job configs on Optuna: `mxrec-pipeline sweep CONFIG`.

Modules, one job each:
  config     the sweep config (SweepConfig), sampler and pruner factories
  space      the search space over dotted job-config keys
  storage    the study's database, the trial-start lock, failing dead trials
  runner     the command: check, start workers, report
  worker     a worker process: study.optimize, one trial process at a time
  trial      a trial process: train one config, report epochs to the worker
  reporter   the Keras callback a trial reports epochs with
  reporting  trial table, best_config.yaml, best model, plots

Needs the `sweep` extra (`pip install 'mxrec-pipeline[sweep]'`: Optuna,
SQLAlchemy, plotly, matplotlib, psycopg2); importing the package without it
raises ImportError naming the extra and what is missing. See docs/sweeps.md.
"""

import importlib.util

# Import name -> the distribution of the `sweep` extra (pyproject.toml).
EXTRA = {
    "optuna": "optuna", "sqlalchemy": "sqlalchemy", "plotly": "plotly", "matplotlib": "matplotlib",
    "psycopg2": "psycopg2-binary"
}


def missing_packages() -> list[str]:
  """Distributions of the `sweep` extra that are not installed."""
  return [dist for name, dist in EXTRA.items() if importlib.util.find_spec(name) is None]


if missing_packages():
  raise ImportError(f"sweeps need the `sweep` extra: pip install 'mxrec-pipeline[sweep]' "
                    f"(missing: {', '.join(missing_packages())})")
