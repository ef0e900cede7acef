"""Tether's one implementation of RLlink: framing, messages, spaces, episodes,
errors and connection state, without any I/O. Shared by the server and the
Python SDK; see docs/protocol.md for the normative specification."""

from .connection import ClientConnection, Refusal, Request, ServerConnection
from .distributions import deterministic, dist_inputs_size, log_prob, sample, to_env_action
from .episodes import EpisodeChunk, decode_episode, decode_episodes, encode_episode
from .errors import (
    AuthenticationError,
    ErrorCode,
    FramingError,
    LocalProtocolError,
    MessageError,
    RemoteProtocolError,
    ServerError,
    TetherConnectionError,
    TetherError,
    TetherTimeoutError,
    VersionMismatchError,
    server_error_from_message,
)
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_body, encode_frame
from .messages import PROTOCOL_VERSION, MessageType, decode_message, error_message
from .onnx_codec import decode_onnx, encode_onnx
from .spaces import Box, Discrete, MultiDiscrete, Space, box, from_gymnasium, space_from_json, to_gymnasium

__all__ = [name for name in dir() if not name.startswith("_")]
