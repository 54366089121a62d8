"""No step of ``training/fit/`` takes more than six parameters: a step that needs more reads them
from the run object (:class:`suffice.training.fit.loop.TrainingRun`), the way setfit's ``Trainer``
steps read the trainer."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import suffice.training.fit as fit

MAX_PARAMETERS = 6


def fit_functions():
    """(qualified name, function) for every function and method written in a ``suffice.training.fit`` module
    (dataclass-generated ``__init__`` methods are left out: their fields are the run object's point)."""
    for info in pkgutil.iter_modules(fit.__path__):
        module = importlib.import_module(f"{fit.__name__}.{info.name}")
        source = inspect.getsourcefile(module)
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            candidates = [(name, obj)] if inspect.isfunction(obj) else []
            if inspect.isclass(obj):
                candidates = [(f"{name}.{n}", getattr(f, "__func__", f)) for n, f in vars(obj).items()]
            for qual, f in candidates:
                if inspect.isfunction(f) and inspect.getsourcefile(f) == source:
                    yield f"{module.__name__}.{qual}", f


def test_every_fit_function_takes_at_most_six_parameters():
    found = list(fit_functions())
    assert len(found) > 50  # the walk reached the modules
    wide = {name: n for name, f in found
            if (n := len([p for p in inspect.signature(f).parameters if p not in ("self", "cls")])) > MAX_PARAMETERS}
    assert not wide, f"functions in training/fit/ with more than {MAX_PARAMETERS} parameters (read them from TrainingRun): {wide}"
