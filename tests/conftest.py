"""Suite-wide hooks: the C++ SDK's builds run in the background, its tests last.

The C++ tests need minutes of compiling (four configurations of sdk_cpp and
the example programs). Once the suite is collected, the builds they need start
at the lowest priority (tests/cpp/background_build.py) and the C++ tests are
moved to the end, so the compiler uses the CPU the Python tests leave idle.
"""

from __future__ import annotations

import sys

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


@pytest.fixture(autouse=True)
def _one_torch_thread() -> None:
    """Learners built in this process run on one CPU thread, as the server runs its own
    (ServerConfig.torch_threads, default 1). With torch's default, a thread per core, every
    small step is handed between threads, and with anything else busy on the machine (a
    server and a client process, the C++ builds started above) each hand-off waits: the
    centralized-critic test took 45 s in the suite and 53 s on a busy machine, 3-5 s on one
    thread (an in-process Trainer sets one thread too, so tests after one were fast anyway).
    Nothing is imported here: a test module that uses torch imported it at collection."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)
