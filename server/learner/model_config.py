"""The description of a module's network (the ``model`` option, per module or for the run).

``model`` is a table (TOML), a JSON object (``--model``) or absent. Its ``encoder`` picks what reads
the observation before the policy and value heads (each an MLP of ``hidden_sizes``):

* ``"mlp"`` (the default): the flat observation goes to the heads as it is.
* ``"cnn"``: the observation is one or more images, each ``image_shape`` (height, width, channels:
  HWC, as engines produce them) of values flattened row by row; each is scaled by ``scale``, read by
  convolutions (``conv``: ``[out_channels, kernel, stride]`` per layer, ReLU after each; Nature-CNN's
  by default) and a ``dense`` ReLU layer. An observation of several images (a group's members, or a
  centralized critic's agents) is read image by image with the same weights, features side by side.

A ``recurrent`` table adds memory (recurrent_core.py), after the encoder and before the heads:
``type`` (``"lstm"`` or ``"gru"``), ``size`` (units, 64 by default), and for training ``seq_len`` (the
steps one backpropagation through time covers, 16 by default) and ``burn_in`` (steps run before each
sequence, without gradient, to refresh its start state; 0 by default). The value head shares the core:
it reads the core's output (with the critic's own input beside it), so the state an engine carries is
all the learner needs.

Or ``class = "package.module:Class"``: a torch module of the user's that follows the interface in
policy_model.py, built with ``options`` as keyword arguments. docs/models.md documents all of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: Nature-CNN (Mnih et al. 2015), as CleanRL's and Stable-Baselines3's Atari agents use it.
NATURE_CONV = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
NATURE_DENSE = 512
#: Images arrive as 0-255 values; the network reads them in [0, 1].
DEFAULT_IMAGE_SCALE = 1.0 / 255.0

ENCODERS = ("mlp", "cnn")
_KEYS = {"encoder", "image_shape", "conv", "dense", "scale", "class", "options", "recurrent"}
_RECURRENT_KEYS = {"type", "size", "seq_len", "burn_in"}
#: Defaults of the ``recurrent`` table.
DEFAULT_RECURRENT_SIZE = 64
DEFAULT_SEQ_LEN = 16
#: Limits of the ``recurrent`` table: a state is what every SDK keeps per agent, a sequence what one
#: backpropagation through time unrolls.
MAX_RECURRENT_SIZE = 4096
MAX_SEQ_LEN = 1024


class ModelConfigError(ValueError):
    """A ``model`` description that cannot build a network; the message names the member."""


@dataclass(frozen=True)
class RecurrentConfig:
    """The ``recurrent`` table: the core and how the learner trains it on sequences."""

    type: str = "lstm"
    size: int = DEFAULT_RECURRENT_SIZE
    seq_len: int = DEFAULT_SEQ_LEN
    burn_in: int = 0

    @property
    def state_names(self) -> tuple[str, ...]:
        """Suffixes of the state tensors: ``h`` (and ``c`` for an LSTM); the model's inputs are
        ``state_in_<suffix>``, its outputs ``state_out_<suffix>`` (§12.1)."""
        return ("h", "c") if self.type == "lstm" else ("h",)


@dataclass(frozen=True)
class ModelConfig:
    """A parsed, checked ``model`` option."""

    encoder: str = "mlp"
    image_shape: tuple[int, int, int] | None = None
    conv: tuple[tuple[int, int, int], ...] = NATURE_CONV
    dense: int = NATURE_DENSE
    scale: float = DEFAULT_IMAGE_SCALE
    #: ``package.module:Class`` of a user module (then ``encoder`` is not used).
    user_class: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: Memory (None: none).
    recurrent: RecurrentConfig | None = None

    @property
    def is_default_mlp(self) -> bool:
        """The network every peer knows: written by the fixed Gemm/Tanh writer (RLlib's v1 client runs it)."""
        return self.user_class is None and self.encoder == "mlp" and self.recurrent is None


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"model: {what} must be a positive integer, got {value!r}")
    return value


def parse_model_config(raw: dict[str, Any] | None, obs_dim: int, module_id: str = "",
                       composite: bool = False) -> ModelConfig:
    """Check ``raw`` (the option as given) against a module's flat observation size ``obs_dim``.
    For a ``composite`` (Dict or Tuple) observation the ``cnn`` encoder takes each image's shape from
    its leaf (composite_encoder.py), so ``image_shape`` is not given."""
    where = f"module {module_id!r}: " if module_id else ""
    try:
        return _parse(raw, obs_dim, composite)
    except ModelConfigError as exc:
        raise ModelConfigError(where + str(exc)) from None


def _parse(raw: dict[str, Any] | None, obs_dim: int, composite: bool) -> ModelConfig:
    if raw is None:
        return ModelConfig()
    if not isinstance(raw, dict):
        raise ModelConfigError(f"model must be a table (JSON object), got {type(raw).__name__}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ModelConfigError(f"model has unknown member(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
    options = raw.get("options", {})
    if not isinstance(options, dict):
        raise ModelConfigError(f"model: options must be a table, got {type(options).__name__}")
    recurrent = _recurrent(raw.get("recurrent"))
    if "class" in raw:
        if recurrent is not None:
            raise ModelConfigError("model: recurrent is for the built-in encoders; a user class ('class') that "
                                   "needs memory is not supported")
        target = raw["class"]
        if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
            raise ModelConfigError(f"model: class must be 'package.module:Class', got {target!r}")
        return ModelConfig(user_class=target, options=dict(options))
    if options:
        raise ModelConfigError("model: options are for a user class ('class'), not a built-in encoder")
    encoder = raw.get("encoder", "mlp")
    if encoder not in ENCODERS:
        raise ModelConfigError(f"model: encoder must be one of {', '.join(ENCODERS)}, got {encoder!r}")
    if encoder == "mlp":
        extra = sorted(set(raw) & {"image_shape", "conv", "dense", "scale"})
        if extra:
            raise ModelConfigError(f"model: {', '.join(extra)} only apply to encoder 'cnn'")
        return ModelConfig(recurrent=recurrent)
    shape = raw.get("image_shape")
    if composite:
        if shape is not None:
            raise ModelConfigError("model: image_shape is for a single image observation; a Dict or Tuple "
                                   "observation's images take their shapes from their leaves")
        shape = [1 << 16, 1 << 16, 1]  # (only to check the layers below; each leaf's shape is checked when built)
    if not isinstance(shape, (list, tuple)) or len(shape) != 3:
        raise ModelConfigError(f"model: encoder 'cnn' needs image_shape [height, width, channels], got {shape!r}")
    image_shape = tuple(_positive_int(v, "every image_shape value") for v in shape)
    image_size = math.prod(image_shape)
    if not composite and obs_dim % image_size != 0:
        raise ModelConfigError(
            f"model: image_shape {list(image_shape)} holds {image_size} values, but the observation has {obs_dim} "
            f"(it must be one or more whole images)")
    conv_raw = raw.get("conv", NATURE_CONV)
    if not isinstance(conv_raw, (list, tuple)) or not conv_raw:
        raise ModelConfigError(f"model: conv must be a list of [out_channels, kernel, stride], got {conv_raw!r}")
    conv = []
    for layer in conv_raw:
        if not isinstance(layer, (list, tuple)) or len(layer) != 3:
            raise ModelConfigError(f"model: each conv layer is [out_channels, kernel, stride], got {layer!r}")
        conv.append(tuple(_positive_int(v, "conv values") for v in layer))
    if not composite:
        check_conv_fits(tuple(conv), image_shape)  # type: ignore[arg-type]
    scale = raw.get("scale", DEFAULT_IMAGE_SCALE)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ModelConfigError(f"model: scale must be a positive number, got {scale!r}")
    return ModelConfig(encoder="cnn", image_shape=None if composite else image_shape,  # type: ignore[arg-type]
                       conv=tuple(conv),  # type: ignore[arg-type]
                       dense=_positive_int(raw.get("dense", NATURE_DENSE), "dense"), scale=float(scale),
                       recurrent=recurrent)


def _recurrent(raw: Any) -> RecurrentConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"model: recurrent must be a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _RECURRENT_KEYS)
    if unknown:
        raise ModelConfigError(f"model: recurrent has unknown member(s) {', '.join(unknown)}; "
                               f"known: {', '.join(sorted(_RECURRENT_KEYS))}")
    kind = raw.get("type")
    if kind not in ("lstm", "gru"):
        raise ModelConfigError(f"model: recurrent type must be 'lstm' or 'gru', got {kind!r}")
    size = _positive_int(raw.get("size", DEFAULT_RECURRENT_SIZE), "recurrent size")
    seq_len = _positive_int(raw.get("seq_len", DEFAULT_SEQ_LEN), "recurrent seq_len")
    burn_in = raw.get("burn_in", 0)
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
        raise ModelConfigError(f"model: recurrent burn_in must be an integer >= 0, got {burn_in!r}")
    if size > MAX_RECURRENT_SIZE:
        raise ModelConfigError(f"model: recurrent size {size} is above the limit {MAX_RECURRENT_SIZE}")
    if seq_len + burn_in > MAX_SEQ_LEN:
        raise ModelConfigError(f"model: recurrent seq_len + burn_in is {seq_len + burn_in}, above the limit "
                               f"{MAX_SEQ_LEN}")
    return RecurrentConfig(kind, size, seq_len, burn_in)


def check_conv_fits(conv: tuple[tuple[int, int, int], ...], image_shape: tuple[int, ...]) -> None:
    """Refuses conv layers that shrink an image of ``image_shape`` (HWC) to nothing."""
    height, width = image_shape[0], image_shape[1]
    for _channels, kernel, stride in conv:
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        if height < 1 or width < 1:
            raise ModelConfigError(
                f"model: conv layers {[list(c) for c in conv]} shrink a {image_shape[0]}x{image_shape[1]} image "
                f"to nothing (a kernel is larger than what is left)")
