"""The packages of mxrec_pipeline import downwards only, and never in a cycle.

Reads every module's imports with `ast` (no module is imported, TensorFlow is
not needed). Imports inside functions count; imports under
`if TYPE_CHECKING:` do not (they never run). See docs/architecture.md,
"Layers of the code".
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "mxrec_pipeline"

# Low to high. A package may import packages of its own layer or of lower ones.
LAYERS = (
    ("ops", "constants", "data"),  # No imports of mxrec_pipeline: the op loader, names, datasets.
    ("util",),  # The run (init, table registry) and small helpers.
    ("core",),  # create_table, sparse_lookup, the key process, tiers, lookup.
    ("optimizers", "saver"),  # Hash optimizers and the TF1 Saver over the core's tables.
    ("hparams",),  # PipelineHparams (TF-free, checked against constant name lists).
    ("graph",),  # mx_rec's graph modification, on top of the core.
    ("embedding",),  # TPUEmbedding's mid-level API.
    ("distributed",),  # Tables sharded by key over workers (MultiWorkerMirroredStrategy).
    ("keras",),  # tfr-shaped layers, models and pipelines.
    # Jobs and commands; gbdt: the LambdaMART baseline of the evaluation.
    ("config", "evaluation", "gbdt", "serving", "jobs", "continuous_job", "early_stopping_job",
     "sidecar", "sweep", "cluster", "cli"),
)
# Tolerated upward imports, (importer, imported) units, each with the reason and
# the issue that removes it. None today (core -> graph went with issue 15).
KNOWN_UPWARD = frozenset()


def _unit(module: str) -> str:
  """The package ("core") or top-level module ("jobs") a dotted module name belongs to."""
  return module.split(".")[1]


def _is_type_checking(node: ast.If) -> bool:
  test = node.test
  return (isinstance(test, ast.Name) and
          test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and
                                          test.attr == "TYPE_CHECKING")


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
  """Dotted names of mxrec_pipeline modules (or their attributes) imported below `node`."""
  names = []
  for child in ast.iter_child_nodes(node):
    if isinstance(child, ast.If) and _is_type_checking(child):
      names += [n for stmt in child.orelse for n in _imported_stmt(stmt, module, is_package)]
      continue
    names += _imported_stmt(child, module, is_package)
  return names


def _imported_stmt(node: ast.AST, module: str, is_package: bool) -> list[str]:
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  if isinstance(node, ast.ImportFrom):
    base = node.module or ""
    if node.level:  # Relative: resolve against the importing module's package.
      parent = module.split(".")
      parent = parent[:len(parent) - node.level + (1 if is_package else 0)]
      base = ".".join(parent + ([base] if base else []))
    return [f"{base}.{a.name}" for a in node.names]
  return _imported(node, module, is_package)


def _modules() -> dict[str, pathlib.Path]:
  modules = {}
  for path in sorted((ROOT / PACKAGE).rglob("*.py")):
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    modules[".".join(parts)] = path
  return modules


def _module_imports() -> set[tuple[str, str]]:
  """(importer, imported) pairs of mxrec_pipeline modules."""
  modules = _modules()
  edges = set()
  for module, path in modules.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    for name in _imported(tree, module, path.name == "__init__.py"):
      # `from package import name` names a module or an attribute of one.
      target = name if name in modules else name.rpartition(".")[0]
      if target in modules and target != module:
        edges.add((module, target))
  return edges


def _package_imports() -> dict[tuple[str, str], list[str]]:
  """(importer, imported) unit pairs -> the importing modules, units differing."""
  edges = {}
  for importer, imported in sorted(_module_imports()):
    if PACKAGE not in (importer, imported) and _unit(importer) != _unit(imported):
      edges.setdefault((_unit(importer), _unit(imported)), []).append(importer)
  return edges


def _assert_acyclic(edges, what: str) -> None:
  graph = {}
  for importer, imported in edges:
    graph.setdefault(importer, set()).add(imported)
  state = {}  # node -> "open" while on the path, "done" when fully explored.

  def visit(node, path):
    state[node] = "open"
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        pytest.fail(f"import cycle between {what}: {' -> '.join(path[path.index(nxt):] + [nxt])}")
      if nxt not in state:
        visit(nxt, path + [nxt])
    state[node] = "done"

  for node in sorted(graph):
    if node not in state:
      visit(node, [node])


def _layer_of() -> dict[str, int]:
  return {unit: i for i, units in enumerate(LAYERS) for unit in units}


def test_every_package_has_a_layer():
  units = {_unit(m) for m in _modules() if m != PACKAGE}
  missing = sorted(units - set(_layer_of()))
  assert not missing, f"add {missing} to LAYERS (low to high) in this test"


def test_no_import_goes_up_a_layer():
  layer = _layer_of()
  upward = {
      edge: sorted(set(modules)) for edge, modules in _package_imports().items()
      if layer[edge[1]] > layer[edge[0]] and edge not in KNOWN_UPWARD
  }
  assert not upward, f"imports from a lower layer to a higher one: {upward}"


def test_no_import_cycle_between_packages():
  _assert_acyclic(_package_imports(), "packages")


def test_no_import_cycle_between_modules():
  _assert_acyclic(_module_imports(), "modules")


def test_parser_sees_relative_lazy_and_type_checking_imports():
  source = ("from typing import TYPE_CHECKING\n"
            "from . import lookup\n"
            "from ..graph import modifier\n"
            "if TYPE_CHECKING:\n"
            "  from mxrec_pipeline.keras import layers\n"
            "def f():\n"
            "  import mxrec_pipeline.saver.saver\n")
  names = _imported(ast.parse(source), "mxrec_pipeline.core.embedding", is_package=False)
  assert names == [
      "typing.TYPE_CHECKING", "mxrec_pipeline.core.lookup", "mxrec_pipeline.graph.modifier",
      "mxrec_pipeline.saver.saver"
  ]
