"""The packages depend one way: the protocol core on nothing of Tether's, the server and the Python
SDK on the protocol core, never on each other (the server runs without the client package)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Folder -> its package's name once installed (pyproject.toml's package-dir).
PACKAGES = {"protocol": "tether.protocol", "server": "tether.server", "sdk_python": "tether.sdk"}
#: Folder -> the packages its modules must not import.
FORBIDDEN = {"protocol": ("tether.server", "tether.sdk"), "server": ("tether.sdk",), "sdk_python": ("tether.server",)}


def package_of(path: Path) -> str:
    """The dotted package a module file belongs to (server/learner/ppo.py -> tether.server.learner)."""
    folder, *inner = path.relative_to(REPO).parent.parts
    return ".".join([PACKAGES[folder], *inner])


def imported_modules(path: Path) -> list[str]:
    """Absolute names of everything a module imports, anywhere in it: ``import a.b``, ``from a import
    b`` (both ``a`` and ``a.b``: b may be a module) and relative imports resolved from its package."""
    tree = ast.parse(path.read_text(), str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package_of(path).split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            names.append(source)
            names += [f"{source}.{alias.name}" for alias in node.names]
    return names


def forbidden_imports(folder: str) -> list[str]:
    return [f"{path.relative_to(REPO)} imports {name}" for path in sorted((REPO / folder).rglob("*.py"))
            for name in imported_modules(path) if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[folder])]


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_module_imports_a_package_it_must_not(folder: str) -> None:
    assert not forbidden_imports(folder)


def test_the_import_forms_are_all_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser itself: each way of importing the client package from the server is caught."""
    forms = ["import tether.sdk", "import tether.sdk.policy as p", "from tether import sdk",
             "from tether.sdk.policy import OnnxPolicy", "from ... import sdk", "from ...sdk import policy",
             "def f():\n    from tether.sdk import TetherClient"]
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    for i, form in enumerate(forms):
        module = tmp_path / "server" / "learner" / f"m{i}.py"
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(form + "\n")
    caught = forbidden_imports("server")
    assert len({line.split(" imports ")[0] for line in caught}) == len(forms), caught


def test_every_server_module_imports_without_the_client_package() -> None:
    """At run time too: with tether.sdk unimportable, every module of the server still imports."""
    program = textwrap.dedent("""
        import importlib, pkgutil, sys
        sys.modules["tether.sdk"] = None  # (any import of it now fails)
        import tether.server
        for info in pkgutil.walk_packages(tether.server.__path__, "tether.server."):
            importlib.import_module(info.name)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
