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
