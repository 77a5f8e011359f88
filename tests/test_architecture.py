"""The floor plan, enforced: which package may import which and no import cycles (import-linter,
with the contracts in setup.cfg), and every package of models saying what it may import."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lint_imports(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--no-logo", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_the_imports_keep_the_floor_plan():
    """setup.cfg's contracts: config < models < tasks < web; models' packages by layer
    (security, the foundation, speech and jobs, the model registry, access, delivery, pipeline
    and maintenance, runtime); no import cycle among the siblings of any package of models."""
    run = lint_imports()
    assert run.returncode == 0, run.stdout + run.stderr
    assert ", 0 broken" in run.stdout


def test_a_forbidden_import_direction_is_caught(tmp_path):
    """The check can fail: a contract that the tree breaks (speech decodes sealed files, so it
    imports security) is reported with the import that breaks it."""
    config = tmp_path / "contracts.ini"
    config.write_text(
        "[importlinter]\nroot_packages =\n    models\n\n[importlinter:contract:probe]\n"
        "name = speech never imports security\ntype = forbidden\nsource_modules = models.speech\n"
        "forbidden_modules = models.security\n"
    )
    run = lint_imports(str(config))
    assert run.returncode == 1 and "BROKEN" in run.stdout
    assert "models.speech.audio -> models.security.crypto" in run.stdout


def test_an_import_cycle_between_packages_is_caught(tmp_path):
    package = tmp_path / "plan"
    for name, body in {
        "__init__": "",
        "low/__init__": "",
        "low/a": "from plan.high import b\n",
        "high/__init__": "",
        "high/b": "from plan.low import a\n",
    }.items():
        (package / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (package / f"{name}.py").write_text(body)
    config = tmp_path / "contracts.ini"
    config.write_text(
        "[importlinter]\nroot_packages =\n    plan\n\n[importlinter:contract:cycles]\n"
        "name = no cycles\ntype = acyclic_siblings\nancestors =\n    plan\n"
    )
    run = lint_imports(str(config), cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert run.returncode == 1 and "No cycles are allowed in plan" in run.stdout, run.stdout + run.stderr


def test_every_models_package_says_what_it_may_import():
    packages = sorted(p.parent for p in (ROOT / "models").glob("*/__init__.py") if p.parent.name != "migrations")
    assert {p.name for p in packages} == {
        "security",
        "storage",
        "speech",
        "analysis",
        "registry",
        "jobs",
        "access",
        "delivery",
        "pipeline",
        "maintenance",
    }
    for package in [*packages, ROOT / "models" / "runtime.py", ROOT / "models"]:
        init = package / "__init__.py" if package.is_dir() else package
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(ROOT)} needs a docstring saying what it may import"
