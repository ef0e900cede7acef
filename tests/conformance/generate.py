"""Writes the conformance vectors in this folder.

The vectors are the executable half of docs/protocol.md (§16): plain JSON
inputs and expected outcomes, so that an SDK in any language can load them.
Today tests/protocol/test_conformance.py runs every file against the Python
protocol core and, for the server-session files, against a real Tether
server. Expected error codes are the specification's; expected log-
probabilities are computed here with torch.distributions, an implementation
independent of every SDK's own formulas.

    python tests/conformance/generate.py   # rewrites the *.json files
"""

from __future__ import annotations

import base64
import json
import math
import struct
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
        ok("episodes_with_batch_ids", '{"type": "EPISODES_AND_GET_STATE", "episodes": [], "client_session": "9f1c", '
           '"batch_seq": 1, "env_steps": 0, "agent_steps": 0}', "EPISODES_AND_GET_STATE"),
        ok("connection_level_error", '{"type": "ERROR", "code": "CLIENT_TIMEOUT", "message": "no byte for 60 s"}', "ERROR"),
        ok("map_agents", '{"type": "MAP_AGENTS", "episode_id": "ep-1", "agent_ids": ["red_0"]}', "MAP_AGENTS"),
        ok("agent_modules", '{"type": "AGENT_MODULES", "modules": {"red_0": "red"}}', "AGENT_MODULES"),
        # 1.4 §4.3: a NUL byte ends the JSON text; the attachment after it is never UTF-8- or JSON-checked.
        {"name": "episodes_with_attachment", "type": "EPISODES",
         "body_hex": hexs(b'{"type": "EPISODES", "episodes": []}\x00\xff\xfe{[\x00"')},
        {"name": "ping_with_attachment_ignored", "type": "PING", "body_hex": hexs(b'{"type": "PING"}\x00\x01\x02')},
        {"name": "empty_attachment", "type": "PING", "body_hex": hexs(b'{"type": "PING"}\x00')},
        {"name": "invalid_json_before_nul", "error": "INVALID_JSON", "body_hex": hexs(b'{"type": "PING"\x00}')},
        err("invalid_utf8", b'{"type": "PING", "client_name": "\xff\xfe"}', "INVALID_UTF8"),
        err("invalid_json", b'{"type": "PING"', "INVALID_JSON"),
        err("empty_body", b"", "INVALID_JSON"),
        err("array_body", b'[{"type": "PING"}]', "NOT_AN_OBJECT"),
        err("string_body", b'"PING"', "NOT_AN_OBJECT"),
        err("missing_type", b'{"episodes": []}', "MISSING_TYPE"),
        err("unknown_type", b'{"type": "FLY"}', "UNKNOWN_TYPE"),
        err("type_not_string", b'{"type": 7}', "UNKNOWN_TYPE"),
        err("type_wrong_case", b'{"type": "ping"}', "UNKNOWN_TYPE"),
        # §4.1: at most 64 levels of arrays and objects (the body object is level 1); brackets in strings
        # do not count. Every receiver refuses 65 levels (a server keeps the connection open: connection.json).
        ok("nested_64_levels", '{"type": "PING", "x": ' + "[" * 63 + "]" * 63 + "}", "PING"),
        ok("nested_64_levels_of_objects", '{"type": "PING", "x": ' + '{"a": ' * 63 + "1" + "}" * 63 + "}", "PING"),
        ok("brackets_in_strings_not_counted", '{"type": "PING", "client_name": "' + "[{" * 300 + '\\\\", "x": "\\"[["}',
           "PING"),
        err("nested_65_levels", b'{"type": "PING", "x": ' + b"[" * 64 + b"]" * 64 + b"}", "INVALID_JSON"),
        err("nested_65_levels_of_objects", b'{"type": "PING", "x": ' + b'{"a": ' * 64 + b"1" + b"}" * 64 + b"}",
            "INVALID_JSON"),
        err("nested_600_levels", b'{"type": "PING", "x": ' + b"[" * 599 + b"]" * 599 + b"}", "INVALID_JSON"),
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
        # 1.4 §8.1: a uint8 Box holds integers 0-255 (an image, HWC); its bounds lie within them.
        {"name": "uint8_image", "space": {"type": "Box", "shape": [84, 84, 4], "dtype": "uint8", "low": 0, "high": 255},
         "shape": [84, 84, 4], "dist_inputs_size": 2 * 84 * 84 * 4},
        {"name": "uint8_bound_above_255", "space": {"type": "Box", "shape": [2], "dtype": "uint8", "low": 0, "high": 256},
         "error": "INVALID_FIELD"},
        {"name": "uint8_bound_negative", "space": {"type": "Box", "shape": [2], "dtype": "uint8", "low": -1, "high": 255},
         "error": "INVALID_FIELD"},
        {"name": "dtype_not_string", "space": {"type": "Box", "shape": [2], "dtype": 8}, "error": "INVALID_FIELD"},
    ]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def tensor(dtype: str, shape: list[int], values: list) -> dict:
    """A tensor object (§10.9) of ``values`` (row-major)."""
    packed = struct.pack(f"<{len(values)}{'B' if dtype == 'uint8' else 'f'}", *values)
    return {"dtype": dtype, "shape": shape, "b64": b64(packed)}


def tensor_cases() -> list[dict]:
    """1.4 §10.9: a tensor object -> its dtype, shape and values (row-major, as JSON numbers), or the
    error a receiver raises for it (INVALID_TENSOR)."""
    ok = lambda name, t, values: {"name": name, "tensor": t, "dtype": t["dtype"], "shape": t["shape"], "values": values}
    bad = lambda name, t: {"name": name, "tensor": t, "error": "INVALID_TENSOR"}
    pixels = [0, 1, 127, 128, 254, 255]
    floats = [0.0, -1.5, 3.25, 1e-3]
    def at(name: str, t: dict, attachment: bytes, values: list | None = None) -> dict:
        case = {"name": name, "tensor": t, "attachment_hex": hexs(attachment)}
        return {**case, "dtype": t["dtype"], "shape": t["shape"], "values": values} if values is not None \
            else {**case, "error": "INVALID_TENSOR"}

    return [
        # In the body's attachment (§4.3), at an offset; bytes before and after are another tensor's or unused.
        at("uint8_in_attachment", {"dtype": "uint8", "shape": [2, 3], "offset": 2}, b"\xaa\xbb" + bytes(pixels) + b"\xcc",
           pixels),
        at("float32_in_attachment_unaligned", {"dtype": "float32", "shape": [2], "offset": 1},
           b"\x00" + struct.pack("<2f", 1.5, -2.0), [1.5, -2.0]),
        at("offset_past_the_end", {"dtype": "uint8", "shape": [4], "offset": 1}, bytes(4)),
        at("offset_negative", {"dtype": "uint8", "shape": [1], "offset": -1}, bytes(4)),
        at("offset_float", {"dtype": "uint8", "shape": [1], "offset": 1.0}, bytes(4)),
        at("offset_and_b64", {"dtype": "uint8", "shape": [1], "offset": 0, "b64": b64(bytes(1))}, bytes(1)),
        bad("offset_without_attachment", {"dtype": "uint8", "shape": [1], "offset": 0}),
        ok("uint8_2x3", tensor("uint8", [2, 3], pixels), pixels),
        ok("uint8_hwc_1x2x2x1", tensor("uint8", [1, 2, 2, 1], [9, 8, 7, 6]), [9, 8, 7, 6]),
        # float32 little-endian: 1e-3 is the float32 nearest to it, as a float64 decimal.
        ok("float32_little_endian", tensor("float32", [2, 2], floats),
           [float(struct.unpack("<f", struct.pack("<f", v))[0]) for v in floats]),
        ok("empty", {"dtype": "uint8", "shape": [0, 3], "b64": ""}, []),
        bad("unknown_dtype", {"dtype": "int64", "shape": [1], "b64": b64(bytes(8))}),
        bad("dtype_not_string", {"dtype": 8, "shape": [1], "b64": b64(bytes(1))}),
        bad("missing_b64", {"dtype": "uint8", "shape": [1]}),
        bad("extra_member", {**tensor("uint8", [1], [1]), "order": "C"}),
        bad("shape_not_list", {"dtype": "uint8", "shape": 3, "b64": b64(bytes(3))}),
        bad("shape_empty", {"dtype": "uint8", "shape": [], "b64": b64(bytes(1))}),
        bad("shape_negative", {"dtype": "uint8", "shape": [-1], "b64": ""}),
        bad("shape_float", {"dtype": "uint8", "shape": [2.0], "b64": b64(bytes(2))}),
        bad("shape_boolean", {"dtype": "uint8", "shape": [True], "b64": b64(bytes(1))}),
        bad("shape_33_dimensions", {"dtype": "uint8", "shape": [1] * 33, "b64": b64(bytes(1))}),
        bad("shape_dimension_above_2_31", {"dtype": "uint8", "shape": [0, 2**31], "b64": ""}),
        ok("shape_32_dimensions", {"dtype": "uint8", "shape": [1] * 32, "b64": b64(bytes([7]))}, [7]),
        bad("too_few_bytes", {"dtype": "uint8", "shape": [2, 3], "b64": b64(bytes(5))}),
        bad("too_many_bytes", {"dtype": "float32", "shape": [1], "b64": b64(bytes(8))}),
        bad("not_base64", {"dtype": "uint8", "shape": [3], "b64": "A*B="}),
        bad("unpadded_base64", {"dtype": "uint8", "shape": [1], "b64": "AA"}),
        bad("url_safe_alphabet", {"dtype": "uint8", "shape": [3], "b64": "-_-_"}),
        bad("b64_not_string", {"dtype": "uint8", "shape": [1], "b64": [0]}),
    ]


CARTPOLE_OBS = {"type": "Box", "shape": [4], "low": "-inf", "high": "inf"}
IMAGE_2X2 = {"type": "Box", "shape": [2, 2, 1], "dtype": "uint8", "low": 0, "high": 255}
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
        case("box_action_raw_sample_far_outside", [good_episode(1, actions=[[1e6, -1e6]], action_dist_inputs=[[0, 0, 0, 0]])],
             steps=1, act={"type": "Box", "shape": [2], "low": -1, "high": 1}),
        case("box_action_overflows_float32", [], code="NON_FINITE_VALUE", act={"type": "Box", "shape": [2], "low": -1, "high": 1},
             raw=json.dumps({"type": "EPISODES", "episodes": [good_episode(1, actions=[[0.0, 0.0]], action_dist_inputs=[[0, 0, 0, 0]])]})
             .replace('"actions": [[0.0, 0.0]]', '"actions": [[0.0, 1e39]]')),
        case("box_action_nan", [], code="NON_FINITE_VALUE", act={"type": "Box", "shape": [2], "low": -1, "high": 1},
             raw=json.dumps({"type": "EPISODES", "episodes": [good_episode(1, actions=[[0.0, 0.0]], action_dist_inputs=[[0, 0, 0, 0]])]})
             .replace('"actions": [[0.0, 0.0]]', '"actions": [[NaN, 0.0]]')),
        case("multidiscrete_still_strict", [good_episode(1, actions=[[3, 0]], action_dist_inputs=[[0] * 5])],
             code="ACTION_OUT_OF_SPACE", act={"type": "MultiDiscrete", "nvec": [3, 2]}),
        case("batch_ids_are_not_record_fields", [], steps=2,
             raw=json.dumps({"type": "EPISODES", "client_session": "s", "batch_seq": 1, "env_steps": 2, "agent_steps": 2,
                             "episodes": [good_episode(2)]})),
        case("box_action_wrong_shape", [good_episode(1, actions=[[0.5]], action_dist_inputs=[[0, 0, 0, 0]])],
             code="ACTION_OUT_OF_SPACE", act={"type": "Box", "shape": [2], "low": -1, "high": 1}),
        case("missing_logp_on_policy", [{k: v for k, v in good_episode(2).items() if k != "action_logp"}],
             code="MISSING_ACTION_LOGP"),
        case("missing_obs", [{k: v for k, v in good_episode(2).items() if k != "obs"}], code="INVALID_FIELD"),
        case("flag_not_bool", [good_episode(2, is_terminated="no")], code="INVALID_FIELD"),
        case("rewards_not_numbers", [good_episode(2, rewards=["a", "b"])], code="INVALID_FIELD"),
        # §10.5: a number written as a string is no number, however it reads.
        case("reward_numeric_string", [good_episode(2, rewards=["1e30", 1.0])], code="INVALID_FIELD"),
        case("obs_numeric_string", [good_episode(2, obs=[[0.0, "0.5", 0.0, 0.0]] * 3)], code="INVALID_FIELD"),
        case("action_numeric_string", [good_episode(2, actions=["1", 0])], code="INVALID_FIELD"),
        case("logp_numeric_string", [good_episode(2, action_logp=["-0.69", -0.69])], code="INVALID_FIELD"),
        # Booleans are no numbers either (numpy would read true as 1).
        case("action_true", [good_episode(2, actions=[True, 0])], code="INVALID_FIELD"),
        case("reward_false", [good_episode(2, rewards=[1.0, False])], code="INVALID_FIELD"),
        case("obs_true", [good_episode(2, obs=[[0.0, True, 0.0, 0.0]] * 3)], code="INVALID_FIELD"),
        case("episodes_not_list", [], code="INVALID_FIELD", raw='{"type": "EPISODES", "episodes": {"obs": []}}'),
        case("second_chunk_bad_stores_nothing", [good_episode(2), good_episode(2, actions=[0, 5])],
             code="ACTION_OUT_OF_SPACE"),
        # 1.3 §10.1: the version of every step, as [version, steps] runs covering the chunk.
        case("runs_two_versions", [good_episode(3, weights_seq_no_runs=[[4, 1], [5, 2]])], steps=3),
        case("runs_one_version", [good_episode(2, weights_seq_no_runs=[[0, 2]])], steps=2),
        case("runs_null_ok", [good_episode(2, weights_seq_no_runs=None)], steps=2),
        case("runs_largest_version", [good_episode(1, weights_seq_no_runs=[[2147483647, 1]])], steps=1),
        case("runs_sum_short", [good_episode(3, weights_seq_no_runs=[[4, 2]])], code="EPISODE_LENGTH_MISMATCH"),
        case("runs_sum_long", [good_episode(3, weights_seq_no_runs=[[4, 2], [5, 2]])], code="EPISODE_LENGTH_MISMATCH"),
        case("runs_empty", [good_episode(2, weights_seq_no_runs=[])], code="EPISODE_LENGTH_MISMATCH"),
        case("runs_zero_count", [good_episode(2, weights_seq_no_runs=[[4, 0], [5, 2]])], code="INVALID_FIELD"),
        case("runs_negative_version", [good_episode(2, weights_seq_no_runs=[[-1, 2]])], code="INVALID_FIELD"),
        case("runs_version_too_large", [good_episode(2, weights_seq_no_runs=[[2147483648, 2]])], code="INVALID_FIELD"),
        case("runs_float_version", [good_episode(2, weights_seq_no_runs=[[4.0, 2]])], code="INVALID_FIELD"),
        case("runs_float_count", [good_episode(2, weights_seq_no_runs=[[4, 2.0]])], code="INVALID_FIELD"),
        case("runs_boolean", [good_episode(2, weights_seq_no_runs=[[True, 2]])], code="INVALID_FIELD"),
        case("runs_string_version", [good_episode(2, weights_seq_no_runs=[["4", 2]])], code="INVALID_FIELD"),
        case("runs_triple", [good_episode(2, weights_seq_no_runs=[[4, 1, 1]])], code="INVALID_FIELD"),
        case("runs_flat_pair", [good_episode(2, weights_seq_no_runs=[4, 2])], code="INVALID_FIELD"),
        case("runs_not_array", [good_episode(2, weights_seq_no_runs={"4": 2})], code="INVALID_FIELD"),
        # 1.4 §10.9: obs as one tensor of [T+1, *shape], of the space's element type; JSON numbers stay valid.
        case("uint8_obs_tensor", [good_episode(2, obs=tensor("uint8", [3, 2, 2, 1], list(range(12))))], steps=2,
             obs=IMAGE_2X2),
        case("uint8_obs_json_integers", [good_episode(2, obs=[[[[0], [255]], [[7], [8]]]] * 3)], steps=2, obs=IMAGE_2X2),
        case("float32_obs_tensor", [good_episode(2, obs=tensor("float32", [3, 4], [0.5] * 12))], steps=2),
        case("uint8_obs_json_fraction", [good_episode(2, obs=[[[[0], [0.5]], [[7], [8]]]] * 3)],
             code="OBS_DTYPE_MISMATCH", obs=IMAGE_2X2),
        case("uint8_obs_json_above_255", [good_episode(2, obs=[[[[0], [256]], [[7], [8]]]] * 3)],
             code="OBS_DTYPE_MISMATCH", obs=IMAGE_2X2),
        case("uint8_obs_json_negative", [good_episode(2, obs=[[[[0], [-1]], [[7], [8]]]] * 3)],
             code="OBS_DTYPE_MISMATCH", obs=IMAGE_2X2),
        case("float32_tensor_for_uint8_space", [good_episode(2, obs=tensor("float32", [3, 2, 2, 1], [1.0] * 12))],
             code="OBS_DTYPE_MISMATCH", obs=IMAGE_2X2),
        case("uint8_tensor_for_float_space", [good_episode(2, obs=tensor("uint8", [3, 4], [1] * 12))],
             code="OBS_DTYPE_MISMATCH"),
        case("obs_tensor_wrong_shape", [good_episode(2, obs=tensor("uint8", [3, 2, 1, 2], list(range(12))))],
             code="OBS_SHAPE_MISMATCH", obs=IMAGE_2X2),
        case("obs_tensor_flat_rows", [good_episode(2, obs=tensor("uint8", [3, 4], list(range(12))))],
             code="OBS_SHAPE_MISMATCH", obs=IMAGE_2X2),
        case("obs_tensor_one_row_short", [good_episode(2, obs=tensor("uint8", [2, 2, 2, 1], list(range(8))))],
             code="EPISODE_LENGTH_MISMATCH", obs=IMAGE_2X2),
        case("obs_tensor_bad_bytes", [good_episode(2, obs={"dtype": "uint8", "shape": [3, 2, 2, 1], "b64": b64(bytes(11))})],
             code="INVALID_TENSOR", obs=IMAGE_2X2),
        case("obs_tensor_non_finite", [good_episode(2, obs=tensor("float32", [3, 4], [0.0] * 5 + [float("inf")] + [0.0] * 6))],
             code="NON_FINITE_VALUE"),
    ]


MASK_BOARD = {"type": "Dict", "spaces": {
    "board": {"type": "Box", "shape": [2, 2], "low": 0, "high": 1},
    "action_mask": {"type": "Box", "shape": [3], "dtype": "int8", "low": 0, "high": 1}}}
CAMERA_AND_SPEED = {"type": "Dict", "spaces": {
    "speed": {"type": "Box", "shape": [2], "low": -1, "high": 1},
    "camera": IMAGE_2X2}}


def composite_cases() -> list[dict]:
    """1.4 §8.6, §10.6 checks 4c and 14b-14d, §11.6, §12.1: Dict and Tuple spaces and action masks.

    kind "space": a space -> its leaves (path, offset and size in the flat row, element type), flat_dim
    and the model's inputs (name, element type, dimensions after the batch), or INVALID_FIELD.
    kind "observation": one observation as an SDK takes it (by key / position) -> its flat row, or
    the code an SDK raises locally. kind "episode": as episodes.json, with the module's
    ``action_mask`` leaf (or null). kind "mask": one step's mask for an action space -> whether a
    client may sample with it, or the code it raises locally (§11.6)."""

    def space(name: str, sp: dict, leaves: list | None = None, error: str | None = None) -> dict:
        out = {"name": name, "kind": "space", "space": sp}
        if error:
            return {**out, "error": error}
        rows = []
        offset = 0
        for path, shape, dtype in leaves or []:
            size = math.prod(shape)
            rows.append({"path": path, "offset": offset, "size": size, "dtype": dtype})
            offset += size
        inputs = [{"name": path, "dtype": dtype, "dims": list(shape) if dtype == "uint8" else [math.prod(shape)]}
                  for path, shape, dtype in leaves or []]
        return {**out, "leaves": rows, "flat_dim": offset, "inputs": inputs}

    def observation(name: str, sp: dict, value: object, flat: list | None = None, error: str | None = None) -> dict:
        out = {"name": name, "kind": "observation", "space": sp, "observation": value}
        return {**out, "error": error} if error else {**out, "flat_row": flat}

    def episode(name: str, sp: dict, obs: object, actions: list, *, act: dict | None = None, mask: str | None = None,
                code: str | None = None, flat_rows: list | None = None, logged: bool = False) -> dict:
        """``flat_rows``: the record's observations as flat rows (leaves in leaf order), written out by hand.
        ``logged``: **[1.6]** every step logged (§10.1 ``logged_runs``), checked against the mask all the same."""
        steps = len(actions)
        record = {"obs": obs, "actions": actions, "rewards": [1.0] * steps,
                  "action_logp": [0.0 if logged else -0.5] * steps, "is_terminated": True, "is_truncated": False}
        if logged:
            record["logged_runs"] = [[0, steps]]
        body = json.dumps({"type": "EPISODES_AND_GET_STATE", "episodes": [record]})
        out = {"name": name, "kind": "episode", "observation_space": sp, "action_space": act or {"type": "Discrete", "n": 3},
               "action_mask": mask, "require_logp": True, "body": body}
        if code:
            return {**out, "error": code}
        return {**out, "env_steps": steps, **({"flat_rows": flat_rows} if flat_rows is not None else {})}

    def mask(name: str, act: dict, values: list, error: str | None = None) -> dict:
        return {"name": name, "kind": "mask", "action_space": act, "mask": values, "error": error}

    tuple_space = {"type": "Tuple", "spaces": [{"type": "Discrete", "n": 4},
                                                {"type": "Dict", "spaces": {"b": {"type": "Box", "shape": [2]},
                                                                            "a": {"type": "Box", "shape": []}}}]}
    nested = {"type": "Box", "shape": [1]}
    for _ in range(8):
        nested = {"type": "Tuple", "spaces": [nested]}
    board = [[[0, 1], [1, 0]], [[0, 0], [1, 1]], [[1, 1], [0, 0]]]
    masks = [[1, 0, 1], [0, 1, 1], [0, 0, 0]]
    md = {"type": "MultiDiscrete", "nvec": [2, 3]}
    return [
        space("dict_keys_sorted", CAMERA_AND_SPEED, [("camera", [2, 2, 1], "uint8"), ("speed", [2], "float32")]),
        space("dict_with_mask", MASK_BOARD, [("action_mask", [3], "float32"), ("board", [2, 2], "float32")]),
        space("tuple_nested_dict", tuple_space,
              [("0", [], "float32"), ("1.a", [], "float32"), ("1.b", [2], "float32")]),
        space("nesting_8_levels", {"type": "Dict", "spaces": {"x": nested["spaces"][0]}},
              [("x" + ".0" * 7, [1], "float32")]),
        space("nesting_9_levels", {"type": "Dict", "spaces": {"x": nested}}, error="INVALID_FIELD"),
        space("dict_65_leaves", {"type": "Dict", "spaces": {f"k{i:02d}": {"type": "Box", "shape": [1]}
                                                            for i in range(65)}}, error="INVALID_FIELD"),
        space("dict_empty", {"type": "Dict", "spaces": {}}, error="INVALID_FIELD"),
        space("dict_key_with_dot", {"type": "Dict", "spaces": {"a.b": {"type": "Box", "shape": [1]}}},
              error="INVALID_FIELD"),
        space("dict_spaces_not_object", {"type": "Dict", "spaces": [{"type": "Box", "shape": [1]}]},
              error="INVALID_FIELD"),
        space("tuple_spaces_not_array", {"type": "Tuple", "spaces": {"0": {"type": "Box", "shape": [1]}}},
              error="INVALID_FIELD"),
        space("dict_bad_leaf", {"type": "Dict", "spaces": {"a": {"type": "Discrete", "n": 0}}}, error="INVALID_FIELD"),
        observation("dict_by_key", CAMERA_AND_SPEED, {"speed": [0.5, -1], "camera": [[[1], [2]], [[3], [4]]]},
                    [1, 2, 3, 4, 0.5, -1]),
        observation("tuple_by_position", tuple_space, [3, {"a": 0.25, "b": [1, 2]}], [3, 0.25, 1, 2]),
        observation("missing_leaf", CAMERA_AND_SPEED, {"speed": [0.5, -1]}, error="OBS_LEAF_MISMATCH"),
        observation("unknown_leaf", CAMERA_AND_SPEED,
                    {"speed": [0.5, -1], "camera": [[[1], [2]], [[3], [4]]], "lidar": [1]}, error="OBS_LEAF_MISMATCH"),
        observation("leaf_wrong_size", CAMERA_AND_SPEED, {"speed": [0.5, -1, 0], "camera": [[[1], [2]], [[3], [4]]]},
                    error="OBS_SHAPE_MISMATCH"),
        # (board's members written before action_mask's: rows follow leaf order, not the order written)
        episode("leaves_as_json", MASK_BOARD, {"board": board, "action_mask": masks}, [0, 2], mask="action_mask",
                flat_rows=[[1, 0, 1, 0, 1, 1, 0], [0, 1, 1, 0, 0, 1, 1], [0, 0, 0, 1, 1, 0, 0]]),
        episode("leaves_as_tensors", CAMERA_AND_SPEED,
                {"speed": tensor("float32", [3, 2], [0.5, -1, 0.25, 2, 0, 3]),
                 "camera": tensor("uint8", [3, 2, 2, 1], list(range(12)))},
                [1, 1], flat_rows=[[0, 1, 2, 3, 0.5, -1], [4, 5, 6, 7, 0.25, 2], [8, 9, 10, 11, 0, 3]]),
        episode("leaf_ragged", MASK_BOARD, {"board": [[[0, 1], [1, 0]], [[0], [1, 1]], [[1, 1], [0, 0]]],
                                            "action_mask": masks}, [0, 2], mask="action_mask",
                code="OBS_SHAPE_MISMATCH"),
        episode("leaf_missing", CAMERA_AND_SPEED, {"camera": tensor("uint8", [3, 2, 2, 1], list(range(12)))}, [1, 1],
                code="OBS_LEAF_MISMATCH"),
        episode("leaf_unknown", MASK_BOARD, {"board": board, "action_mask": masks, "extra": [[0]] * 3}, [0, 2],
                mask="action_mask", code="OBS_LEAF_MISMATCH"),
        episode("obs_not_object", MASK_BOARD, [[0] * 7] * 3, [0, 2], mask="action_mask", code="INVALID_FIELD"),
        episode("leaf_wrong_shape", MASK_BOARD, {"board": [[0, 1, 1, 0]] * 3, "action_mask": masks}, [0, 2],
                mask="action_mask", code="OBS_SHAPE_MISMATCH"),
        episode("leaves_of_different_lengths", MASK_BOARD, {"board": board[:2], "action_mask": masks}, [0, 2],
                mask="action_mask", code="EPISODE_LENGTH_MISMATCH"),
        episode("byte_leaf_fraction", CAMERA_AND_SPEED, {"camera": [[[[0.5], [1]], [[2], [3]]]] * 3,
                                                         "speed": [[0, 0]] * 3}, [1, 1], code="OBS_DTYPE_MISMATCH"),
        episode("byte_leaf_float_tensor", CAMERA_AND_SPEED, {"camera": tensor("float32", [3, 2, 2, 1], [1.0] * 12),
                                                             "speed": [[0, 0]] * 3}, [1, 1], code="OBS_DTYPE_MISMATCH"),
        episode("leaf_non_finite", CAMERA_AND_SPEED, {"camera": [[[[0], [1]], [[2], [3]]]] * 3,
                                                      "speed": tensor("float32", [3, 2], [0.0, float("inf")] + [0.0] * 4)},
                [1, 1], code="NON_FINITE_VALUE"),
        episode("mask_value_not_0_or_1", MASK_BOARD, {"board": board, "action_mask": [[1, 0, 2], [0, 1, 1], [0, 0, 0]]},
                [0, 2], mask="action_mask", code="INVALID_ACTION_MASK"),
        episode("mask_allows_nothing", MASK_BOARD, {"board": board, "action_mask": [[1, 0, 1], [0, 0, 0], [0, 0, 0]]},
                [0, 2], mask="action_mask", code="ACTION_MASK_EMPTY"),
        episode("final_mask_allows_nothing_ok", MASK_BOARD, {"board": board, "action_mask": masks}, [2, 1],
                mask="action_mask"),
        episode("masked_action", MASK_BOARD, {"board": board, "action_mask": masks}, [0, 0], mask="action_mask",
                code="ACTION_MASKED"),
        episode("masked_action_unchecked_without_mask", MASK_BOARD, {"board": board, "action_mask": masks}, [0, 0]),
        episode("masked_logged_action", MASK_BOARD, {"board": board, "action_mask": masks}, [0, 0], mask="action_mask",
                code="ACTION_MASKED", logged=True),
        episode("allowed_logged_action", MASK_BOARD, {"board": board, "action_mask": masks}, [0, 2], mask="action_mask",
                logged=True),
        episode("multidiscrete_mask_entry_empty",
                {"type": "Dict", "spaces": {"m": {"type": "Box", "shape": [5], "low": 0, "high": 1}}},
                {"m": [[1, 1, 0, 0, 0], [1, 0, 1, 1, 1], [0] * 5]}, [[0, 0], [0, 1]], act=md, mask="m",
                code="ACTION_MASK_EMPTY"),
        episode("multidiscrete_masked_entry",
                {"type": "Dict", "spaces": {"m": {"type": "Box", "shape": [5], "low": 0, "high": 1}}},
                {"m": [[1, 1, 0, 0, 1], [1, 0, 1, 1, 1], [0] * 5]}, [[0, 2], [1, 0]], act=md, mask="m",
                code="ACTION_MASKED"),
        episode("multidiscrete_masked_ok",
                {"type": "Dict", "spaces": {"m": {"type": "Box", "shape": [5], "low": 0, "high": 1}}},
                {"m": [[1, 1, 0, 0, 1], [1, 0, 1, 1, 1], [0] * 5]}, [[1, 2], [0, 0]], act=md, mask="m"),
        mask("discrete_ok", {"type": "Discrete", "n": 3}, [0, 1, 0]),
        mask("discrete_all_zero", {"type": "Discrete", "n": 3}, [0, 0, 0], "ACTION_MASK_EMPTY"),
        mask("discrete_value_2", {"type": "Discrete", "n": 3}, [0, 2, 1], "INVALID_ACTION_MASK"),
        mask("multidiscrete_entry_empty", md, [1, 0, 0, 0, 0], "ACTION_MASK_EMPTY"),
        mask("multidiscrete_ok", md, [0, 1, 0, 0, 1]),
    ]


def _recurrent_model(kind: str = "lstm") -> tuple[bytes, list[dict]]:
    """A small model with memory (an LSTM or GRU of 3 units on 2 observation values, Discrete(2)
    actions), exported by the server's own writer with fixed weights."""
    import sys

    import torch

    sys.path.insert(0, str(HERE.parents[2]))
    from tether.protocol.spaces import Discrete, box  # noqa: E402
    from tether.server.learner.ppo import PPOHyperparams, PPOLearner  # noqa: E402

    torch.manual_seed(7)
    learner = PPOLearner(box([-1.0, -1.0], [1.0, 1.0]), Discrete(2),
                         PPOHyperparams(hidden_sizes=(4,), model={"recurrent": {"type": kind, "size": 3}}), seed=7)
    with torch.no_grad():  # weights large enough that the state matters to the output
        for parameter in learner.model.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=torch.Generator().manual_seed(11)) * 2 - 1)
    states = [{"input": f"state_in_{n}", "output": f"state_out_{n}", "size": 3}
              for n in (("h", "c") if kind == "lstm" else ("h",))]
    return learner.export_onnx(), states


def recurrent_cases() -> list[dict]:
    """1.5 §9.1, §10.1, §10.6 check 19, §12.1, §12.4: models with memory.

    kind "module": a module object -> its recurrent state (input, output, size per state tensor), or
    the code a client raises locally. kind "carry": a model with memory (``model_b64``, ONNX) and an
    episode's observations -> per step the dist inputs and the state after it, starting from zeros and
    fed back; with the episode cut into records after ``cut_after`` steps, each record's ``state_in``.
    kind "episode": a record of a module with ``recurrent_state`` (or none) -> its steps and state_in,
    or the server's code."""
    import numpy as np
    import onnxruntime as ort

    def module(name: str, state: object, expect: list | None = None, error: str | None = None) -> dict:
        entry = {"observation_space": {"type": "Box", "shape": [2], "low": -1, "high": 1},
                 "action_space": {"type": "Discrete", "n": 2}, "onnx_input_names": ["obs"],
                 "onnx_output_names": ["action_dist_inputs"], "trainable": True}
        if state != "absent":
            entry["recurrent_state"] = state
        out = {"name": name, "kind": "module", "module": entry}
        return {**out, "error": error} if error else {**out, "recurrent_state": expect}

    def state_in(rows: list) -> dict:
        return {s["input"]: row for s, row in zip(states, rows)}

    def carry(name: str, kind: str) -> dict:
        """The model run from zeros with its state fed back; the episode cut after ``cut_after`` steps."""
        nonlocal states
        model, states = _recurrent_model(kind)
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        observations = [[0.5, -0.25], [0.0, 1.0], [-1.0, 0.75], [0.25, 0.25], [0.0, 0.0], [1.0, -1.0]]
        state = np.zeros((len(states), 1, 3), np.float32)
        dist_inputs, after, before = [], [], []
        for obs in observations[:-1]:
            before.append(state[:, 0].tolist())
            feed = {"onnx::Gemm_0": np.array([obs], np.float32), **{s["input"]: state[k] for k, s in enumerate(states)}}
            out = session.run(["action_dist_inputs", *(s["output"] for s in states)], feed)
            dist_inputs.append(out[0][0].tolist())
            state = np.stack(out[1:])
            after.append(state[:, 0].tolist())
        cut_after = 2
        return {"name": name, "kind": "carry", "model_b64": b64(model), "input": "onnx::Gemm_0",
                "output": "action_dist_inputs", "action_space": {"type": "Discrete", "n": 2},
                "recurrent_state": states, "observations": observations, "dist_inputs": dist_inputs,
                "state_after": after, "cut_after": cut_after,
                "records_state_in": [state_in(before[0]), state_in(before[cut_after])], "tolerance": 1e-5}

    states: list[dict] = []
    carry_gru = carry("gru_state_fed_back", "gru")
    carry_lstm = carry("lstm_state_fed_back", "lstm")  # (last: the episode cases below use its two tensors)

    def episode(name: str, state: object, *, steps: int = 2, error: str | None = None, module_state: bool = True,
                record_state: object = "zeros") -> dict:
        record = {"obs": [[0.5, 0.5]] * (steps + 1), "actions": [1] * steps, "rewards": [0.5] * steps,
                  "action_logp": [-0.7] * steps, "is_terminated": False, "is_truncated": False}
        if record_state == "zeros":
            record["state_in"] = state_in([[0.0] * 3, [0.0] * 3])
        elif record_state != "absent":
            record["state_in"] = record_state  # (None: a JSON null)
        out = {"name": name, "kind": "episode", "observation_space": {"type": "Box", "shape": [2], "low": -1, "high": 1},
               "action_space": {"type": "Discrete", "n": 2}, "recurrent_state": states if module_state else None,
               "require_logp": True, "body": json.dumps({"type": "EPISODES_AND_GET_STATE", "episodes": [record]})}
        if error:
            return {**out, "error": error}
        return {**out, "env_steps": steps, "state_in": None if not module_state else
                [[0.0] * 3, [0.0] * 3] if record_state == "zeros" else [record_state[s["input"]] for s in states]}

    good = state_in([[0.5, -0.25, 1e-3], [2.0, -3.5, 0.0]])
    return [
        module("lstm", states, expect=states),
        module("gru", [states[0]], expect=[states[0]]),
        module("absent", "absent", expect=[]),
        module("null", None, expect=[]),
        module("empty_array", [], error="INVALID_FIELD"),
        module("not_an_array", {"input": "a", "output": "b", "size": 3}, error="INVALID_FIELD"),
        module("missing_output", [{"input": "a", "size": 3}], error="INVALID_FIELD"),
        module("size_zero", [{"input": "a", "output": "b", "size": 0}], error="INVALID_FIELD"),
        module("size_too_large", [{"input": "a", "output": "b", "size": 4097}], error="INVALID_FIELD"),
        module("size_not_integer", [{"input": "a", "output": "b", "size": 3.5}], error="INVALID_FIELD"),
        module("size_boolean", [{"input": "a", "output": "b", "size": True}], error="INVALID_FIELD"),
        module("repeated_name", [{"input": "a", "output": "b", "size": 3}, {"input": "a", "output": "c", "size": 3}],
               error="INVALID_FIELD"),
        module("sizes_differ", [{"input": "a", "output": "b", "size": 3}, {"input": "c", "output": "d", "size": 4}],
               error="INVALID_FIELD"),
        carry_lstm,
        carry_gru,
        episode("zeros_at_the_start", states),
        episode("carried_state", states, record_state=good),
        episode("missing_state", states, record_state="absent", error="MISSING_STATE"),
        episode("null_state", states, record_state=None, error="MISSING_STATE"),
        episode("state_for_a_module_without_memory", states, module_state=False, error="INVALID_STATE"),
        episode("no_state_without_memory", states, module_state=False, record_state="absent"),
        episode("state_missing_a_tensor", states, record_state={"state_in_h": [0.0] * 3}, error="INVALID_STATE"),
        episode("state_unknown_tensor", states, record_state={**good, "state_in_x": [0.0] * 3}, error="INVALID_STATE"),
        episode("state_wrong_size", states, record_state={**good, "state_in_c": [0.0] * 4}, error="INVALID_STATE"),
        episode("state_nested", states, record_state={**good, "state_in_c": [[0.0] * 3]}, error="INVALID_STATE"),
        episode("state_string", states, record_state={**good, "state_in_c": ["0", 0.0, 0.0]}, error="INVALID_STATE"),
        episode("state_boolean", states, record_state={**good, "state_in_c": [True, 0.0, 0.0]}, error="INVALID_STATE"),
        episode("state_tensor_object", states,
                record_state={**good, "state_in_c": tensor("float32", [3], [0.0, 0.0, 0.0])}, error="INVALID_STATE"),
        episode("state_not_object", states, record_state=[[0.0] * 3, [0.0] * 3], error="INVALID_STATE"),
        episode("state_too_large_a_float32", states, record_state={**good, "state_in_h": [1e39, 0.0, 0.0]},
                error="NON_FINITE_VALUE"),
        episode("chunk_of_10000_steps", states, steps=10000),
        episode("chunk_of_10001_steps", states, steps=10001, error="SEQUENCE_TOO_LONG"),
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
    # 1.3 (§11.4, §11.5): the record carries the raw sample, which may lie outside the box, and its
    # Gaussian logp; the engine executes the sample clipped into the box ("env_action").
    for name, mean, log_std, raw, low, high in [
        ("box1_raw_sample_outside_box", [0.8], [math.log(0.5)], [1.3], -1.0, 1.0),
        ("box2_raw_sample_one_element_outside", [0.2, -0.3], [-0.5, 0.1], [1.4, -0.3], -1.0, 1.0),
        ("box2_raw_sample_below_low", [0.0, 0.0], [0.0, 0.0], [-2.5, 0.25], -1.0, 1.0),
    ]:
        n = Normal(torch.tensor(mean, dtype=torch.float64), torch.tensor(log_std, dtype=torch.float64).exp())
        lp = float(n.log_prob(torch.tensor(raw, dtype=torch.float64)).sum())
        cases.append({"name": name, "space": {"type": "Box", "shape": [len(mean)], "low": low, "high": high},
                      "dist_inputs": mean + log_std, "action": raw, "logp": lp,
                      "env_action": [min(max(a, low), high) for a in raw]})
    # 1.4 §11.6: the model's masked logits hold -1e9 where the mask forbids; logp is the masked
    # distribution's, from the same formulas (the forbidden terms vanish in logsumexp).
    cases.append({"name": "masked_discrete3", "space": {"type": "Discrete", "n": 3}, "dist_inputs": [0.5, -1e9, 1.5],
                  "action": 2, "logp": categorical([0.5, -1e9, 1.5], 2)})
    masked_md = [-1e9, 0.0, 0.1, -1e9, 0.3]
    cases.append({"name": "masked_multidiscrete_2_3", "space": {"type": "MultiDiscrete", "nvec": [2, 3]},
                  "dist_inputs": masked_md, "action": [1, 2],
                  "logp": categorical(masked_md[:2], 1) + categorical(masked_md[2:], 2)})
    cases.append({"name": "masked_one_allowed", "space": {"type": "Discrete", "n": 4},
                  "dist_inputs": [-1e9, -1e9, 2.0, -1e9], "action": 2, "logp": 0.0})
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
        # 1.3: a PING with a wrong token is refused and the connection closed (connection.json).
        {"name": "request_before_auth_then_ping", "server": {"auth_token": "s3cret"},
         "requests": [{"type": "GET_STATE"}, {"type": "GET_CONFIG"},
                      {"type": "PING", "auth_token": "s3cret"}, {"type": "GET_STATE"}],
         "responses": ["ERROR:AUTH_FAILED", "ERROR:AUTH_FAILED", "PONG", "SET_STATE"]},
        {"name": "version_mismatch_does_not_authenticate", "server": {"auth_token": "s3cret"},
         "requests": [{"type": "PING", "protocol_version": "2.0", "auth_token": "s3cret"}, {"type": "GET_CONFIG"},
                      {"type": "PING", "protocol_version": "1.3", "auth_token": "s3cret"}, {"type": "GET_CONFIG"}],
         "responses": ["ERROR:VERSION_MISMATCH", "ERROR:AUTH_FAILED", "PONG", "SET_CONFIG"]},
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

    def case(name: str, agents: dict, steps: int | None = None, code: str | None = None, raw_value_obs: bool = False,
             **record: object) -> dict:
        rec = {"episode_id": "e", "is_terminated": False, "is_truncated": False, "agents": agents}
        rec.update(record)
        out = {"name": name, "modules": modules, "require_logp": True, "record": rec}
        if raw_value_obs:  # the record as JSON text, so a NaN token can be written
            out["record_json"] = json.dumps(rec).replace('"value_obs": [[0.0', '"value_obs": [[NaN', 1)
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
        case("central_critic_ragged_value_obs", {"a": agent("critic", value_obs=[[0.0] * 6, [0.0] * 5, [0.0] * 6])},
             code="OBS_SHAPE_MISMATCH"),
        case("central_critic_value_obs_strings", {"a": agent("critic", value_obs=[["x"] * 6] * 3)}, code="OBS_SHAPE_MISMATCH"),
        case("central_critic_value_obs_too_few_rows", {"a": agent("critic", value_obs=[[0.0] * 6] * 2)},
             code="OBS_SHAPE_MISMATCH"),
        case("central_critic_value_obs_nan", {"a": agent("critic", value_obs=[[0.0] * 6] * 3)}, code="NON_FINITE_VALUE",
             raw_value_obs=True),
        case("value_obs_ignored_without_critic", {"a": agent(value_obs=[["not", "checked"]])}, 2),
        case("zero_step_entry", {"a": agent(steps=0)}, code="EPISODE_LENGTH_MISMATCH"),
        case("negative_start_step", {"a": agent(start_step=-1)}, code="INVALID_FIELD"),
        case("entry_reward_numeric_string", {"a": agent(rewards=["0.5", 0.5])}, code="INVALID_FIELD"),
        case("entry_reward_true", {"a": agent(rewards=[True, 0.5])}, code="INVALID_FIELD"),
        case("central_critic_value_obs_numeric_strings", {"a": agent("critic", value_obs=[["0"] * 6] * 3)},
             code="OBS_SHAPE_MISMATCH"),
        case("agents_not_object", [], code="INVALID_FIELD"),
        case("entry_runs", {"a": agent(steps=3, weights_seq_no_runs=[[2, 2], [3, 1]]), "b": agent()}, 5),
        case("entry_runs_sum_mismatch", {"a": agent(steps=3, weights_seq_no_runs=[[2, 2]])},
             code="EPISODE_LENGTH_MISMATCH"),
        case("entry_runs_not_pairs", {"a": agent(weights_seq_no_runs=[[2, "2"]])}, code="INVALID_FIELD"),
    ]


# -- server sessions ---------------------------------------------------------------------------------
#
# A server-session case gives the server's settings (the options of ``tether serve`` as JSON: spaces,
# modules, policy_mapping, groups, force_on_policy; nothing is trained: no update runs during a case)
# and a list of steps. A step either sends one request on the current connection and says what the
# server answers ("expect": a response type, "ERROR:<code>", or null for no answer at all - an EPISODES
# that was accepted; a runner checks that by sending a PING next and getting PONG first), or is
# {"reconnect": true}: close the connection and open a new one. "fields" are members the answer has
# with exactly these values, "present"/"absent" name members (dotted paths) it must have or lack,
# "same_answer_as": i says the answer equals, member for member, the answer to step i.
# "received_agent_steps", when given, is the number of agent steps the server has accepted at the end.
# Records carry the action_logp of a uniform policy, which a freshly started server's models are close
# to, so a server that checks behaviour log-probabilities (§13.6) accepts them.

BOX3 = {"type": "Box", "shape": [3], "low": -10, "high": 10}
LAYOUT = {
    "modules": {
        "chaser": {"observation_space": BOX3, "action_space": {"type": "Discrete", "n": 2}},
        "runner": {"observation_space": BOX3, "action_space": {"type": "Discrete", "n": 3}, "trainable": False},
        "pairmod": {"observation_space": {"type": "Box", "shape": [6], "low": -10, "high": 10},
                    "action_space": {"type": "MultiDiscrete", "nvec": [2, 2]}},
    },
    "policy_mapping": [{"pattern": "adversary_*", "module": "chaser"}, {"agent_id": "good_0", "module": "runner"},
                       {"agent_id": "pair", "module": "pairmod"},
                       {"pattern": "car_*", "choose_from": ["chaser", "runner"]}],
    "groups": {"pair": {"members": ["m_0", "m_1"], "reward": "sum"}},
}
SINGLE = {"observation_space": CARTPOLE_OBS, "action_space": DISCRETE2}


def _fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def _choose(episode_id: str, agent_id: str, choices: list[str]) -> str:
    return choices[_fnv1a32(f"{episode_id}\x00{agent_id}".encode()) % len(choices)]


def send(message: dict, expect: str | None, **checks: object) -> dict:
    return {"send": message, "expect": expect, **checks}


RECONNECT = {"reconnect": True}


def send_text(message: dict, expect: str | None, **checks: object) -> dict:
    """A step sending ``message`` as JSON text with every non-ASCII character escaped: a lone
    surrogate (no Unicode text, §4.1) can only travel as its escape, \\ud800."""
    return {"send_hex": frame(json.dumps(message)).hex(), "expect": expect, **checks}


#: The log-probability of any action under a uniform policy, per module of LAYOUT. A freshly started
#: server's policies are close to uniform, so these pass a server's logp check (§13.6).
UNIFORM_LOGP = {"chaser": -math.log(2), "runner": -math.log(3), "pairmod": -2 * math.log(2)}


def entry(module: str, steps: int = 2, width: int = 3, action: object = 1, **kw: object) -> dict:
    out = {"module": module, "start_step": 0, "obs": [[0.1] * width] * (steps + 1), "actions": [action] * steps,
           "rewards": [0.5] * steps, "action_logp": [round(UNIFORM_LOGP.get(module, -0.7), 6)] * steps,
           "is_terminated": False, "is_truncated": False}
    out.update(kw)
    return out


def ma_record(agents: dict, episode_id: str = "ep-1", **flags: object) -> dict:
    return {"episode_id": episode_id, "is_terminated": bool(flags.get("is_terminated", False)),
            "is_truncated": bool(flags.get("is_truncated", False)), "agents": agents}


def batch(records: list, kind: str = "EPISODES_AND_GET_STATE", **top: object) -> dict:
    return {"type": kind, "episodes": records, **top}


def map_agents_cases() -> list[dict]:
    """MAP_AGENTS requests -> AGENT_MODULES answers, or ERROR codes (§7.10, §7.11)."""
    def case(name: str, *steps: dict) -> dict:
        return {"name": name, "server": LAYOUT, "steps": list(steps)}

    def ask(agent_ids: object, episode_id: object = "ep-1", **kw: object) -> dict:
        msg: dict = {"type": "MAP_AGENTS", "agent_ids": agent_ids}
        if episode_id is not None:
            msg["episode_id"] = episode_id
        return msg

    choices = ["chaser", "runner"]
    return [
        case("rules", send(ask(["adversary_0", "good_0", "pair"]), "AGENT_MODULES",
                           fields={"modules": {"adversary_0": "chaser", "good_0": "runner", "pair": "pairmod"}})),
        case("choose_from_depends_on_episode",
             send(ask(["car_0", "car_1"], "ep-1"), "AGENT_MODULES",
                  fields={"modules": {"car_0": _choose("ep-1", "car_0", choices), "car_1": _choose("ep-1", "car_1", choices)}}),
             send(ask(["car_0"], "ep-2"), "AGENT_MODULES", fields={"modules": {"car_0": _choose("ep-2", "car_0", choices)}})),
        case("no_episode_id_is_empty_string",
             send(ask(["car_0", "car_7"], None), "AGENT_MODULES",
                  fields={"modules": {"car_0": _choose("", "car_0", choices), "car_7": _choose("", "car_7", choices)}})),
        case("null_episode_id_is_empty_string",
             send({"type": "MAP_AGENTS", "episode_id": None, "agent_ids": ["car_7"]}, "AGENT_MODULES",
                  fields={"modules": {"car_7": _choose("", "car_7", choices)}})),
        case("empty_list", send(ask([]), "AGENT_MODULES", fields={"modules": {}})),
        case("repeated_id_answered_once", send(ask(["adversary_3", "adversary_3"]), "AGENT_MODULES",
                                               fields={"modules": {"adversary_3": "chaser"}})),
        case("unmapped_id", send(ask(["adversary_0", "zzz"]), "ERROR:UNMAPPED_AGENT", fields={"request": "MAP_AGENTS"})),
        case("group_member_id", send(ask(["m_0"]), "ERROR:GROUP_MEMBER_OUTSIDE_GROUP", fields={"request": "MAP_AGENTS"})),
        case("agent_ids_missing", send({"type": "MAP_AGENTS", "episode_id": "ep-1"}, "ERROR:INVALID_FIELD")),
        case("agent_ids_not_a_list", send(ask("adversary_0"), "ERROR:INVALID_FIELD")),
        case("agent_ids_not_strings", send(ask(["adversary_0", 7]), "ERROR:INVALID_FIELD")),
        case("error_keeps_connection", send(ask(["zzz"]), "ERROR:UNMAPPED_AGENT"),
             send(ask(["adversary_1"]), "AGENT_MODULES", fields={"modules": {"adversary_1": "chaser"}})),
        # §4.1: ids are Unicode text; half a surrogate pair is none.
        case("agent_id_lone_surrogate", send_text(ask(["adversary_0", "adversary_\ud800"]), "ERROR:INVALID_FIELD",
                                                  fields={"request": "MAP_AGENTS"})),
        case("episode_id_lone_surrogate", send_text(ask(["adversary_0"], "ep-\udc00"), "ERROR:INVALID_FIELD")),
        case("agent_id_surrogate_pair_is_text", send_text(ask(["adversary_\U0001F600"]), "AGENT_MODULES",
                                                          fields={"modules": {"adversary_\U0001F600": "chaser"}})),
    ]


def agent_modules_cases() -> list[dict]:
    """A client reading AGENT_MODULES, the answer to its MAP_AGENTS for `asked` (§7.10): the module
    of each asked id, or the error of the first id (in the order asked) that the answer fails."""
    described = ["chaser", "runner"]

    def case(name: str, asked: list, answer: object, modules: dict | None = None, error: str | None = None) -> dict:
        out: dict = {"name": name, "described": described, "asked": asked, "answer": answer}
        if error is None:
            out["modules"] = modules
        else:
            out["error"] = error
        return out

    def answer(modules: object) -> dict:
        return {"type": "AGENT_MODULES", "modules": modules}

    return [
        case("every_id_mapped", ["adversary_0", "good_0"], answer({"adversary_0": "chaser", "good_0": "runner"}),
             {"adversary_0": "chaser", "good_0": "runner"}),
        case("ids_not_asked_about_are_ignored", ["adversary_0"], answer({"adversary_0": "chaser", "zzz": "ghost",
                                                                         "good_0": 7}), {"adversary_0": "chaser"}),
        case("nothing_asked", [], answer({}), {}),
        case("id_left_out", ["adversary_0", "good_0"], answer({"adversary_0": "chaser"}), error="INVALID_FIELD"),
        case("module_not_a_string", ["adversary_0"], answer({"adversary_0": 7}), error="INVALID_FIELD"),
        case("module_null", ["adversary_0"], answer({"adversary_0": None}), error="INVALID_FIELD"),
        case("module_a_list", ["adversary_0"], answer({"adversary_0": ["chaser"]}), error="INVALID_FIELD"),
        case("modules_not_an_object", ["adversary_0"], answer([["adversary_0", "chaser"]]), error="INVALID_FIELD"),
        case("modules_missing", ["adversary_0"], {"type": "AGENT_MODULES"}, error="INVALID_FIELD"),
        case("modules_null", ["adversary_0"], answer(None), error="INVALID_FIELD"),
        case("answer_not_an_object", ["adversary_0"], None, error="INVALID_FIELD"),
        case("answer_a_list", ["adversary_0"], [answer({"adversary_0": "chaser"})], error="INVALID_FIELD"),
        case("type_missing", ["adversary_0"], {"modules": {"adversary_0": "chaser"}}, error="INVALID_FIELD"),
        case("type_not_a_string", ["adversary_0"], {"type": 7, "modules": {"adversary_0": "chaser"}},
             error="INVALID_FIELD"),
        # (a client asks about each id once; one asked twice gets its module each time)
        case("asked_twice", ["adversary_0", "adversary_0"], answer({"adversary_0": "chaser"}),
             {"adversary_0": "chaser"}),
        case("another_message", ["adversary_0"], {"type": "SET_CONFIG", "modules": {"adversary_0": "chaser"}},
             error="INVALID_FIELD"),
        case("module_not_described", ["adversary_0"], answer({"adversary_0": "ghost"}), error="UNKNOWN_MODULE"),
        case("module_empty_name", ["adversary_0"], answer({"adversary_0": ""}), error="UNKNOWN_MODULE"),
        case("module_name_differs_in_case", ["adversary_0"], answer({"adversary_0": "Chaser"}), error="UNKNOWN_MODULE"),
        # The first id that fails decides, whichever its failure.
        case("first_failing_id_decides_unknown_module", ["adversary_0", "good_0"], answer({"adversary_0": "ghost"}),
             error="UNKNOWN_MODULE"),
        case("first_failing_id_decides_left_out", ["adversary_0", "good_0"], answer({"good_0": "ghost"}),
             error="INVALID_FIELD"),
    ]


def multi_agent_session_cases() -> list[dict]:
    """The multi-agent checks that need the server's layout and state (§10.8 pass 2), as sessions."""
    def case(name: str, *steps: dict, received: int | None = None, server: dict | None = None) -> dict:
        out = {"name": name, "server": server or LAYOUT, "steps": list(steps)}
        if received is not None:
            out["received_agent_steps"] = received
        return out

    car = _choose("ep-1", "car_0", ["chaser", "runner"])
    other = "runner" if car == "chaser" else "chaser"
    done = entry("chaser", is_terminated=True)
    return [
        case("accepted", send(batch([ma_record({"adversary_0": entry("chaser"), "good_0": entry("runner"),
                                                "pair": entry("pairmod", width=6, action=[1, 0])})]),
                              "SET_STATE"), received=6),
        case("module_mismatch", send(batch([ma_record({"adversary_0": entry("runner")})]), "ERROR:MODULE_MISMATCH",
                                     fields={"request": "EPISODES_AND_GET_STATE"}), received=0),
        case("module_mismatch_choose_from", send(batch([ma_record({"car_0": entry(other)})]), "ERROR:MODULE_MISMATCH"),
             send(batch([ma_record({"car_0": entry(car)})]), "SET_STATE"), received=2),
        case("module_mismatch_in_episodes_answer_for_episodes",
             send(batch([ma_record({"adversary_0": entry("runner")})], "EPISODES"), "ERROR:MODULE_MISMATCH",
                  fields={"request": "EPISODES"})),
        case("unmapped_agent", send(batch([ma_record({"zzz": entry("chaser")})]), "ERROR:UNMAPPED_AGENT")),
        case("single_agent_record_without_default_module",
             send(batch([good_episode(2)]), "ERROR:UNMAPPED_AGENT")),
        # A single-agent record has no value_obs: refused for a default module with a centralized critic
        # (it would otherwise fail the update of every module), while multi-agent records train.
        case("single_agent_record_for_a_critic_module",
             send(batch([good_episode(2)]), "ERROR:OBS_SHAPE_MISMATCH"),
             send(batch([ma_record({"a": {**good_episode(2), "module": "critic", "value_obs": [[0.0] * 8] * 3}})]),
                  "SET_STATE"),
             received=2,
             server={"modules": {"critic": {**SINGLE, "value_obs_agents": ["a", "b"]}},
                     "policy_mapping": [{"pattern": "*", "module": "critic"}]}),
        case("group_member_outside_group",
             send(batch([ma_record({"m_0": entry("pairmod", width=6, action=[1, 0])})]), "ERROR:GROUP_MEMBER_OUTSIDE_GROUP")),
        case("group_member_reported_before_later_unmapped_entry",
             send(batch([ma_record({"m_1": entry("chaser"), "zzz": entry("chaser")})]), "ERROR:GROUP_MEMBER_OUTSIDE_GROUP")),
        case("unmapped_entry_reported_before_later_group_member",
             send(batch([ma_record({"zzz": entry("chaser"), "m_1": entry("chaser")})]), "ERROR:UNMAPPED_AGENT")),
        case("malformed_entry_before_mapping_problem",
             send(batch([ma_record({"zzz": entry("chaser"), "adversary_0": entry("chaser", width=2)})]),
                  "ERROR:OBS_SHAPE_MISMATCH")),
        case("agent_already_done_in_later_message",
             send(batch([ma_record({"adversary_0": done, "adversary_1": entry("chaser")})]), "SET_STATE"),
             send(batch([ma_record({"adversary_0": entry("chaser")})]), "ERROR:AGENT_ALREADY_DONE"), received=4),
        case("agent_already_done_in_same_message",
             send(batch([ma_record({"adversary_0": done}), ma_record({"adversary_0": entry("chaser")})]),
                  "ERROR:AGENT_ALREADY_DONE"), received=0),
        case("group_leaves_as_a_whole",
             send(batch([ma_record({"pair": entry("pairmod", width=6, action=[1, 0], is_truncated=True)})]), "SET_STATE"),
             send(batch([ma_record({"pair": entry("pairmod", width=6, action=[0, 0])})]), "ERROR:AGENT_ALREADY_DONE"),
             received=2),
        case("refused_message_keeps_no_done_state",
             send(batch([ma_record({"adversary_0": done, "zzz": entry("chaser")})]), "ERROR:UNMAPPED_AGENT"),
             send(batch([ma_record({"adversary_0": entry("chaser")})]), "SET_STATE"), received=2),
        case("episode_end_forgets_done_agents",
             send(batch([ma_record({"adversary_0": done}), ma_record({}, is_terminated=True)]), "SET_STATE"),
             send(batch([ma_record({"adversary_0": entry("chaser")})]), "SET_STATE"), received=4),
        case("done_state_is_per_episode",
             send(batch([ma_record({"adversary_0": done})]), "SET_STATE"),
             send(batch([ma_record({"adversary_0": entry("chaser")}, "ep-2")]), "SET_STATE"), received=4),
        case("done_state_is_per_connection_without_client_session",
             send(batch([ma_record({"adversary_0": done})]), "SET_STATE"), RECONNECT,
             send(batch([ma_record({"adversary_0": entry("chaser")})]), "SET_STATE"), received=4),
        case("closing_record_without_agents",
             send(batch([ma_record({"adversary_0": entry("chaser")}), ma_record({}, is_terminated=True)]), "SET_STATE"),
             received=2),
        # §4.1, §10.8: ids are Unicode text (half a surrogate pair is none), refused before anything is kept.
        case("finished_agent_id_lone_surrogate",
             send_text(batch([ma_record({"adversary_\ud800": done})]), "ERROR:INVALID_FIELD",
                       fields={"request": "EPISODES_AND_GET_STATE"}),
             send(batch([ma_record({"adversary_0": done})]), "SET_STATE"), received=2),
        case("agent_id_lone_surrogate_after_good_entry",
             send_text(batch([ma_record({"adversary_0": entry("chaser"), "\udfff": entry("chaser")})]),
                       "ERROR:INVALID_FIELD"), received=0),
        case("episode_id_lone_surrogate",
             send_text(batch([ma_record({"adversary_0": entry("chaser")}, "ep-\ud800")]), "ERROR:INVALID_FIELD"),
             received=0),
        case("module_lone_surrogate",
             send_text(batch([ma_record({"adversary_0": entry("chaser\ud800")})]), "ERROR:INVALID_FIELD"), received=0),
        case("surrogate_pair_ids_are_text",
             send_text(batch([ma_record({"adversary_\U0001F600": entry("chaser")}, "ep-\U0001F600")]), "SET_STATE"),
             received=2),
        # §10.5: booleans and numeric strings are no numbers (numpy-style conversion reads them as 1 and 1e30).
        case("entry_action_true", send(batch([ma_record({"adversary_0": entry("chaser", action=True)})]),
                                       "ERROR:INVALID_FIELD"), received=0),
        case("entry_reward_false", send(batch([ma_record({"adversary_0": entry("chaser", rewards=[0.5, False])})]),
                                        "ERROR:INVALID_FIELD"), received=0),
        case("entry_obs_true", send(batch([ma_record({"adversary_0": entry("chaser", obs=[[0.1, True, 0.1]] * 3)})]),
                                    "ERROR:INVALID_FIELD"), received=0),
        case("entry_logp_numeric_string",
             send(batch([ma_record({"adversary_0": entry("chaser", action_logp=["-0.693147", -0.693147])})]),
                  "ERROR:INVALID_FIELD"), received=0),
        case("entry_multidiscrete_action_false",
             send(batch([ma_record({"pair": entry("pairmod", width=6, action=[1, False])})]), "ERROR:INVALID_FIELD"),
             received=0),
        case("single_agent_action_true", send(batch([good_episode(2, actions=[True, 0])]), "ERROR:INVALID_FIELD"),
             received=0, server=SINGLE),
        case("single_agent_dist_inputs_false",
             send(batch([good_episode(2, action_dist_inputs=[[0.1, False], [0.1, -0.1]])]), "ERROR:INVALID_FIELD"),
             received=0, server=SINGLE),
        case("single_agent_reward_numeric_string", send(batch([good_episode(2, rewards=["1e30", 1.0])]),
                                                        "ERROR:INVALID_FIELD"), received=0, server=SINGLE),
        case("single_agent_integers_are_numbers",
             send(batch([good_episode(2, obs=[[0, 1, 0, 1]] * 3, rewards=[1, 0])]), "SET_STATE"),
             received=2, server=SINGLE),
    ]


def exactly_once_cases() -> list[dict]:
    """1.3 exactly-once batches (§7.7, §13.5): client_session + batch_seq, duplicates stored once."""
    def case(name: str, *steps: dict, received: int | None = None, server: dict | None = None) -> dict:
        out = {"name": name, "server": server or SINGLE, "steps": list(steps)}
        if received is not None:
            out["received_agent_steps"] = received
        return out

    def ids(session: object = "9f1c2a", seq: object = 1) -> dict:
        return {"client_session": session, "batch_seq": seq}

    good = [good_episode(3)]
    bad = [good_episode(3, actions=[0, 5, 1])]
    ping = {"type": "PING", "protocol_version": "1.3"}
    same = {"weights_seq_no": 0}
    return [
        case("duplicate_answered_alike_stored_once",
             send(batch(good, **ids()), "SET_STATE", fields=same, present=["onnx_file"]),
             send(batch(good, **ids()), "SET_STATE", fields=same, present=["onnx_file"], same_answer_as=0), received=3),
        case("duplicate_after_reconnect",
             send(ping, "PONG"), send(batch(good, weights_seq_no=0, **ids()), "SET_STATE", fields=same, absent=["onnx_file"]),
             RECONNECT, send(ping, "PONG"),
             send(batch(good, weights_seq_no=0, **ids()), "SET_STATE", fields=same, absent=["onnx_file"],
                  same_answer_as=1), received=3),
        case("duplicate_per_module_answer",
             send(batch(good, weights_seq_nos={}, **ids()), "SET_STATE", present=["models.default_policy.onnx_file"]),
             send(batch(good, weights_seq_nos={}, **ids()), "SET_STATE", same_answer_as=0), received=3),
        case("duplicate_episodes_has_no_answer",
             send(batch(good, "EPISODES", **ids()), None), send(batch(good, "EPISODES", **ids()), None), received=3),
        case("lower_seq_is_a_duplicate",
             send(batch(good, **ids(seq=1)), "SET_STATE"), send(batch(good, **ids(seq=2)), "SET_STATE"),
             send(batch(good, **ids(seq=1)), "SET_STATE"), received=6),
        case("gap_in_seq_is_new_and_raises_the_mark",
             send(batch(good, **ids(seq=1)), "SET_STATE"), send(batch(good, **ids(seq=5)), "SET_STATE"),
             send(batch(good, **ids(seq=3)), "SET_STATE"), send(batch(good, **ids(seq=6)), "SET_STATE"), received=9),
        case("sessions_are_independent",
             send(batch(good, **ids("a")), "SET_STATE"), send(batch(good, **ids("b")), "SET_STATE"), received=6),
        case("refused_batch_does_not_advance",
             send(batch(bad, **ids()), "ERROR:ACTION_OUT_OF_SPACE"), send(batch(good, **ids()), "SET_STATE"), received=3),
        case("duplicate_checked_before_episodes",
             send(batch(good, **ids()), "SET_STATE"), send(batch(bad, **ids()), "SET_STATE"), received=3),
        case("without_ids_every_batch_is_new",
             send(batch(good), "SET_STATE"), send(batch(good), "SET_STATE"), received=6),
        case("session_of_128_characters", send(batch(good, **ids("s" * 128)), "SET_STATE"), received=3),
        case("session_too_long", send(batch(good, **ids("s" * 129)), "ERROR:INVALID_FIELD"), received=0),
        case("session_empty", send(batch(good, **ids("")), "ERROR:INVALID_FIELD"), received=0),
        case("session_not_a_string", send(batch(good, **ids(17)), "ERROR:INVALID_FIELD"), received=0),
        case("session_lone_surrogate", send_text(batch(good, **ids("9f1c\ud800")), "ERROR:INVALID_FIELD"), received=0),
        case("seq_zero", send(batch(good, **ids(seq=0)), "ERROR:INVALID_FIELD"), received=0),
        case("seq_not_an_integer", send(batch(good, **ids(seq=1.5)), "ERROR:INVALID_FIELD"), received=0),
        case("seq_a_string", send(batch(good, **ids(seq="1")), "ERROR:INVALID_FIELD"), received=0),
        case("seq_a_boolean", send(batch(good, **ids(seq=True)), "ERROR:INVALID_FIELD"), received=0),
        case("only_session", send(batch(good, client_session="9f1c2a"), "ERROR:INVALID_FIELD"), received=0),
        case("only_seq", send(batch(good, batch_seq=1), "ERROR:INVALID_FIELD"), received=0),
        case("only_seq_in_episodes", send(batch(good, "EPISODES", batch_seq=1), "ERROR:INVALID_FIELD",
                                          fields={"request": "EPISODES"}), received=0),
        case("done_state_survives_reconnect_with_client_session",
             send(batch([ma_record({"adversary_0": entry("chaser", is_terminated=True)})], **ids()), "SET_STATE"),
             RECONNECT,
             send(batch([ma_record({"adversary_0": entry("chaser")})], **ids(seq=2)), "ERROR:AGENT_ALREADY_DONE"),
             server=LAYOUT, received=2),
    ]


def set_state_cases() -> list[dict]:
    """When SET_STATE may omit the model (§7.6): only for a client that announced a protocol version
    and claims, as a JSON integer, the weights the server serves, or [1.3] claims nothing and was
    already sent them on this connection."""
    def case(name: str, *steps: dict) -> dict:
        return {"name": name, "server": SINGLE, "steps": list(steps)}

    v13 = send({"type": "PING", "protocol_version": "1.3"}, "PONG")
    bare = send({"type": "PING"}, "PONG")

    def get(claim: object = "absent", key: str = "weights_seq_no") -> dict:
        msg: dict = {"type": "GET_STATE"}
        if claim != "absent":
            msg[key] = claim
        return msg

    model, no_model = {"present": ["onnx_file"]}, {"absent": ["onnx_file"]}
    return [
        case("v1_client_always_gets_model", send(get(), "SET_STATE", fields={"weights_seq_no": 0}, **model)),
        case("v1_client_claiming_current_still_gets_model", bare, send(get(0), "SET_STATE", **model)),
        case("no_ping_claiming_current_gets_model", send(get(0), "SET_STATE", **model)),
        case("announced_client_without_claim", v13, send(get(), "SET_STATE", **model)),
        case("announced_client_claiming_current", v13, send(get(0), "SET_STATE", fields={"weights_seq_no": 0}, **no_model)),
        case("announced_client_claiming_other", v13, send(get(4), "SET_STATE", fields={"weights_seq_no": 0}, **model)),
        case("claim_as_float_is_not_held", v13, send(get(0.0), "SET_STATE", **model)),
        case("claim_as_string_is_not_held", v13, send(get("0"), "SET_STATE", **model)),
        case("claim_false_is_not_zero", v13, send(get(False), "SET_STATE", **model)),
        case("episodes_and_get_state_claiming_current", v13,
             send(batch([good_episode(2)], weights_seq_no=0), "SET_STATE", **no_model)),
        case("per_module_empty_claims_every_model",
             send(get({}, "weights_seq_nos"), "SET_STATE", present=["models.default_policy.onnx_file"],
                  absent=["onnx_file", "weights_seq_no"])),
        case("per_module_held_is_left_out_even_without_version",
             send(get({"default_policy": 0}, "weights_seq_nos"), "SET_STATE", fields={"models": {}})),
        case("per_module_float_claim_is_not_held",
             send(get({"default_policy": 0.0}, "weights_seq_nos"), "SET_STATE",
                  present=["models.default_policy.onnx_file"])),
        case("per_module_unknown_module_ignored",
             send(get({"default_policy": 0, "nope": 3}, "weights_seq_nos"), "SET_STATE", fields={"models": {}})),
        case("per_module_form_wins_over_single_claim", v13,
             send({"type": "GET_STATE", "weights_seq_no": 0, "weights_seq_nos": {}}, "SET_STATE",
                  present=["models.default_policy.onnx_file"], absent=["onnx_file"])),
        # [1.3] A model is sent once per version and connection to a client that announced a version:
        # a request without a claim counts as claiming what this connection was last sent.
        case("announced_client_asking_again_gets_no_model", v13, send(get(), "SET_STATE", **model),
             send(get(), "SET_STATE", fields={"weights_seq_no": 0}, **no_model)),
        case("announced_client_claiming_other_after_its_model_gets_it_again", v13, send(get(), "SET_STATE", **model),
             send(get(3), "SET_STATE", **model)),
        case("v1_client_asking_again_still_gets_model", send(get(), "SET_STATE", **model),
             send(get(), "SET_STATE", **model)),
        case("per_module_empty_again_on_the_same_connection_lists_nothing", v13,
             send(get({}, "weights_seq_nos"), "SET_STATE", present=["models.default_policy.onnx_file"]),
             send(get({}, "weights_seq_nos"), "SET_STATE", fields={"models": {}})),
        case("per_module_empty_again_without_version_sends_every_model",
             send(get({}, "weights_seq_nos"), "SET_STATE", present=["models.default_policy.onnx_file"]),
             send(get({}, "weights_seq_nos"), "SET_STATE", present=["models.default_policy.onnx_file"])),
    ]


def connection_cases() -> list[dict]:
    """1.3 liveness and connection limits (§6.2, §6.6, §3.2). Extra step kinds: "then_closed" (after
    the answer the server closes the connection), "send_hex" (raw bytes instead of a message),
    {"wait_unsolicited": ..., "within_s": ...} (an ERROR the server writes on its own), and
    {"extra_connection": {...}} (open one more connection and read what the server writes on it)."""
    token = {"auth_token": "s3cret"}
    ok_ping = {"type": "PING", "protocol_version": "1.3", "auth_token": "s3cret"}

    def case(name: str, server: dict, *steps: dict) -> dict:
        return {"name": name, "server": {**SINGLE, **server}, "steps": list(steps)}

    padded = lambda kind, size: {"type": kind, "pad": "x" * (size - len(json.dumps({"type": kind, "pad": ""}, separators=(",", ":"))))}  # noqa: E731
    at_limit = padded("GET_CONFIG", 65536)
    assert len(json.dumps(at_limit, separators=(",", ":"))) == 65536
    return [
        case("set_config_announces_heartbeat", {"client_timeout_s": 60},
             send({"type": "GET_CONFIG"}, "SET_CONFIG", fields={"client_timeout_s": 60, "heartbeat_interval_s": 15})),
        case("set_config_announces_session_state_ttl", {"session_state_ttl_s": 120},
             send({"type": "GET_CONFIG"}, "SET_CONFIG", fields={"session_state_ttl_s": 120})),
        case("heartbeat_ping_after_handshake", {},
             send({"type": "PING", "protocol_version": "1.3"}, "PONG"), send({"type": "GET_CONFIG"}, "SET_CONFIG"),
             send({"type": "PING"}, "PONG"), send({"type": "PING"}, "PONG")),
        case("wrong_token_closes", token,
             send({"type": "PING", "protocol_version": "1.3", "auth_token": "guess"}, "ERROR:AUTH_FAILED",
                  fields={"request": "PING"}, then_closed=True),
             RECONNECT, send(ok_ping, "PONG")),
        case("missing_token_keeps_connection", token,
             send({"type": "PING", "protocol_version": "1.3"}, "ERROR:AUTH_FAILED", fields={"request": "PING"}),
             send(ok_ping, "PONG")),
        case("wrong_token_type_closes", token,
             send({"type": "PING", "auth_token": 12345}, "ERROR:AUTH_FAILED", then_closed=True)),
        case("request_before_auth_keeps_connection", token,
             send({"type": "GET_CONFIG"}, "ERROR:AUTH_FAILED", fields={"request": "GET_CONFIG"}),
             send(ok_ping, "PONG"), send({"type": "GET_CONFIG"}, "SET_CONFIG")),
        case("pre_auth_frame_over_64KiB_refused", token,
             {"send_hex": b"00065537".hex(), "expect": "ERROR:FRAME_TOO_LARGE", "absent": ["request"],
              "then_closed": True}),
        # Raw bytes: the body is exactly 65,536 bytes only as written here (JSON allows spaces, §4.1,
        # and a runner that re-encodes the message with them would send a larger frame).
        case("pre_auth_frame_at_64KiB_read", token,
             {"send_hex": frame(json.dumps(at_limit, separators=(",", ":"))).hex(), "expect": "ERROR:AUTH_FAILED",
              "fields": {"request": "GET_CONFIG"}}, send(ok_ping, "PONG")),
        case("after_auth_full_frame_limit", token,
             send(ok_ping, "PONG"), send(padded("PING", 200_000), "PONG")),
        case("no_auth_token_no_pre_auth_limit", {}, send(padded("PING", 200_000), "PONG")),
        case("client_timeout", {"client_timeout_s": 0.5},
             send({"type": "PING", "protocol_version": "1.3"}, "PONG"),
             {"wait_unsolicited": "ERROR:CLIENT_TIMEOUT", "within_s": 5, "absent": ["request"], "then_closed": True}),
        case("handshake_timeout", {**token, "handshake_timeout_s": 0.5},
             {"wait_unsolicited": "ERROR:HANDSHAKE_TIMEOUT", "within_s": 5, "absent": ["request"],
              "then_closed": True}),
        # §4.2: more than 64 levels of arrays and objects is refused before parsing, as invalid JSON
        # (no "request": the server cannot know what the body was); the connection stays open.
        case("nesting_65_levels_refused", {},
             {"send_hex": frame('{"type": "PING", "x": ' + "[" * 64 + "]" * 64 + "}").hex(), "expect": "ERROR:INVALID_JSON",
              "absent": ["request"]},
             send({"type": "PING"}, "PONG")),
        case("nesting_64_levels_read", {},
             {"send_hex": frame('{"type": "PING", "x": ' + "[" * 63 + "]" * 63 + "}").hex(), "expect": "PONG"}),
        # 1.8: every PONG of one run names it, on every connection (§7.2).
        case("pong_names_the_run", {},
             send({"type": "PING", "protocol_version": "1.8"}, "PONG", present=["run_id"]), RECONNECT,
             send({"type": "PING", "protocol_version": "1.8"}, "PONG", same_answer_as=0),
             send({"type": "PING"}, "PONG", same_answer_as=0)),
        case("too_many_connections", {"max_connections": 1},
             send({"type": "PING"}, "PONG"),
             {"extra_connection": {"wait_unsolicited": "ERROR:TOO_MANY_CONNECTIONS", "within_s": 5,
                                   "absent": ["request"], "then_closed": True}},
             send({"type": "PING"}, "PONG")),
    ]


def counting_cases() -> list[dict]:
    """1.3 counting (§10.2): agent steps from the records, env steps from a 1.3 message's env_steps."""
    def case(name: str, server: dict, *steps: dict, env: int, agent: int) -> dict:
        return {"name": name, "server": server, "steps": list(steps), "received_env_steps": env,
                "received_agent_steps": agent}

    three = {f"adversary_{i}": entry("chaser") for i in range(3)}  # 3 agents x 2 steps, in 2 env steps
    return [
        case("single_agent", SINGLE, send(batch([good_episode(3)], env_steps=3, agent_steps=3), "SET_STATE"),
             env=3, agent=3),
        case("v1_message_without_counts", SINGLE, send(batch([good_episode(3)]), "SET_STATE"), env=3, agent=3),
        case("parallel_agents", LAYOUT, send(batch([ma_record(three)], env_steps=2, agent_steps=6), "SET_STATE"),
             env=2, agent=6),
        case("duplicate_counts_once", LAYOUT,
             send(batch([ma_record(three)], env_steps=2, agent_steps=6, client_session="c", batch_seq=1), "SET_STATE"),
             send(batch([ma_record(three)], env_steps=2, agent_steps=6, client_session="c", batch_seq=1), "SET_STATE"),
             env=2, agent=6),
        case("refused_counts_nothing", LAYOUT,
             send(batch([ma_record({**three, "zzz": entry("chaser")})], env_steps=2, agent_steps=8),
                  "ERROR:UNMAPPED_AGENT"), env=0, agent=0),
        case("claimed_agent_steps_not_trusted", SINGLE,
             send(batch([good_episode(3)], env_steps=3, agent_steps=1000), "SET_STATE"), env=3, agent=3),
    ]


def client_pairing_cases() -> list[dict]:
    """How a client pairs what it receives with what it sent (§5.3, §5.4): the request types sent, in
    order, and the bodies received -> for each body, the request type it answers (null: none), or
    "violation" when the server broke the protocol (the client stops using the connection)."""
    def err(code: str, request: str | None = None) -> dict:
        body = {"type": "ERROR", "code": code, "message": "m"}
        if request is not None:
            body["request"] = request
        return body

    def case(name: str, sent: list[str], received: list[dict], pairs: list | None = None) -> dict:
        out: dict = {"name": name, "sent": sent, "received": received}
        if pairs is None:
            out["violation"] = True
        else:
            out["pairs"] = pairs
        return out

    state = {"type": "SET_STATE", "weights_seq_no": 0}
    return [
        case("one_request", ["PING"], [{"type": "PONG"}], ["PING"]),
        case("in_order", ["PING", "GET_CONFIG", "GET_STATE"],
             [{"type": "PONG"}, {"type": "SET_CONFIG", "env_steps_per_sample": 1, "force_on_policy": True}, state],
             ["PING", "GET_CONFIG", "GET_STATE"]),
        case("episodes_has_no_answer", ["EPISODES", "PING"], [{"type": "PONG"}], ["PING"]),
        case("error_answers_oldest", ["GET_STATE", "PING"], [err("AUTH_FAILED", "GET_STATE"), {"type": "PONG"}],
             ["GET_STATE", "PING"]),
        case("error_for_episodes_pairs_with_nothing", ["EPISODES", "GET_STATE"],
             [err("ACTION_OUT_OF_SPACE", "EPISODES"), state], [None, "GET_STATE"]),
        case("error_when_nothing_outstanding", [], [err("ACTION_OUT_OF_SPACE", "EPISODES")], [None]),
        case("body_error_without_request_answers_oldest", ["GET_STATE"], [err("INVALID_JSON")], ["GET_STATE"]),
        case("map_agents", ["MAP_AGENTS"], [{"type": "AGENT_MODULES", "modules": {}}], ["MAP_AGENTS"]),
        case("unknown_error_code_answers_oldest", ["GET_STATE"], [err("SOME_FUTURE_CODE", "GET_STATE")], ["GET_STATE"]),
        # "request" naming another type: pairing goes by order all the same (§5.3 step 2).
        case("error_naming_another_request_answers_oldest", ["GET_STATE", "PING"],
             [err("AUTH_FAILED", "PING"), {"type": "PONG"}], ["GET_STATE", "PING"]),
        # 1.3: connection-level refusals answer nothing; the outstanding request stays unanswered.
        case("client_timeout_answers_nothing", ["EPISODES_AND_GET_STATE"], [err("CLIENT_TIMEOUT")], [None]),
        case("too_many_connections_answers_nothing", ["PING"], [err("TOO_MANY_CONNECTIONS")], [None]),
        case("handshake_timeout_answers_nothing", ["PING"], [err("HANDSHAKE_TIMEOUT")], [None]),
        case("server_overloaded_answers_nothing", ["EPISODES_AND_GET_STATE"], [err("SERVER_OVERLOADED")], [None]),
        case("framing_error_report_answers_nothing", ["GET_STATE"], [err("BAD_HEADER")], [None]),
        case("training_done_answers_nothing", ["EPISODES_AND_GET_STATE"], [err("TRAINING_DONE")], [None]),
        case("unsolicited_response", [], [{"type": "PONG"}]),
        case("wrong_response_type", ["PING"], [state]),
        case("response_for_episodes", ["EPISODES"], [state]),
    ]


def run_id_cases() -> list[dict]:
    """1.8: whether steps whose versions were learned on a connection to run ``acted_in`` are sent on a
    connection to run ``connected_to`` (§6.5): dropped only when both runs are named and differ.
    Values are PONG's ``run_id`` members as received (null: absent); one that is not a non-empty
    string counts as absent (§7.2)."""
    def case(name: str, acted_in: object, connected_to: object, send: bool) -> dict:
        return {"name": name, "acted_in": acted_in, "connected_to": connected_to, "send": send}

    run_a, run_b = "5f0c8e2a9b7d4c1e8f3a6b2d9c0e7f41", "0b9d27c4e1f64a3c9e8d7b6a5f4e3d21"
    return [
        case("same_run_sent", run_a, run_a, True),
        case("another_run_dropped", run_a, run_b, False),
        case("compared_exactly", "run-A", "run-a", False),
        case("new_server_names_no_run_sent", run_a, None, True),
        case("old_server_named_no_run_sent", None, run_b, True),
        case("neither_names_a_run_sent", None, None, True),
        case("empty_string_is_absent", "", run_b, True),
        case("non_string_is_absent", 7, run_b, True),
    ]


def rank_address_cases() -> list[dict]:
    """1.9: a group's addresses (§6.7). ``parse``: what a rank's address string reads as (null: not an
    address). ``pong``: what a client takes from a PONG on the connection to ``current`` (made on a
    redirect when ``redirected``): the ranks to remember and the rank to move to (null: stay).
    ``reconnect``: after the connection to ``lost`` ended, where the first attempts go."""
    def parse(name: str, value: object, address: list | None) -> dict:
        return {"name": name, "kind": "parse", "value": value, "address": address}

    def pong(name: str, body: dict, current: str, redirected: bool, ranks: list, follow: list | None) -> dict:
        return {"name": name, "kind": "pong", "pong": {"type": "PONG", "protocol_version": "1.9", **body},
                "current": current, "redirected": redirected, "ranks": ranks, "follow": follow}

    def reconnect(name: str, given: str, ranks: list[str], lost: str, attempts: list[str]) -> dict:
        return {"name": name, "kind": "reconnect", "given": given, "ranks": ranks, "lost": lost,
                "attempts": attempts}

    group = {"ranks": ["10.0.0.5:9100", "10.0.0.5:9101", "10.0.0.6:9100"]}
    group_parsed = [["10.0.0.5", 9100], ["10.0.0.5", 9101], ["10.0.0.6", 9100]]
    return [
        parse("ipv4_host", "10.0.0.5:9100", ["10.0.0.5", 9100]),
        parse("dns_name", "trainer-0.tether.svc:9100", ["trainer-0.tether.svc", 9100]),
        parse("ipv6_in_brackets", "[fd00::5]:9100", ["fd00::5", 9100]),
        parse("highest_port", "h:65535", ["h", 65535]),
        parse("port_zero", "h:0", None),
        parse("port_too_high", "h:65536", None),
        parse("port_signed", "h:+9100", None),
        parse("port_not_decimal", "h:91a0", None),
        parse("port_fullwidth_digits", "h:\uff19\uff11", None),
        parse("no_port", "trainer-0", None),
        parse("empty_host", ":9100", None),
        parse("ipv6_without_brackets", "fd00::5:9100", None),
        parse("empty_brackets", "[]:9100", None),
        parse("host_with_space", "a b:9100", None),
        parse("not_a_string", 9100, None),
        parse("leading_zero_port", "h:09100", ["h", 9100]),
        parse("six_digit_port", "h:009100", None),
        parse("longest_address", "h" * 294 + ":65535", ["h" * 294, 65535]),
        parse("address_too_long", "h" * 295 + ":65535", None),
        parse("unicode_space_in_host", "a\u3000b:9100", None),
        parse("null", None, None),
        pong("single_server_names_no_ranks", {"run_id": "r"}, "127.0.0.1:9000", False, [], None),
        pong("group_without_redirect", group, "10.0.0.5:9100", False, group_parsed, None),
        pong("redirect_followed", {**group, "redirect": "10.0.0.6:9100"}, "10.0.0.5:9100", False,
             group_parsed, ["10.0.0.6", 9100]),
        pong("redirect_after_a_redirect_ignored", {**group, "redirect": "10.0.0.5:9101"}, "10.0.0.6:9100", True,
             group_parsed, None),
        pong("redirect_to_itself_ignored", {**group, "redirect": "10.0.0.5:9100"}, "10.0.0.5:9100", False,
             group_parsed, None),
        pong("invalid_redirect_ignored", {**group, "redirect": "10.0.0.6"}, "10.0.0.5:9100", False,
             group_parsed, None),
        pong("redirect_outside_ranks_followed", {"redirect": "10.0.0.7:9100"}, "10.0.0.5:9100", False, [],
             ["10.0.0.7", 9100]),
        pong("invalid_and_repeated_ranks_left_out",
             {"ranks": ["10.0.0.5:9100", "nonsense", 7, "10.0.0.5:9100", "[fd00::6]:9100"]}, "10.0.0.5:9100",
             False, [["10.0.0.5", 9100], ["fd00::6", 9100]], None),
        pong("ranks_not_an_array", {"ranks": "10.0.0.5:9100"}, "10.0.0.5:9100", False, [], None),
        reconnect("first_attempt_retries_the_lost_rank", "10.0.0.5:9100", group["ranks"], "10.0.0.5:9101",
                  ["10.0.0.5:9101", "10.0.0.6:9100", "10.0.0.5:9100", "10.0.0.5:9101"]),
        reconnect("given_address_leads_the_candidates", "lb.example:9000", group["ranks"], "10.0.0.6:9100",
                  ["10.0.0.6:9100", "lb.example:9000", "10.0.0.5:9100", "10.0.0.5:9101", "10.0.0.6:9100"]),
        reconnect("no_ranks_known_retries_the_given", "127.0.0.1:9000", [], "127.0.0.1:9000",
                  ["127.0.0.1:9000", "127.0.0.1:9000"]),
        reconnect("lost_address_not_a_candidate_heads_the_list", "10.0.0.5:9100", ["10.0.0.5:9100"],
                  "10.0.0.9:9100", ["10.0.0.9:9100", "10.0.0.5:9100", "10.0.0.9:9100"]),
    ]


# -- client-side transforms -----------------------------------------------------------------------------

def group_cases() -> list[dict]:
    """Groups as a client hides them (§9.6): observations joined, actions split, rewards combined, spaces.
    "error": INVALID_FIELD (§14) for member spaces a client refuses in SET_CONFIG; LOCAL_INVALID_ARGUMENT
    (no wire code: the engine called the client wrongly) for a member observation that is missing."""
    d = lambda n: {"type": "Discrete", "n": n}  # noqa: E731
    b = lambda shape, lo, hi: {"type": "Box", "shape": shape, "low": lo, "high": hi}  # noqa: E731
    pair = {"members": ["m_0", "m_1"], "reward": "sum"}
    trio_mean = {"members": ["c", "a", "b"], "reward": "mean"}
    return [
        {"name": "observation_concat_in_member_order", "group": pair,
         "member_observations": {"m_1": [3.0, 4.0, 5.0], "m_0": [0.0, 1.0, 2.0]},
         "group_observation": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]},
        {"name": "observation_flattened_row_major", "group": pair,
         "member_observations": {"m_0": [[1.0, 2.0], [3.0, 4.0]], "m_1": [5.0]},
         "group_observation": [1.0, 2.0, 3.0, 4.0, 5.0]},
        {"name": "observation_member_missing", "group": pair, "member_observations": {"m_0": [0.0]},
         "error": "LOCAL_INVALID_ARGUMENT"},
        {"name": "action_split_discrete_members", "group": pair, "group_action_space": {"type": "MultiDiscrete", "nvec": [2, 3]},
         "group_action": [1, 2], "member_actions": {"m_0": 1, "m_1": 2}},
        {"name": "action_split_multidiscrete_members", "group": pair,
         "group_action_space": {"type": "MultiDiscrete", "nvec": [2, 3, 4, 5]},
         "group_action": [1, 2, 3, 4], "member_actions": {"m_0": [1, 2], "m_1": [3, 4]}},
        {"name": "action_split_box_members", "group": pair, "group_action_space": b([4], -1, 1),
         "group_action": [0.5, -0.25, 1.0, 0.0], "member_actions": {"m_0": [0.5, -0.25], "m_1": [1.0, 0.0]}},
        {"name": "action_split_box_one_element_stays_array", "group": pair, "group_action_space": b([2], -1, 1),
         "group_action": [0.5, -0.25], "member_actions": {"m_0": [0.5], "m_1": [-0.25]}},
        {"name": "action_split_three_members", "group": trio_mean, "group_action_space": {"type": "MultiDiscrete", "nvec": [2, 2, 2]},
         "group_action": [1, 0, 1], "member_actions": {"c": 1, "a": 0, "b": 1}},
        {"name": "reward_sum", "group": pair, "member_rewards": [{"m_0": 1.0, "m_1": 2.0}, {"m_0": 0.5}],
         "group_reward": 3.5},
        {"name": "reward_mean", "group": trio_mean, "member_rewards": [{"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 3.0}],
         "group_reward": 3.0},
        {"name": "reward_default_is_sum", "group": {"members": ["x", "y"]}, "member_rewards": [{"x": 1.0, "y": 1.0}],
         "group_reward": 2.0},
        {"name": "spaces_discrete_members", "member_observation_spaces": [b([2], -1, 1), b([2], [0, 0], [5, 6])],
         "member_action_spaces": [d(2), d(3)],
         "group_observation_space": {"type": "Box", "shape": [4], "dtype": "float32", "low": [-1, -1, 0, 0], "high": [1, 1, 5, 6]},
         "group_action_space": {"type": "MultiDiscrete", "nvec": [2, 3]}},
        {"name": "spaces_multidiscrete_and_discrete", "member_observation_spaces": [b([1], -1, 1), b([1], -1, 1)],
         "member_action_spaces": [{"type": "MultiDiscrete", "nvec": [2, 2]}, d(4)],
         "group_observation_space": {"type": "Box", "shape": [2], "dtype": "float32", "low": -1, "high": 1},
         "group_action_space": {"type": "MultiDiscrete", "nvec": [2, 2, 4]}},
        {"name": "spaces_box_members", "member_observation_spaces": [b([1], -1, 1), b([1], -2, 2)],
         "member_action_spaces": [b([2], -1, 1), b([2], 0, 1)],
         "group_observation_space": {"type": "Box", "shape": [2], "dtype": "float32", "low": [-1, -2], "high": [1, 2]},
         "group_action_space": {"type": "Box", "shape": [4], "dtype": "float32", "low": [-1, -1, 0, 0], "high": 1}},
        {"name": "spaces_mixed_actions_refused", "member_observation_spaces": [b([1], -1, 1), b([1], -1, 1)],
         "member_action_spaces": [d(2), b([1], -1, 1)], "error": "INVALID_FIELD"},
        {"name": "spaces_discrete_with_start_refused", "member_observation_spaces": [b([1], -1, 1), b([1], -1, 1)],
         "member_action_spaces": [{"type": "Discrete", "n": 2, "start": 1}, d(2)], "error": "INVALID_FIELD"},
    ]


def value_obs_cases() -> list[dict]:
    """Centralized-critic rows (§9.7): for each listed agent, its latest observation in the episode
    (this step's included), zeros before its first; an agent that left keeps its final one."""
    return [
        {"name": "all_observed_each_step", "value_obs_agents": ["a", "b"], "obs_dim": 2,
         "steps": [{"observe": {"a": [1, 2], "b": [3, 4]}, "row": [1, 2, 3, 4]},
                   {"observe": {"b": [5, 6], "a": [7, 8]}, "row": [7, 8, 5, 6]}]},
        {"name": "not_yet_observed_is_zeros", "value_obs_agents": ["a", "b", "c"], "obs_dim": 1,
         "steps": [{"observe": {"b": [2]}, "row": [0, 2, 0]}, {"observe": {"a": [1]}, "row": [1, 2, 0]}]},
        {"name": "latest_observation_kept_between_steps", "value_obs_agents": ["a", "b"], "obs_dim": 1,
         "steps": [{"observe": {"a": [1], "b": [2]}, "row": [1, 2]}, {"observe": {"a": [3]}, "row": [3, 2]},
                   {"observe": {"a": [4]}, "row": [4, 2]}]},
        {"name": "agent_that_left_keeps_final_observation", "value_obs_agents": ["a", "b"], "obs_dim": 1,
         "steps": [{"observe": {"a": [1], "b": [2]}, "row": [1, 2]}, {"leave": {"b": [9]}, "row": [1, 9]},
                   {"observe": {"a": [5]}, "row": [5, 9]}]},
        {"name": "list_order_not_observation_order", "value_obs_agents": ["z", "a"], "obs_dim": 2,
         "steps": [{"observe": {"a": [1, 1], "z": [2, 2]}, "row": [2, 2, 1, 1]}]},
        {"name": "unlisted_agents_ignored", "value_obs_agents": ["a"], "obs_dim": 1,
         "steps": [{"observe": {"a": [1], "x": [7]}, "row": [1]}]},
    ]


def logged_cases() -> list[dict]:
    """1.6 §10.1, §10.6 check 20, §10.7: logged steps.

    kind "episode": a single-agent record with ``logged_runs`` -> its steps and the logged step
    indices, or the server's code. kind "agent_entry": the same inside a multi-agent record's agent
    entry (the entry's own step indices). kind "record": what a client records: a sequence of
    ``calls`` ("sample" or "log", one per step, of one episode) cut into records after each count of
    ``cuts`` steps (the last record takes the rest) -> each record's ``logged_runs`` (null: the field
    is absent, every step sampled). Runs are written merged: adjacent logged steps are one run."""
    box2 = {"type": "Box", "shape": [2], "low": -1, "high": 1}
    disc3 = {"type": "Discrete", "n": 3}

    def record(steps: int, runs: object) -> dict:
        rec = {"obs": [[0.5, -0.5]] * (steps + 1), "actions": [2] * steps, "rewards": [1.0] * steps,
               "action_logp": [0.0] * steps, "action_dist_inputs": [[0.0, 0.0, 0.0]] * steps,
               "is_terminated": False, "is_truncated": False}
        if runs != "absent":
            rec["logged_runs"] = runs
        return rec

    def expected(steps: int, runs: object) -> list[int]:
        if not isinstance(runs, list):
            return []
        return [t for start, n in runs for t in range(start, start + n)]

    def episode(name: str, steps: int, runs: object, error: str | None = None, **extra: object) -> dict:
        rec = record(steps, runs)
        rec.update(extra)
        out = {"name": name, "kind": "episode", "observation_space": box2, "action_space": disc3,
               "require_logp": True, "body": json.dumps({"type": "EPISODES_AND_GET_STATE", "episodes": [rec]})}
        if error:
            return {**out, "error": error}
        return {**out, "env_steps": steps, "logged_steps": expected(steps, runs)}

    def agent_entry(name: str, steps: int, runs: object, error: str | None = None) -> dict:
        entry = {"module": "m", "start_step": 0, **record(steps, runs)}
        rec = {"episode_id": "e", "is_terminated": False, "is_truncated": False,
               "agents": {"a": entry, "b": {"module": "m", "start_step": 0, **record(1, "absent")}}}
        out = {"name": name, "kind": "agent_entry", "modules": {"m": {"observation_space": box2, "action_space": disc3}},
               "require_logp": True, "record": rec}
        if error:
            return {**out, "error": error}
        return {**out, "agent_steps": steps + 1, "logged_steps": {"a": expected(steps, runs), "b": []}}

    def client(name: str, calls: list[str], cuts: list[int]) -> dict:
        records, start = [], 0
        for end in [*cuts, len(calls)]:
            part = calls[start:end]
            runs: list[list[int]] = []
            for t, kind in enumerate(part):
                if kind != "log":
                    continue
                if runs and runs[-1][0] + runs[-1][1] == t:
                    runs[-1][1] += 1
                else:
                    runs.append([t, 1])
            records.append(runs or None)
            start = end
        return {"name": name, "kind": "record", "calls": calls, "cuts": cuts, "records_logged_runs": records}

    return [
        episode("absent", 3, "absent"),
        episode("null", 3, None),
        episode("empty", 3, []),
        episode("all_logged", 3, [[0, 3]]),
        episode("two_runs", 5, [[0, 1], [3, 2]]),
        episode("adjacent_runs_unmerged", 4, [[0, 2], [2, 1]]),
        episode("logged_action_checked_against_space", 2, [[0, 2]], error="ACTION_OUT_OF_SPACE", actions=[2, 3]),
        episode("not_an_array", 3, {"start": 0, "n": 1}, error="INVALID_FIELD"),
        episode("not_pairs", 3, [[0, 1, 2]], error="INVALID_FIELD"),
        episode("flat_pair", 3, [0, 1], error="INVALID_FIELD"),
        episode("float_start", 3, [[0.0, 1]], error="INVALID_FIELD"),
        episode("boolean_count", 3, [[0, True]], error="INVALID_FIELD"),
        episode("string_count", 3, [[0, "1"]], error="INVALID_FIELD"),
        episode("negative_start", 3, [[-1, 1]], error="INVALID_FIELD"),
        episode("zero_count", 3, [[0, 0]], error="INVALID_FIELD"),
        episode("overlapping_runs", 5, [[0, 2], [1, 2]], error="INVALID_FIELD"),
        episode("runs_out_of_order", 5, [[3, 1], [0, 1]], error="INVALID_FIELD"),
        episode("run_past_the_chunk", 3, [[2, 2]], error="EPISODE_LENGTH_MISMATCH"),
        episode("start_past_the_chunk", 3, [[3, 1]], error="EPISODE_LENGTH_MISMATCH"),
        agent_entry("agent_logged_other_sampled", 3, [[1, 2]]),
        agent_entry("agent_bad_runs", 3, [[0, 1], [0, 1]], error="INVALID_FIELD"),
        agent_entry("agent_run_past_the_entry", 2, [[0, 3]], error="EPISODE_LENGTH_MISMATCH"),
        client("client_all_sampled", ["sample"] * 4, [2]),
        client("client_all_logged", ["log"] * 4, []),
        client("client_mixed_one_record", ["sample", "log", "log", "sample", "log"], []),
        client("client_cut_inside_a_run", ["sample", "log", "log", "log", "sample"], [2]),
        client("client_cut_between_runs", ["log", "sample", "log", "log", "sample", "sample"], [1, 4]),
    ]


#: The smallest magnitude whose float32 rounding is infinite: 2^128 - 2^103, halfway between float32's
#: largest finite value and 2^128 (a tie rounds to even, 2^128: infinite).
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
FLOAT32_MAX = 2.0**128 - 2.0**104


def reward_cases() -> list[dict]:
    """1.6 §10.5: a step's reward (the rewards logged for it, summed) never goes out beyond float32.

    kind "single": one episode's ``calls`` in order, each "act" (a step: an action, and the rewards
    logged after it go to it) or a number (log_returns with that reward) -> ``step_rewards``, the
    rewards of the record cut at the end (compare within 1e-9 relative), and ``refused``: the indices
    of the calls refused with NON_FINITE_VALUE, which add nothing. A reward before the first action
    goes to no step. Computed here with Python floats (IEEE doubles) and the threshold above."""

    def case(name: str, *calls: object) -> dict:
        steps: list[float] = []
        refused = []
        for index, call in enumerate(calls):
            if call == "act":
                steps.append(0.0)
                continue
            assert isinstance(call, float)
            if steps:
                if abs(steps[-1] + call) >= FLOAT32_OVERFLOW:
                    refused.append(index)
                    continue
                steps[-1] += call
        return {"name": name, "kind": "single", "calls": list(calls), "step_rewards": steps, "refused": refused}

    return [
        case("sums_within_float32", "act", 1.0, 2.5, "act", 3e38, "act", -3e38),
        case("a_sum_beyond_float32_is_refused", "act", 2e38, 2e38, "act", 1.0),
        case("after_a_refusal_the_step_takes_more", "act", 2e38, 2e38, -1e38, 5e37),
        case("negative_sums_too", "act", -3e38, -1e38, -1.0),
        case("float32_max_and_a_little_rounds_to_max", "act", FLOAT32_MAX, 5e30, 1e31),
        case("the_threshold_itself_is_refused", "act", FLOAT32_OVERFLOW / 2, FLOAT32_OVERFLOW / 2,
             FLOAT32_OVERFLOW / 2 - 2.0**80),
        case("the_negative_threshold_too", "act", -FLOAT32_OVERFLOW / 2, -FLOAT32_OVERFLOW / 2,
             -(FLOAT32_OVERFLOW / 2 - 2.0**80)),
        case("each_step_has_its_own_sum", "act", 3e38, "act", 3e38, "act", 3e38, 3e38),
        case("a_reward_before_the_first_action_goes_to_no_step", 3e38, 3e38, "act", 1.0),
    ]


def offline_policy_cases() -> list[dict]:
    """§20: how an offline policy file's text is read. ``messages``: the PONG, SET_CONFIG and SET_STATE
    taken from it; else ``code`` and ``names`` (a word the error message must hold)."""
    pong = {"type": "PONG", "protocol_version": "1.9", "server": "tether", "run_id": "5f0c8e2a9b7d4c1e"}
    config = {"type": "SET_CONFIG", "env_steps_per_sample": 200, "force_on_policy": True,
              "observation_space": {"type": "Box", "shape": [4], "low": -5.0, "high": 5.0},
              "action_space": {"type": "Discrete", "n": 2}}
    state = {"type": "SET_STATE", "weights_seq_no": 3, "onnx_file": "", "models": {}}
    good = {"format": "tether-offline-policy", "version": 1, "pong": pong, "config": config, "state": state}

    def accepted(name: str, body: dict) -> dict:
        return {"name": name, "text": json.dumps(body), "messages": [body["pong"], body["config"], body["state"]]}

    def refused(name: str, text: str, code: str, names: str) -> dict:
        return {"name": name, "text": text, "code": code, "names": names}

    without = lambda key: {k: v for k, v in good.items() if k != key}  # noqa: E731
    return [
        accepted("good", good),
        accepted("unknown_members_ignored", {**good, "written_by": "tether serve", "pong": {**pong, "extra": 1}}),
        refused("not_json", '{"format": "tether-offline-policy", ', "INVALID_JSON", "JSON"),
        refused("not_an_object", json.dumps([good]), "INVALID_FIELD", "object"),
        refused("another_format", json.dumps({**good, "format": "tether-demonstrations"}), "INVALID_FIELD", "format"),
        refused("format_missing", json.dumps(without("format")), "INVALID_FIELD", "format"),
        refused("newer_version", json.dumps({**good, "version": 2}), "INVALID_FIELD", "version"),
        refused("version_as_string", json.dumps({**good, "version": "1"}), "INVALID_FIELD", "version"),
        refused("version_fractional", json.dumps({**good, "version": 1.5}), "INVALID_FIELD", "version"),
        refused("pong_missing", json.dumps(without("pong")), "INVALID_FIELD", "pong"),
        refused("config_not_an_object", json.dumps({**good, "config": [config]}), "INVALID_FIELD", "config"),
        refused("state_missing", json.dumps(without("state")), "INVALID_FIELD", "state"),
        refused("config_of_another_type", json.dumps({**good, "config": {**config, "type": "SET_STATE"}}),
                "INVALID_FIELD", "config"),
        refused("state_without_type", json.dumps({**good, "state": {"models": {}}}), "INVALID_FIELD", "state"),
    ]


def demonstration_cases() -> list[dict]:
    """1.6 §18: demonstration files.

    kind "read": a file's ``lines`` (each a JSON text; joined with LF, a final LF unless
    ``no_final_newline``) -> its ``episodes`` count and total ``steps`` per module, or the ``error``
    with the ``line`` (1-based) a reader names. kind "write": a writer given the ``modules`` and then,
    per episode, its ``steps`` (observation, action, reward, logged), final observation and flags, ->
    the ``lines`` it writes (compared as JSON values; numbers exact; the header's spaces compared as
    spaces, since a space has more than one valid JSON form, §8.4)."""
    box2 = {"type": "Box", "shape": [2], "dtype": "float32", "low": [-1.0, -1.0], "high": [1.0, 1.0]}
    disc2 = {"type": "Discrete", "n": 2, "start": 0}
    header = {"format": "tether-demonstrations", "version": 1,
              "modules": {"default_policy": {"observation_space": box2, "action_space": disc2}}}

    def line(steps: int = 2, module: str = "default_policy", **kw: object) -> dict:
        ep = {"module": module, "agent_id": "default_agent", "episode_id": "e1",
              "obs": [[0.5, -0.5]] * (steps + 1), "actions": [1] * steps, "rewards": [1.0] * steps,
              "is_terminated": True, "is_truncated": False}
        ep.update(kw)
        return ep

    def read(name: str, lines: list, episodes: int = 0, steps: int = 0, error_line: int | None = None,
             no_final_newline: bool = False) -> dict:
        out = {"name": name, "kind": "read",
               "lines": [x if isinstance(x, str) else json.dumps(x) for x in lines]}
        if no_final_newline:
            out["no_final_newline"] = True
        if error_line is not None:
            return {**out, "error_line": error_line}
        return {**out, "episodes": episodes, "steps": {"default_policy": steps}}

    def write(name: str, episodes: list[dict]) -> dict:
        """Each episode's steps, then its end; an episode whose ``final_obs`` is null is still running when
        the writer closes: written then, in the order they started, truncated at its latest step's
        observation (that step left out), and not at all with a single step (§18)."""
        lines = [header]
        ended = [ep for ep in episodes if ep["final_obs"] is not None]
        running = [{**ep, "steps": ep["steps"][:-1], "final_obs": ep["steps"][-1][0], "terminated": False}
                   for ep in episodes if ep["final_obs"] is None and len(ep["steps"]) >= 2]
        for ep in ended + running:
            runs: list[list[int]] = []
            for t, (_, _, _, logged) in enumerate(ep["steps"]):
                if logged:
                    if runs and runs[-1][0] + runs[-1][1] == t:
                        runs[-1][1] += 1
                    else:
                        runs.append([t, 1])
            out = {"module": "default_policy", "agent_id": ep.get("agent_id", "default_agent"),
                   "episode_id": ep["episode_id"], "obs": [s[0] for s in ep["steps"]] + [ep["final_obs"]],
                   "actions": [s[1] for s in ep["steps"]], "rewards": [s[2] for s in ep["steps"]],
                   "is_terminated": ep["terminated"], "is_truncated": not ep["terminated"]}
            if runs:
                out["logged_runs"] = runs
            lines.append(out)
        return {"name": name, "kind": "write", "modules": header["modules"], "episodes": episodes, "lines": lines}

    truncated_tail = json.dumps(line())[:25]
    return [
        read("one_episode", [header, line()], 1, 2),
        read("two_episodes_logged_and_sampled", [header, line(3, logged_runs=[[0, 3]]), line(1)], 2, 4),
        read("header_only", [header], 0, 0),
        read("unknown_fields_ignored", [{**header, "note": "x"}, line(extra=1)], 1, 2),
        read("empty_file", [], error_line=1),
        read("header_wrong_format", [{**header, "format": "something-else"}, line()], error_line=1),
        read("header_wrong_version", [{**header, "version": 2}, line()], error_line=1),
        read("header_bad_space", [{**header, "modules": {"default_policy": {"observation_space": {"type": "Box"},
                                                                             "action_space": disc2}}}], error_line=1),
        read("truncated_last_line", [header, line(), truncated_tail], error_line=3, no_final_newline=True),
        read("not_json", [header, "this is not json"], error_line=2),
        read("not_an_object", [header, "[1, 2]"], error_line=2),
        read("unknown_module", [header, line(module="other")], error_line=2),
        read("action_outside_space", [header, line(actions=[1, 2])], error_line=2),
        read("lengths_mismatch", [header, line(rewards=[1.0])], error_line=2),
        read("no_flag", [header, line(is_terminated=False)], error_line=2),
        read("bad_logged_runs", [header, line(logged_runs=[[1, 5]])], error_line=2),
        read("non_finite_observation", [header, json.dumps(line()).replace("0.5", "NaN", 1)], error_line=2),
        read("blank_line", [header, "", line()], error_line=2),
        write("sampled_then_logged", [
            {"episode_id": "a", "steps": [([0.5, -0.5], 1, 1.0, False), ([0.25, 0.0], 0, 0.5, False)],
             "final_obs": [0.0, 1.0], "terminated": True},
            {"episode_id": "b", "steps": [([1.0, 1.0], 0, -1.0, True), ([0.5, 0.5], 1, 2.0, True),
                                          ([0.0, 0.0], 1, 0.0, False), ([-0.5, 0.5], 0, 1.5, True)],
             "final_obs": [-1.0, -1.0], "terminated": False},
        ]),
        write("running_at_close_truncated", [
            {"episode_id": "long", "steps": [([0.5, -0.5], 1, 1.0, False), ([0.25, 0.0], 0, 0.5, True),
                                             ([0.0, 0.75], 1, 2.0, True)],
             "final_obs": None, "terminated": False},
            {"episode_id": "single", "steps": [([0.125, 0.125], 0, 3.0, False)], "final_obs": None, "terminated": False},
            {"episode_id": "ended", "steps": [([-0.25, 0.5], 1, -1.0, True), ([1.0, 0.0], 0, 0.25, False)],
             "final_obs": [0.5, 0.5], "terminated": True},
            {"episode_id": "later", "steps": [([0.75, 0.0], 0, 0.0, False), ([0.5, 0.25], 1, 1.0, False)],
             "final_obs": None, "terminated": False},
        ]),
    ]


def env_params_cases() -> list[dict]:
    """**[1.7]** §19: parameter sets a client accepts or ignores, what each sampler gives for given
    uniform draws, a whole set's draws in name order, and records a server checks against a set."""
    from tether.protocol.env_params import EnvParamsError, draw, draw_all, parse_env_params

    def accepted(name: str, body: object) -> dict:
        try:
            parse_env_params(body)
        except EnvParamsError as exc:
            raise AssertionError(f"{name}: {exc}") from None
        return {"name": name, "kind": "set", "env_params": body, "valid": True}

    def ignored(name: str, body: object) -> dict:
        try:
            parse_env_params(body)
        except EnvParamsError:
            return {"name": name, "kind": "set", "env_params": body, "valid": False}
        raise AssertionError(f"{name} was accepted")

    def drawn(name: str, value: object, uniforms: list[float]) -> dict:
        it = iter(uniforms)
        return {"name": name, "kind": "draw", "value": value, "uniforms": uniforms,
                "expect": draw(value, lambda: next(it))}

    def drawn_all(name: str, values: dict, uniforms: list[float]) -> dict:
        it = iter(uniforms)
        return {"name": name, "kind": "draw_all", "values": values, "uniforms": uniforms,
                "expect": draw_all(values, lambda: next(it))}

    held = {"seq": 3, "lesson": 1, "values": {"speed": 2.0, "gravity": {"sampler": "uniform", "low": 9.0, "high": 11.0},
                                              "gap": {"sampler": "ranges", "ranges": [[1.0, 2.0], [4.0, 5.0]]},
                                              "wind": {"sampler": "gaussian", "mean": 0.0, "std": 1.0}}}

    def record(name: str, body: object, error: str | None = None) -> dict:
        return {"name": name, "kind": "record", "held": held, "record": body, "error": error}

    good = {"seq": 3, "values": {"speed": 2.0, "gravity": 10.5, "gap": 4.5, "wind": -3.0}}
    uni = {"sampler": "uniform", "low": -1.0, "high": 3.0}
    gauss = {"sampler": "gaussian", "mean": 1.0, "std": 0.5}
    ranges = {"sampler": "ranges", "ranges": [[0.0, 1.0], [2.0, 2.0], [5.0, 8.0]]}
    return [
        accepted("numbers", {"seq": 1, "lesson": 0, "values": {"speed": 1, "size": 0.25}}),
        accepted("samplers", held),
        accepted("empty_values", {"seq": 7, "lesson": 2, "values": {}}),
        accepted("unicode_name", {"seq": 1, "lesson": 0, "values": {"vitesse_é": 1.5}}),
        ignored("not_an_object", [1, 2]),
        ignored("seq_zero", {"seq": 0, "lesson": 0, "values": {}}),
        ignored("seq_float", {"seq": 1.0, "lesson": 0, "values": {}}),
        ignored("seq_bool", {"seq": True, "lesson": 0, "values": {}}),
        ignored("lesson_negative", {"seq": 1, "lesson": -1, "values": {}}),
        ignored("lesson_missing", {"seq": 1, "values": {}}),
        ignored("values_list", {"seq": 1, "lesson": 0, "values": [1]}),
        ignored("value_string", {"seq": 1, "lesson": 0, "values": {"speed": "fast"}}),
        ignored("value_bool", {"seq": 1, "lesson": 0, "values": {"speed": True}}),
        ignored("value_huge", {"seq": 1, "lesson": 0, "values": {"speed": 1e301}}),
        ignored("empty_name", {"seq": 1, "lesson": 0, "values": {"": 1}}),
        ignored("long_name", {"seq": 1, "lesson": 0, "values": {"n" * 65: 1}}),
        ignored("unknown_sampler", {"seq": 1, "lesson": 0, "values": {"x": {"sampler": "beta", "a": 1, "b": 2}}}),
        ignored("uniform_low_above_high", {"seq": 1, "lesson": 0, "values": {"x": {"sampler": "uniform", "low": 2, "high": 1}}}),
        ignored("uniform_extra_member", {"seq": 1, "lesson": 0, "values": {"x": {**uni, "mean": 0}}}),
        ignored("uniform_missing_high", {"seq": 1, "lesson": 0, "values": {"x": {"sampler": "uniform", "low": 0}}}),
        ignored("gaussian_negative_std", {"seq": 1, "lesson": 0, "values": {"x": {"sampler": "gaussian", "mean": 0, "std": -1}}}),
        ignored("ranges_empty", {"seq": 1, "lesson": 0, "values": {"x": {"sampler": "ranges", "ranges": []}}}),
        ignored("ranges_not_pairs", {"seq": 1, "lesson": 0, "values": {"x": {"sampler": "ranges", "ranges": [[1, 2, 3]]}}}),
        ignored("ranges_reversed", {"seq": 1, "lesson": 0, "values": {"x": {"sampler": "ranges", "ranges": [[3, 2]]}}}),
        ignored("too_many_ranges", {"seq": 1, "lesson": 0, "values": {"x": {"sampler": "ranges", "ranges": [[0, 1]] * 17}}}),
        ignored("too_many_params", {"seq": 1, "lesson": 0, "values": {f"p{i}": i for i in range(65)}}),
        drawn("number", 2.5, []),
        drawn("uniform_zero", uni, [0.0]),
        drawn("uniform_mid", uni, [0.375]),
        drawn("uniform_near_one", uni, [0.999999999]),
        drawn("uniform_point", {"sampler": "uniform", "low": 4.0, "high": 4.0}, [0.7]),
        drawn("gaussian_a", gauss, [0.5, 0.0]),
        drawn("gaussian_b", gauss, [0.9, 0.25]),
        drawn("gaussian_c", gauss, [0.1, 0.6]),
        drawn("gaussian_zero_u1", gauss, [0.0, 0.3]),
        drawn("ranges_first", ranges, [0.1]),
        drawn("ranges_skips_point", ranges, [0.25]),
        drawn("ranges_last", ranges, [0.5]),
        drawn("ranges_end", ranges, [0.999]),
        drawn("ranges_all_points_first", {"sampler": "ranges", "ranges": [[1.0, 1.0], [3.0, 3.0], [7.0, 7.0]]}, [0.3]),
        drawn("ranges_all_points_second", {"sampler": "ranges", "ranges": [[1.0, 1.0], [3.0, 3.0], [7.0, 7.0]]}, [0.34]),
        drawn("ranges_all_points_last", {"sampler": "ranges", "ranges": [[1.0, 1.0], [3.0, 3.0], [7.0, 7.0]]}, [0.999]),
        drawn_all("set_in_name_order", {"zeta": uni, "alpha": gauss, "mid": 7.0, "beta": ranges},
                  [0.5, 0.9, 0.25, 0.75]),
        # UTF-8 byte order, which is code point order: U+FF21 (EF BC A1) before U+1F600 (F0 9F 98 80),
        # though UTF-16 puts the surrogate pair of U+1F600 (D83D ...) first; "Z" before "a".
        drawn_all("set_in_utf8_byte_order", {"\U0001F600": uni, "\uFF21": uni, "a": uni, "Z": uni},
                  [0.1, 0.2, 0.3, 0.4]),
        record("record_good", good),
        record("record_with_measure", {**good, "measure": 0.75}),
        record("record_unknown_seq_not_checked", {"seq": 99, "values": {"anything": 1.0}}),
        record("record_gaussian_value_beyond_1e300", {**good, "values": {**good["values"], "wind": 1e305}}),
        record("record_uniform_value_beyond_1e300", {**good, "values": {**good["values"], "gravity": 1e305}}, "INVALID_FIELD"),
        record("record_measure_beyond_1e300", {**good, "measure": 1e301}, "INVALID_FIELD"),
        record("record_value_outside_uniform", {**good, "values": {**good["values"], "gravity": 11.5}}, "INVALID_FIELD"),
        record("record_value_between_ranges", {**good, "values": {**good["values"], "gap": 3.0}}, "INVALID_FIELD"),
        record("record_fixed_value_differs", {**good, "values": {**good["values"], "speed": 2.5}}, "INVALID_FIELD"),
        record("record_missing_value", {"seq": 3, "values": {"speed": 2.0}}, "INVALID_FIELD"),
        record("record_extra_value", {**good, "values": {**good["values"], "other": 1.0}}, "INVALID_FIELD"),
        record("record_value_string", {**good, "values": {**good["values"], "speed": "2"}}, "INVALID_FIELD"),
        record("record_measure_string", {**good, "measure": "high"}, "INVALID_FIELD"),
        record("record_seq_zero", {**good, "seq": 0}, "INVALID_FIELD"),
        record("record_not_an_object", [3], "INVALID_FIELD"),
        record("record_unknown_member", {**good, "lesson": 1}, "INVALID_FIELD"),
    ]


class _Actor:
    """One actor's steps not cut yet, in the reference cutter of cut_cases: the observations from the
    one the next chunk starts with, and the rewards of the steps acted since."""

    def __init__(self, start_step: int) -> None:
        self.start_step = start_step  # the episode's env step of its first action (§10.7)
        self.obs: list[float] = []
        self.rewards: list[float] = []
        self.latest: float | None = None  # its latest observation (kept when its steps are let go)
        self.ended: str | None = None  # "terminated" / "truncated" once it left

    def complete(self) -> int:
        return min(len(self.rewards), len(self.obs) - 1)

    def cut(self) -> dict | None:
        """Its complete steps as an agent entry (None: no complete step, nothing to send)."""
        done = self.complete()
        if done <= 0:
            return None
        left = self.ended is not None and done == len(self.rewards)  # (its last step: the entry ends it)
        entry = {"start_step": self.start_step, "obs": self.obs[:done + 1], "rewards": self.rewards[:done],
                 "is_terminated": left and self.ended == "terminated", "is_truncated": left and self.ended == "truncated"}
        self.obs, self.rewards = self.obs[done:], self.rewards[done:]
        return entry


class _Episode:
    def __init__(self, training: bool, held_back: bool) -> None:
        self.training, self.held_back = training, held_back  # (held back: played, counted, never recorded)
        self.actors: dict[str, _Actor] = {}
        self.frames = 0  # env steps so far
        self.ended: str | None = None
        self.end_sent = False

    @property
    def recorded(self) -> bool:
        return self.training and not self.held_back


class _ReferenceCutter:
    """The client behaviour cuts.json states (§13.3, §16.1), written from the rule, not from an SDK."""

    def __init__(self, kind: str, steps: int, reconnect: str | None, record_shares: list[float] | None) -> None:
        self.kind, self.steps, self.reconnect = kind, steps, reconnect
        # record_share of SET_STATE n (0: the handshake's, n: the answer to batch n), the last one repeated;
        # an episode draws whether it is recorded when it starts (1: recorded, 1e-9: held back)
        self.record_shares = record_shares or [1.0]
        assert set(self.record_shares) <= {1.0, 1e-9}
        self.episodes: dict[str, _Episode] = {}
        self.held = 0  # steps played in held-back episodes since the last batch
        self.batches: list[dict] = []

    def actors(self) -> list[_Actor]:
        return [a for e in self.episodes.values() if e.recorded for a in e.actors.values()]

    def due(self, ep: _Episode) -> bool:
        """The complete steps a cut would carry, with the held-back steps played, reach the steps per batch;
        at a call of a held-back episode, only once a held-back step was played since the last batch."""
        if ep.held_back and self.held == 0:
            return False
        return sum(max(a.complete(), 0) for a in self.actors()) + self.held >= self.steps

    def draw(self, training: bool) -> _Episode:
        share = self.record_shares[min(len(self.batches), len(self.record_shares) - 1)]
        return _Episode(training, training and share < 1.0)

    def cut(self, in_a_call: bool) -> None:
        batch = {}
        for eid, ep in self.episodes.items():
            if not ep.recorded:
                continue
            entries = {agent: entry for agent, actor in ep.actors.items() if (entry := actor.cut()) is not None}
            unsent_end = ep.ended is not None and not ep.end_sent and all(a.complete() <= 0 for a in ep.actors.values())
            if self.kind == "single":
                if entries:
                    entry = entries["default_agent"]
                    batch[eid] = {"obs": entry["obs"], "rewards": entry["rewards"], "is_terminated": entry["is_terminated"],
                                  "is_truncated": entry["is_truncated"]}
                continue
            if entries or unsent_end:
                ep.end_sent = unsent_end
                batch[eid] = {"is_terminated": unsent_end and ep.ended == "terminated",
                              "is_truncated": unsent_end and ep.ended == "truncated", "agents": entries}
        if not batch and not in_a_call:
            return  # (a flush with nothing complete sends nothing)
        self.batches.append(batch)
        self.held = 0
        if len(self.batches) == 1 and self.reconnect is not None:
            # The connection is lost with batch 1; the call that cut it waits for its answer on the next one.
            assert in_a_call, "batch 1 of a reconnect case is cut by a call, not the flush"
            if self.reconnect == "bounds_changed":
                for actor in self.actors():
                    actor.obs, actor.rewards = [], []  # (let go: the next chunk starts from the next observation)

    def play(self, call: list) -> None:
        what, eid = call[0], call[1]
        if what == "start":
            assert eid not in self.episodes
            self.episodes[eid] = self.draw(call[2])
            return
        if eid not in self.episodes:
            self.episodes[eid] = self.draw(True)
        ep = self.episodes[eid]
        assert ep.ended is None, f"{call}: the episode ended"
        if what in ("act", "frame"):
            self.act(ep, call[2] if what == "frame" else {"default_agent": call[2]})
        elif what == "reward":
            agent, reward = ("default_agent", call[2]) if self.kind == "single" else (call[2], call[3])
            actor = ep.actors.get(agent)
            if actor is not None and actor.rewards:  # (else its step was let go: the reward goes to no step)
                actor.rewards[-1] += reward
        else:
            final = call[2] if self.kind == "multi" else {"default_agent": call[2]}
            how = "truncated" if what.startswith("truncate") else "terminated"
            whole = what in ("end", "truncate")
            for agent, actor in ep.actors.items():  # (an agent named that never acted leaves nothing)
                if actor.ended is None and (whole or agent in final):
                    if actor.rewards:  # (its last step ends with this observation, or else its latest)
                        actor.obs.append(final.get(agent, actor.latest))
                    actor.ended = how
            if whole:
                ep.ended = how

    def act(self, ep: _Episode, observations: dict[str, float]) -> None:
        # A single-agent call's observation completes its recorded episode's last step before the count.
        completing = ep.actors.get("default_agent") if self.kind == "single" and ep.recorded else None
        if completing is not None:
            completing.obs.append(observations["default_agent"])
        if ep.training and self.due(ep):
            self.cut(in_a_call=True)
        if completing is not None and completing.obs:  # (unless a reconnect let it go with the rest)
            completing.obs.pop()
        for agent, v in observations.items():
            actor = ep.actors.setdefault(agent, _Actor(ep.frames))
            assert actor.ended is None, f"{agent} left"
            actor.obs.append(v)
            actor.rewards.append(0.0)
            actor.latest = v
        ep.frames += 1
        if ep.held_back:
            self.held += 1 if self.kind == "single" else len(observations)


def cut_cases() -> list[dict]:
    """Where a batch is cut (§13.3), client side: a client's steps per batch and one engine's calls in
    order -> the batches it sends, the last the flush after the calls; the format and the rule are
    §16.1's (`cuts.json`). Computed by _ReferenceCutter, a statement of the rule independent of every SDK;
    every expected record is checked as a server checks records (at least one step per agent entry)."""

    def case(name: str, kind: str, steps: int, *calls: list, reconnect: str | None = None,
             record_shares: list[float] | None = None) -> dict:
        assert reconnect is None or record_shares is None  # (a share is counted by the answers of one connection)
        cutter = _ReferenceCutter(kind, steps, reconnect, record_shares)
        for call in calls:
            cutter.play(list(call))
        cutter.cut(in_a_call=False)  # the flush
        for batch in cutter.batches:
            for record in batch.values():
                for entry in (record["agents"].values() if kind == "multi" else [record]):
                    assert len(entry["obs"]) == len(entry["rewards"]) + 1 >= 2, (name, record)
        out: dict = {"name": name, "kind": kind, "steps_per_batch": steps, "calls": [list(c) for c in calls]}
        if reconnect is not None:
            out["reconnect"] = reconnect
        if record_shares is not None:
            out["record_shares"] = record_shares
        # (the client waits for each batch's answer where an answer changes what follows: a reconnect, a share)
        out["wait_for_weights"] = reconnect is not None or (record_shares is not None and len(record_shares) > 1)
        return {**out, "batches": cutter.batches}

    act = lambda e, *vs: [["act", e, v] for v in vs]  # noqa: E731
    pair = lambda e, *fs: [["frame", e, {"a_0": f, "a_1": -f}] for f in fs]  # noqa: E731
    return [
        # §13.3's single-agent example, with 4 steps per batch: the call that brings step 4's observation
        # cuts steps 0-3, ending with it; a reward logged after that call goes to step 4.
        case("single_the_call_bringing_the_last_observation_cuts", "single", 4,
             *act("e", 0, 1, 2, 3), ["reward", "e", 0.5], *act("e", 4), ["reward", "e", 2.0],
             *act("e", 5), ["end", "e", 6]),
        # Another open episode's last step waits for its next observation: at a's third call 4 steps are
        # played but b's last waits, so nothing is cut; b's next call completes its own and cuts 4.
        case("single_another_episodes_waiting_step_is_not_counted", "single", 4,
             ["act", "a", 0], ["act", "b", -1], ["act", "a", 1], ["act", "b", -2], ["act", "a", 2],
             ["reward", "a", 1.0], ["act", "b", -3], ["act", "a", 3], ["end", "a", 4], ["act", "b", -4],
             ["truncate", "b", -5]),
        # An episode that ends before its first action sends nothing.
        case("single_an_episode_ended_before_acting_sends_nothing", "single", 2, *act("e", 0),
             ["start", "z", True], ["end", "z", 5], *act("e", 1, 2), ["end", "e", 3]),
        # Ending an episode cuts nothing (it acts on no step): the next episode's first call cuts it.
        case("single_an_end_cuts_nothing_the_next_action_does", "single", 2,
             *act("e", 0, 1), ["end", "e", 2], *act("f", 5), ["reward", "f", -1.0], *act("f", 6),
             ["truncate", "f", 7]),
        # One step per batch: every call after the first cuts the step before it.
        case("single_one_step_per_batch", "single", 1, *act("e", 0, 1, 2), ["end", "e", 3]),
        # A flush sends the complete steps only: an open episode's last step waits for its next observation.
        case("single_a_flush_leaves_the_waiting_step", "single", 10, *act("e", 0, 1, 2, 3)),
        case("multi_a_flush_leaves_the_waiting_steps", "multi", 10, *pair("e", 0, 1, 2)),
        # §13.3's multi-agent example: two agents, 10 agent steps per batch; frame 5's call finds 10 played
        # but 8 complete, frame 6's cuts frames 0-4 of both, each ending with its frame-5 observation.
        case("multi_the_cut_comes_before_the_frames_observations", "multi", 10,
             *pair("e", 0, 1, 2, 3, 4, 5), ["reward", "e", "a_0", 1.0], *pair("e", 6, 7),
             ["end", "e", {"a_0": 8, "a_1": -8}]),
        # Agents acting at different rates, one joining late (start_step 2: its first frame): every waiting
        # last step is left out of the count.
        case("multi_agents_at_different_rates", "multi", 4,
             ["frame", "e", {"a_0": 0, "a_1": 0}], ["frame", "e", {"a_0": 1}], ["reward", "e", "a_1", 2.0],
             ["frame", "e", {"a_0": 2, "a_1": 2, "a_2": 9}], ["frame", "e", {"a_0": 3}], ["frame", "e", {"a_0": 4, "a_1": 4}],
             ["end", "e", {"a_0": 5, "a_1": 5}]),
        # An agent that left goes (terminated) with the next cut; the episode's record is not ended yet.
        case("multi_an_agent_that_left_goes_with_the_next_cut", "multi", 4,
             ["frame", "e", {"a_0": 0, "a_1": 0}], ["end_agents", "e", {"a_1": 1}],
             *[["frame", "e", {"a_0": f}] for f in (1, 2, 3, 4)], ["end", "e", {"a_0": 5}]),
        # A reconnect within the call that cut batch 1: with other bounds, the steps not cut are let go (a's
        # waiting step and the rewards logged for it, before and after the cut); the calling episode's own
        # observation went with the cut and starts its next chunk; the late a_2 keeps its start_step; a_3,
        # let go, then leaving without another step, sends nothing. With the same config nothing is let go.
        *[case(f"single_a_reconnect_with_{name}", "single", 4, ["act", "a", 0], ["act", "b", -1], ["act", "a", 1],
               ["act", "b", -2], ["act", "a", 2], ["reward", "a", 1.0], ["act", "b", -3], ["reward", "a", 3.0],
               ["act", "a", 3],
               ["act", "b", -4], ["end", "a", 4], ["reward", "b", 0.5], ["end", "b", -5], reconnect=how)
          for name, how in (("other_bounds_lets_the_uncut_steps_go", "bounds_changed"),
                            ("the_same_config_lets_nothing_go", "same_config"))],
        *[case(f"multi_a_reconnect_with_{name}", "multi", 4, *pair("e", 0), ["frame", "e", {"a_0": 1, "a_1": -1, "a_2": 7}],
               ["frame", "e", {"a_0": 2, "a_1": -2, "a_3": 6}], ["reward", "e", "a_0", 1.0], *pair("e", 3),
               ["end_agents", "e", {"a_3": 6.5}], ["reward", "e", "a_0", 2.0],
               ["frame", "e", {"a_0": 4, "a_1": -4, "a_2": 8}], ["end", "e", {"a_0": 5, "a_1": -5, "a_2": 9}],
               reconnect=how)
          for name, how in (("other_bounds_lets_the_uncut_steps_go", "bounds_changed"),
                            ("the_same_config_lets_nothing_go", "same_config"))],
        # The frame that cuts need not name every agent: a_1's waiting step stays for its next observation.
        case("multi_a_cutting_frame_without_every_agent", "multi", 3, *pair("e", 0), ["frame", "e", {"a_0": 1, "a_1": 1}],
             ["frame", "e", {"a_0": 2}], ["frame", "e", {"a_0": 3}], ["frame", "e", {"a_0": 4, "a_1": 4}],
             ["end", "e", {"a_0": 5, "a_1": 5}]),
        # Agents that leave truncated, one by one and with the episode; an episode that ends before anyone
        # acted sends its end alone.
        case("multi_truncated_agents_and_episodes", "multi", 4, *pair("e", 0, 1), ["truncate_agents", "e", {"a_1": -2}],
             ["start", "z", True], ["frame", "e", {"a_0": 2}], ["end", "z", {}], ["frame", "e", {"a_0": 3}],
             ["truncate", "e", {}]),
        # An evaluation episode (training off) neither counts nor cuts: e's 2 steps are due at its calls, but
        # the batch waits for the next training call, and by then h has a complete step too.
        case("single_an_evaluation_episode_neither_counts_nor_cuts", "single", 2,
             ["act", "h", 0], *act("e", 0, 1), ["end", "e", 2], ["start", "v", False], *act("v", 5, 6),
             ["end", "v", 7], ["act", "h", 1], ["truncate", "h", 2]),
        case("multi_an_evaluation_episode_neither_counts_nor_cuts", "multi", 2,
             ["frame", "h", {"a_0": 0}], ["frame", "e", {"a_0": 0}], ["frame", "e", {"a_0": 1}], ["end", "e", {"a_0": 2}],
             ["start", "v", False], ["frame", "v", {"a_0": 5, "a_1": 5}], ["end", "v", {}],
             ["end_agents", "h", {"a_0": 1}], ["frame", "g", {"a_0": 9}], ["end", "g", {"a_0": 8}], ["end", "h", {}]),
        # Every episode held back (record_share 1e-9 from the handshake on): a batch without records at the
        # first call after steps per batch were played (agent steps for multi), its own step not yet counted,
        # and none at the flush.
        case("single_held_back_episodes_keep_the_cadence", "single", 3, *act("e", 0, 1, 2, 3, 4, 5), ["end", "e", 6],
             record_shares=[1e-9]),
        case("multi_held_back_episodes_keep_the_cadence", "multi", 4, *pair("e", 0, 1, 2, 3), ["end", "e", {}],
             record_shares=[1e-9]),
        # Recorded, then held back (the answer to batch 1 brings record_share 1e-9): r's last steps are due
        # when the held-back h starts, but h's first call cuts nothing (no held-back step played yet); its
        # second does.
        case("single_a_held_back_call_cuts_once_a_held_back_step_was_played", "single", 2, *act("r", 0, 1, 2, 3),
             ["end", "r", 4], *act("h", 0, 1, 2), ["end", "h", 3], record_shares=[1.0, 1e-9]),
        case("multi_a_held_back_call_cuts_once_a_held_back_step_was_played", "multi", 2,
             *[["frame", "r", {"a_0": f}] for f in (0, 1, 2, 3)], ["end", "r", {"a_0": 4}],
             *[["frame", "h", {"a_0": f}] for f in (0, 1, 2)], ["end", "h", {}], record_shares=[1.0, 1e-9]),
        # A flush sends an end not sent yet, alone when nothing is complete (g's step still waits).
        case("multi_a_flush_sends_an_end_not_sent_yet", "multi", 1, ["frame", "e", {"a_0": 0}],
             ["end_agents", "e", {"a_0": 1}], ["frame", "g", {"a_0": 5}], ["end", "e", {}]),
        # Every agent left and was cut before the episode ended: the end goes as a record without agents.
        case("multi_an_end_after_every_agent_was_cut_has_no_agents", "multi", 2,
             ["frame", "e", {"a_0": 0, "a_1": 0}], ["end_agents", "e", {"a_0": 1, "a_1": 1}],
             ["frame", "g", {"a_0": 5}], ["end", "e", {}], ["frame", "g", {"a_0": 6}], ["end", "g", {"a_0": 7}]),
    ]


def main() -> None:
    files = {
        "framing.json": framing_cases(),
        "messages.json": message_cases(),
        "spaces.json": space_cases(),
        "episodes.json": episode_cases(),
        "tensors.json": tensor_cases(),
        "logp.json": logp_cases(),
        "session.json": session_cases(),
        "policy_mapping.json": mapping_cases(),
        "multi_agent_episodes.json": multi_agent_episode_cases(),
        "map_agents.json": map_agents_cases(),
        "agent_modules.json": agent_modules_cases(),
        "multi_agent_sessions.json": multi_agent_session_cases(),
        "exactly_once.json": exactly_once_cases(),
        "set_state.json": set_state_cases(),
        "connection.json": connection_cases(),
        "counting.json": counting_cases(),
        "client_pairing.json": client_pairing_cases(),
        "run_ids.json": run_id_cases(),
        "rank_addresses.json": rank_address_cases(),
        "groups.json": group_cases(),
        "value_obs.json": value_obs_cases(),
        "composite.json": composite_cases(),
        "recurrent.json": recurrent_cases(),
        "logged.json": logged_cases(),
        "demonstrations.json": demonstration_cases(),
        "offline_policy.json": offline_policy_cases(),
        "rewards.json": reward_cases(),
        "cuts.json": cut_cases(),
        "env_params.json": env_params_cases(),
    }
    for name, cases in files.items():
        names = [c["name"] for c in cases]
        assert len(names) == len(set(names)), f"duplicate case names in {name}"
        extra = {"rules": MAPPING_RULES} if name == "policy_mapping.json" else {}
        (HERE / name).write_text(
            json.dumps({"version": "1.9", **extra, "cases": cases}, indent=1, ensure_ascii=False) + "\n"
        )
        print(f"wrote {name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
