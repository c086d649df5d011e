"""The first-party import graph (hvdtrain/, etl/, yarn/): subsystems in layers, no circles, and no imports hidden
inside functions.

Built with ``ast`` from the source, top-level imports only (``if`` blocks
included, e.g. ``TYPE_CHECKING``), so it needs none of the heavy dependencies.
A function-level first-party import is allowed only where it defers a heavy
optional dependency; each one is listed in :data:`ALLOWED_FUNCTION_IMPORTS`
with its reason.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Union

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hvdtrain", "etl", "yarn")
# hvdtrain's subsystems (the names under hvdtrain/), lowest first: each imports only those before it. etl and yarn
# come last, beside each other: they build on hvdtrain and never import each other.
LAYERS = ("core", "hadoop", "data", "runtime", "model", "observe", "tune", "training", "score", "cli")

# (module, function, imported module): why the import waits until the function runs.
ALLOWED_FUNCTION_IMPORTS = {
    ("yarn.executor", "run_rank", "hvdtrain.training.train"):
        "TensorFlow and Horovod load in the rank's process only after its GPUs are pinned; the driver "
        "imports yarn.executor to pickle run_rank by reference",
    ("yarn.executor", "run_rank", "hvdtrain.training.elastic"):
        "the same deferral, for a train.elastic job's ranks (horovod.spark.run_elastic)",
}

Import = Union[ast.Import, ast.ImportFrom]


def module_files(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the first-party packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imported(node: Import, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The first-party modules an import statement loads (the longest known prefix of each name)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def _top_level(body: list[ast.stmt]) -> Iterator[Import]:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, *[h.body for h in getattr(node, "handlers", [])],
                          getattr(node, "finalbody", [])):
                yield from _top_level(block)


def import_graph(files: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Module -> modules it imports at top level; and every (module, function, module) function-level import."""
    known = set(files)
    graph: dict[str, set[str]] = {}
    in_functions = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        graph[module] = {m for node in _top_level(tree.body) for m in imported(node, module, is_package, known)}
        graph[module].discard(module)
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        in_functions += [(module, function.name, m)
                                         for m in imported(node, module, is_package, known)]
    return graph, in_functions


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle as a path (first module repeated at the end), or [] when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return []


def test_the_first_party_modules_import_each_other_without_circles() -> None:
    graph, _ = import_graph(module_files())
    assert "hvdtrain.training.loop" in graph and graph["hvdtrain.training.loop"] >= {"hvdtrain.observe.events"}
    cycle = find_cycle(graph)
    assert not cycle, "import circle: " + " -> ".join(cycle) + " (move the shared types down a layer)"


def subsystem(module: str) -> str:
    """``hvdtrain.hadoop.fs`` -> ``hadoop``; ``etl.job`` -> ``etl``; the package ``hvdtrain`` itself -> ``""``."""
    parts = module.split(".")
    if parts[0] != "hvdtrain":
        return parts[0]
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every (module, imported module) whose import runs from a lower subsystem to a higher one, or between
    etl and yarn, or into etl/yarn from hvdtrain; functions' deferred imports count too."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    rank.update({"etl": len(LAYERS), "yarn": len(LAYERS), "": -1})
    out = []
    for module, targets in graph.items():
        low = subsystem(module)
        for target in targets:
            high = subsystem(target)
            if high == low:
                continue
            if high not in rank or low not in rank:
                out.append((module, target))  # a subsystem missing from LAYERS: place it
            elif rank[high] >= rank[low]:
                out.append((module, target))
    return sorted(out)


def test_hvdtrain_is_a_handful_of_subsystems_in_layers() -> None:
    files = module_files()
    graph, in_functions = import_graph(files)
    names = {subsystem(m) for m in files if m.startswith("hvdtrain.")}
    assert names == set(LAYERS), f"hvdtrain/ holds {sorted(names)}; LAYERS places {sorted(LAYERS)}: place each one"
    for name in LAYERS:
        path = files.get(f"hvdtrain.{name}")
        assert path is not None and ast.get_docstring(ast.parse(path.read_text())), (
            f"hvdtrain.{name} needs a docstring saying what it owns")
    for module, _, target in in_functions:
        graph[module] = graph[module] | {target}
    upward = upward_imports(graph)
    assert not upward, "imports from a lower subsystem up (move the shared piece down a layer): " + ", ".join(
        f"{a} -> {b}" for a, b in upward)


def test_an_upward_import_is_found() -> None:
    graph = {"hvdtrain.core.config": {"hvdtrain.hadoop.fs"}, "hvdtrain.hadoop.fs": {"hvdtrain.core.errors"},
             "etl.job": {"yarn.submit", "hvdtrain.training.train"}, "hvdtrain.data.plan": {"hvdtrain.data.staging"},
             "hvdtrain.model.heads": {"hvdtrain.attic.x"}}
    assert upward_imports(graph) == [("etl.job", "yarn.submit"), ("hvdtrain.core.config", "hvdtrain.hadoop.fs"),
                                     ("hvdtrain.model.heads", "hvdtrain.attic.x")]


def test_first_party_imports_inside_functions_are_only_the_listed_deferrals() -> None:
    _, in_functions = import_graph(module_files())
    unlisted = sorted(set(in_functions) - set(ALLOWED_FUNCTION_IMPORTS))
    assert not unlisted, ("first-party imports inside functions (import at the top, or list the heavy dependency "
                          f"they defer in ALLOWED_FUNCTION_IMPORTS): {unlisted}")
    stale = sorted(set(ALLOWED_FUNCTION_IMPORTS) - set(in_functions))
    assert not stale, f"ALLOWED_FUNCTION_IMPORTS lists imports that are gone: {stale}"


def test_a_circle_and_a_hidden_import_are_found(tmp_path: Path) -> None:
    (tmp_path / "hvdtrain").mkdir()
    (tmp_path / "hvdtrain" / "__init__.py").write_text("")
    (tmp_path / "hvdtrain" / "a.py").write_text("from hvdtrain import b\n")
    (tmp_path / "hvdtrain" / "b.py").write_text("from . import c\n\ndef f():\n    from hvdtrain.a import x\n")
    (tmp_path / "hvdtrain" / "c.py").write_text("if True:\n    import hvdtrain.a\n")
    graph, in_functions = import_graph(module_files(tmp_path))
    assert find_cycle(graph) == ["hvdtrain.a", "hvdtrain.b", "hvdtrain.c", "hvdtrain.a"]
    assert in_functions == [("hvdtrain.b", "f", "hvdtrain.a")]
    assert find_cycle({"x": {"y"}, "y": set()}) == []
