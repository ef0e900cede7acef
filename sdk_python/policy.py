"""Local inference: an ONNX Runtime session that turns observations into actions."""

from __future__ import annotations

import functools
import random
import threading
from typing import Any, Callable

import numpy as np
import onnxruntime as ort

from tether.protocol.distributions import deterministic, dist_inputs_size, sample
from tether.protocol.episodes import StateSpec
from tether.protocol.model_input import ModelFeeds
from tether.protocol.spaces import Discrete, Space


class OnnxPolicy:
    """Wraps one ONNX model: obs (batch, obs_dim) -> action_dist_inputs (batch, K).

    Sessions use one intra-op thread: for the small networks games use, that is
    both the fastest per call and the kindest to the engine's own threads.

    **[1.5]** A model with memory (``recurrent_state``, §12.1) also takes the state before the step
    and returns the state after it; ``step`` and ``step_one`` feed and return it. Its keeper is the
    client (per agent), never the engine.
    """

    def __init__(
        self,
        model_bytes: bytes,
        action_space: Space | None = None,
        input_name: str | None = None,
        output_name: str | None = None,
        seed: int | None = None,
        observation_space: Space | None = None,
        recurrent_state: tuple[StateSpec, ...] = (),
    ) -> None:
        """``observation_space``: needed for a Dict or Tuple observation (**[1.4]**: one input per leaf).
        ``recurrent_state``: **[1.5]** the module's state tensors as SET_CONFIG announces them."""
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        self.input_name = input_name or inputs[0].name
        #: float32 rows, or (1.4) a uint8 Box's observations in their own shape, or one input per
        #: leaf of a composite observation, fed from its flat rows (§12.1).
        self.feeds = ModelFeeds.of_session(inputs, observation_space, self.input_name)
        self.output_name = output_name or outputs[0].name
        self.recurrent_state = tuple(recurrent_state)
        have_in, have_out = {i.name for i in inputs}, {o.name for o in outputs}
        lacking = [s.input for s in recurrent_state if s.input not in have_in] + [
            s.output for s in recurrent_state if s.output not in have_out]
        if lacking:
            raise ValueError(f"the model has no input or output {lacking[0]!r} of its announced recurrent state")
        self._output_names = [self.output_name, *(s.output for s in recurrent_state)]
        #: (state tensors, units) of a model with memory, else None.
        self.state_shape = (len(recurrent_state), recurrent_state[0].size) if recurrent_state else None
        out_dim = outputs[0].shape[-1]
        # A server that does not describe its action space (RLlib's v1) serves
        # categorical logits: infer Discrete(K) from the output width.
        if action_space is None:
            if not isinstance(out_dim, int):
                raise ValueError("cannot infer the action space from the model; pass action_space")
            action_space = Discrete(out_dim)
        if isinstance(out_dim, int) and out_dim != dist_inputs_size(action_space):
            raise ValueError(
                f"model outputs {out_dim} action_dist_inputs but the action space "
                f"{action_space.to_json()} needs {dist_inputs_size(action_space)}"
            )
        self.action_space = action_space
        self._rng = random.Random(seed)
        # One-row calls (an engine's get_action) run through buffers bound once; None where the model's
        # shapes leave that open. A call that finds them in use (another thread's) runs unbound.
        self._one_row = _BoundRow.of(self.session, self.feeds, self._output_names, self.recurrent_state)
        self._one_row_lock = threading.Lock()

    def _run_one(self, obs: np.ndarray, state: list[np.ndarray] | None,
                 own_state: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
        """One observation (and its state, for a model with memory): (dist inputs, the state after).
        ``own_state``: the state may be one this policy's bound run returned last (``step_own``)."""
        if (self.state_shape is not None) != (state is not None) or (
                state is not None and len(state) != self.state_shape[0]):  # type: ignore[index]
            raise ValueError(f"the model has {0 if self.state_shape is None else self.state_shape[0]} state "
                             f"tensor(s); {0 if state is None else len(state)} given (step_one takes a model "
                             "with memory's state)")
        bound = self._one_row
        if bound is not None and self._one_row_lock.acquire(blocking=False):
            try:
                return bound.run(obs, state, own_state)
            finally:
                self._one_row_lock.release()
        feeds = self.feeds.feed(obs, 1)
        if state is None:
            return self.session.run(self._output_names, feeds)[0][0], []
        dist, after = self._run(feeds, state)
        return dist[0], after

    def dist_inputs(self, obs_batch: np.ndarray) -> np.ndarray:
        """Raw model output for a batch of observations (rows)."""
        return self.session.run(self._output_names, self.feeds.feed(obs_batch, len(obs_batch)))[0]

    def dist_inputs_one(self, obs: np.ndarray) -> np.ndarray:
        """Raw model output for one observation (a new array); ValueError for a model with memory
        (``step_one`` takes its state)."""
        return self._run_one(obs, None)[0]

    def initial_state(self, rows: int = 1) -> list[np.ndarray] | None:
        """The state of actors that have not acted yet: zeros, one (rows, size) array per state
        tensor (None without memory)."""
        if self.state_shape is None:
            return None
        return [np.zeros((rows, self.state_shape[1]), np.float32) for _ in range(self.state_shape[0])]

    def fits(self, state: list[np.ndarray] | None) -> bool:
        """Whether ``state`` (one actor's) is a state of this model's shape."""
        return state is not None and self.state_shape is not None and len(state) == self.state_shape[0] \
            and state[0].shape[-1] == self.state_shape[1]

    def step(self, obs_batch: np.ndarray, states: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """A model with memory, for rows of observations and their states (one (rows, size) array per
        state tensor): (dist inputs, the states after the step, in the same form)."""
        return self._run(self.feeds.feed(obs_batch, len(obs_batch)), states)

    def step_one(self, obs: np.ndarray, state: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """``step`` for one observation and its state (arrays of one row): the state after it is new
        arrays, so the one given stays as it was (a record may hold it)."""
        return self._run_one(obs, state)

    def step_own(self, obs: np.ndarray, state: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """``step_one`` on the clients' per-step path, for the state an actor keeps: made by a policy of
        this state's shape (``initial_state`` or an earlier step) and never changed since. When it is
        what this policy's last ``step_own`` returned, its values are already where the model reads
        them and are not assigned again (a state changed in place would not be seen)."""
        bound = self._one_row  # (_run_one's path, its state count checked first as there)
        if bound is None or self.state_shape is None or state is None or len(state) != self.state_shape[0] \
                or not self._one_row_lock.acquire(blocking=False):
            return self._run_one(obs, state, True)
        try:
            return bound.run(obs, state, True)
        finally:
            self._one_row_lock.release()

    def _run(self, feeds: dict[str, np.ndarray], states: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        for spec, value in zip(self.recurrent_state, states):
            feeds[spec.input] = value
        out = self.session.run(self._output_names, feeds)
        return out[0], out[1:]

    def sample(self, obs: np.ndarray, rng: random.Random | None = None) -> tuple[Any, float, np.ndarray]:
        """Sample one action for one observation: (action, logp, dist_inputs).

        ``rng`` defaults to the policy's own generator (seeded by ``seed``);
        the clients pass theirs, which outlives every model swap.
        """
        dist = self.dist_inputs_one(obs)
        action, logp = sample(self.action_space, dist, rng or self._rng)
        return action, logp, dist

    def act_deterministic(self, obs: np.ndarray) -> Any:
        """The most likely action (argmax / mean) for one observation."""
        dist = self.dist_inputs_one(obs)
        return deterministic(self.action_space, dist)


class _BoundRow:
    """One observation's run through ONNX Runtime's IOBinding: the model's inputs and outputs are
    arrays bound once, filled and read in place. ``InferenceSession.run`` builds and checks its feed
    and converts every output on each call, which for the small models of games costs as much as
    the model itself (an LSTM's three inputs and outputs most)."""

    def __init__(self, session: ort.InferenceSession, inputs: list[tuple[str, np.ndarray, slice | None]],
                 state_inputs: list[tuple[str, np.ndarray]], outputs: list[tuple[str, np.ndarray]]) -> None:
        """``inputs``: (name, the bound array, the leaf's values within a flat row or None for the whole
        row); ``state_inputs``: (name, array) per state tensor; ``outputs``: (name, array), the dist
        inputs first, then the state after the step per state tensor."""
        self._inputs = [(array, part) for _, array, part in inputs]
        # The common case, found once: one input that takes the whole row, which an observation in
        # the row's own shape is assigned to as it is.
        self._row = self._inputs[0][0][0] if len(self._inputs) == 1 and self._inputs[0][1] is None else None
        self._dist = outputs[0][1][0]
        # Per binding: (the run, its state inputs, its state outputs). A model with memory has a second
        # binding with the state arrays swapped, so that the state one step leaves in its outputs is
        # where the next step reads it: a client's next step of the same actor assigns no state
        # (``run``'s ``own_state``), and the two take turns.
        inputs = [(name, array) for name, array, _ in inputs]
        self._turns = [self._bind(session, inputs + state_inputs, outputs)]
        if state_inputs:
            swapped_outputs = [(name, array) for (name, _), (_, array) in zip(outputs[1:], state_inputs)]
            swapped_inputs = [(name, array) for (name, _), (_, array) in zip(state_inputs, outputs[1:])]
            self._turns.append(self._bind(session, inputs + swapped_inputs, outputs[:1] + swapped_outputs))
        self._turn = 0
        #: The state the last own-state step returned: its values are in the next turn's state inputs.
        self._last_state: list[np.ndarray] | None = None

    @staticmethod
    def _bind(session: ort.InferenceSession, inputs: list[tuple[str, np.ndarray]],
              outputs: list[tuple[str, np.ndarray]]) -> tuple[Callable[[], Any], list[np.ndarray], list[np.ndarray]]:
        """One binding of ``inputs`` (the observation's, then the state tensors') and ``outputs`` (the
        dist inputs, then the state tensors'): (the run, the state input arrays, the state output arrays)."""
        binding = session.io_binding()
        for name, array in inputs:
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        for name, array in outputs:
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        state_inputs = [array for _, array in inputs[len(inputs) - len(outputs) + 1:]]
        # The run itself: the session's native binding where this ONNX Runtime has one (a bound call,
        # no Python frame). Its Python wrapper's checks (graph capture on WebGPU) cost a CPU model of a
        # game's size a sixth of a call.
        native, native_binding = getattr(session, "_sess", None), getattr(binding, "_iobinding", None)
        if native is not None and native_binding is not None and hasattr(native, "run_with_iobinding"):
            run = functools.partial(native.run_with_iobinding, native_binding, None)
        else:
            run = functools.partial(session.run_with_iobinding, binding)
        return run, state_inputs, [array for _, array in outputs[1:]]

    @staticmethod
    def of(session: ort.InferenceSession, feeds: ModelFeeds, output_names: list[str],
           recurrent_state: tuple[StateSpec, ...]) -> "_BoundRow | None":
        """For a model whose inputs and outputs have fixed sizes past the batch dimension and float
        outputs, else None (such a model runs unbound)."""
        inputs = []
        for name, layout, part in feeds.inputs:
            if layout.dims is None:
                return None
            inputs.append((name, np.zeros((1, *layout.dims), layout.dtype), part))
        described = {o.name: o for o in session.get_outputs()}
        outputs = []
        for name in output_names:
            dims = list(described[name].shape)[1:]
            if described[name].type != "tensor(float)" or not all(isinstance(d, int) for d in dims):
                return None
            outputs.append((name, np.zeros((1, *dims), np.float32)))
        state_inputs = [(spec.input, np.zeros((1, spec.size), np.float32)) for spec in recurrent_state]
        if any(array.shape != (1, spec.size) for (_, array), spec in zip(outputs[1:], recurrent_state)):
            return None
        return _BoundRow(session, inputs, state_inputs, outputs)

    def run(self, obs: np.ndarray, state: list[np.ndarray] | None,
            own_state: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
        """One observation (and, for a model with memory, its state: one (1, size) array per tensor):
        (the dist inputs, the state after the step), new arrays each. ``own_state``: an actor's kept
        state, unchanged since it was returned (``step_own``): the one returned last is in the next
        turn's state inputs already, and is not assigned again."""
        # (Every check and numpy call costs a tenth of a microsecond or more against a model run of a
        # few: the common row is assigned as it is.)
        row = self._row
        if row is not None and obs.__class__ is np.ndarray and obs.shape == row.shape:
            row[...] = obs
        else:
            self._fill(obs)
        run, state_inputs, state_outputs = self._turns[self._turn]
        if state is None:
            run()
            return self._dist.copy(), []
        kept = own_state and state is self._last_state
        self._last_state = None  # (until this run has succeeded: a state refused half-way leaves no mark)
        if not kept:
            for array, value in zip(state_inputs, state):
                shape = value.shape if isinstance(value, np.ndarray) else np.shape(value)
                if shape[-1:] != array.shape[-1:]:  # (one value would fill the whole state)
                    raise ValueError(f"a state tensor of shape {shape}; the model's is {array.shape}")
                array[...] = value
        run()
        self._turn ^= 1
        after = list(map(np.ndarray.copy, state_outputs))
        if own_state:
            self._last_state = after
        return self._dist.copy(), after

    def _fill(self, obs: Any) -> None:
        """The model's inputs from an observation in any other form: a whole-row input's values in its
        (1, n) shape, an image's flat row, any other layout of the row's values, or a composite
        observation's flat row, split into its leaves' inputs."""
        if self._row is not None:
            array = self._inputs[0][0]
            obs = np.asarray(obs)
            if obs.size != array.size:  # (one value would fill the row)
                raise ValueError(f"an observation of {obs.size} values; the model takes {array.size}")
            if obs.shape == array.shape:
                array[...] = obs
            else:
                np.copyto(array, obs.reshape(array.shape), casting="unsafe")
        else:
            flat = np.ravel(obs)
            for array, part in self._inputs:
                np.copyto(array, flat[part].reshape(array.shape), casting="unsafe")
