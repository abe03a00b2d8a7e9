"""The client stack: every client's model as one row of an `[m, d]` tensor.

The flat layout is `model.named_parameters()` order, each tensor row-major. `ParamLayout` maps a flat
row (or a batch of rows under `vmap`) back to named parameter views, so `functional_call` can run the
template model with any client's parameters without copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dfl.models.layout import param_layout


@dataclass(frozen=True)
class ParamLayout:
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    numels: tuple[int, ...]

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        entries = param_layout(model)
        return cls(
            names=tuple(e[0] for e in entries),
            shapes=tuple(torch.Size(e[1]) for e in entries),
            offsets=tuple(e[3] for e in entries),
            numels=tuple(e[2] for e in entries),
        )

    @property
    def dim(self) -> int:
        return self.offsets[-1] + self.numels[-1] if self.names else 0

    def views(self, row: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views of a flat `[..., d]` tensor (leading dims kept): {name: [..., *shape]}."""
        lead = row.shape[:-1]
        return {
            name: row[..., o : o + k].view(*lead, *shape)
            for name, shape, o, k in zip(self.names, self.shapes, self.offsets, self.numels)
        }

    def flatten(self, model: nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])

    def mask(self, predicate) -> torch.Tensor:
        """A `[d]` bool vector, True on the coordinates of parameters whose name satisfies `predicate`."""
        out = torch.zeros(self.dim, dtype=torch.bool)
        for name, o, k in zip(self.names, self.offsets, self.numels):
            if predicate(name):
                out[o : o + k] = True
        return out

    def load_into(self, model: nn.Module, row: torch.Tensor) -> None:
        """Copy a flat `[d]` row into a module's parameters (used by references and evaluation tools)."""
        with torch.no_grad():
            for (_, p), view in zip(model.named_parameters(), self.views(row).values()):
                p.copy_(view)


def initial_stack(model: nn.Module, num_clients: int, device: torch.device) -> torch.Tensor:
    """X_0: every client starts from the template model's initial parameters (a common x_0)."""
    row = ParamLayout.of(model).flatten(model).to(device)
    return row.unsqueeze(0).repeat(num_clients, 1).contiguous()
