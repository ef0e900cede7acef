"""demonstrations.json (protocol 1.6 §18): demonstration files read back by the server's reader, and
written by the Python SDK's DemoWriter (the C++ and C# SDKs run the ``write`` cases too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.protocol.demonstrations import DemonstrationError, parse_demonstrations
from tether.protocol.multi_agent import ModuleSpec
from tether.protocol.spaces import space_from_json
from tether.sdk.demonstrations import DemoWriter

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "conformance" / "demonstrations.json").read_text())["cases"]


def _kind(kind: str) -> list[dict]:
    return [c for c in VECTORS if c["kind"] == kind]


@pytest.mark.parametrize("case", _kind("read"), ids=lambda c: c["name"])
def test_read(case: dict) -> None:
    text = "\n".join(case["lines"]) + ("" if case.get("no_final_newline") or not case["lines"] else "\n")
    if "error_line" in case:
        with pytest.raises(DemonstrationError) as info:
            parse_demonstrations(text)
        assert info.value.line == case["error_line"], str(info.value)
        assert str(info.value).startswith(f"line {case['error_line']}: ")
        return
    demos = parse_demonstrations(text)
    assert len(demos.episodes) == case["episodes"]
    for module, steps in case["steps"].items():
        assert demos.steps(module) == steps


@pytest.mark.parametrize("case", _kind("write"), ids=lambda c: c["name"])
def test_write(case: dict, tmp_path: Path) -> None:
    modules = {m: ModuleSpec.from_json(m, spec) for m, spec in case["modules"].items()}
    path = tmp_path / "demos.jsonl"
    with DemoWriter(path, modules) as writer:
        for episode in case["episodes"]:
            agent = episode.get("agent_id", "default_agent")
            for obs, action, reward, logged in episode["steps"]:
                writer.step(episode["episode_id"], agent, "default_policy", obs, action, logged)
                writer.add_reward(episode["episode_id"], agent, reward)
            if episode["final_obs"] is not None:  # (null: still running when the writer closes)
                writer.end(episode["episode_id"], agent, episode["final_obs"], episode["terminated"])
    text = path.read_text()
    assert text.endswith("\n") and "\n\n" not in text
    written = [json.loads(line) for line in text.splitlines()]
    assert written[1:] == case["lines"][1:]
    # The header: its spaces as spaces (a space has more than one valid JSON form, §8.4).
    head, want = written[0], case["lines"][0]
    assert (head["format"], head["version"], sorted(head["modules"])) == (want["format"], want["version"],
                                                                            sorted(want["modules"]))
    for module, spec in want["modules"].items():
        for key in ("observation_space", "action_space"):
            assert space_from_json(head["modules"][module][key]).to_json() == space_from_json(spec[key]).to_json()
    assert len(parse_demonstrations(text).episodes) == len(case["lines"]) - 1  # (and the reader takes it back)


def test_close_writes_running_episodes_truncated(tmp_path: Path) -> None:
    """§18: an episode still running at close ends at its latest step's observation, that step left out;
    one with a single step is not written."""
    modules = {m: ModuleSpec.from_json(m, spec) for m, spec in _kind("write")[0]["modules"].items()}
    path = tmp_path / "demos.jsonl"
    writer = DemoWriter(path, modules)
    for t in range(3):
        writer.step("long", "default_agent", "default_policy", [t / 4, 0.0], t % 2, logged=t == 1)
        writer.add_reward("long", "default_agent", 1.0)
    writer.step("short", "default_agent", "default_policy", [0.0, 0.0], 1)
    writer.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    assert lines[1]["obs"] == [[0.0, 0.0], [0.25, 0.0], [0.5, 0.0]] and lines[1]["actions"] == [0, 1]
    assert lines[1]["is_truncated"] and not lines[1]["is_terminated"] and lines[1]["logged_runs"] == [[1, 1]]
