"""The package's import graph has no circle: every seed_jax module can be read (and
imported) after the modules it imports, with no half-initialised module in between.

The graph is read from the source with `ast`, so nothing is imported and the test is fast.
Imports inside functions count too: a circle closed by a function-level import is still a
circle (it only fails later, and hides which module depends on which); imports under
`if TYPE_CHECKING:` do not, as they never run.
"""

from __future__ import annotations

import ast
import os

PACKAGE = "seed_jax"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_modules(root: str = ROOT, package: str = PACKAGE) -> dict[str, str]:
  """{dotted module name: file} of every module of `package` (a package is its __init__)."""
  modules = {}
  for folder, _, files in os.walk(os.path.join(root, package)):
    for file in files:
      if file.endswith(".py"):
        path = os.path.join(folder, file)
        name = os.path.relpath(path, root)[:-len(".py")].replace(os.sep, ".")
        modules[name.removesuffix(".__init__")] = path
  return modules


def _type_checking_only(node: ast.AST) -> bool:
  test = getattr(node, "test", None)
  return isinstance(node, ast.If) and (
      (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
      or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imported_modules(source: str, module: str, known: set[str], is_package: bool = False
                     ) -> set[str]:
  """The modules of `known` that `module`'s `source` imports, at any depth of the code.

  `from a import b` imports the module `a.b` when there is one, else (a name of) `a`;
  relative imports are resolved against `module` (its own package if `is_package`).
  """
  found = set()
  package = module if is_package else module.rpartition(".")[0]
  for node in _executed_nodes(ast.parse(source)):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # `from . import x`, `from ..a import b`
        parts = package.split(".")
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
      for alias in node.names:
        found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
  return {name for name in found if name in known and name != module}


def _executed_nodes(tree: ast.AST):
  """Every node of `tree` except those under `if TYPE_CHECKING:`."""
  stack = [tree]
  while stack:
    node = stack.pop()
    yield node
    if not _type_checking_only(node):
      stack.extend(ast.iter_child_nodes(node))


def import_graph(root: str = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
  """{module: the package's modules it imports}."""
  modules = package_modules(root, package)
  graph = {}
  for name, path in modules.items():
    with open(path) as f:
      graph[name] = imported_modules(f.read(), name, set(modules),
                                     is_package=path.endswith("__init__.py"))
  return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import circle of `graph` as [a, b, ..., a], or None when the graph is acyclic."""
  state: dict[str, str] = {}  # "open" while on the current path, "done" after it

  def visit(node: str, path: list[str]) -> list[str] | None:
    state[node] = "open"
    for neighbour in sorted(graph.get(node, ())):
      if state.get(neighbour) == "open":
        return path[path.index(neighbour):] + [neighbour]
      if neighbour not in state:
        circle = visit(neighbour, path + [neighbour])
        if circle:
          return circle
    state[node] = "done"
    return None

  for start in sorted(graph):
    if start not in state:
      circle = visit(start, [start])
      if circle:
        return circle
  return None


def test_the_package_has_no_import_circle():
  graph = import_graph()
  assert len(graph) > 50 and "seed_jax.train.trainer" in graph  # the walk found the package
  circle = find_circle(graph)
  assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_circle_finder_finds_a_circle_through_a_function_level_import():
  known = {"p.a", "p.b", "p.c"}
  graph = {"p.a": imported_modules("from p.b import f\n", "p.a", known),
           "p.b": imported_modules("def g():\n  from p import c\n", "p.b", known),
           "p.c": imported_modules("import p.a\n", "p.c", known)}
  assert find_circle(graph) == ["p.a", "p.b", "p.c", "p.a"]
  typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  import p.a\n"
  assert imported_modules(typing_only, "p.c", known) == set()
  assert imported_modules("from . import a\nfrom .b import f\n", "p.c", known) == {"p.a", "p.b"}
