"""Imports point one way (docs/architecture.md, "The layers"): read from the source, no import run.

A domain package (``ops/service``, ``ops/bench``, ``ops/gpu``) builds with ``ops/api`` and is
imported by the step families, never the other way; the runtime never imports the controller; the
torch-free shared modules import neither side. Type-only imports count: they are a dependency too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (the files, the modules they must not import, why[, the banned modules' exceptions])
RULES = [
    ("ops/service", ("ops.steps", "ops.runner", "ops.tasks"), "a domain package sits under the steps"),
    ("ops/bench", ("ops.steps", "ops.runner", "ops.tasks"), "a domain package sits under the steps"),
    ("ops/gpu", ("ops.steps", "ops.runner", "ops.tasks"), "a domain package sits under the steps"),
    ("ops/api", ("ops.steps", "ops.service", "ops.bench", "ops.gpu", "ops.runner"), "the API is below all"),
    ("ddtree_runtime", ("ops",), "the runtime never imports the controller"),
    ("ddtree_kernels", ("ddtree_runtime", "ops"), "kernels are leaves"),
    # ddtree_kernels.host (integer maths, the SM count, the quantized-rows type) is Triton-free
    (
        "ddtree_runtime/backend.py",
        ("triton", "ddtree_kernels"),
        "the PyTorch path needs no Triton",
        ("ddtree_kernels.host",),
    ),
    ("ddtree_kernels/host.py", ("triton",), "the runtime's PyTorch path imports it"),
    ("ddtree_runtime/gated_delta.py", ("triton", "ddtree_kernels"), "the PyTorch path needs no Triton"),
    ("ddtree_runtime/models", ("triton", "ddtree_kernels"), "the PyTorch path needs no Triton"),
    ("drafter_config", ("ops", "ddtree_runtime", "torch"), "the lint runs on both sides, torch-free"),
    ("specops_files", ("ops", "ddtree_runtime", "drafter_config", "torch"), "shared, standard library"),
    ("specops_contract.py", ("ops", "ddtree_runtime", "torch"), "the shared names, torch-free"),
]


def imported(path: Path) -> set[str]:
    """Every module a file imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def sources(where: str) -> list[Path]:
    path = ROOT / where
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def _under(module: str, names: tuple[str, ...]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


@pytest.mark.parametrize("rule", RULES, ids=[r[0] for r in RULES])
def test_imports_point_one_way(rule: tuple) -> None:
    where, banned, why, *rest = rule
    allowed = rest[0] if rest else ()
    files = sources(where)
    assert files, f"{where}: no Python files (the rule names a folder that moved)"
    wrong = []
    for path in files:
        hits = {m for m in imported(path) if _under(m, banned) and not _under(m, allowed)}
        outermost = sorted(m for m in hits if m.rpartition(".")[0] not in hits)
        wrong += [f"{path.relative_to(ROOT)} imports {m}" for m in outermost]
    assert not wrong, f"{why}:\n" + "\n".join(wrong)


def test_no_script_imports_a_test_module() -> None:
    """Benchmarks may use the test harness (``tests/sshd.py``, helpers), never a test module."""
    wrong = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sources("benchmarks")
        for module in sorted(imported(path))
        if module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert not wrong, "\n".join(wrong)


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ops.steps.base import Step\n"
        "from ops import runner\n"
    )
    assert {"ops.steps.base", "ops.runner"} <= imported(tmp_path / "m.py")
