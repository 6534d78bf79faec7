"""The house: folders are floors. Every import between the project's top-level folders runs from
a higher floor to a lower one (or across one floor without a loop), read from the code itself."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# architecture.md's floors; a folder imports only folders on its own floor or below.
FLOORS = {
    "configs": 1, "numerics": 1, "schedules": 1, "device": 1, "workbench": 1,
    "producers": 2, "consumers": 2, "epilogues": 2,
    "kernels": 3,
    "models": 4,
    "validators": 5, "experiments": 5,
    "cli": 6, "scripts": 6,
}


def _folder_imports() -> dict[tuple[str, str], set[str]]:
    """(importing folder, imported folder) -> the files that make that import, any depth of
    the code (imports inside functions count too)."""
    edges: dict[tuple[str, str], set[str]] = {}
    for folder in FLOORS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in FLOORS and top != folder:
                        edges.setdefault((folder, top), set()).add(
                            str(path.relative_to(ROOT)))
    return edges


def test_every_top_level_folder_has_a_floor():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - set(FLOORS) == set(), "a new top-level package needs a floor here"


def test_no_import_runs_back_up_a_floor():
    up = {f"{a} (floor {FLOORS[a]}) -> {b} (floor {FLOORS[b]}): {sorted(files)}"
          for (a, b), files in _folder_imports().items() if FLOORS[b] > FLOORS[a]}
    assert not up, "imports that run back up a floor:\n" + "\n".join(sorted(up))


def test_no_import_cycle_between_folders():
    graph: dict[str, set[str]] = {}
    for a, b in _folder_imports():
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for folder in sorted(graph):
        if folder not in state:
            visit(folder, [])
