"""The package layers ARCHITECTURE.md lists are the layers the code has.

Read from the source (``ast``; nothing is imported), every import counts, lazy ones inside functions
included:
- every package and top-level module of ``solar`` sits on exactly one line of the list;
- a package imports only packages on lower lines, never a peer on its own line;
- a line marked ``[no torch]`` never imports torch (an optional import inside ``try`` aside) nor a
  package that is not marked;
- no import cycle between modules, in ``solar`` or ``solar_operator``;
- no ``_private`` name taken from another module (``from m import _x`` or ``m._x``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"solar": ROOT / "trainer" / "solar", "solar_operator": ROOT / "operator" / "solar_operator"}
LINE = re.compile(r"^    (\w+)\s{2,}(\S+(?: \| \S+)*)\s{2,}(.*)$")


@dataclass(frozen=True)
class Layer:
    name: str
    rank: int                # 0 is the bottom line
    packages: tuple[str, ...]
    no_torch: bool


@dataclass(frozen=True)
class Import:
    source: str              # importing module
    target: str              # imported module (the deepest one that exists)
    line: int
    names: tuple[str, ...]   # names taken with ``from target import ...`` that are not modules
    optional: bool           # inside a ``try`` body


def layers() -> list[Layer]:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [LINE.match(line) for line in block.splitlines()]
    rows = [m for m in rows if m]
    assert rows, "ARCHITECTURE.md has no layer lines under '## Layers'"
    out = []
    for rank, m in enumerate(reversed(rows)):
        packages = tuple("solar" if p == "__init__" else f"solar.{p}" for p in m.group(2).split(" | "))
        out.append(Layer(m.group(1), rank, packages, "[no torch]" in m.group(3)))
    return out


def modules(top: str) -> dict[str, Path]:
    base = SOURCES[top]
    found = {}
    for path in sorted(base.rglob("*.py")):
        parts = [top, *path.relative_to(base).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


ALL = {**modules("solar"), **modules("solar_operator")}


def _existing(name: str) -> str | None:
    while name and name not in ALL:
        name = name.rpartition(".")[0]
    return name or None


def _inside_try(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and node.handlers:
            for stmt in node.body:
                ids.update(id(n) for n in ast.walk(stmt))
    return ids


def imports_of(module: str) -> list[Import]:
    path = ALL[module]
    tree = ast.parse(path.read_text(), str(path))
    optional = _inside_try(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _existing(alias.name) if alias.name.split(".")[0] in SOURCES else alias.name
                found.append(Import(module, target, node.lineno, (), id(node) in optional))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            if origin.split(".")[0] not in SOURCES:
                found.append(Import(module, origin, node.lineno, (), id(node) in optional))
                continue
            names = []
            for alias in node.names:
                if f"{origin}.{alias.name}" in ALL:
                    found.append(Import(module, f"{origin}.{alias.name}", node.lineno, (), id(node) in optional))
                else:
                    names.append(alias.name)
            if names:
                found.append(Import(module, _existing(origin), node.lineno, tuple(names), id(node) in optional))
    return found


EDGES = {m: imports_of(m) for m in ALL}


def layer_of(module: str, table: list[Layer]) -> tuple[Layer, str]:
    """The line a module of ``solar`` sits on, and its package (``solar.x`` or the root ``solar``)."""
    package = ".".join(module.split(".")[:2])
    layer = next((la for la in table if package in la.packages), None)
    assert layer is not None, f"ARCHITECTURE.md's layers do not list {package}"
    return layer, package


def ours(name: str | None) -> bool:
    return bool(name) and (name == "solar" or name.startswith("solar."))


def test_every_package_is_on_exactly_one_line():
    table = layers()
    listed = [p for layer in table for p in layer.packages]
    assert len(listed) == len(set(listed)), f"a package is listed twice: {sorted(listed)}"
    tops = sorted({".".join(m.split(".")[:2]) for m in ALL if m.startswith("solar.")} | {"solar"})
    missing = [t for t in tops if t not in listed]
    assert not missing, f"ARCHITECTURE.md's layers do not list {missing}"
    unknown = [p for p in listed if p not in tops]
    assert not unknown, f"ARCHITECTURE.md lists packages that do not exist: {unknown}"


def layer_violations(module: str, table: list[Layer]) -> list[str]:
    """Imports of ``module`` that go to a peer or up, or bring torch into a ``[no torch]`` line."""
    here, package = layer_of(module, table)
    wrong = []
    for edge in imports_of(module):
        if edge.target and edge.target.split(".")[0] == "torch" and here.no_torch and not edge.optional:
            wrong.append(f"{module}:{edge.line} imports {edge.target} (layer {here.name} is [no torch])")
        if not ours(edge.target):
            continue
        there, target_package = layer_of(edge.target, table)
        if target_package == package:
            continue
        if there.rank >= here.rank:
            relation = "a peer" if there.rank == here.rank else "a higher layer"
            wrong.append(f"{module}:{edge.line} imports {edge.target} ({relation}: {here.name} -> {there.name})")
        elif here.no_torch and not there.no_torch:
            wrong.append(f"{module}:{edge.line} imports {edge.target} (layer {there.name} uses torch)")
    return wrong


def test_packages_import_only_lower_layers_and_no_torch_lines_stay_free_of_torch():
    table = layers()
    wrong = [v for module in ALL if ours(module) for v in layer_violations(module, table)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("where, source, expected", [
    ("solar.config.probe", "from solar.train.setup import build_parts\n", "a higher layer: config -> verbs"),
    ("solar.train.probe", "def f():\n    from solar.infer import weights\n", "a peer: verbs -> verbs"),
    ("solar.storage.probe", "import torch\n", "layer storage is [no torch]"),
    ("solar.local.probe", "from solar.data.stream import ClipSource\n", "layer data uses torch"),
    ("solar.storage.probe", "try:\n    import torch\nexcept ImportError:\n    torch = None\n", None),
    ("solar.infer.probe", "from solar.launch.session import Session\n", None),
])
def test_layer_check_sees_what_it_should(where, source, expected, monkeypatch, tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(ALL, where, path)
    found = layer_violations(where, layers())
    assert (expected in found[0]) if expected else not found, found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_cycles():
    graph = {m: {e.target for e in edges if e.target in ALL and e.target != m} for m, edges in EDGES.items()}
    # a package's __init__ is imported with its modules; only cycles through real imports count
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _module_aliases(tree: ast.AST, module: str) -> dict[str, str]:
    """Local names bound to modules of ours (``import a.b as m``, ``from a import b``)."""
    aliases = {}
    package = module if ALL[module].name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in ALL:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                base = package.split(".")
                origin = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{origin}.{alias.name}" in ALL:
                    aliases[alias.asname or alias.name] = f"{origin}.{alias.name}"
    return aliases


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(module: str) -> list[str]:
    """Each ``_private`` name ``module`` takes from another module of ours."""
    found = [f"{module}:{e.line} takes {e.target}.{n}" for e in imports_of(module) for n in e.names if _private(n)]
    tree = ast.parse(ALL[module].read_text())
    aliases = _module_aliases(tree, module)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and _private(node.attr) and aliases[node.value.id] != module):
            found.append(f"{module}:{node.lineno} takes {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_private_name_crosses_modules():
    wrong = [use for module in ALL for use in private_uses(module)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("source, expected", [
    ("from solar.train.setup import _load_base\n", ["solar.probe:1 takes solar.train.setup._load_base"]),
    ("from solar.train import setup as s\ns._load_base(1)\n", ["solar.probe:2 takes solar.train.setup._load_base"]),
    ("import solar.train.setup as s\ns._x\n", ["solar.probe:2 takes solar.train.setup._x"]),
    ("from solar import __version__\nfrom solar.train.setup import build_parts\n", []),
])
def test_private_name_check_sees_what_it_should(source, expected, monkeypatch, tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(ALL, "solar.probe", path)
    assert private_uses("solar.probe") == expected
