"""How the engine's code hangs together, as numbers to compare before and after a redesign.

    .venv/bin/python benchmarks/structure.py [--root include/tidegate] [--tests tests] [--top 8]

Reads the source with ``ast`` (nothing is imported) and prints:

* modules and lines;
* imports inside functions (an import the module graph does not show at the top);
* the import graph between the engine's modules (top-level and in-function imports alike):
  its cycles (strongly connected sets of two or more modules), and between packages (the top
  package's own modules counted as one) the pairs that import each other, with the number of
  module imports each way (the core importing the sinks to build them, the sinks importing
  the core's errors: the top package mixes layers);
* the largest classes by method count;
* writes through ``__dict__`` and ``object.__setattr__`` (frozen dataclasses changed anyway);
* tests that patch an engine function (``monkeypatch.setattr`` on a ``tidegate`` module or on a
  name imported from one).

:func:`path_moves` measures a traced path through the modules (tests/dags/test_run_counts.py
traces the deliver step): how many moves from one module to another it makes, and how many of
them go back up the import order (into a module that imports the one it leaves).
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve_import(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class ModuleFacts(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]):
        self.module, self.is_package, self.known = module, is_package, known
        self.imports: set[str] = set()
        self.inner_imports = 0
        self.depth = 0
        self.classes: list[tuple[str, int]] = []
        self.dict_writes = 0

    def _target(self, name: str) -> str | None:
        while name and name not in self.known:
            name = name.rpartition(".")[0]
        return name or None

    def _add(self, names: list[str]) -> None:
        for n in names:
            t = self._target(n)
            if t and t != self.module:
                self.imports.add(t)

    def visit_Import(self, node: ast.Import) -> None:
        self.inner_imports += self.depth > 0
        self._add([a.name for a in node.names])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.inner_imports += self.depth > 0
        base = resolve_import(self.module, self.is_package, node)
        # ``from pkg import module`` depends on that module (as ``from pkg.module import x``
        # does), not on the package's __init__; ``from pkg import name`` depends on the package.
        submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in self.known]
        self._add(submodules + ([base] if len(submodules) < len(node.names) else []))

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        methods = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body)
        self.classes.append((f"{self.module}.{node.name}", methods))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr == "__setattr__" and isinstance(f.value, ast.Name)
                and f.value.id == "object"):
            self.dict_writes += 1
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if (isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "__dict__"):
            self.dict_writes += 1
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # x.__dict__.update(...)
        if node.attr == "update" and isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__":
            self.dict_writes += 1
        self.generic_visit(node)


def scan(root: Path) -> dict[str, tuple[ModuleFacts, int]]:
    files = sorted(root.rglob("*.py"))
    known = {module_name(p, root) for p in files}
    out = {}
    for p in files:
        name = module_name(p, root)
        facts = ModuleFacts(name, p.name == "__init__.py", known)
        text = p.read_text(encoding="utf-8")
        facts.visit(ast.parse(text))
        out[name] = (facts, text.count("\n"))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_of(module: str, top: str) -> str:
    """The engine's sub-package a module is in (``tidegate.sinks``), or the top for modules directly in it."""
    rest = module[len(top) + 1:].split(".") if module != top else []
    return f"{top}.{rest[0]}" if len(rest) > 1 else top


def package_edges(graph: dict[str, set[str]], top: str) -> dict[tuple[str, str], int]:
    """Imports between the engine's packages (the top package's own modules count as one):
    (importing package, imported package) -> how many module imports."""
    edges: dict[tuple[str, str], int] = defaultdict(int)
    for src, targets in graph.items():
        for dst in targets:
            a, b = package_of(src, top), package_of(dst, top)
            if a != b:
                edges[(a, b)] += 1
    return dict(sorted(edges.items()))


def is_engine(module: str) -> bool:
    return module == "tidegate" or module.startswith("tidegate.")


def patches_of_engine(tests: Path) -> list[str]:
    """``monkeypatch.setattr(x, ...)`` calls in tests whose target is a tidegate module."""
    found = []
    for p in sorted(tests.rglob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        engine_names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and is_engine(node.module or ""):
                engine_names |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                engine_names |= {a.asname or a.name.split(".")[0] for a in node.names
                                 if is_engine(a.name)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "setattr" and node.args):
                first = node.args[0]
                target = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) \
                    else ast.unparse(first)
                if target.split(".")[0] in engine_names or is_engine(target):
                    found.append(f"{p.relative_to(tests.parent)}:{node.lineno} {ast.unparse(node)[:90]}")
    return found


def reaches(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Every module each module imports, directly or through others."""
    out: dict[str, set[str]] = {}

    def visit(m: str) -> set[str]:
        if m not in out:
            out[m] = set()
            for n in graph.get(m, ()):
                out[m] |= {n} | visit(n)
        return out[m]

    for m in graph:
        visit(m)
    return out


def unit_of(module: str) -> str:
    """What a path counts as one place: a module of the top package, or a whole subpackage
    (``tidegate.store``, ``tidegate.sinks.kafka``, ``tidegate.spark``: its inner calls are its own)."""
    parts = module.split(".")
    kind_package = parts[1:2] in (["sources"], ["sinks"])
    if len(parts) > 2 and kind_package and parts[2] not in ("base", "preflight", "_common"):
        return ".".join(parts[:3])
    if len(parts) > 2:
        return ".".join(parts[:2])
    return module


def path_moves(path: list[str], graph: dict[str, set[str]]) -> dict[str, object]:
    """Moves between places (:func:`unit_of`) along ``path`` (consecutive repeats collapsed),
    those into a place that imports the one left (back up the import order; places of one
    cycle are level), and how often each place is entered."""
    units: dict[str, set[str]] = defaultdict(set)
    for m, deps in graph.items():
        units[unit_of(m)] |= {unit_of(d) for d in deps} - {unit_of(m)}
    graph = units
    path = [unit_of(m) for m in path]
    seq = [m for i, m in enumerate(path) if i == 0 or path[i - 1] != m]
    below = reaches(graph)
    up = sum(1 for a, b in zip(seq, seq[1:], strict=False)
             if a in below.get(b, ()) and b not in below.get(a, ()))
    visits: dict[str, int] = defaultdict(int)
    for m in seq:
        visits[m] += 1
    return {"moves": len(seq) - 1, "up": up,
            "visits": dict(sorted(visits.items(), key=lambda kv: -kv[1]))}


def engine_graph(root: Path = ROOT / "include" / "tidegate") -> dict[str, set[str]]:
    return {m: f.imports for m, (f, _) in scan(root).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(ROOT / "include" / "tidegate"))
    ap.add_argument("--tests", default=str(ROOT / "tests"))
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    root = Path(args.root)
    facts = scan(root)
    top = module_name(root / "__init__.py", root)
    graph = {m: f.imports for m, (f, _) in facts.items()}
    lines = sum(n for _, n in facts.values())
    print(f"modules                      {len(facts)}  ({lines:,} lines)")
    inner = {m: f.inner_imports for m, (f, _) in facts.items() if f.inner_imports}
    print(f"imports inside functions     {sum(inner.values())}  in {len(inner)} modules")
    cyc = cycles(graph)
    print(f"import cycles                {len(cyc)}" + "".join(f"\n  {' <-> '.join(c)}" for c in cyc))
    edges = package_edges(graph, top)
    both = [(a, b) for a, b in edges if a < b and (b, a) in edges]
    print(f"package imports              {len(edges)} edges, {len(both)} pairs importing each other"
          + "".join(f"\n  {a} -> {b}: {edges[(a, b)]}, back: {edges[(b, a)]}" for a, b in both))
    classes = sorted((c for f, _ in facts.values() for c in f.classes), key=lambda c: -c[1])[: args.top]
    print("largest classes (methods)    " + ", ".join(f"{n.rsplit('.', 1)[1]} {k}" for n, k in classes))
    print(f"__dict__ / object.__setattr__ writes  {sum(f.dict_writes for f, _ in facts.values())}")
    patches = patches_of_engine(Path(args.tests))
    print(f"tests patching tidegate      {len(patches)}" + "".join(f"\n  {p}" for p in patches))
    by_pkg: dict[str, int] = defaultdict(int)
    for m, (_, n) in facts.items():
        by_pkg[package_of(m, top)] += n
    print("lines per package            " + ", ".join(f"{k} {v:,}" for k, v in sorted(by_pkg.items())))


if __name__ == "__main__":
    main()
