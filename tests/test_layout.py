"""The import graph of the repository, read from the source (ast, nothing imported): no circle between modules,
and arrows down only, between the packages (bench -> dllm -> triton_kernels) and between the layers of dllm
(cli -> eval / harness / distributed -> the public API ``dllm`` -> generate -> prefilling -> decode -> model).

Every import counts, those inside functions too (a late import is still an arrow). An import of ``a.b.c``
is an arrow to the module ``a.b.c`` only, not to the packages above it (their ``__init__`` runs first, but
that is Python's order, not a dependency the code chose). The layers are named by sub-package, so a new
module falls into its package's layer; a new top-level name of dllm has to be given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("triton_kernels", "dllm", "bench")  # in this order: each may import only those before it
# dllm's layers, lowest first: a module may import its own sub-package or a strictly lower layer. "" is
# dllm/__init__.py, the public API (load_model, generate, encode_document, ...), which the layers above use.
DLLM_LAYERS = (
    ("model", "file_targets"),
    ("decode",),
    ("prefilling",),
    ("generate",),
    ("",),
    ("eval", "harness", "distributed"),
    ("cli",),
    ("__main__",),
)


def find_modules(root: Path, packages) -> dict[str, Path]:
    """``{"pkg.sub.mod": path}`` of every ``.py`` file under the packages (``pkg.sub`` for an ``__init__.py``)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known) -> set[str]:
    """The modules of ``known`` that the module ``name`` (file ``path``) imports, at any depth of its code."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()

    def longest_known(dotted: str) -> str | None:
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in known:
                return ".".join(parts[:n])
        return None

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [longest_known(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # "from pkg import sub" imports the module pkg.sub when there is one, else a name of pkg
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else longest_known(module)
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t is not None and t != name)
    return found


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    known = find_modules(root, packages)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def dllm_layer(name: str, layers=DLLM_LAYERS) -> tuple[int, str]:
    """``(rank, group)`` of a module of dllm: its sub-package (or top-level module) and that one's layer."""
    group = name.split(".")[1] if "." in name else ""
    for rank, groups in enumerate(layers):
        if group in groups:
            return rank, group
    raise LookupError(f"{name}: dllm.{group} has no layer in tests/test_layout.py DLLM_LAYERS (give it one)")


def upward_imports(graph: dict[str, set[str]], packages=PACKAGES, layers=DLLM_LAYERS) -> list[str]:
    """Every arrow that points up: between the packages, or between the layers of dllm."""
    bad = []
    for src, targets in sorted(graph.items()):
        src_pkg = packages.index(src.split(".")[0])
        for dst in sorted(targets):
            dst_pkg = packages.index(dst.split(".")[0])
            if dst_pkg > src_pkg:
                bad.append(f"{src} -> {dst} (package {packages[dst_pkg]} is above {packages[src_pkg]})")
            elif src_pkg == dst_pkg == packages.index("dllm"):
                (src_rank, src_group), (dst_rank, dst_group) = dllm_layer(src, layers), dllm_layer(dst, layers)
                if src_group != dst_group and dst_rank >= src_rank:
                    bad.append(f"{src} -> {dst} (dllm.{dst_group} is not below dllm.{src_group or '__init__'})")
    return bad


GRAPH = import_graph()


def test_the_graph_is_read():
    # the graph holds what the source says (a sample of arrows that are part of the design)
    assert "dllm.model.modeling" in GRAPH["dllm.generate"] or "dllm.decode.denoise" in GRAPH["dllm.generate"]
    assert "dllm.decode.policies" in GRAPH["dllm.prefilling"]
    assert "dllm.cli.parser" in GRAPH["dllm.cli"]
    assert any(t.startswith("dllm.") for t in GRAPH["bench.fidelity.demo"])
    assert len(GRAPH) > 100


def test_no_import_circle():
    library = {name: targets for name, targets in GRAPH.items() if not name.startswith("bench")}
    cycle = find_cycle(library)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_import_circle_in_bench():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_every_dllm_module_has_a_layer():
    for name in GRAPH:
        if name.split(".")[0] == "dllm":
            dllm_layer(name)  # raises for a sub-package with no layer


def test_arrows_point_down_only():
    bad = upward_imports(GRAPH)
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_checks_catch_a_circle_and_an_upward_import(tmp_path):
    # a small tree with one circle (model.x <-> model.y, one arrow a late import) and two upward arrows
    files = {
        "lo/__init__.py": "",
        "lo/k.py": "import dllm.m\n",  # lo is below dllm: upward
        "dllm/__init__.py": "",
        "dllm/m.py": "import os\n",
        "dllm/model/__init__.py": "",
        "dllm/model/x.py": "def f():\n    from dllm.model.y import g\n",
        "dllm/model/y.py": "from . import x\nfrom dllm.cli import main\n",  # model -> cli: upward
        "dllm/cli.py": "from dllm import m\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = import_graph(tmp_path, ("lo", "dllm"))
    assert graph["dllm.model.y"] == {"dllm.model.x", "dllm.cli"} and graph["dllm.cli"] == {"dllm.m"}
    assert graph["dllm.model.x"] == {"dllm.model.y"}  # the late import counts
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"dllm.model.x", "dllm.model.y"}
    bad = upward_imports(graph, ("lo", "dllm"), (("model",), ("", "m"), ("cli",)))
    assert bad == [
        "dllm.model.y -> dllm.cli (dllm.cli is not below dllm.model)",
        "lo.k -> dllm.m (package dllm is above lo)",
    ]
    with pytest.raises(LookupError, match="dllm.cli has no layer"):
        dllm_layer("dllm.cli.x", (("model",),))
