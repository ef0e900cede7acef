"""Suite-wide hooks: the C++ SDK's builds run in the background, its tests last.

The C++ tests need minutes of compiling (four configurations of sdk_cpp and
the example programs). Once the suite is collected, the builds they need start
at the lowest priority (tests/cpp/background_build.py) and the C++ tests are
moved to the end, so the compiler uses the CPU the Python tests leave idle.
"""

from __future__ import annotations

import pytest

from tests.cpp import background_build


def _cpp_configs(item: pytest.Item) -> set[str]:
    configs = {mark.args[0] for mark in item.iter_markers("cpp_build")}
    if "examples" in getattr(item, "fixturenames", ()):
        configs.add("examples")
    return configs


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    cpp = [item for item in items if _cpp_configs(item)]
    if not cpp:
        return
    chosen = set(map(id, cpp))
    items[:] = [item for item in items if id(item) not in chosen] + cpp
    if not config.option.collectonly:
        background_build.start(sorted(set().union(*map(_cpp_configs, cpp))))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    background_build.stop()
