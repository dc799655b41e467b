"""Models: pure ``init``/``loss`` functions, built-in ones and wrappers.

A :class:`Model` is ``(init, loss, task, name, config, apply)``; ``apply``
(the logits of the forward that ``loss`` scores) is optional for a user's
model and given by every built-in. The built-ins are flax linen modules
wrapped into that contract: :func:`mlp` and :func:`cnn` classify ``{"x",
"y"}`` batches, :func:`gpt` and :func:`moe_gpt` model ``{"tokens"}`` batches
(:func:`gpt_flops_per_token` counts a gpt's matmul FLOPs per token).
:func:`from_flax` wraps a user's linen module, :func:`from_nnx` a Flax NNX
module, :func:`from_equinox` an Equinox model and :func:`from_apply` an
``(init, apply)`` pair; :func:`as_model` accepts whatever a
user passes as ``model=``, and :func:`get` builds a built-in by name.
"""

from lowbw.models._cnn import cnn
from lowbw.models._contract import check_contract
from lowbw.models._contract import from_flax
from lowbw.models._contract import Model
from lowbw.models._contract import param_count
from lowbw.models._flops import flops_per_token
from lowbw.models._foreign import (as_model, from_apply, from_equinox,
                                   from_nnx)
from lowbw.models._generate import generate
from lowbw.models._gpt import flops_per_token as gpt_flops_per_token
from lowbw.models._blocks import CHOICES as GPT_CHOICES
from lowbw.models._gpt import OPTIONS as GPT_OPTIONS
from lowbw.models._gpt import gpt
from lowbw.models._mlp import mlp
from lowbw.models._moe_gpt import moe_gpt
from lowbw.models._registry import get, register
from lowbw.models._stages import (Stages, activation_shapes, block_ranges,
                                  from_stages, split, stage_flops_per_token,
                                  staged_loss, staged_model)
from lowbw.models._registry import names as model_names

__all__ = (
    "register", "model_names",
    "GPT_CHOICES",
    "GPT_OPTIONS",
    "check_contract",
    "Model",
    "as_model",
    "cnn",
    "flops_per_token",
    "from_apply",
    "from_equinox",
    "from_flax",
    "from_nnx",
    "generate",
    "get",
    "gpt",
    "gpt_flops_per_token",
    "mlp",
    "moe_gpt",
    "param_count",
    "Stages", "activation_shapes", "block_ranges", "from_stages", "split",
    "stage_flops_per_token",
    "staged_loss", "staged_model",
)
