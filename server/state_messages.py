"""SET_CONFIG and SET_STATE: what clients are told of the layout and of the weights.

SET_CONFIG is the same for every client; SET_STATE depends on what the client says
it holds and on what its connection was already sent (a model goes once per version
and connection, §7.5), and its encoded frames are kept per weights version."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tether.protocol.framing import encode_frame
from tether.protocol.messages import PROTOCOL_VERSION, MessageType
from tether.protocol.offline_policy import offline_policy

if TYPE_CHECKING:
    from .trainer import Trainer


def same_version(claimed: Any, current: int) -> bool:
    """Whether a client's claimed weights_seq_no (a JSON integer, not a boolean) is ``current``."""
    return isinstance(claimed, int) and not isinstance(claimed, bool) and claimed == current


def config_message(trainer: "Trainer") -> dict[str, Any]:
    """SET_CONFIG: the v1 fields, the 1.1 single-module description, the 1.2 layout, and
    the liveness rules (1.3)."""
    c, layout = trainer.config, trainer.layout
    msg: dict[str, Any] = {
        "type": MessageType.SET_CONFIG.value,
        "env_steps_per_sample": c.env_steps_per_sample,
        "force_on_policy": c.force_on_policy,
        "protocol_version": PROTOCOL_VERSION,
    }
    if trainer.default_module is not None:
        spec = layout.specs[trainer.default_module]
        msg.update({
            "observation_space": spec.observation_space.to_json(),
            "action_space": spec.action_space.to_json(),
            "onnx_input_names": spec.onnx_input_names,
            "onnx_output_names": [spec.onnx_output_name],
        })
        if spec.action_mask_leaf is not None:
            msg["action_mask"] = spec.action_mask_leaf
        if spec.recurrent_state:
            msg["recurrent_state"] = [state.to_json() for state in spec.recurrent_state]
    msg.update({
        "train_batch_size": c.train_batch_size,
        "max_staleness": c.max_staleness,
        "modules": {m: s.to_json() for m, s in layout.specs.items()},
        "policy_mapping": layout.client_mapping.to_json() if layout.client_mapping is not None else None,
        "groups": {g: spec.to_json() for g, spec in layout.groups.items()},
        "policies_to_train": layout.trainable,
    })
    timeout = c.client_timeout_s
    if timeout > 0:  # absent: the server never drops a silent client
        msg["client_timeout_s"] = timeout
        msg["heartbeat_interval_s"] = timeout / 4
    msg["session_state_ttl_s"] = c.session_state_ttl_s
    return msg


def state_message(
    trainer: "Trainer", client_holds: Any = None, may_omit_model: bool = False, sent: dict[str, int] | None = None,
    clients: int = 1,
) -> dict[str, Any]:
    """SET_STATE. A 1.2 client that sends ``weights_seq_nos`` gets ``models``
    with only the modules that changed; others get the v1 fields for the
    default module (without the model for a 1.1 client that holds it).
    ``sent``: the version of each module whose model the connection already
    got; with ``may_omit_model``, a module the request does not name counts
    as held at that version (a model is sent once per version and connection)."""
    msg: dict[str, Any] = {"type": MessageType.SET_STATE.value}
    share = round(trainer.record_share.current(clients), 6)
    trainer.metrics.record_share = share
    if may_omit_model:  # to a client that announced a version (§13.2)
        if share < 1.0:
            msg["record_share"] = share
        every = trainer.record_share.steps_per_batch(time.monotonic())
        if every is not None:
            msg["steps_per_batch"] = every
    sent = sent if may_omit_model and sent is not None else {}
    if isinstance(client_holds, dict):
        msg["models"] = {
            m: {"weights_seq_no": rt.weights_seq_no, "onnx_file": rt.onnx_field}
            for m, rt in trainer.modules.items()
            if not same_version(client_holds.get(m, sent.get(m)), rt.weights_seq_no)
        }
        return msg
    served = trainer.served_module
    runtime = trainer.modules[served]
    msg["weights_seq_no"] = runtime.weights_seq_no
    if client_holds is None:
        client_holds = sent.get(served)
    holds = same_version(client_holds, runtime.weights_seq_no)
    if not (may_omit_model and holds):
        msg["onnx_file"] = runtime.onnx_field
    return msg


def offline_policy_object(trainer: "Trainer") -> dict[str, Any]:
    """The offline policy file's object (§20): the PONG, SET_CONFIG and SET_STATE a client connecting
    now would be given, the state with every module's model but self-play slots not filled yet (and,
    with a default module, its v1 fields too, for a single-agent client) and the curriculum's current
    parameter set. Built on the thread that publishes models (its versions and models agree)."""
    pong: dict[str, Any] = {"type": MessageType.PONG.value, "protocol_version": PROTOCOL_VERSION, "server": "tether"}
    if trainer.run_id:
        pong["run_id"] = trainer.run_id
    state: dict[str, Any] = {"type": MessageType.SET_STATE.value}
    if trainer.default_module is not None:
        runtime = trainer.modules[trainer.default_module]
        state.update({"weights_seq_no": runtime.weights_seq_no, "onnx_file": runtime.onnx_field})
    state["models"] = {m: {"weights_seq_no": trainer.modules[m].weights_seq_no,
                           "onnx_file": trainer.modules[m].onnx_field} for m in trainer.policy_modules()}
    if trainer.curriculum is not None:
        state["env_params"] = trainer.curriculum.current.to_json()
    return offline_policy(pong, config_message(trainer), state)


def env_params_for(curriculum: Any, claimed: Any) -> dict[str, Any] | None:
    """**[1.7]** SET_STATE's ``env_params`` (§19.2): the current parameter set, for a request whose
    ``env_params_seq`` is a JSON integer other than its seq; None when there is nothing to send."""
    if curriculum is None or type(claimed) is not int or claimed == curriculum.current.seq:
        return None
    return curriculum.current.to_json()


class StateFrames:
    """Encoded SET_STATE frames, encoded once per weights version: a model is large,
    and re-encoding it per answer cost memory and time."""

    def __init__(self, trainer: "Trainer") -> None:
        self.trainer = trainer
        #: Encoded SET_STATE frames of the current weights, keyed by what they contain.
        self._frames: dict[tuple, bytes] = {}
        self._versions: tuple = ()

    def frame(self, key: tuple, message: dict) -> bytes:
        """The encoded frame of ``message``; ``key`` names what it contains (besides the versions)."""
        versions = (*(rt.weights_seq_no for rt in self.trainer.modules.values()), self.trainer.record_share.value)
        if versions != self._versions:
            self._frames.clear()
            self._versions = versions
        frame = self._frames.get(key)
        if frame is None:
            frame = self._frames[key] = encode_frame(message)
        return frame
