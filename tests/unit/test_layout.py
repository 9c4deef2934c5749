"""The package boundaries the layout promises, checked: a new import across one fails here."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import rollout.engine.scheduling

ROOT = Path(__file__).resolve().parents[2]


def _modules_loaded_by(statement: str) -> set[str]:
    """Top-level packages in sys.modules after running `statement` in a fresh interpreter."""
    code = f"import sys; {statement}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


def test_the_scheduling_part_imports_no_torch() -> None:
    names = [
        f"rollout.engine.scheduling.{m.name}"
        for m in pkgutil.iter_modules(rollout.engine.scheduling.__path__)
    ]
    assert "rollout.engine.scheduling.scheduler" in names
    loaded = _modules_loaded_by("; ".join(f"import {n}" for n in names))
    assert "torch" not in loaded, "the host-only scheduling part must stay free of torch"
    assert "rollout" in loaded


def test_the_engine_imports_no_ray_trl_or_wandb() -> None:
    loaded = _modules_loaded_by("import rollout.engine.llm_engine, rollout.actors.worker")
    assert "torch" in loaded
    assert not loaded & {"ray", "trl", "wandb", "datasets"}, loaded & {"ray", "trl", "wandb"}


def _rollout_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rollout"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("rollout"))
    return found


def test_the_kernels_depend_on_nothing_in_the_engine() -> None:
    kernels = sorted((ROOT / "rollout" / "kernels").glob("*.py"))
    assert len(kernels) > 5
    for path in kernels:
        engine = {m for m in _rollout_imports(path) if m.startswith("rollout.engine")}
        assert not engine, f"{path.name} imports {engine}: kernels sit below the engine"


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


# The engine's parts behind LLMEngine: read through stats(), changed through its methods.
_ENGINE_PARTS = {"_scheduler", "_block_manager", "_runner", "_step_loop"}


def test_nothing_outside_the_engine_reaches_into_it() -> None:
    """Code outside rollout/engine/ uses LLMEngine's public interface; tests and benchmarks that
    look inside a step go through the one debug accessor, which serving code never uses."""
    engine_dir = ROOT / "rollout" / "engine"
    outside = [
        p
        for p in _python_files("rollout", "trainers", "scripts", "benchmarks", "tests", "examples")
        if engine_dir not in p.parents
    ]
    assert len(outside) > 50
    reach_ins, debug_uses = [], []
    for path in outside:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in _ENGINE_PARTS
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                reach_ins.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Attribute) and node.attr == "debug_internals":
                debug_uses.append(path.relative_to(ROOT).parts[0])
    assert not reach_ins, f"reaches into the engine's parts (use stats() or a method): {reach_ins}"
    assert set(debug_uses) <= {"tests", "benchmarks"}, (
        "only tests and benchmarks may use LLMEngine.debug_internals()"
    )


def test_weight_sync_is_transport_only() -> None:
    """rollout/weight_sync moves tensors over a process group: no Ray, no actors, no trainer."""
    files = _python_files("rollout/weight_sync")
    assert len(files) > 4
    for path in files:
        imported = _rollout_imports(path) | _imports(path)
        assert not {m for m in imported if m.split(".")[0] in ("ray", "trainers")}, path.name
        assert not {m for m in imported if m.startswith("rollout.actors")}, path.name


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_time_edges(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports when it is imported (its top-level statements; not
    the imports inside functions or under TYPE_CHECKING). `from package import name` counts as
    importing the package, and the module `package.name` too when there is one."""
    edges = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        statements = [node] if isinstance(node, ast.Import | ast.ImportFrom) else []
        for statement in statements:
            if isinstance(statement, ast.Import):
                edges.update(a.name for a in statement.names)
            elif statement.module and statement.level == 0:
                edges.add(statement.module)
                edges.update(f"{statement.module}.{a.name}" for a in statement.names)
    return edges & modules


def test_no_import_circle() -> None:
    files = _python_files("rollout", "trainers")
    modules = {_module_name(p): p for p in files}
    graph = {
        name: _import_time_edges(path, set(modules)) - {name} for name, path in modules.items()
    }
    # A package's __init__ importing its own modules is how packages work: only its own edges
    # into the package are left out, so a circle through the package from outside still shows.
    graph = {
        name: {m for m in edges if not (modules[name].name == "__init__.py" and m.startswith(name))}
        for name, edges in graph.items()
    }
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for nxt in sorted(graph[name]):
            if state.get(nxt) == "open":
                cycle = path[path.index(nxt) :] + [nxt] if nxt in path else [name, nxt]
                raise AssertionError(f"import circle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def _imports_trl(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if any(name == "trl" or name.startswith("trl.") for name in names):
            return True
    return False


def test_only_the_trl_adapter_imports_trl() -> None:
    adapter = ROOT / "trainers" / "trl_adapter"
    assert any(_imports_trl(path) for path in adapter.glob("*.py"))
    sources = [
        path
        for folder in ("rollout", "trainers", "scripts", "examples")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if adapter not in path.parents
    ]
    assert len(sources) > 20
    outside = [str(p.relative_to(ROOT)) for p in sources if _imports_trl(p)]
    assert not outside, f"{outside} import trl: TRL belongs in trainers/trl_adapter/"
