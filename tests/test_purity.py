"""The one dependency rule (DESIGN section 2): the scheduler core stays pure."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1] / "helios" / "scheduler"
FORBIDDEN = {"torch", "asyncio", "time", "helios.engine", "helios.server", "helios.sim", "threading", "datetime"}


def test_scheduler_source_imports_nothing_forbidden():
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), (path, name)


def test_importing_the_scheduler_loads_no_torch_or_asyncio():
    code = ("import sys, helios.scheduler; "
            "bad = [m for m in ('torch', 'asyncio', 'helios.engine', 'helios.server', 'helios.sim') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
