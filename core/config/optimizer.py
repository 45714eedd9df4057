"""Keys of the memory-saving optimizers LLaMA-Factory offers: GaLore, APOLLO, BAdam, Adam-mini, Muon."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tuneline.core.config.fields import documented as _doc


@dataclass(frozen=True)
class OptimizerConfig:
    use_galore: bool = _doc("GaLore: gradients projected to a low rank inside the optimizer (galore-torch).", default=False)
    galore_target: str = _doc("GaLore: modules whose weights are projected, 'all' or names, comma-separated.", default="all")
    galore_rank: int = _doc("GaLore: rank of the projection.", default=16)
    galore_update_interval: int = _doc("GaLore: steps between updates of the projection.", default=200)
    galore_scale: float = _doc("GaLore: scale of the projected update.", default=2.0)
    galore_proj_type: Literal["std", "reverse_std", "right", "left", "full"] = _doc("GaLore: projection type.", default="std")
    galore_layerwise: bool = _doc("GaLore: one optimizer per parameter, stepped in the backward pass.", default=False)
    use_apollo: bool = _doc("APOLLO: SGD-like memory with scaled updates (apollo-torch).", default=False)
    apollo_target: str = _doc("APOLLO: modules it optimizes, 'all' or names, comma-separated.", default="all")
    apollo_rank: int = _doc("APOLLO: rank of the auxiliary space.", default=16)
    apollo_update_interval: int = _doc("APOLLO: steps between updates of the projection.", default=200)
    apollo_scale: float = _doc("APOLLO: scale of the update.", default=32.0)
    apollo_proj: Literal["svd", "random"] = _doc("APOLLO: projection.", default="random")
    apollo_proj_type: Literal["std", "right", "left"] = _doc("APOLLO: projection type.", default="std")
    apollo_scale_type: Literal["channel", "tensor"] = _doc("APOLLO: scaling per channel or per tensor.", default="channel")
    apollo_layerwise: bool = _doc("APOLLO: one optimizer per parameter, stepped in the backward pass.", default=False)
    apollo_scale_front: bool = _doc("APOLLO: scale the gradient before the norm-growth limiter.", default=False)
    use_badam: bool = _doc("BAdam: block-coordinate Adam, one block of parameters trained at a time (badam).", default=False)
    badam_mode: Literal["layer", "ratio"] = _doc("BAdam: blocks are layers, or a share of each matrix.", default="layer")
    badam_start_block: int | None = _doc("BAdam layer mode: the block trained first.", default=None)
    badam_switch_mode: Literal["ascending", "descending", "random", "fixed"] | None = _doc(
        "BAdam layer mode: the order blocks are switched in.", default="ascending")
    badam_switch_interval: int | None = _doc("BAdam layer mode: steps between block switches (-1: never).", default=50)
    badam_update_ratio: float = _doc("BAdam ratio mode: share of each matrix's entries updated.", default=0.05)
    badam_mask_mode: Literal["adjacent", "scatter"] = _doc("BAdam ratio mode: updated entries adjacent or scattered.",
                                                           default="adjacent")
    badam_verbose: int = _doc("BAdam: 0 quiet, 1 names the active block, 2 also its trainable parameters.", default=0)
    use_adam_mini: bool = _doc("Adam-mini: one second-moment value per parameter block (adam-mini).", default=False)
    use_muon: bool = _doc("Muon: orthogonalised momentum for the 2-D weights, AdamW for the rest.", default=False)
