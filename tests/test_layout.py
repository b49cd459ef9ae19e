"""The layout's rules, read from the source: imports point one way and never go round."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "serving", "worker", "training", "models", "core", "cli", "client")
# Who may import whom (DESIGN: api and worker use core, training and models; serving, the
# prediction runtime, sits below api and beside worker; training uses models; models uses
# only torch; the command line sits above all of them but api and serving; the Python
# client stands alone, so that it installs without the server's packages; the server takes
# the words of the wire from the client's light modules, `SHARED`, and nothing else of it).
ALLOWED = {
    "models": {"models"},
    "training": {"training", "models"},
    "core": {"core", "client", "training", "models"},
    "worker": {"worker", "core", "training", "models"},
    "serving": {"serving", "core", "training", "models"},
    "api": {"api", "serving", "core", "client", "training", "models"},
    "cli": {"cli", "client", "worker", "core", "training", "models"},
    "client": {"client"},
}
# The client's modules that import nothing of the client's transport: what the service and
# its client declare once for both (client.wire's words, client.filters' job filter).
SHARED = {"client.wire", "client.filters"}


def _modules() -> dict[str, Path]:
    """Every product module by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _package(name: str, path: Path) -> str:
    """The package a module's relative imports start from."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(tree: ast.AST, package: str, *, top_level_only: bool) -> Iterator[str]:
    """The dotted names a module imports (relative imports resolved against `package`)."""
    nodes = ast.iter_child_nodes(tree) if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _graph(*, top_level_only: bool = True) -> dict[str, set[str]]:
    """Imports between product modules: module-level ones, or also those inside functions."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        imported = set(_imports(tree, _package(name, path), top_level_only=top_level_only))
        graph[name] = {target for target in imported if target in modules and target != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_product_module_imports_round_in_a_cycle() -> None:
    assert _cycles(_graph()) == []


def test_no_import_inside_a_function_goes_round_either() -> None:
    assert _cycles(_graph(top_level_only=False)) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def _every_import() -> Iterator[tuple[str, str]]:
    """Each product module and each dotted name it imports, anywhere in it."""
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        for target in sorted(set(_imports(tree, _package(name, path), top_level_only=False))):
            yield name, target


def _shared(target: str) -> bool:
    return any(target == module or target.startswith(f"{module}.") for module in SHARED)


def test_imports_point_one_way_between_packages() -> None:
    wrong = [
        f"{name} imports {target}"
        for name, target in _every_import()
        if target.split(".")[0] in PACKAGES
        and target.split(".")[0] not in ALLOWED[name.split(".")[0]]
    ]
    assert sorted(wrong) == []


def test_the_server_takes_from_the_client_only_its_shared_declarations() -> None:
    wrong = [
        f"{name} imports {target}"
        for name, target in _every_import()
        if name.split(".")[0] in ("api", "core")
        and target.split(".")[0] == "client"
        and not _shared(target)
    ]
    assert sorted(wrong) == []


def test_the_shared_declarations_import_nothing_of_the_product() -> None:
    wrong = [
        f"{name} imports {target}"
        for name, target in _every_import()
        if name in SHARED and target.split(".")[0] in PACKAGES and not _shared(target)
    ]
    assert sorted(wrong) == []


def _layout_words() -> set[str]:
    """The words of the README's Layout block."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("```")[1]
    return set(re.findall(r"[A-Za-z_]\w*", block))


def test_the_readme_layout_names_every_product_module() -> None:
    words = _layout_words()
    unnamed = sorted(
        str(path.relative_to(ROOT))
        for name, path in _modules().items()
        if name.rpartition(".")[2] not in words
    )
    assert not unnamed, f"the README's Layout does not name: {unnamed}"


def test_the_readme_layout_has_a_line_for_each_folder_that_exists() -> None:
    block = (ROOT / "README.md").read_text(encoding="utf-8").split("## Layout", 1)[1]
    folders = re.findall(r"^(\w+)/ ", block.split("```")[1], flags=re.MULTILINE)
    assert set(PACKAGES) <= set(folders), "every product package has its line"
    assert [folder for folder in folders if not (ROOT / folder).is_dir()] == []
