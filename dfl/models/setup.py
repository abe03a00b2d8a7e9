"""`model_for_run`: the template model of a run, built (or taken) and checked before any training.

    torch.manual_seed(seed); model = factory(input_shape, num_classes, **options)      # a spec from the config
    model = copy.deepcopy(module)                                                       # dfl.run(config, model=module)

The model comes back on `device`, in train mode, checked by `dfl.models.check.check_model`. A module passed
in is copied (the caller's module is never changed); its parameters are every client's starting point.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from dfl.errors import ModelError
from dfl.models.check import check_model
from dfl.models.registry import build_model, call_factory


def model_for_run(spec: str, options: dict[str, Any], input_shape, num_classes: int, seed: int,
                  device: torch.device, sample: tuple[torch.Tensor, torch.Tensor], given: Any = None) -> nn.Module:
    """The run's model.

    `given` (an nn.Module or a factory from `dfl.run(config, model=...)`, recorded as `spec`) or the spec's factory,
    called after torch.manual_seed(seed); checked on `sample` = (x, y).
    """
    torch.manual_seed(seed)
    if isinstance(given, nn.Module):
        if options:
            raise ModelError(f"model_options {options} apply to a factory; the nn.Module given as model= "
                             f"({spec}) takes none")
        try:
            model = copy.deepcopy(given)
        except Exception as exc:
            raise ModelError(f"model {spec!r} cannot be copied ({type(exc).__name__}: {exc}); pass a factory "
                             "f(input_shape, num_classes) -> nn.Module instead") from exc
    elif given is not None and not isinstance(given, str):
        model = call_factory(given, spec, input_shape, num_classes, dict(options))
    else:
        model = build_model(spec, input_shape, num_classes, **options)
    model = model.to(device).train()
    check_model(model, spec, num_classes, *sample)
    return model
