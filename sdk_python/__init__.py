"""Tether's Python SDK: connect an engine or simulator to a Tether server, act
locally with ONNX Runtime, and send experience back. Depends on numpy,
onnxruntime and orjson only."""

from .client import TetherClient
from .loop import run_env
from .multi_agent_client import MultiAgentClient
from .policy import OnnxPolicy
from tether.protocol.errors import (
    AuthenticationError,
    InvalidInputError,
    NotReadyError,
    ServerError,
    TetherConnectionError,
    TetherError,
    TetherTimeoutError,
    VersionMismatchError,
)

__all__ = [
    "AuthenticationError",
    "InvalidInputError",
    "MultiAgentClient",
    "NotReadyError",
    "OnnxPolicy",
    "ServerError",
    "TetherClient",
    "TetherConnectionError",
    "TetherError",
    "TetherTimeoutError",
    "VersionMismatchError",
    "run_env",
]
