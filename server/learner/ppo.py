"""PPO: the clipped-surrogate update of one module, in the shape of CleanRL's ppo.py."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from tether.protocol.distributions import dist_inputs_size
from tether.protocol.action_mask import ActionMask
from tether.protocol.episodes import EpisodeChunk
from tether.protocol.spaces import Box, Space, is_composite

from ..config import ServerConfig
from .gae import compute_gae, compute_gae_batched
from .model_config import parse_model_config
from .onnx_export import DEFAULT_INPUT_NAME, DEFAULT_OUTPUT_NAME, export_policy
from .action_masking import MaskedPolicy
from .observation_normalizer import NormalizedPolicy, normalized_values
from .onnx_template import TracedPolicyExporter
from .packed_observations import ObservationPacking
from .optimizer_startup import adam
from .policy_model import PolicyModel, check_output_width, load_user_model
from .policy_network import ActorCritic, critic_input_dim, flat_obs_dim
from .rollout_batch import RolloutBatch, build_batch
from .distributions import ActionDistribution
from .sequences import StatePass, run_windows, state_pass, windows
from .cloning import CloningData
from .schedule import SCHEDULES, scheduled


def _server_default(name: str) -> Any:
    """The default of ServerConfig's option ``name``: the one place PPO defaults live."""
    spec = ServerConfig.__dataclass_fields__[name]
    value = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()  # type: ignore[misc]
    return tuple(value) if isinstance(value, list) else value


@dataclass
class PPOHyperparams:
    """The knobs of one PPO update (ServerConfig carries the same names, and the defaults)."""

    lr: float = _server_default("lr")
    gamma: float = _server_default("gamma")
    gae_lambda: float = _server_default("gae_lambda")
    clip_coef: float = _server_default("clip_coef")
    vf_coef: float = _server_default("vf_coef")
    ent_coef: float = _server_default("ent_coef")
    #: How ``lr`` and ``ent_coef`` change over the run (schedule.py): "constant" or "linear" (to 0 at max_env_steps).
    lr_schedule: str = _server_default("lr_schedule")
    ent_coef_schedule: str = _server_default("ent_coef_schedule")
    num_epochs: int = _server_default("num_epochs")
    minibatch_size: int = _server_default("minibatch_size")
    max_grad_norm: float = _server_default("max_grad_norm")
    norm_adv: bool = _server_default("norm_adv")
    clip_vloss: bool = _server_default("clip_vloss")
    #: The update's forward passes in bfloat16 ("bf16") or float32 ("off"); weights and losses stay float32.
    mixed_precision: str = _server_default("mixed_precision")
    hidden_sizes: tuple[int, ...] = _server_default("hidden_sizes")
    #: The network (model_config.py): None is the MLP of ``hidden_sizes``.
    model: dict | None = _server_default("model")
    #: Normalise observations inside the network (observation_normalizer.py), clipped to [-clip, clip].
    normalize_observations: bool = _server_default("normalize_observations")
    normalize_clip: float = _server_default("normalize_clip")
    #: Clip each reward into [-reward_clip, reward_clip] before GAE (None: off).
    reward_clip: float | None = _server_default("reward_clip")
    #: **[1.6]** The behaviour-cloning term on logged steps (§13.7): its coefficient.
    bc_coef: float = _server_default("bc_coef")
    #: **[1.6]** A demonstration dataset's behaviour-cloning term (demonstrations.py): its coefficient at the
    #: first update, and the updates over which it decays linearly to 0 (0: it never decays).
    demo_coef: float = _server_default("demo_coef")
    demo_decay_updates: int = _server_default("demo_decay_updates")
    #: The dataset itself (a path: module_runtime.py loads it into ``PPOLearner.set_demonstrations``).
    demos: str | None = _server_default("demos")


#: The update's precision choices (PPOHyperparams.mixed_precision).
MIXED_PRECISION = ("off", "bf16")


class NonFiniteUpdate(RuntimeError):
    """An update produced a non-finite loss, gradient or weight; the learner was
    rolled back to its weights and optimizer state from before the update."""


#: A network with memory: a step whose behaviour log-probability is this far (in nats) from the current
#: policy's is not trained on, and its source is left out of the update (isolation.py's screen). Such a
#: step's logp depends on the state its client carried, so the server cannot recheck it against the
#: served models at ingest as it does for other networks (§13.6); the policies the data may come from
#: (at most max_staleness updates old, each a PPO step of small KL) give a recorded action probabilities
#: well within a factor of e^3 of the current one's, while one made-up logp (-20) would multiply its
#: importance ratio by e^19 and wreck the update.
RECURRENT_LOGP_LIMIT = 3.0

#: Value targets at or beyond this magnitude (2**64, about 1.8e19: the square root of
#: float32's largest value) cannot be trained on: their squared error overflows float32.
TARGET_LIMIT = float(2.0**64)


class PPOLearner:
    """Owns one module's network and optimizer and performs PPO updates."""

    def __init__(
        self,
        observation_space: Space,
        action_space: Space,
        hp: PPOHyperparams,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        onnx_input_name: str = DEFAULT_INPUT_NAME,
        onnx_output_name: str = DEFAULT_OUTPUT_NAME,
        value_obs_dim: int | None = None,
        action_mask: ActionMask | None = None,
    ) -> None:
        if seed is not None:
            torch.manual_seed(seed)
        for name in ("lr_schedule", "ent_coef_schedule"):
            if getattr(hp, name) not in SCHEDULES:
                raise ValueError(f"{name} {getattr(hp, name)!r}: one of {', '.join(SCHEDULES)}")
        if hp.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision {hp.mixed_precision!r}: one of {', '.join(MIXED_PRECISION)} (float16 "
                             "would need a loss scale that every rank agrees on; bfloat16 needs none)")
        self.hp = hp
        self.device = torch.device(device)
        self.action_space = action_space
        self.onnx_input_name = onnx_input_name
        self.onnx_output_name = onnx_output_name
        obs_dim = flat_obs_dim(observation_space)
        leaves = observation_space.leaves if is_composite(observation_space) else None
        #: How composite rows with byte leaves wait in the pool (packed_observations.py; build_batch unpacks
        #: them), else None.
        self.packing = ObservationPacking.of(observation_space)
        self.model_config = parse_model_config(hp.model, obs_dim, composite=leaves is not None)
        self.model: PolicyModel
        if self.model_config.user_class is not None:
            self.model = load_user_model(self.model_config, observation_space, action_space, obs_dim,
                                         critic_input_dim(obs_dim, value_obs_dim))
            check_output_width(self.model, obs_dim, dist_inputs_size(action_space), self.model_config.user_class)
        else:
            self.model = ActorCritic(obs_dim, action_space, tuple(hp.hidden_sizes), value_obs_dim, self.model_config,
                                     leaves)
        #: The statistics the update folds each batch into (normalize_observations), else None.
        self.normalizer: NormalizedPolicy | None = None
        if hp.normalize_observations:
            self.model = self.normalizer = NormalizedPolicy(self.model, obs_dim, hp.normalize_clip, action_space,
                                                            normalized_values(observation_space, action_mask))
        if action_mask is not None:
            self.model = MaskedPolicy(self.model, action_mask)  # (outermost: it reads the raw mask)
        self.model.to(self.device)
        # The fixed MLP is written directly; other networks are traced once, then only their weights change.
        byte_shape = observation_space.shape if isinstance(observation_space, Box) and observation_space.is_bytes else None
        fixed = (self.model_config.is_default_mlp and not hp.normalize_observations and byte_shape is None
                 and leaves is None and action_mask is None)
        recurrent = self.model_config.recurrent
        #: Training on sequences (a network with memory): the ``recurrent`` table, else None.
        self.recurrent = recurrent
        if recurrent is not None and hp.mixed_precision != "off":
            raise ValueError(f"mixed_precision {hp.mixed_precision!r} with a model with memory (recurrent) is not "
                             "supported yet: use 'off'")
        state = () if recurrent is None else tuple(
            (f"state_in_{n}", f"state_out_{n}", recurrent.size) for n in recurrent.state_names)
        self._traced = None if fixed else TracedPolicyExporter(onnx_input_name, onnx_output_name, obs_dim, byte_shape,
                                                               leaves, state)
        self.optimizer = adam(self.model.parameters(), lr=hp.lr, eps=1e-5)  # (no compiler import: optimizer_startup.py)
        self._rng = np.random.default_rng(seed)
        #: **[1.6]** A demonstration dataset cloned beside PPO in every update (cloning.py).
        self.demos: CloningData | None = None
        #: Updates that trained with the dataset so far (its coefficient's decay; kept in checkpoints).
        self.demo_updates = 0
        self._value_obs_dim = value_obs_dim
        #: Several ranks train this module together (distributed/data_parallel.py), else None.
        self.data_parallel: Any = None
        #: The share of the run left when the next update starts (schedule.py; set by the learner loop).
        self.run_left = 1.0
        #: Several ranks: the (lr, ent_coef) bases rank 0 handed every rank for the update that runs (the
        #: console may change this rank's own meanwhile); None: ``hp``'s.
        self.pinned_bases: tuple[float, float] | None = None

    def _cloning_data(self, episodes: list[EpisodeChunk], returns: np.ndarray | None) -> CloningData:
        if self.recurrent is not None and self._value_obs_dim is not None:
            raise ValueError("demonstrations for a module with memory and a centralized critic are not supported: "
                             "a demonstration file holds no critic input (value_obs)")
        return CloningData(episodes, self.recurrent, self.device, returns)

    def set_demonstrations(self, episodes: list[EpisodeChunk]) -> None:
        """Train on these demonstration episodes (whole, validated against the module's spaces) by
        behavioural cloning in every update (``demo_coef``), beside PPO. A network with memory clones
        along sequences from each episode's zero state (cloning.py)."""
        self.demos = self._cloning_data(episodes, None)

    def demo_coef_now(self) -> float:
        """The dataset's cloning coefficient for the next update (after its linear decay)."""
        hp = self.hp
        if self.demos is None:
            return 0.0
        if hp.demo_decay_updates <= 0:
            return hp.demo_coef
        return hp.demo_coef * max(0.0, 1.0 - self.demo_updates / hp.demo_decay_updates)

    def _cloning_loss(self, dist_inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The behavioural-cloning loss: the mean of -log pi(a | o) over the given steps."""
        return -ActionDistribution(self.action_space, dist_inputs).log_prob(actions).mean()

    def pretrain(self, episodes: list[EpisodeChunk], returns: np.ndarray | None, epochs: int) -> list[float]:
        """Behavioural cloning from demonstration episodes (``tether pretrain``): ``epochs`` passes of
        minibatches of about ``minibatch_size`` steps minimising -log pi(a | o) (a network with memory:
        windows of sequences from each episode's zero state), and, with ``returns`` (the discounted
        return from each step, in episode order), the value loss towards them, so PPO starts from a
        critic that knows the demonstrated states. Returns the mean cloning loss of each epoch."""
        data = self._cloning_data(episodes, returns)
        if self.normalizer is not None:
            self.normalizer.observe(data.batch.all_obs)
        for group in self.optimizer.param_groups:
            group["lr"] = self.hp.lr  # (the configured rate: a loaded optimizer state holds its last step's)
        losses: list[float] = []
        for _ in range(epochs):
            total = 0.0
            for steps, dist_inputs, values in data.epoch(self.model, self._rng, self.hp.minibatch_size):
                bc = self._cloning_loss(dist_inputs, data.actions[steps])
                loss = bc if values is None or data.returns is None else bc + self.hp.vf_coef * 0.5 * (
                    (values - data.returns[steps]) ** 2).mean()
                if not torch.isfinite(loss):
                    raise NonFiniteUpdate(f"the cloning loss is {loss.item()}")
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.model.parameters(), self.hp.max_grad_norm)
                self.optimizer.step()
                total += bc.item() * int(steps.shape[0])
            losses.append(total / data.steps)
        return losses

    def export_onnx(self) -> bytes:
        """The current policy as ONNX bytes (see onnx_export.py)."""
        if self._traced is not None:
            return self._traced.export(self.model)
        assert isinstance(self.model, ActorCritic)
        return export_policy(self.model, self.onnx_input_name, self.onnx_output_name)

    def _tensor(self, array: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.device.type != "cuda":
            return torch.as_tensor(array, dtype=dtype, device=self.device)
        # To a GPU from page-locked host memory: the copy is a DMA that does not wait on the host.
        return torch.as_tensor(array, dtype=dtype).pin_memory().to(self.device, non_blocking=True)

    def _forward_precision(self) -> Any:
        """The context of the update's forward passes: bfloat16 autocast with mixed_precision "bf16"."""
        if self.hp.mixed_precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _evaluate(self, obs: torch.Tensor, actions: torch.Tensor, value_obs: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log pi(a|o), entropy and V(o) of a minibatch, in the update's precision; float32 out (the losses'
        precision)."""
        with self._forward_precision():
            logp, entropy, value = self.model.evaluate(obs, actions, value_obs)
        return logp.float(), entropy.float(), value.float()

    def save_state(self) -> tuple:
        """A copy of everything an update changes (weights, optimizer, minibatch order, the demonstration
        term's decay count); ``load_state`` puts it back, so a trial update leaves no trace."""
        return (copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict()),
                copy.deepcopy(self._rng.bit_generator.state), self.demo_updates)

    def load_state(self, saved: tuple) -> None:
        """Restore what ``save_state`` returned."""
        self.model.load_state_dict(saved[0])
        self.optimizer.load_state_dict(saved[1])
        self._rng.bit_generator.state = copy.deepcopy(saved[2])
        self.demo_updates = saved[3]

    def batch_of(self, chunks: Sequence[EpisodeChunk]) -> RolloutBatch:
        """The batch of pooled chunks (their composite rows unpacked where they were pooled packed)."""
        return build_batch(chunks, self.packing)

    def untrainable_steps(self, batch: RolloutBatch) -> np.ndarray:
        """Per step, whether the update could not train on it whatever else the batch
        holds: its value or value target (computed as ``update`` does) is not finite
        or reaches TARGET_LIMIT in magnitude, so the value loss would overflow; or, for a
        network with memory, its behaviour logp is RECURRENT_LOGP_LIMIT or more from the
        current policy's (the server cannot recheck those at ingest, §13.6)."""
        states = state_pass(self.model, batch, self.device) if self.recurrent is not None else None
        with np.errstate(over="ignore", invalid="ignore"):
            values, _, returns = self._targets(batch, states)
            bad = ~np.isfinite(values) | ~np.isfinite(returns) | (np.abs(returns) >= TARGET_LIMIT)
            if states is not None:
                far = np.abs(batch.logp - self._current_logp(batch, states)) >= RECURRENT_LOGP_LIMIT  # (NaN: False)
                bad |= far if batch.logged is None else far & ~batch.logged  # (1.6: a logged step has no logp)
            return bad

    def _current_logp(self, batch: RolloutBatch, states: StatePass) -> np.ndarray:
        """log pi(a_t | the state pass's state and o_t) of every step, with the current weights."""
        act_dtype = torch.float32 if batch.actions.dtype.kind == "f" else torch.long
        steps_dist = states.dist_inputs[torch.as_tensor(batch.next_obs_index - 1, device=self.device)]
        with torch.no_grad():
            return ActionDistribution(self.action_space, steps_dist).log_prob(
                self._tensor(batch.actions, act_dtype)).cpu().numpy()

    def _targets(self, batch: RolloutBatch, states: StatePass | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per step: V(o_t), the GAE advantage and the value target, with the current critic (for a
        network with memory, from ``states``: the pass along the chunks, sequences.py)."""
        hp = self.hp
        if self.recurrent is None and self.device.type == "cuda":
            return self._targets_on_device(batch)
        if self.recurrent is not None:
            all_values = (states or state_pass(self.model, batch, self.device)).values
        else:
            critic_input = batch.all_obs if batch.all_value_obs is None else batch.all_value_obs
            with torch.no_grad():
                all_values = self.model.value(self._tensor(critic_input)).cpu().numpy()
        values = all_values[batch.next_obs_index - 1]
        next_values = all_values[batch.next_obs_index]
        rewards = batch.rewards
        if hp.reward_clip is not None:
            rewards = np.clip(rewards, -hp.reward_clip, hp.reward_clip)
        advantages, returns = compute_gae(
            rewards, values, next_values, batch.terminated, batch.chunk_ends, hp.gamma, hp.gae_lambda
        )
        return values, advantages, returns

    def _targets_on_device(self, batch: RolloutBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_targets`` on a GPU: the critic's values stay there and GAE runs there, every chunk at once
        (gae.py's compute_gae_batched); only the results come back to the host."""
        hp = self.hp
        critic_input = batch.all_obs if batch.all_value_obs is None else batch.all_value_obs
        with torch.no_grad():
            all_values = self.model.value(self._tensor(critic_input)).float()
            steps = torch.as_tensor(batch.next_obs_index, device=self.device)
            values, next_values = all_values[steps - 1], all_values[steps]
            rewards = self._tensor(batch.rewards)
            if hp.reward_clip is not None:
                rewards = rewards.clamp(-hp.reward_clip, hp.reward_clip)
            advantages, returns = compute_gae_batched(rewards, values, next_values,
                                                      self._tensor(batch.terminated, torch.bool),
                                                      self._tensor(batch.chunk_ends, torch.bool), hp.gamma,
                                                      hp.gae_lambda)
        return values.cpu().numpy(), advantages.cpu().numpy(), returns.cpu().numpy()

    def update(self, batch: RolloutBatch | None, global_steps: int | None = None) -> dict[str, float]:
        """One PPO update (all epochs and minibatches) on a batch; returns loss statistics.

        Every step is used: the last, partial minibatch of an epoch too. A
        minibatch of ``k < minibatch_size`` steps is taken with the learning
        rate scaled by ``k / minibatch_size`` (the linear scaling rule), so a
        module that received only a few steps moves only a little. If the
        loss, a gradient or a weight becomes non-finite, the model and the
        optimizer are restored and ``NonFiniteUpdate`` is raised.

        With ``data_parallel`` set, ``global_steps`` is the batch's size over all ranks and every
        rank calls this together, ``batch`` being its own steps (None: it has none); the ranks
        take the same steps with the same gradients (distributed/data_parallel.py).
        """
        saved = (copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict()), self.demo_updates)
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # overflow is caught below as a non-finite loss
                stats = self._update_without_steps(global_steps) if batch is None else self._update(batch, global_steps)
            if not all(torch.isfinite(t).all() for t in (*self.model.parameters(), *self.model.buffers())):
                raise NonFiniteUpdate("weights became non-finite")
        except NonFiniteUpdate:
            self.model.load_state_dict(saved[0])
            self.optimizer.load_state_dict(saved[1])
            self.demo_updates = saved[2]
            raise
        return stats

    def _update_without_steps(self, global_steps: int | None) -> dict[str, float]:
        """A rank with none of the module's steps: the same sums and optimizer steps as the ranks
        that have some (zeros from here), so that every rank joins every sum and ends with the same weights."""
        assert self.data_parallel is not None and global_steps is not None, "an update without steps needs other ranks"
        zeros = torch.zeros(0, device=self.device)
        lr = self.lr_now()
        if self.normalizer is not None:  # (the other ranks' observations move this rank's statistics too)
            self.normalizer.observe(np.zeros((0, self.normalizer.obs_dim), np.float32), self.data_parallel)
        for _ in range(self.hp.num_epochs):
            for _ in range(self.data_parallel.minibatch_count(global_steps, self.hp.minibatch_size)):
                if self.hp.norm_adv:
                    self.data_parallel.advantage_moments(zeros)
                self._take_step(None, 0, lr)
        if self.demo_coef_now() > 0:
            self.demo_updates += 1  # (the demonstration term decays with the group's updates, on every rank alike)
        return {}

    def _take_step(self, loss: torch.Tensor | None, size: int, lr: float) -> None:
        """Backpropagate ``loss`` (the mean over this minibatch's ``size`` steps), sum the gradients over
        the ranks when there are several, clip and step with ``lr`` (the update's, read once as it
        started) scaled to the minibatch's size. Raises NonFiniteUpdate for a loss or gradient norm that is not finite
        (on every rank alike when there are several)."""
        hp = self.hp
        self.optimizer.zero_grad(set_to_none=True)
        finite = loss is None or bool(torch.isfinite(loss))
        if loss is not None and finite:
            loss.backward()
        if self.data_parallel is not None:
            size, finite = self.data_parallel.sum_gradients(self.model.parameters(), size, finite)
            if not finite:
                raise NonFiniteUpdate("a rank's loss is not finite")
            if size == 0:
                return  # (no rank had a step for this minibatch)
        elif not finite:
            assert loss is not None
            raise NonFiniteUpdate(f"loss is {loss.item()}")
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), hp.max_grad_norm)
        if not torch.isfinite(grad_norm):
            raise NonFiniteUpdate(f"gradient norm is {grad_norm.item()}")
        for group in self.optimizer.param_groups:
            group["lr"] = lr * min(1.0, size / hp.minibatch_size)
        self.optimizer.step()

    def _update(self, batch: RolloutBatch, global_steps: int | None = None) -> dict[str, float]:
        hp = self.hp
        # (read once: the console's set_lr and set_ent_coef, on the event loop, apply from the next update,
        # so that every minibatch, and every rank, steps with the same values)
        lr, ent_coef = self.lr_now(), self.ent_coef_now()
        parallel = self.data_parallel
        if self.normalizer is not None:  # the statistics follow the data trained on, this batch included (every rank's)
            self.normalizer.observe(batch.all_obs, self.data_parallel)
        states = state_pass(self.model, batch, self.device) if self.recurrent is not None else None
        values, advantages, returns = self._targets(batch, states)
        step_index = batch.next_obs_index - 1

        obs = self._tensor(batch.obs)
        value_obs = None if batch.all_value_obs is None else self._tensor(batch.all_value_obs[step_index])
        act_dtype = torch.float32 if batch.actions.dtype.kind == "f" else torch.long
        actions = self._tensor(batch.actions, act_dtype)
        old_logp = self._tensor(batch.logp)
        logged = None if batch.logged is None or not batch.logged.any() else self._tensor(batch.logged, torch.bool)
        missing = torch.isnan(old_logp) if logged is None else torch.isnan(old_logp) | logged
        if missing.any():
            with torch.no_grad():
                if states is not None:
                    current = self._tensor(self._current_logp(batch, states))
                else:
                    current, _, _ = self.model.evaluate(obs, actions, value_obs)
            old_logp = torch.where(missing, current, old_logp)
        adv_t = self._tensor(advantages)
        ret_t = self._tensor(returns)
        val_t = self._tensor(values)

        mb = hp.minibatch_size
        parts = None if parallel is None else parallel.minibatch_count(global_steps or batch.size, mb)
        if states is not None:
            minibatches = self._sequence_minibatches(batch, states, actions, parts)
        else:
            minibatches = self._step_minibatches(batch.size, obs, actions, value_obs, parts)
        stats: dict[str, list[float]] = {k: [] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")}
        if logged is not None:
            stats["bc_loss"] = []
        demo_coef = self.demo_coef_now()
        if demo_coef > 0:
            stats["demo_bc_loss"] = []
            assert self.demos is not None
            self.demos.refresh(self.model)  # (memory: the windows' start states, with this update's weights)
        for _ in range(hp.num_epochs):
            for idx, new_logp, entropy, new_value in minibatches():
                size = int(idx.shape[0])
                if size == 0:  # (several ranks: this rank holds no step of this minibatch; it joins the sums)
                    if hp.norm_adv:
                        parallel.advantage_moments(adv_t[idx])
                    self._take_step(None, 0, lr)
                    continue
                # 1.6 (§13.7): the surrogate only on sampled steps; logged ones are cloned instead.
                cloned = None if logged is None else logged[idx]
                sampled = slice(None) if cloned is None else ~cloned
                log_ratio = (new_logp - old_logp[idx])[sampled]
                ratio = log_ratio.exp()
                adv = adv_t[idx][sampled]
                n_sampled = int(adv.shape[0])
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean() if n_sampled else torch.zeros(())
                    clipfrac = ((ratio - 1.0).abs() > hp.clip_coef).float().mean() if n_sampled else torch.zeros(())
                if hp.norm_adv and parallel is not None:  # (the whole minibatch's statistics, every rank's steps)
                    mean, std, total = parallel.advantage_moments(adv)
                    if total > 1:
                        adv = (adv - mean) / (std + 1e-8)
                elif hp.norm_adv and n_sampled > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - hp.clip_coef, 1 + hp.clip_coef)
                                    ).mean() if n_sampled else torch.zeros((), device=self.device)
                if hp.clip_vloss:
                    v_clipped = val_t[idx] + torch.clamp(new_value - val_t[idx], -hp.clip_coef, hp.clip_coef)
                    v_loss = 0.5 * torch.max((new_value - ret_t[idx]) ** 2, (v_clipped - ret_t[idx]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((new_value - ret_t[idx]) ** 2).mean()
                ent = entropy.mean()
                loss = pg_loss - ent_coef * ent + hp.vf_coef * v_loss
                if cloned is not None and bool(cloned.any()):
                    bc_loss = -new_logp[cloned].mean()
                    loss = loss + hp.bc_coef * bc_loss
                    stats["bc_loss"].append(bc_loss.item())
                if demo_coef > 0:
                    assert self.demos is not None
                    steps, demo_dist, _ = self.demos.sample(self.model, self._rng, mb)
                    demo_loss = self._cloning_loss(demo_dist, self.demos.actions[steps])
                    loss = loss + demo_coef * demo_loss
                    stats["demo_bc_loss"].append(demo_loss.item())
                self._take_step(loss, size, lr)
                if n_sampled:  # (a minibatch of logged steps only has no surrogate to report)
                    stats["policy_loss"].append(pg_loss.item())
                    stats["approx_kl"].append(approx_kl.item())
                    stats["clipfrac"].append(clipfrac.item())
                stats["value_loss"].append(v_loss.item())
                stats["entropy"].append(ent.item())
        if demo_coef > 0:
            self.demo_updates += 1
        var_y = float(np.var(returns))
        out = {k: float(np.mean(v)) if v else 0.0 for k, v in stats.items()}
        if batch.logged is not None:
            out["logged_fraction"] = float(batch.logged.mean())
        if demo_coef > 0:
            out["demo_coef"] = demo_coef
        if hp.lr_schedule != "constant" or hp.ent_coef_schedule != "constant":  # (what this update trained with)
            out["lr"], out["ent_coef"] = lr, ent_coef
        out["explained_variance"] = float("nan") if var_y == 0 else 1.0 - float(np.var(returns - values)) / var_y
        return out

    def _step_minibatches(self, n: int, obs: torch.Tensor, actions: torch.Tensor, value_obs: torch.Tensor | None,
                          parts: int | None = None):
        """One epoch of minibatches of steps in a new random order: (steps, logp, entropy, value) each.
        With ``parts`` (several ranks), exactly that many, some possibly empty (steps only, the rest None)."""
        def epoch():
            if parts is not None:
                for chosen in self.data_parallel.parts(self._rng.permutation(n), parts):
                    idx = torch.as_tensor(chosen, device=self.device, dtype=torch.long)
                    if not len(chosen):
                        yield idx, None, None, None
                        continue
                    yield (idx, *self._evaluate(obs[idx], actions[idx],
                                                None if value_obs is None else value_obs[idx]))
                return
            order = torch.as_tensor(self._rng.permutation(n), device=self.device)
            for start in range(0, n, self.hp.minibatch_size):
                idx = order[start:start + self.hp.minibatch_size]
                yield (idx, *self._evaluate(obs[idx], actions[idx], None if value_obs is None else value_obs[idx]))
        return epoch

    def _sequence_minibatches(self, batch: RolloutBatch, states: StatePass, actions: torch.Tensor,
                              parts: int | None = None):
        """One epoch of minibatches of whole windows (sequences.py) in a new random order, packed to
        ``minibatch_size`` steps each: (steps, logp, entropy, value) of their real steps. With ``parts``
        (several ranks), exactly that many, of near-equal numbers of windows, some possibly empty."""
        assert self.recurrent is not None
        win = windows(batch, self.recurrent.seq_len, self.recurrent.burn_in)
        obs = torch.as_tensor(batch.all_obs, device=self.device)  # (uint8 images stay bytes until read)
        critic = None if batch.all_value_obs is None else self._tensor(batch.all_value_obs)

        def epoch():
            order = self._rng.permutation(win.count)
            chosen_parts = (win.minibatches(order, self.hp.minibatch_size) if parts is None
                            else self.data_parallel.parts(order, parts))
            for chosen in chosen_parts:
                if not len(chosen):  # (several ranks: none of this minibatch's windows is this rank's)
                    yield torch.zeros(0, dtype=torch.long, device=self.device), None, None, None
                    continue
                steps, dist_inputs, values = run_windows(self.model, win, chosen, obs, critic, states.state_before)
                dist = ActionDistribution(self.action_space, dist_inputs)
                yield steps, dist.log_prob(actions[steps]), dist.entropy(), values
        return epoch

    def set_run_left(self, left: float) -> None:
        """The share of the run left (in [0, 1]) as the next update starts: the schedules' factor
        (``lr_schedule``, ``ent_coef_schedule``; schedule.py)."""
        self.run_left = min(1.0, max(0.0, float(left)))

    def lr_now(self) -> float:
        """The learning rate the next update trains with: ``lr`` after its schedule."""
        base = self.hp.lr if self.pinned_bases is None else self.pinned_bases[0]
        return scheduled(base, self.hp.lr_schedule, self.run_left)

    def ent_coef_now(self) -> float:
        """The entropy coefficient the next update trains with: ``ent_coef`` after its schedule."""
        base = self.hp.ent_coef if self.pinned_bases is None else self.pinned_bases[1]
        return scheduled(base, self.hp.ent_coef_schedule, self.run_left)

    def set_lr(self, lr: float) -> None:
        """Train with learning rate ``lr`` from the next update on (the console's set_lr; an update reads
        it once as it starts, and sets the optimizer's rate at every step)."""
        self.hp.lr = lr

    def set_ent_coef(self, ent_coef: float) -> None:
        """Train with entropy coefficient ``ent_coef`` from the next update on (the console's set_ent_coef)."""
        self.hp.ent_coef = ent_coef

    def state_dict(self) -> dict:
        """Weights, optimizer, and the hyperparameters that can change while the run goes
        (the console's set_lr and set_ent_coef): a resumed run continues with them."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "live_hyperparams": {"lr": float(self.hp.lr), "ent_coef": float(self.hp.ent_coef)},
                "demo_updates": self.demo_updates}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.demo_updates = int(state.get("demo_updates", 0))
        live = state.get("live_hyperparams") or {}  # absent in checkpoints written before they were kept
        if "lr" in live:
            self.set_lr(float(live["lr"]))
        if "ent_coef" in live:
            self.set_ent_coef(float(live["ent_coef"]))
