"""The package's architecture, read from its imports: at most 15 entries under actlab/, every
import pointing down the layers of docs/design.md §2, and no import cycles between modules."""

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "actlab"

# docs/design.md §2, lowest first: a module may import its own package and the layers below it.
LAYERS = (("infra",), ("core", "data"), ("config",), ("hf",), ("tasks",), ("measure",), ("run",),
          ("report",), ("sweep", "bench"), ("main", "sample", "ask"))
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}
ENTRIES = {part for part in RANK if "." not in part}  # the tree's top level
# The core's boundary: it imports only itself and these libraries (tests/test_core.py uses it
# from a notebook with none of the harness).
CORE_LIBRARIES = {"dataclasses", "difflib", "functools", "math", "typing", "absl", "flax", "jax",
                  "numpy", "optax"}


def modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return out


def imports(name: str, path: pathlib.Path, known) -> set[str]:
  """The actlab modules `name` imports, at its top or inside functions."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
      found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
  return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
  known = modules()
  return {name: imports(name, path, known) for name, path in known.items()}


def layer(module: str) -> str:
  parts = module.split(".")
  return ".".join(parts[1:3]) if ".".join(parts[1:3]) in RANK else (parts[1:2] or [""])[0]


def core_crossings(paths) -> list[str]:
  """Every import of a core module (`paths`) that leaves the core: another actlab module, or a
  library outside `CORE_LIBRARIES` (a config, a run directory: the harness's)."""
  found = []
  for path in paths:
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
      for name in names:
        top = name.split(".")[0]
        if (name.startswith("actlab.core") if top == "actlab" else top in CORE_LIBRARIES):
          continue
        found.append(f"{path.name} imports {name}")
  return found


def test_every_module_states_its_one_job():
  """A module is held to one job, not to a length: its docstring opens by stating the job (its first
  paragraph, of a few words at least); docs/design.md §2 lists them. Past ~450 lines, look again."""
  silent = [name for name, path in modules().items()
            if len((ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n")[0].split())
            < 5]
  assert not silent, silent


def test_the_tree_has_at_most_15_entries():
  entries = [p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"]
  assert len(entries) <= 15, sorted(entries)


def test_every_entry_has_a_layer():
  assert {p.stem for p in PACKAGE.iterdir() if p.name not in ("__pycache__", "__init__.py")} \
      == ENTRIES


def test_imports_point_down_the_layers():
  wrong = [f"{m} imports {d}" for m, deps in graph().items() for d in deps
           if layer(m) and layer(d) != layer(m) and RANK[layer(d)] >= RANK[layer(m)]]
  assert not wrong, wrong


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
  """Each cycle found by a depth-first search (one per back edge)."""
  found, state, stack = [], {}, []

  def visit(m):
    state[m] = "open"
    stack.append(m)
    for d in sorted(g.get(m, ())):
      if state.get(d) == "open":
        found.append(stack[stack.index(d):] + [d])
      elif d not in state:
        visit(d)
    stack.pop()
    state[m] = "done"

  for m in sorted(g):
    if m not in state:
      visit(m)
  return found


def test_no_import_cycles():
  # A package's __init__ importing its own submodules is how a package exposes them; a
  # submodule importing its package's __init__ back would close a cycle and is caught here.
  assert cycles(graph()) == []


@pytest.mark.parametrize("g, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b", "a"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_can_fail(g, expected):
  assert cycles(g) == expected


def test_the_layer_check_reads_imports_inside_functions(tmp_path):
  """A lazy import counts: it is still a dependency, and the reason devices were once set up
  late (a `run` module touched JAX from a function the entry points called first)."""
  path = tmp_path / "m.py"
  path.write_text("def f():\n  from actlab.run import train\n")
  assert imports("actlab.core.m", path, {"actlab.run.train", "actlab.run"}) \
      == {"actlab.run.train"}


def test_the_readme_and_the_design_notes_name_every_entry():
  """The README's Layout and docs/design.md §2 describe the tree as it is."""
  repo = PACKAGE.parent
  layout = (repo / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
  design = (repo / "docs" / "design.md").read_text().split("## §2", 1)[1].split("\n## ", 1)[0]
  for entry in sorted(ENTRIES):
    name = f"{entry}.py" if (PACKAGE / f"{entry}.py").exists() else f"{entry}/"
    assert name in layout, f"README.md's Layout does not name actlab/{name}"
    assert f"`actlab/{name}" in design or f"{name}`" in design, \
        f"docs/design.md §2 does not name actlab/{name}"


def test_the_core_imports_nothing_of_the_harness():
  assert core_crossings(sorted((PACKAGE / "core").glob("*.py"))) == []


def test_the_core_boundary_check_fails_on_a_planted_import(tmp_path):
  """A core module that reaches for the config, a task or the run directory is caught."""
  planted = tmp_path / "step.py"
  planted.write_text((PACKAGE / "core" / "step.py").read_text()
                     + "\nimport ml_collections\nfrom actlab import tasks\n"
                     "def f():\n  from actlab.infra import workdir\n")
  assert core_crossings([planted]) == [
      "step.py imports ml_collections", "step.py imports actlab", "step.py imports actlab.infra"]


def test_training_and_sweeping_import_neither_matplotlib_nor_scipy_stats():
  """Every sweep worker and test subprocess imports the sweep: the report's plotting and
  statistics (about a second to import) load only where a report is written."""
  code = ("import sys, actlab.main, actlab.sweep; "
          "print(sorted({'matplotlib', 'scipy.stats'} & set(sys.modules)))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=PACKAGE.parent)
  assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
