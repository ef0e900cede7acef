"""Server configuration: one typed object, readable from TOML and from CLI flags.

Every field of ``ServerConfig`` is an option under the same name in a TOML
file (``tether serve --config run.toml``) and as a flag with dashes
(``--train-batch-size 4000``); flags override the file, the file overrides
the defaults. The ``help`` metadata of each field is the flag's help text.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from tether.protocol.connection import DEFAULT_PRE_AUTH_MAX_FRAME_BYTES
from tether.protocol.framing import DEFAULT_MAX_FRAME_BYTES

#: Environment variable read by ``tether serve`` for the auth token (not visible in ps).
AUTH_TOKEN_ENV = "TETHER_AUTH_TOKEN"
#: Options never written to checkpoints or summaries.
SECRET_OPTIONS = ("auth_token",)


def _opt(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict, tuple)):
        return field(default_factory=lambda: default, metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


class ConfigError(ValueError):
    """A configuration the server cannot run (modules, mapping, a checkpoint to start from): the
    message says what to change."""


@dataclass
class ServerConfig:
    """All options of ``tether serve``; see each field's help."""

    # Network.
    host: str = _opt("127.0.0.1", "address to bind (loopback by default; use 0.0.0.0 to accept remote engines)")
    port: int = _opt(5555, "TCP port to listen on")
    auth_token: str | None = _opt(
        None, "if set, clients must send this token in PING before anything else; a token given as a flag is "
        "visible to every user in the process list: prefer --auth-token-file or the TETHER_AUTH_TOKEN "
        "environment variable"
    )
    max_frame_bytes: int = _opt(DEFAULT_MAX_FRAME_BYTES, "largest accepted message body in bytes")
    # Connection limits and liveness (protocol 1.3).
    auth_token_file: str | None = _opt(None, "read the auth token from this file (surrounding whitespace is stripped)")
    pre_auth_max_frame_bytes: int = _opt(
        DEFAULT_PRE_AUTH_MAX_FRAME_BYTES, "with an auth token: largest body accepted before the client authenticated"
    )
    handshake_timeout_s: float = _opt(
        10.0, "close a connection that has not completed its handshake (with an auth token: authenticated; "
        "without: sent its first request) after this many s (HANDSHAKE_TIMEOUT)"
    )
    max_connections: int = _opt(256, "refuse further connections (TOO_MANY_CONNECTIONS) while this many are open")
    max_handshaking_connections: int = _opt(
        0, "connections still in their handshake held at once, within max_connections; one more closes the "
        "oldest of them (HANDSHAKE_TIMEOUT), never an established one (0: max(8, max_connections / 8))"
    )
    auth_max_failures: int = _opt(
        5, "with an auth token: wrong tokens from one address (IPv4 address, IPv6 /64) within 60 s before its "
        "connections are refused (AUTH_THROTTLED) for 1 s, then for twice as long after each further wrong token"
    )
    auth_backoff_max_s: float = _opt(60.0, "with an auth token: the longest refusal after wrong tokens (AUTH_THROTTLED)")
    client_timeout_s: float = _opt(
        60.0, "close a connection silent this many s while no answer is owed (0: never); clients PING every 1/4 of it"
    )
    max_partial_frame_bytes: int = _opt(
        256 * 1024 * 1024, "total bytes of unfinished frames held for all clients; over it the largest holder is "
        "closed (SERVER_OVERLOADED); raised to max_frame_bytes if lower"
    )

    # Environment description sent to clients in SET_CONFIG.
    env: str | None = _opt(
        "CartPole-v1", "gymnasium env id whose spaces to use when no spaces are given (needs gymnasium)"
    )
    observation_space: dict | None = _opt(None, "observation space as JSON, e.g. '{\"type\": \"Box\", ...}'")
    action_space: dict | None = _opt(None, "action space as JSON, e.g. '{\"type\": \"Discrete\", \"n\": 2}'")
    onnx_input_name: str = _opt("onnx::Gemm_0", "name of the ONNX model's observation input")
    onnx_output_name: str = _opt("action_dist_inputs", "name of the ONNX model's output")
    action_mask: str | None = _opt(
        None, "leaf of a Dict observation that masks Discrete/MultiDiscrete actions (default: its 'action_mask' "
        "leaf, if any; '' for none)")

    # Multi-agent (leave unset for one module trained on every agent).
    modules: dict | None = _opt(
        None,
        "modules as JSON/TOML tables: {id: {observation_space, action_space, trainable, value_obs_agents, "
        "init_from ('checkpoint.pt' or 'checkpoint.pt#module': start from trained weights), "
        "and any PPO option (lr, gamma, ...) to override for that module}}",
    )
    policy_mapping: list | None = _opt(
        None, "policy-mapping rules, e.g. '[{\"pattern\": \"adversary_*\", \"module\": \"chaser\"}]'"
    )
    policy_mapping_fn: str | None = _opt(
        None, "instead of rules: a Python function 'package.module:function(agent_id, episode_id) -> module id'; "
        "clients then ask the server once per new agent (MAP_AGENTS)"
    )
    groups: dict | None = _opt(None, "agent groups: {group_id: {members: [...], reward: sum|mean}}")
    policies_to_train: list | None = _opt(None, "modules to train (default: every module marked trainable)")
    self_play: dict | None = _opt(
        None, "self-play (docs/self_play.md): {teams: [agent-id patterns, one per team], snapshot_every, window, "
        "latest_share, sampling: uniform|prioritized, modules, elo_k, initial_rating, draw_margin, "
        "outcome: higher_return|sign}")
    curriculum: dict | None = _opt(
        None, "environment parameters and lessons (docs/curriculum.md): {parameters: {name: number or sampler}, "
        "bounds, lessons: [{name, values, threshold, min_episodes}], measure: return|reported, module}")

    # Sampling.
    train_batch_size: int = _opt(2000, "agent steps (one per decision of one agent; env steps for a single agent) per learner update, pooled from all clients")
    env_steps_per_sample: int = _opt(500, "env steps a client collects before sending them (SET_CONFIG)")
    force_on_policy: bool = _opt(True, "clients wait for new weights after a batch completes (else off-policy)")
    max_staleness: int = _opt(1, "accept data computed with weights at most this many versions old")

    # PPO.
    lr: float = _opt(1e-3, "Adam learning rate")
    gamma: float = _opt(0.99, "discount factor")
    gae_lambda: float = _opt(0.95, "GAE lambda")
    clip_coef: float = _opt(0.2, "PPO surrogate clipping")
    vf_coef: float = _opt(0.5, "value loss coefficient")
    ent_coef: float = _opt(0.0, "entropy bonus coefficient")
    lr_schedule: str = _opt(
        "constant", "'constant', or 'linear': the learning rate decays from lr to 0 at max_env_steps (README: Running a server)")
    ent_coef_schedule: str = _opt(
        "constant", "'constant', or 'linear': the entropy coefficient decays from ent_coef to 0 at max_env_steps")
    num_epochs: int = _opt(10, "passes over each batch")
    minibatch_size: int = _opt(256, "minibatch size")
    max_grad_norm: float = _opt(0.5, "gradient clipping norm")
    norm_adv: bool = _opt(True, "normalise advantages per minibatch")
    clip_vloss: bool = _opt(False, "clip the value loss like the surrogate")
    mixed_precision: str = _opt(
        "off", "the update's forward passes in bfloat16: 'bf16' (CPUs and GPUs; weights, optimizer, advantages "
               "and losses stay float32), or 'off'")
    hidden_sizes: list = _opt([64, 64], "hidden layer widths of the policy and value MLPs, e.g. 64,64")
    model: dict | None = _opt(
        None, "the network (docs/models.md): none for an MLP of hidden_sizes; "
        "'{\"encoder\": \"cnn\", \"image_shape\": [84, 84, 4]}' for Nature-CNN on HWC images; "
        "'{\"class\": \"package.module:Class\", \"options\": {...}}' for a network of your own")
    normalize_observations: bool = _opt(
        False, "normalise each observation value by a running mean and variance kept inside the exported model "
        "(engines send raw values; docs/models.md)")
    normalize_clip: float = _opt(10.0, "with normalize_observations: clip normalised values into [-clip, clip]")
    bc_coef: float = _opt(
        1.0, "behaviour-cloning coefficient on logged steps (actions the policy did not choose, log_action; "
        "0: they train only the value function); docs/demonstrations.md")
    demos: str | None = _opt(
        None, "a demonstration dataset (a .jsonl demonstration file or a Minari dataset folder) cloned beside PPO "
        "in every update (docs/demonstrations.md)")
    demo_coef: float = _opt(1.0, "with demos: the dataset's behaviour-cloning coefficient at the first update")
    demo_decay_updates: int = _opt(0, "with demos: updates over which demo_coef decays linearly to 0 (0: never)")
    device: str = _opt("auto", "torch device: auto (cuda when present), cpu, cuda, cuda:1 ...")
    torch_threads: int = _opt(1, "CPU threads for torch (small MLPs are fastest on one)")
    seed: int | None = _opt(None, "random seed for the learner")
    # Robustness of training (protocol 1.3).
    reward_clip: float | None = _opt(None, "clip every reward into [-reward_clip, reward_clip] for training (off by default)")
    verify_action_logp: bool = _opt(
        True, "refuse (ACTION_LOGP_MISMATCH) behaviour action_logp that no recently served model can have produced")
    session_state_ttl_s: float = _opt(
        300.0, "seconds a disconnected client_session's open-episode state waits for the client to reconnect "
        "(announced in SET_CONFIG as session_state_ttl_s)")

    # Run control, metrics, checkpoints.
    logdir: str = _opt("runs/tether", "folder for TensorBoard event files and checkpoints")
    tensorboard: bool = _opt(True, "write TensorBoard event files to logdir")
    checkpoint_every: int = _opt(10, "write a checkpoint every N updates (0: only on exit)")
    resume: str | None = _opt(None, "checkpoint file to restore weights, optimizer, weights_seq_no and counters from")
    init_from: str | None = _opt(
        None, "without modules: start the one module from the trained weights of a checkpoint of another run "
        "('checkpoint.pt', or 'checkpoint.pt#module' for a module of another id); frozen or fine-tuned as configured")
    pool_journal: bool = _opt(
        True, "write every stored batch to <logdir>/journal (fdatasync) before answering it; --resume replays "
              "what came after the checkpoint, so no answered step is lost to a crash or kill -9")
    metrics_window: int = _opt(100, "episodes averaged in the return metrics (at least 5 with stop_at_return)")
    stop_at_return: float | None = _opt(
        None, "stop once the windowed mean return reaches this over three updates, and every client that sent "
              "data in the last three updates or the last minute reaches it on its own last episodes")
    max_env_steps: int | None = _opt(None, "stop after this many env steps were received")
    summary_file: str | None = _opt(None, "write a JSON summary of the run here on exit")
    group_timeout_s: float = _opt(
        60.0, "started by torchrun on several ranks: seconds a rank waits for the others in one collective (an "
              "agreement, a gradient sum) before the group stops (docs/scale-out.md)")
    group_start_timeout_s: float = _opt(
        600.0, "started by torchrun on several ranks: seconds a rank waits at start-up for the others to be "
               "ready (loading a checkpoint, replaying a journal, taking the group's weights) before it gives up")
    advertise_host: str | None = _opt(
        None, "started by torchrun on several ranks: the host clients reach this rank at, named to them in PONG's "
              "ranks and redirects (protocol §6.7); by default --host, or, when it is a wildcard, this node's "
              "address on the network that reaches MASTER_ADDR")
    quiet: bool = _opt(False, "do not print the progress line")
    console_port: int | None = _opt(
        None, "serve the live console (a web page and its websocket feed) on this port; 0 picks a free one "
              "(off by default)")
    console_host: str = _opt("127.0.0.1", "address the console listens on (loopback by default)")
    ws_port: int | None = _opt(
        None, "also serve RLlink over websockets on this port, at ws://host:port/rllink, for browser games "
              "(docs/protocol.md §3.4); 0 picks a free one (off by default)")

    def __post_init__(self) -> None:
        if self.train_batch_size < 1 or self.env_steps_per_sample < 1:
            raise ValueError("train_batch_size and env_steps_per_sample must be positive")
        if self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        if self.max_env_steps is not None and self.max_env_steps < 1:
            raise ValueError(f"max_env_steps must be >= 1 (or unset: no budget), not {self.max_env_steps}")
        from .stop_rule import MIN_EPISODES_PER_CLIENT  # (the rule's own bound: each client's last few returns)

        too_few = self.stop_at_return is not None and self.metrics_window < MIN_EPISODES_PER_CLIENT
        if self.metrics_window < 1 or too_few:
            raise ValueError(f"metrics_window must be >= 1, and >= {MIN_EPISODES_PER_CLIENT} with stop_at_return "
                             "(the rule needs each active client's last returns at the target)")
        self.hidden_sizes = [int(v) for v in self.hidden_sizes]
        if self.auth_token is None and self.auth_token_file:
            self.auth_token = Path(self.auth_token_file).read_text(encoding="utf-8").strip() or None
            if self.auth_token is None:
                raise ValueError(f"auth_token_file {self.auth_token_file} is empty")
        if self.max_connections < 1 or self.pre_auth_max_frame_bytes < 64:
            raise ValueError("max_connections must be >= 1 and pre_auth_max_frame_bytes >= 64")
        if self.handshake_timeout_s <= 0 or self.client_timeout_s < 0:
            raise ValueError("handshake_timeout_s must be > 0 and client_timeout_s >= 0")
        if not (self.group_timeout_s > 0 and self.group_start_timeout_s > 0):  # (also refuses NaN)
            raise ValueError("group_timeout_s and group_start_timeout_s must be > 0")
        if self.max_handshaking_connections < 0 or self.auth_max_failures < 1 or self.auth_backoff_max_s <= 0:
            raise ValueError("max_handshaking_connections must be >= 0, auth_max_failures >= 1 "
                             "and auth_backoff_max_s > 0")

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> "ServerConfig":
        """Read a TOML file (keys = field names); ``overrides`` win over the file."""
        with open(path, "rb") as f:
            data = tomllib.load(f)
        data.update(overrides)
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ServerConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown server option(s): {', '.join(unknown)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """Every option except secrets (the auth token): what checkpoints record."""
        data = dataclasses.asdict(self)
        for name in SECRET_OPTIONS:
            data.pop(name, None)
        return data

    def ppo_options(self) -> dict[str, Any]:
        """The PPO hyperparameters (the names a module may override)."""
        return {name: getattr(self, name) for name in PPO_OPTION_NAMES}


#: Options a module entry may override for itself (the seed sets gamma per policy).
PPO_OPTION_NAMES = (
    "lr", "gamma", "gae_lambda", "clip_coef", "vf_coef", "ent_coef", "lr_schedule", "ent_coef_schedule", "num_epochs",
    "minibatch_size",
    "max_grad_norm", "norm_adv", "clip_vloss", "mixed_precision", "hidden_sizes", "model",
    "normalize_observations", "normalize_clip", "reward_clip", "bc_coef", "demos", "demo_coef", "demo_decay_updates",
)


def host_in_url(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets (``http://[::1]:8080/``)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def _parse_int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


#: Shorter flags besides the option's name with dashes.
_FLAG_NAMES = {"client_timeout_s": "--client-timeout"}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per ServerConfig field (defaults are left unset so TOML can fill them)."""
    hints = get_type_hints(ServerConfig)
    parser.add_argument("--config", help="TOML file with any of the options below (flags win over the file)")
    for f in dataclasses.fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        flags = (flag, _FLAG_NAMES[f.name]) if f.name in _FLAG_NAMES else (flag,)  # the first names the option
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        help_text = f"{f.metadata['help']} (default: {default})"
        hint = hints[f.name]
        if hint is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif f.name in ("observation_space", "action_space", "modules", "policy_mapping", "groups", "model",
                        "self_play", "curriculum"):
            parser.add_argument(*flags, type=_parse_json, default=None, help=help_text)
        elif f.name == "policies_to_train":
            parser.add_argument(*flags, type=lambda t: [v for v in t.split(",") if v], default=None, help=help_text)
        elif f.name == "hidden_sizes":
            parser.add_argument(*flags, type=_parse_int_list, default=None, help=help_text)
        else:
            base = {int: int, float: float, str: str}
            kind = next((t for t in (int, float, str) if t in getattr(hint, "__args__", (hint,))), str)
            parser.add_argument(*flags, type=base[kind], default=None, help=help_text)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Build the config: defaults, then the TOML file, then explicit flags."""
    flags = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(ServerConfig)
        if getattr(args, f.name, None) is not None
    }
    if "auth_token" not in flags and "auth_token_file" not in flags and os.environ.get(AUTH_TOKEN_ENV):
        flags["auth_token"] = os.environ[AUTH_TOKEN_ENV]
    if getattr(args, "config", None):
        return ServerConfig.from_toml(args.config, **flags)
    return ServerConfig.from_dict(flags)
