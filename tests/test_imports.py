"""The layout of ``services/``: no import cycle among module-top imports, no oversized file.

The graph: every ``services/**/*.py`` file is a node (``services/a/b.py`` is ``services.a.b``, a package's
``__init__.py`` is the package). ``import services.a.b`` and ``from services.a.b import c`` (absolute or
relative) are edges to ``services.a.b``, or to ``services.a.b.c`` when that is a module itself. An import
is *module-top* when it runs at import time: at module level or in a class body, ``try``/``if`` blocks
included, except under ``if TYPE_CHECKING:``; an import inside a function body is *in-function*.

- ``test_no_import_cycle``: no cycle among module-top imports anywhere in ``services/`` (each strongly
  connected component with more than one module, or a module importing itself, is a cycle);
- ``test_in_function_project_imports_are_commented``: in ``services/pipeline`` and
  ``services/policy_trainer``, every in-function import of a ``services.*`` module carries a comment (on
  its line, or above the run of consecutive imports it is in) saying why it is not at module top;
- ``test_file_length``: no Python file under ``services/`` or ``benchmarks/`` longer than
  ``MAX_LINES`` (the generated ``services/common/proto_gen`` left out).

Run ``python tests/test_imports.py`` for the report: the cycles among module-top imports, the cycles that
in-function imports add, and the in-function project imports per package.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVICES = REPO / "services"
MAX_LINES = 600
# packages whose in-function project imports must say why they are in-function
STRICT = ("services.pipeline", "services.policy_trainer")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SERVICES.rglob("*.py")) if "__pycache__" not in p.parts}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module):
    """(node, in_function, first) for every import statement (``TYPE_CHECKING`` blocks left out); ``first``
    is the line of the first statement of the run of consecutive imports the node belongs to."""

    def body(stmts: list, in_function: bool):
        first = None
        for stmt in stmts:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                first = first or stmt.lineno
                yield stmt, in_function, first
                continue
            first = None
            if isinstance(stmt, ast.If) and _is_type_checking(stmt):
                yield from body(stmt.orelse, in_function)
                continue
            inner = in_function or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(stmt, field, None) or []:
                    if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                        yield from body(child.body, inner)
                if isinstance(getattr(stmt, field, None), list):
                    yield from body([c for c in getattr(stmt, field) if isinstance(c, ast.stmt)], inner)

    yield from body(tree.body, False)


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_pkg: bool, modules) -> list[str]:
    """The ``services.*`` modules an import statement of module ``name`` loads."""
    if isinstance(node, ast.Import):
        bases = [a.name for a in node.names]
        subs: list[str] = []
    else:
        if node.level:
            pkg = name.split(".") if is_pkg else name.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        bases = [base]
        subs = [f"{base}.{a.name}" for a in node.names]
    out = []
    for b in bases:
        if b.split(".")[0] != "services":
            continue
        found = [s for s in subs if s in modules]
        if len(found) < len(subs) or not subs:
            m = b
            while m and m not in modules:  # `import services.a.b` where b is not ours: the nearest module
                m = m.rpartition(".")[0]
            if m:
                found.append(m)
        out += found
    return out


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, list[tuple[int, str, bool]]]]:
    """(module-top edges, in-function edges, in-function project imports per module as (line, target,
    commented))."""
    modules = _modules()
    top: dict[str, set[str]] = defaultdict(set)
    lazy: dict[str, set[str]] = defaultdict(set)
    lazy_sites: dict[str, list[tuple[int, str, bool]]] = defaultdict(list)
    for name, path in modules.items():
        src = path.read_text()
        lines = src.splitlines()
        for node, in_function, first in _imports(ast.parse(src, str(path))):
            targets = _targets(node, name, path.name == "__init__.py", modules)
            for t in targets:
                if t == name and path.name == "__init__.py":
                    continue
                (lazy if in_function else top)[name].add(t)
            if in_function and targets:
                here = lines[node.lineno - 1]
                above = lines[first - 2].strip() if first > 1 else ""
                commented = "#" in here or above.startswith("#")
                lazy_sites[name].append((node.lineno, ", ".join(sorted(set(targets))), commented))
    return top, lazy, lazy_sites


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle (Tarjan), each as one cycle through all of it
    where a simple path exists, else its sorted members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
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
            if len(comp) > 1 or v in graph.get(v, ()):
                comps.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return [_one_cycle(graph, c) for c in sorted(comps)]


def _one_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest cycle from the component's first module back to itself (BFS inside the component)."""
    members, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w in members and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def _fmt(cycle: list[str]) -> str:
    return " -> ".join(cycle)


def test_no_import_cycle():
    top, _, _ = import_graph()
    found = cycles(top)
    assert not found, "import cycles (module-top imports):\n" + "\n".join(map(_fmt, found))


def test_cycle_finder():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d"}, "e": {"f"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c", "a"], ["d", "d"]]


def test_in_function_project_imports_are_commented():
    _, _, sites = import_graph()
    bare = [
        f"{REPO.joinpath(*m.split('.')).with_suffix('.py').relative_to(REPO)}:{line} imports {t}"
        for m, rows in sites.items()
        if any(m == p or m.startswith(p + ".") for p in STRICT)
        for line, t, commented in rows
        if not commented
    ]
    assert not bare, "in-function imports of project modules without a comment saying why:\n" + "\n".join(
        bare
    )


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("ray", "grpc_health") or name.endswith("_pb2_grpc"):
            raise ImportError("blocked " + name)
sys.meta_path.insert(0, Block())
"""


def test_engine_and_tuner_run_in_process_without_ray_or_grpc_stubs():
    """A GPU machine may have neither Ray nor a grpcio new enough for the generated stubs: the engine, the
    drafters, the tuner (service and selector) and trace replay must import there."""
    import subprocess

    code = BLOCKER + (
        "import benchmarks.trace_replay.__main__, benchmarks.cuda_graphs\n"
        "import services.tuner.service, services.tuner.selector, services.rollout_actor.engine\n"
        "services.tuner.service.TunerService(available_drafters=['suffix']).merge([])\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _long_files() -> dict[str, int]:
    out = {}
    for root in ("services", "benchmarks"):
        for p in sorted((REPO / root).rglob("*.py")):
            if "__pycache__" in p.parts or "proto_gen" in p.parts:
                continue
            n = len(p.read_text().splitlines())
            if n > MAX_LINES:
                out[str(p.relative_to(REPO))] = n
    return out


def test_file_length():
    long = _long_files()
    assert not long, f"files over {MAX_LINES} lines: {long}"


def main() -> int:
    top, lazy, sites = import_graph()
    found = cycles(top)
    print(f"{len(_modules())} modules under services/")
    print(f"module-top import cycles: {len(found)}")
    for c in found:
        print("  " + _fmt(c))
    both = {m: top.get(m, set()) | lazy.get(m, set()) for m in set(top) | set(lazy)}
    extra = [c for c in cycles(both) if c not in found]
    print(f"cycles when in-function imports count too: {len(extra)} more")
    for c in extra:
        print("  " + _fmt(c))
    per_pkg: dict[str, int] = defaultdict(int)
    for m, rows in sites.items():
        per_pkg[".".join(m.split(".")[:2])] += len(rows)
    print("in-function project imports: " + ", ".join(f"{p} {n}" for p, n in sorted(per_pkg.items())))
    print(f"files over {MAX_LINES} lines: {_long_files()}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
