"""The checks ``tether check-client`` reports, one row each, and how a row ends up."""

from __future__ import annotations

from dataclasses import dataclass

ROWS: list[tuple[str, str]] = [
    ("handshake", "PING with protocol_version 1.x, GET_CONFIG, GET_STATE before the first batch"),
    ("records_valid", "every batch is an on-policy EPISODES_AND_GET_STATE whose records the protocol core accepts"),
    ("engine_gets_clipped_action", "the env executed the clipped action (obs[t+1][1] == clip(actions[t]))"),
    ("raw_box_samples", "records carry the raw Gaussian sample (some outside the box) and its logp"),
    ("logp_from_served_model", "every step's action_logp (and dist inputs) come from a model the server sent"),
    ("batch_ids", "client_session (1..128 chars, kept across reconnects) and batch_seq 1, 2, 3, ..."),
    ("error_reply", "after an ERROR answer the client goes on and does not resend the refused batch"),
    ("model_swap", "after SET_STATE with a new model, later records use it; a batch claims the oldest "
                   "weights_seq_no its steps used"),
    ("drop_reconnect", "connection closed with a batch unanswered: the client reconnects and redoes the handshake"),
    ("resend_same_seq", "the unanswered batch is resent unchanged, with the same client_session and batch_seq"),
    ("duplicate_reply", "after the resent batch's answer the client goes on with the next batch_seq"),
    ("garbage_reconnect", "bad frame header from the server: the client drops the connection, reconnects, resends"),
    ("connection_error", "unsolicited ERROR CLIENT_TIMEOUT, then close: the client reconnects and goes on "
                         "with the next batch_seq"),
    ("heartbeat", "an idle client PINGs about every heartbeat_interval_s"),
]


@dataclass
class Row:
    passed: bool | None = None  # None: not reached
    reason: str = ""

    def fail(self, reason: str) -> None:
        if self.passed is not False:  # keep the first failure's reason
            self.passed, self.reason = False, reason

    def ok(self) -> None:
        if self.passed is None:
            self.passed = True
