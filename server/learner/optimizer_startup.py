"""Building a learner's optimizer without importing torch's compiler.

torch.optim wraps ``Optimizer.add_param_group`` in ``torch._disable_dynamo``, whose first call
imports ``torch._dynamo``, the compiler stack: about 1.2 s of imports on a quiet 2-core machine, paid
by every ``tether serve`` before it listens, because its learners build their optimizers at start-up.
The learner never compiles, so that guard has nothing to do: ``adam`` builds an Adam whose
``add_param_group`` is the plain function, on a subclass of its own (torch and any other optimizer in
the process are left as they are). The first update still imports the compiler once, on the
learner's thread (``Optimizer.step`` does). Where a torch version wraps the method differently, the
plain Adam is built.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch._compile


def _plain_add_param_group() -> Any:
    """``Optimizer.add_param_group`` without its dynamo guard, or None if it is not the guard we know."""
    guard = vars(torch.optim.Optimizer).get("add_param_group")
    code = getattr(guard, "__code__", None)
    if code is None or code.co_filename != torch._compile.__file__:
        return None
    return getattr(guard, "__wrapped__", None)


_PLAIN = _plain_add_param_group()


class _Adam(torch.optim.Adam):
    """Adam, its parameter groups added by the plain function (see the module docstring)."""

    if _PLAIN is not None:
        add_param_group = _PLAIN


def adam(params: Iterable[torch.nn.Parameter], **options: Any) -> torch.optim.Adam:
    """``torch.optim.Adam(params, **options)``, built without importing ``torch._dynamo``."""
    return _Adam(params, **options)


def builds_without_dynamo() -> bool:
    """Whether ``adam`` skips the guard on this torch (tested: a torch upgrade that changes it shows)."""
    return _PLAIN is not None
