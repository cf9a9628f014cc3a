"""The package's architecture as a test: rooms from top to bottom, imports only go down.

Every module under `ray_resilience/` is parsed with `ast`; an import inside a function counts, an
import under `if TYPE_CHECKING:` does not. The test fails on an import circle between modules,
on a module that imports from a room above its own, on a module that is in no room, and on a
package folder of more than `MAX_MODULES_PER_FOLDER` modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "ray_resilience"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
MAX_MODULES_PER_FOLDER = 12

ROOMS: list[tuple[str, tuple[str, ...]]] = [
    ("What users and operators call: the package's names, the CLI, manifest checks, examples.",
     (PACKAGE, f"{PACKAGE}.__main__", f"{PACKAGE}.cli", f"{PACKAGE}.deploy",
      f"{PACKAGE}.examples")),
    ("The driver: ResilientTrainer.fit, its live display, the run folder's artifacts, Ray Train "
     "interop.",
     (f"{PACKAGE}.trainer", f"{PACKAGE}._internal.run_folder", f"{PACKAGE}._internal.display",
      f"{PACKAGE}._internal.ray_train", f"{PACKAGE}._internal.ray_train_error",
      f"{PACKAGE}._internal.pickle_check")),
    ("The supervisor actor: the run's state machine, detection, repair, metrics, preemption.",
     (f"{PACKAGE}._internal.supervisor", f"{PACKAGE}._internal.preemption")),
    ("The rank actors in their placement group: create, replace, prestart processes.",
     (f"{PACKAGE}._internal.worker_group",)),
    ("The control plane's message path: per-node agents batch heartbeats; the metrics log.",
     (f"{PACKAGE}._internal.control",)),
    ("One rank's process: runs the train function in a thread, answers control calls.",
     (f"{PACKAGE}._internal.rank",)),
    ("What the train function calls: get_context, report, load_checkpoint.",
     (f"{PACKAGE}.context",)),
    ("Ray Data: the run's datasets materialized once, each rank's slice and its position.",
     (f"{PACKAGE}._internal.data",)),
    ("Checkpoints on the rank: snapshot, hand-off to a writer, local tier, load.",
     (f"{PACKAGE}._internal.checkpoint.rank",)),
    ("Checkpoint service actors: the commit coordinator and the writers.",
     (f"{PACKAGE}._internal.checkpoint.service",)),
    ("The checkpoint format in storage, and the messages and shared memory between ranks and "
     "writers.",
     (f"{PACKAGE}._internal.checkpoint.format", f"{PACKAGE}._internal.checkpoint.wire",
      f"{PACKAGE}._internal.checkpoint.shm")),
    ("torch.distributed process groups: abort blocked collectives, tear down, collect.",
     (f"{PACKAGE}._internal.process_groups",)),
    ("Goodput: the run timeline and what it is worth.", (f"{PACKAGE}.goodput",)),
    ("User settings and results: configs, timeouts, checkpoint settings, Result, callbacks.",
     (f"{PACKAGE}.config", f"{PACKAGE}.restart_config", f"{PACKAGE}.checkpoint",
      f"{PACKAGE}.timeouts", f"{PACKAGE}.result", f"{PACKAGE}.callbacks")),
    ("Fault injection for tests and benchmarks (a fault plan is a setting, so below them).",
     (f"{PACKAGE}.testing",)),
    ("Recovery policy: the frozen RecoveryState in, a Decision out; the ladder and its parts.",
     (f"{PACKAGE}.policy",)),
    ("Leaves every room may use: typed errors, config field checks, small shared helpers.",
     (f"{PACKAGE}.errors", f"{PACKAGE}._validate", f"{PACKAGE}._internal.constants",
      f"{PACKAGE}._internal.lazy", f"{PACKAGE}._internal.priority",
      f"{PACKAGE}._internal.attempt", f"{PACKAGE}._internal.calls")),
]
"""Top to bottom. A module belongs to the room of its longest matching name; it may import
from its own room and the rooms below."""

ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
"""Known upward imports, each with the reason it is still there. A stale entry fails too."""

NAMESPACE_PACKAGES = {f"{PACKAGE}._internal", f"{PACKAGE}._internal.checkpoint"}
"""Folders that only hold rooms; their empty `__init__` needs no room of its own."""


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(tree: ast.AST, package: str) -> set[tuple[str, str]]:
    """(module, name) pairs a module imports (`import a.b` gives ("a.b", "")), at any depth,
    except under `if TYPE_CHECKING:`. `package` is the one relative imports start from."""
    found: set[tuple[str, str]] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            found.update((base, alias.name) for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for module, attr in _imported_names(ast.parse(path.read_text()), package):
            target = f"{module}.{attr}" if f"{module}.{attr}" in files else module
            while target and target not in files:  # `import a.b.name` of a non-module name
                target = target.rpartition(".")[0]
            if target:
                targets.add(target)
        graph[name] = targets - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def room_of(module: str, rooms: list[tuple[str, tuple[str, ...]]] = ROOMS) -> int | None:
    """Index of the room whose longest name matches `module` (the top package only exactly)."""
    best, best_len = None, -1
    for i, (_, names) in enumerate(rooms):
        for name in names:
            hit = module == name or (name != PACKAGE and module.startswith(name + "."))
            if hit and len(name) > best_len:
                best, best_len = i, len(name)
    return best


def layering_problems(graph: dict[str, set[str]], rooms=ROOMS,
                      allowed: Iterable[tuple[str, str]] = ALLOWED_UPWARD) -> list[str]:
    allowed = set(allowed)
    problems = []
    for module in sorted(graph):
        here = room_of(module, rooms)
        if here is None:
            if module not in NAMESPACE_PACKAGES or graph[module]:
                problems.append(f"{module} is in no room: add it to ROOMS")
            continue
        for target in sorted(graph[module]):
            there = room_of(target, rooms)
            if there is not None and there < here and (module, target) not in allowed:
                problems.append(f"{module} (room {here}) imports {target} from room {there} above")
    for module, target in sorted(allowed):
        if target not in graph.get(module, ()):
            problems.append(f"ALLOWED_UPWARD lists {module} -> {target}, which is gone: drop it")
    return problems


def crowded_folders(root: Path = ROOT, limit: int = MAX_MODULES_PER_FOLDER) -> dict[str, int]:
    counts = {str(folder.relative_to(root.parent)): len([p for p in folder.glob("*.py")
                                                         if p.name != "__init__.py"])
              for folder in [root, *root.rglob("*")] if folder.is_dir()}
    return {folder: n for folder, n in counts.items() if n > limit}


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_only_go_down_the_rooms():
    problems = layering_problems(import_graph())
    assert not problems, "\n".join(problems)


def test_no_folder_holds_more_than_twelve_modules():
    assert crowded_folders() == {}


def test_test_modules_share_helpers_only_through_tests_support():
    tests = ROOT.parent / "tests"
    borrowed = [f"{path.relative_to(tests.parent)} imports {module}"
                for path in tests.rglob("*.py")
                for module, _ in _imported_names(ast.parse(path.read_text()), "tests")
                if module.startswith("tests.") and not module.startswith("tests.support")]
    assert not borrowed, "\n".join(borrowed)


def test_the_checks_catch_a_planted_circle_and_upward_import():
    rooms = [("top", ("pkg.top",)), ("mid", ("pkg.mid",)), ("low", ("pkg.low",))]
    clean = {"pkg.top": {"pkg.mid"}, "pkg.mid": {"pkg.low"}, "pkg.low": set()}
    assert circles(clean) == [] and layering_problems(clean, rooms, allowed=()) == []
    upward = {**clean, "pkg.low": {"pkg.mid"}}
    assert layering_problems(upward, rooms, allowed=()) == [
        "pkg.low (room 2) imports pkg.mid from room 1 above"]
    circle = {**clean, "pkg.low": {"pkg.low.a"}, "pkg.low.a": {"pkg.low.b"},
              "pkg.low.b": {"pkg.low.a"}}
    assert circles(circle) == [["pkg.low.a", "pkg.low.b"]]
    assert layering_problems(clean, rooms, allowed=[("pkg.low", "pkg.top")]) == [
        "ALLOWED_UPWARD lists pkg.low -> pkg.top, which is gone: drop it"]


def test_imports_are_read_inside_functions_but_not_under_type_checking():
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    import pkg.hidden\n"
              "def f():\n    from pkg.sub import thing\n"
              "from . import sibling\n")
    names = _imported_names(ast.parse(source), "pkg")
    assert {("pkg.sub", "thing"), ("pkg", "sibling")} <= names
    assert ("pkg.hidden", "") not in names
