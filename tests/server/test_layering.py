"""The packages depend one way: the protocol core on nothing of Tether's, the server and the Python
SDK on the protocol core, never on each other (the server runs without the client package)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Folder -> the tether packages its modules must not import.
FORBIDDEN = {"protocol": ("tether.server", "tether.sdk"), "server": ("tether.sdk",), "sdk_python": ("tether.server",)}


def imported_modules(path: Path) -> list[str]:
    """Absolute names of what a module imports (relative imports resolved within its own package)."""
    tree = ast.parse(path.read_text(), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names.append(node.module or "")
            elif node.module and node.module.split(".")[0] in ("sdk", "sdk_python"):
                names.append("tether.sdk")  # (a relative import that leaves the server's package)
    return names


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_module_imports_a_package_it_must_not(folder: str) -> None:
    wrong = [f"{path.relative_to(REPO)} imports {name}" for path in sorted((REPO / folder).rglob("*.py"))
             for name in imported_modules(path) if name.startswith(FORBIDDEN[folder])]
    assert not wrong, wrong
