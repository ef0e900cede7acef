"""The background builder yields the CPU to the tests: nice 19, in the suite's own session."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.cpp.background_build import spawn_low_priority


def test_the_builder_is_niced_in_the_suites_session_and_its_own_process_group() -> None:
    probe = "import json, os; print(json.dumps([os.getsid(0), os.getpgid(0), os.getpid(), os.nice(0)]))"
    child = spawn_low_priority([sys.executable, "-c", probe], stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=60)
    sid, pgid, pid, nice = json.loads(out)
    # A new session would be a new autogroup: its nice value would no longer lower its share.
    assert sid == os.getsid(0)
    assert pgid == pid != os.getpgid(0)
    assert nice == min(19, os.nice(0) + 19)
