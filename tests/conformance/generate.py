"""Writes the conformance vectors in this folder.

The vectors are the executable half of docs/protocol.md: every SDK (Python,
C#, C++) loads these JSON files and must produce the expected outcome for
each case. Expected error codes are the specification's; expected log-
probabilities are computed here with torch.distributions, an implementation
independent of every SDK's own formulas.

    python tests/conformance/generate.py   # rewrites the *.json files
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent


def hexs(data: bytes) -> str:
    return data.hex()


def frame(body: str | bytes) -> bytes:
    raw = body.encode() if isinstance(body, str) else body
    return b"%08d" % len(raw) + raw


def framing_cases() -> list[dict]:
    ping = frame('{"type": "PING"}')
    return [
        {"name": "rllink_doc_ping", "input_hex": hexs(b'00000016{"type": "PING"}'), "bodies": ['{"type": "PING"}']},
        {"name": "two_frames_one_read", "input_hex": hexs(ping + frame('{"type":"GET_CONFIG"}')),
         "bodies": ['{"type": "PING"}', '{"type":"GET_CONFIG"}']},
        {"name": "partial_frame_waits", "input_hex": hexs(ping[:-3]), "bodies": []},
        {"name": "partial_header_waits", "input_hex": hexs(b"0000"), "bodies": []},
        {"name": "empty_body", "input_hex": hexs(b"00000000"), "bodies": [""]},
        {"name": "utf8_body_length_is_bytes", "input_hex": hexs(frame('{"type":"PING","client_name":"é"}')),
         "bodies": ['{"type":"PING","client_name":"é"}']},
        {"name": "header_with_letters", "input_hex": hexs(b'0000001a{"type": "PING"}'), "error": "BAD_HEADER"},
        {"name": "header_with_space_padding", "input_hex": hexs(b'      16{"type": "PING"}'), "error": "BAD_HEADER"},
        {"name": "header_with_sign", "input_hex": hexs(b'+0000016{"type": "PING"}'), "error": "BAD_HEADER"},
        {"name": "json_without_header", "input_hex": hexs(b'{"type": "PING"}'), "error": "BAD_HEADER"},
        {"name": "over_limit", "input_hex": hexs(b"00001025" + b" " * 10), "max_frame_bytes": 1024,
         "error": "FRAME_TOO_LARGE"},
        {"name": "at_limit", "input_hex": hexs(frame(b'{"type":"PING","x":"' + b"a" * 1002 + b'"}')),
         "max_frame_bytes": 1024, "bodies": ['{"type":"PING","x":"' + "a" * 1002 + '"}']},
        {"name": "good_frame_then_bad_header", "input_hex": hexs(ping + b"xxxxxxxx"), "bodies_before_error": ['{"type": "PING"}'],
         "error": "BAD_HEADER"},
    ]


def message_cases() -> list[dict]:
    """Body -> decoded type, or the error code a receiver reports."""
    ok = lambda name, body, t: {"name": name, "body_hex": hexs(body.encode()), "type": t}  # noqa: E731
    err = lambda name, body, code: {"name": name, "body_hex": hexs(body), "error": code}  # noqa: E731
    return [
        ok("ping", '{"type": "PING"}', "PING"),
        ok("ping_v11", '{"type": "PING", "protocol_version": "1.1", "client_name": "unity"}', "PING"),
        ok("get_config", '{"type": "GET_CONFIG"}', "GET_CONFIG"),
        ok("get_state", '{"type": "GET_STATE", "weights_seq_no": 3}', "GET_STATE"),
        ok("episodes", '{"type": "EPISODES", "episodes": []}', "EPISODES"),
        ok("episodes_and_get_state", '{"type": "EPISODES_AND_GET_STATE", "episodes": [], "timesteps": 0}',
           "EPISODES_AND_GET_STATE"),
        ok("pong", '{"type": "PONG"}', "PONG"),
        ok("set_config", '{"type": "SET_CONFIG", "env_steps_per_sample": 500, "force_on_policy": true}', "SET_CONFIG"),
        ok("set_state", '{"type": "SET_STATE", "weights_seq_no": 1, "onnx_file": ""}', "SET_STATE"),
        ok("error", '{"type": "ERROR", "code": "INVALID_JSON", "message": "x"}', "ERROR"),
        ok("unknown_fields_ignored", '{"type": "PING", "future_field": [1, 2]}', "PING"),
        err("invalid_utf8", b'{"type": "PING", "client_name": "\xff\xfe"}', "INVALID_UTF8"),
        err("invalid_json", b'{"type": "PING"', "INVALID_JSON"),
        err("empty_body", b"", "INVALID_JSON"),
        err("array_body", b'[{"type": "PING"}]', "NOT_AN_OBJECT"),
        err("string_body", b'"PING"', "NOT_AN_OBJECT"),
        err("missing_type", b'{"episodes": []}', "MISSING_TYPE"),
        err("unknown_type", b'{"type": "FLY"}', "UNKNOWN_TYPE"),
        err("type_not_string", b'{"type": 7}', "UNKNOWN_TYPE"),
        err("type_wrong_case", b'{"type": "ping"}', "UNKNOWN_TYPE"),
    ]


def space_cases() -> list[dict]:
    """Space JSON -> canonical JSON (as the Python core writes it back), or an error."""
    return [
        {"name": "cartpole_obs", "space": {"type": "Box", "shape": [4], "dtype": "float32",
                                           "low": [-4.8, "-inf", -0.418, "-inf"], "high": [4.8, "inf", 0.418, "inf"]},
         "shape": [4], "dist_inputs_size": 8},
        {"name": "box_scalar_bounds", "space": {"type": "Box", "shape": [2, 3], "low": -1, "high": 1},
         "shape": [2, 3], "dist_inputs_size": 12},
        {"name": "box_unbounded_default", "space": {"type": "Box", "shape": [3]}, "shape": [3], "dist_inputs_size": 6},
        {"name": "discrete", "space": {"type": "Discrete", "n": 2}, "shape": [], "dist_inputs_size": 2},
        {"name": "discrete_start", "space": {"type": "Discrete", "n": 3, "start": -1}, "shape": [], "dist_inputs_size": 3},
        {"name": "multidiscrete", "space": {"type": "MultiDiscrete", "nvec": [3, 2, 4]}, "shape": [3],
         "dist_inputs_size": 9},
        {"name": "unknown_type", "space": {"type": "Graph"}, "error": "INVALID_FIELD"},
        {"name": "not_an_object", "space": [4], "error": "INVALID_FIELD"},
        {"name": "discrete_zero", "space": {"type": "Discrete", "n": 0}, "error": "INVALID_FIELD"},
        {"name": "discrete_float", "space": {"type": "Discrete", "n": 2.5}, "error": "INVALID_FIELD"},
        {"name": "box_missing_shape", "space": {"type": "Box", "low": 0, "high": 1}, "error": "INVALID_FIELD"},
        {"name": "box_low_above_high", "space": {"type": "Box", "shape": [1], "low": 2, "high": 1}, "error": "INVALID_FIELD"},
        {"name": "box_bound_wrong_length", "space": {"type": "Box", "shape": [2], "low": [0, 0, 0], "high": 1},
         "error": "INVALID_FIELD"},
        {"name": "box_bound_not_number", "space": {"type": "Box", "shape": [1], "low": "zero", "high": 1},
         "error": "INVALID_FIELD"},
        {"name": "multidiscrete_empty", "space": {"type": "MultiDiscrete", "nvec": []}, "error": "INVALID_FIELD"},
    ]


CARTPOLE_OBS = {"type": "Box", "shape": [4], "low": "-inf", "high": "inf"}
DISCRETE2 = {"type": "Discrete", "n": 2}


def good_episode(steps: int = 3, **overrides: object) -> dict:
    ep = {
        "obs": [[0.01 * i, 0.0, -0.02, 0.1] for i in range(steps + 1)],
        "actions": [i % 2 for i in range(steps)],
        "rewards": [1.0] * steps,
        "action_logp": [-0.69] * steps,
        "action_dist_inputs": [[0.1, -0.1]] * steps,
        "is_terminated": False,
        "is_truncated": False,
    }
    ep.update(overrides)
    return ep


def episode_cases() -> list[dict]:
    """An EPISODES message body (as JSON text, so non-finite tokens can be written)
    checked against spaces; -> accepted env_steps, or the error code."""

    def case(name: str, episodes: list, *, code: str | None = None, steps: int | None = None,
             obs=CARTPOLE_OBS, act=DISCRETE2, require_logp: bool = True, raw: str | None = None) -> dict:
        body = raw if raw is not None else json.dumps({"type": "EPISODES_AND_GET_STATE", "episodes": episodes})
        out = {"name": name, "observation_space": obs, "action_space": act, "require_logp": require_logp,
               "body": body}
        if code:
            out["error"] = code
        else:
            out["env_steps"] = steps
        return out

    nan_obs = json.dumps({"type": "EPISODES", "episodes": [good_episode()]}).replace("-0.02", "NaN", 1)
    inf_reward = json.dumps({"type": "EPISODES", "episodes": [good_episode()]}).replace(
        '"rewards": [1.0', '"rewards": [Infinity', 1)
    return [
        case("one_chunk", [good_episode(3)], steps=3),
        case("rllib_v1_shape_two_chunks", [good_episode(2, is_terminated=True), good_episode(4)], steps=6),
        case("terminated_and_truncated_chunks", [good_episode(1, is_terminated=True), good_episode(1, is_truncated=True)],
             steps=2),
        case("with_episode_id", [good_episode(2, episode_id="e-17")], steps=2),
        case("no_dist_inputs_ok", [{k: v for k, v in good_episode(2).items() if k != "action_dist_inputs"}], steps=2),
        case("no_logp_off_policy_ok", [{k: v for k, v in good_episode(2).items() if k != "action_logp"}], steps=2,
             require_logp=False),
        case("box_actions", [good_episode(2, actions=[[0.5, -1.0], [1.0, 0.0]],
                                          action_dist_inputs=[[0, 0, 0, 0]] * 2)], steps=2,
             act={"type": "Box", "shape": [2], "low": -1, "high": 1}),
        case("multidiscrete_actions", [good_episode(2, actions=[[2, 0], [0, 1]], action_dist_inputs=[[0] * 5] * 2)],
             steps=2, act={"type": "MultiDiscrete", "nvec": [3, 2]}),
        case("empty_list_ok", [], steps=0),
        case("obs_not_one_longer", [good_episode(3, obs=[[0, 0, 0, 0]] * 3)], code="EPISODE_LENGTH_MISMATCH"),
        case("rewards_short", [good_episode(3, rewards=[1.0, 1.0])], code="EPISODE_LENGTH_MISMATCH"),
        case("logp_short", [good_episode(3, action_logp=[-0.1])], code="EPISODE_LENGTH_MISMATCH"),
        case("dist_inputs_wrong_width", [good_episode(2, action_dist_inputs=[[0.0, 0.0, 0.0]] * 2)],
             code="EPISODE_LENGTH_MISMATCH"),
        case("zero_steps", [good_episode(0)], code="EPISODE_LENGTH_MISMATCH"),
        case("obs_wrong_shape", [good_episode(2, obs=[[0, 0, 0]] * 3)], code="OBS_SHAPE_MISMATCH"),
        case("obs_ragged", [good_episode(2, obs=[[0, 0, 0, 0], [0, 0, 0], [0, 0, 0, 0]])], code="OBS_SHAPE_MISMATCH"),
        case("obs_nan", [], code="NON_FINITE_VALUE", raw=nan_obs),
        case("reward_infinite", [], code="NON_FINITE_VALUE", raw=inf_reward),
        case("action_out_of_range", [good_episode(2, actions=[0, 2])], code="ACTION_OUT_OF_SPACE"),
        case("action_negative", [good_episode(2, actions=[-1, 0])], code="ACTION_OUT_OF_SPACE"),
        case("action_not_integer", [good_episode(2, actions=[0.5, 1])], code="ACTION_OUT_OF_SPACE"),
        # 1.3: a Box action is the raw Gaussian sample; outside the bounds is valid, non-finite is not.
        case("box_action_raw_sample_outside_bounds", [good_episode(1, actions=[[1.5, 0.0]], action_dist_inputs=[[0, 0, 0, 0]])], steps=1,
             act={"type": "Box", "shape": [2], "low": -1, "high": 1}),
        case("box_action_wrong_shape", [good_episode(1, actions=[[0.5]], action_dist_inputs=[[0, 0, 0, 0]])],
             code="ACTION_OUT_OF_SPACE", act={"type": "Box", "shape": [2], "low": -1, "high": 1}),
        case("missing_logp_on_policy", [{k: v for k, v in good_episode(2).items() if k != "action_logp"}],
             code="MISSING_ACTION_LOGP"),
        case("missing_obs", [{k: v for k, v in good_episode(2).items() if k != "obs"}], code="INVALID_FIELD"),
        case("flag_not_bool", [good_episode(2, is_terminated="no")], code="INVALID_FIELD"),
        case("rewards_not_numbers", [good_episode(2, rewards=["a", "b"])], code="INVALID_FIELD"),
        case("episodes_not_list", [], code="INVALID_FIELD", raw='{"type": "EPISODES", "episodes": {"obs": []}}'),
        case("second_chunk_bad_stores_nothing", [good_episode(2), good_episode(2, actions=[0, 5])],
             code="ACTION_OUT_OF_SPACE"),
    ]


def logp_cases() -> list[dict]:
    """(space, dist_inputs, action) -> log-probability, computed with torch.distributions."""
    import torch
    from torch.distributions import Categorical, Normal

    cases = []

    def categorical(logits: list[float], action: int) -> float:
        return float(Categorical(logits=torch.tensor(logits, dtype=torch.float64)).log_prob(torch.tensor(action)))

    for name, logits, action in [
        ("discrete2_uniform", [0.0, 0.0], 1),
        ("discrete2_rllib_client", [0.3, -1.2], 0),
        ("discrete4", [1.5, -0.5, 0.25, 3.0], 2),
        ("discrete_large_logits", [1000.0, 999.0, -1000.0], 1),
    ]:
        cases.append({"name": name, "space": {"type": "Discrete", "n": len(logits)}, "dist_inputs": logits,
                      "action": action, "logp": categorical(logits, action)})
    cases.append({"name": "discrete_with_start", "space": {"type": "Discrete", "n": 3, "start": 5},
                  "dist_inputs": [0.1, 0.2, 0.3], "action": 6, "logp": categorical([0.1, 0.2, 0.3], 1)})
    md_inputs = [0.5, -0.5, 1.0, 2.0, -2.0]
    cases.append({"name": "multidiscrete_3_2", "space": {"type": "MultiDiscrete", "nvec": [3, 2]},
                  "dist_inputs": md_inputs, "action": [2, 0],
                  "logp": categorical(md_inputs[:3], 2) + categorical(md_inputs[3:], 0)})
    for name, mean, log_std, action in [
        ("box1_standard", [0.0], [0.0], [0.5]),
        ("box2", [0.2, -0.3], [-0.5, 0.1], [0.0, 0.4]),
        ("box3_narrow", [1.0, 0.0, -1.0], [-2.0, -1.0, 0.5], [0.9, 0.05, -0.2]),
    ]:
        n = Normal(torch.tensor(mean, dtype=torch.float64), torch.tensor(log_std, dtype=torch.float64).exp())
        lp = float(n.log_prob(torch.tensor(action, dtype=torch.float64)).sum())
        cases.append({"name": name, "space": {"type": "Box", "shape": [len(mean)], "low": -5, "high": 5},
                      "dist_inputs": mean + log_std, "action": action, "logp": lp})
    for c in cases:
        assert math.isfinite(c["logp"])
    return cases


def session_cases() -> list[dict]:
    """Request sequences -> the server's answers (type, or ERROR code), per server settings."""
    ping = {"type": "PING"}
    return [
        {"name": "v1_client_no_auth", "server": {}, "requests": [ping, {"type": "GET_CONFIG"}],
         "responses": ["PONG", "SET_CONFIG"]},
        {"name": "v1_client_skips_ping", "server": {}, "requests": [{"type": "GET_CONFIG"}], "responses": ["SET_CONFIG"]},
        {"name": "v11_ping", "server": {}, "requests": [{"type": "PING", "protocol_version": "1.1", "client_name": "c"}],
         "responses": ["PONG"]},
        {"name": "minor_version_newer_ok", "server": {}, "requests": [{"type": "PING", "protocol_version": "1.9"}],
         "responses": ["PONG"]},
        {"name": "major_version_mismatch", "server": {}, "requests": [{"type": "PING", "protocol_version": "2.0"}],
         "responses": ["ERROR:VERSION_MISMATCH"]},
        {"name": "response_type_as_request", "server": {}, "requests": [{"type": "SET_STATE", "weights_seq_no": 1},
                                                                           {"type": "PONG"}],
         "responses": ["ERROR:NOT_A_REQUEST", "ERROR:NOT_A_REQUEST"]},
        {"name": "auth_required_missing", "server": {"auth_token": "s3cret"}, "requests": [ping],
         "responses": ["ERROR:AUTH_FAILED"]},
        {"name": "auth_wrong", "server": {"auth_token": "s3cret"},
         "requests": [{"type": "PING", "auth_token": "guess"}], "responses": ["ERROR:AUTH_FAILED"]},
        {"name": "auth_request_before_ping", "server": {"auth_token": "s3cret"}, "requests": [{"type": "GET_CONFIG"}],
         "responses": ["ERROR:AUTH_FAILED"]},
        {"name": "auth_ok_then_requests", "server": {"auth_token": "s3cret"},
         "requests": [{"type": "PING", "auth_token": "s3cret"}, {"type": "GET_CONFIG"}],
         "responses": ["PONG", "SET_CONFIG"]},
        {"name": "auth_failed_then_retry", "server": {"auth_token": "s3cret"},
         "requests": [{"type": "PING", "auth_token": "x"}, {"type": "GET_STATE"},
                      {"type": "PING", "auth_token": "s3cret"}, {"type": "GET_STATE"}],
         "responses": ["ERROR:AUTH_FAILED", "ERROR:AUTH_FAILED", "PONG", "SET_STATE"]},
    ]


MAPPING_RULES = [
    {"agent_id": "adversary_0", "module": "boss"},
    {"pattern": "adversary_*", "module": "chaser"},
    {"pattern": "car_[0-9]", "choose_from": ["car_a", "car_b", "car_c"]},
    {"pattern": "good_?", "module": "runner"},
]


def mapping_cases() -> list[dict]:
    """Policy-mapping rules -> module per (agent, episode), or UNMAPPED_AGENT.

    choose_from picks index fnv1a32(utf8(episode_id + "\\x00" + agent_id)) % n.
    """

    def fnv1a32(data: bytes) -> int:
        h = 0x811C9DC5
        for byte in data:
            h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
        return h

    cases = []
    for agent, episode in [("adversary_0", ""), ("adversary_7", "e1"), ("good_1", "e1"), ("good_10", "e1"),
                           ("car_3", "ep-1"), ("car_3", "ep-2"), ("car_3", "ep-3"), ("car_5", "ep-1"),
                           ("car_x", "ep-1"), ("plane", "e")]:
        module: str | None = None
        for rule in MAPPING_RULES:
            import fnmatch

            hit = agent == rule["agent_id"] if "agent_id" in rule else fnmatch.fnmatchcase(agent, rule["pattern"])
            if hit:
                if "module" in rule:
                    module = rule["module"]
                else:
                    choices = rule["choose_from"]
                    module = choices[fnv1a32(f"{episode}\x00{agent}".encode()) % len(choices)]
                break
        case = {"name": f"{agent}@{episode or 'none'}", "agent_id": agent, "episode_id": episode}
        if module is None:
            case["error"] = "UNMAPPED_AGENT"
        else:
            case["module"] = module
        cases.append(case)
    cases.append({"name": "fnv1a_empty", "fnv1a32_of_hex": "", "fnv1a32": fnv1a32(b"")})
    cases.append({"name": "fnv1a_foobar", "fnv1a32_of_hex": b"foobar".hex(), "fnv1a32": fnv1a32(b"foobar")})
    cases.append({"name": "fnv1a_utf8", "fnv1a32_of_hex": "ep\x00agent_é".encode().hex(),
                  "fnv1a32": fnv1a32("ep\x00agent_é".encode())})
    return cases


def multi_agent_episode_cases() -> list[dict]:
    """Multi-agent records checked against modules (not mapping): -> agent steps, or error code."""
    box3 = {"type": "Box", "shape": [3], "low": -1, "high": 1}
    modules = {"m": {"observation_space": box3, "action_space": {"type": "Discrete", "n": 2}},
               "critic": {"observation_space": box3, "action_space": {"type": "Discrete", "n": 2},
                          "value_obs_agents": ["a", "b"]}}

    def agent(module: str = "m", steps: int = 2, **kw: object) -> dict:
        entry = {"module": module, "start_step": 0, "obs": [[0.0, 0.0, 0.0]] * (steps + 1), "actions": [1] * steps,
                 "rewards": [0.5] * steps, "action_logp": [-0.7] * steps, "is_terminated": False,
                 "is_truncated": False}
        entry.update(kw)
        return entry

    def case(name: str, agents: dict, steps: int | None = None, code: str | None = None, **record: object) -> dict:
        rec = {"episode_id": "e", "is_terminated": False, "is_truncated": False, "agents": agents}
        rec.update(record)
        out = {"name": name, "modules": modules, "require_logp": True, "record": rec}
        if code:
            out["error"] = code
        else:
            out["agent_steps"] = steps
        return out

    return [
        case("two_agents", {"a": agent(), "b": agent(steps=3)}, 5),
        case("agent_joins_late", {"a": agent(start_step=7)}, 2),
        case("closing_record_without_agents", {}, 0, is_terminated=True),
        case("agent_terminated", {"a": agent(is_terminated=True)}, 2),
        case("central_critic", {"a": agent("critic", value_obs=[[0.0] * 6] * 3)}, 2),
        case("unknown_module", {"a": agent("nope")}, code="UNKNOWN_MODULE"),
        case("agent_lengths_mismatch", {"a": agent(rewards=[1.0])}, code="EPISODE_LENGTH_MISMATCH"),
        case("agent_obs_wrong_shape", {"a": agent(obs=[[0.0, 0.0]] * 3)}, code="OBS_SHAPE_MISMATCH"),
        case("central_critic_missing_value_obs", {"a": agent("critic")}, code="OBS_SHAPE_MISMATCH"),
        case("central_critic_wrong_width", {"a": agent("critic", value_obs=[[0.0] * 3] * 3)}, code="OBS_SHAPE_MISMATCH"),
        case("negative_start_step", {"a": agent(start_step=-1)}, code="INVALID_FIELD"),
        case("agents_not_object", [], code="INVALID_FIELD"),
    ]


def main() -> None:
    files = {
        "framing.json": framing_cases(),
        "messages.json": message_cases(),
        "spaces.json": space_cases(),
        "episodes.json": episode_cases(),
        "logp.json": logp_cases(),
        "session.json": session_cases(),
        "policy_mapping.json": mapping_cases(),
        "multi_agent_episodes.json": multi_agent_episode_cases(),
    }
    for name, cases in files.items():
        names = [c["name"] for c in cases]
        assert len(names) == len(set(names)), f"duplicate case names in {name}"
        extra = {"rules": MAPPING_RULES} if name == "policy_mapping.json" else {}
        (HERE / name).write_text(
            json.dumps({"version": "1.3", **extra, "cases": cases}, indent=1, ensure_ascii=False) + "\n"
        )
        print(f"wrote {name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
