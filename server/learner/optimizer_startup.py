"""Creating an optimizer without importing torch's compiler.

torch.optim wraps ``Optimizer.add_param_group``, ``zero_grad``, ``state_dict`` and
``load_state_dict`` in ``torch._disable_dynamo``, whose first call imports ``torch._dynamo``, the
compiler stack: about 1.2 s of imports on a quiet 2-core machine, paid by every ``tether serve``
before it listens, because its learners build their optimizers at start-up. The learner never
compiles, so those functions need no dynamo guard: their wrappers are resolved to the plain
functions here. (``Optimizer.step`` still imports it once, at the first update, on the learner's
thread.) When a torch version wraps them differently, nothing is changed.
"""

from __future__ import annotations

import torch
import torch._compile

_WRAPPED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _is_dynamo_guard(function: object) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and code.co_filename == torch._compile.__file__ and hasattr(function, "__wrapped__")


def resolve_dynamo_guards() -> int:
    """Resolves the guards of ``torch.optim.Optimizer``'s set-up methods (idempotent); returns how many."""
    resolved = 0
    for name in _WRAPPED:
        guard = vars(torch.optim.Optimizer).get(name)
        if _is_dynamo_guard(guard):
            plain = guard.__wrapped__  # type: ignore[union-attr]
            # torch._compile caches the disabled function under this name on the wrapped one.
            plain.__dynamo_disable = plain  # type: ignore[attr-defined]
            resolved += 1
    return resolved
