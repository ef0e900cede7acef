"""Building a learner's optimizer without importing torch's compiler.

torch.optim wraps ``Optimizer``'s set-up methods (``add_param_group``, ``state_dict``,
``load_state_dict``, ``zero_grad``) in ``torch._disable_dynamo``, whose first call imports
``torch._dynamo``, the compiler stack: about 1.2 s of imports on a quiet 2-core machine, paid by every
``tether serve`` before it listens, because its learners build their optimizers and write the run's
first checkpoint at start-up. The learner never compiles, so that guard has nothing to do: ``adam``
builds an Adam whose set-up methods are the plain functions, on a subclass of its own (torch and any
other optimizer in the process are left as they are). The first update still imports the compiler
once, on the learner's thread (``Optimizer.step`` does). Where a torch version wraps a method
differently, that method keeps torch's wrapper.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch._compile


#: The methods whose guard is skipped: what building, checkpointing and restoring an optimizer call.
GUARDED_METHODS = ("add_param_group", "state_dict", "load_state_dict", "zero_grad")


def _plain(name: str) -> Any:
    """``Optimizer.<name>`` without its dynamo guard, or None if it is not the guard we know or Adam
    has a method of its own by that name (which the plain base method must not replace)."""
    guard = vars(torch.optim.Optimizer).get(name)
    code = getattr(guard, "__code__", None)
    if code is None or code.co_filename != torch._compile.__file__ or getattr(torch.optim.Adam, name) is not guard:
        return None
    return getattr(guard, "__wrapped__", None)


_PLAIN = {name: plain for name in GUARDED_METHODS if (plain := _plain(name)) is not None}

#: Adam with the plain set-up methods (see the module docstring).
_Adam = type("_Adam", (torch.optim.Adam,), dict(_PLAIN, __doc__="Adam, its set-up methods unguarded."))


def adam(params: Iterable[torch.nn.Parameter], **options: Any) -> torch.optim.Adam:
    """``torch.optim.Adam(params, **options)``, built without importing ``torch._dynamo``."""
    return _Adam(params, **options)


def builds_without_dynamo() -> bool:
    """Whether ``adam`` skips every guard on this torch (tested: a torch upgrade that changes it shows)."""
    return set(_PLAIN) == set(GUARDED_METHODS)
