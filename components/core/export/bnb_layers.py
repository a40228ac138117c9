"""bitsandbytes as the export uses it (`precision`, `measure`): the library imported (a clear ConfigError
when it cannot be), its layer and parameter classes, what its layers hold (an LLM.int8 layer's row
scales, a 4-bit weight's `QuantState`), and 4-bit dequantization that stays right where bitsandbytes'
native CPU kernel is not.

bitsandbytes' native CPU dequantization (0.50) gets a 4-bit matrix wrong when its rows are not whole
64-weight blocks (`_rows_split_blocks`); `dequantize_4bit` then dequantizes the same codes block by
block, and `linear4bit_class` is bitsandbytes' `Linear4bit` computing through it in that case (the
stored tensors and the state-dict layout stay bitsandbytes' own).
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from typing import TYPE_CHECKING, Any, Callable, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError

if TYPE_CHECKING:
    from bitsandbytes.nn.modules import Linear8bitLt, Params4bit

__all__ = ["bnb", "bnb_nn", "bnb_param", "dequantize_4bit", "int8_scales", "linear4bit_class", "quant_state"]


class _DropInt8CastNote(logging.Filter):
    """bitsandbytes logs, on every LLM.int8 matmul, that float32 inputs are cast to float16 (its int8
    matmul quantizes fp16 activations; the study's docs say so once): dropped, not repeated per call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("MatMul8bitLt: inputs will be cast")


def bnb():
    """bitsandbytes, imported once (its CPU backend logs a warning when the optional `kernels`
    package is missing; that package only adds a faster AVX512 4-bit GEMM, so the warning is muted)."""
    logging.getLogger("bitsandbytes.autograd._functions").addFilter(_DropInt8CastNote())
    log = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import bitsandbytes
    except Exception as e:  # not installed, or a build whose native library fails to load
        raise ConfigError(
            f"the quantized variants need bitsandbytes, which failed to import ({type(e).__name__}: {e}); "
            "install it (pip install 'bitsandbytes>=0.45') or keep only fp32/fp16/bf16 in `variants`"
        ) from e
    finally:
        log.setLevel(level)
    return bitsandbytes


def bnb_nn():
    """bitsandbytes' layer and parameter classes (`Linear8bitLt`, `Linear4bit`, `Int8Params`, `Params4bit`), from
    `bitsandbytes.nn.modules`, which defines what `bitsandbytes.nn` re-exports (imported through `bnb()`)."""
    bnb()
    import bitsandbytes.nn.modules as modules

    return modules


def bnb_param(cls: Callable[..., nn.Parameter], data: torch.Tensor, **kwargs: Any) -> nn.Parameter:
    """`cls(data, **kwargs)` for bitsandbytes' `Int8Params` / `Params4bit`: their keywords go to their `__new__`,
    which torch's stub hides behind `Parameter.__init__(data, requires_grad)`."""
    return cls(data, **kwargs)


def int8_scales(layer: Linear8bitLt) -> torch.Tensor | None:
    """An LLM.int8 layer's per-output-row scales (SCB): on its weight, else in its matmul state."""
    scb = getattr(layer.weight, "SCB", None)
    return layer.state.SCB if scb is None else scb


def quant_state(weight: torch.Tensor) -> Any:
    """A 4-bit weight's `QuantState` (absmax, code, nested state2 and offset; untyped in bitsandbytes)."""
    return cast("Params4bit", weight).quant_state


def _rows_split_blocks(weight) -> bool:
    """A 4-bit matrix on the CPU whose rows are not whole quantization blocks (in_features % blocksize
    != 0) while the whole matrix is: bitsandbytes' native CPU `dequantize_4bit` (0.50, measured on an
    AVX512 Xeon) indexes such a matrix's blocks per row, not over the flat tensor it quantized, and
    returns wrong values (a 432 × 144 NF4 matrix: relative error 0.26 against 0.09 from bitsandbytes'
    own generic implementation, and 0.09 for any 128- or 192-wide one)."""
    st = weight.quant_state
    n = math.prod(st.shape)
    return weight.device.type == "cpu" and st.shape[-1] % st.blocksize != 0 and n % st.blocksize == 0


def dequantize_4bit(weight) -> torch.Tensor:
    """The float matrix of a 4-bit weight (`Params4bit`), bitsandbytes' `dequantize_4bit`. Where its native CPU
    kernel gets the blocks wrong (`_rows_split_blocks`), the same codes are dequantized as a
    (numel / blocksize, blocksize) matrix, whose rows are the blocks, and reshaped back: exactly the
    blocks they were quantized in."""
    lib, st = bnb(), weight.quant_state
    if not _rows_split_blocks(weight):
        return lib.functional.dequantize_4bit(weight.data, st)
    flat = copy.copy(st)
    flat.shape = torch.Size((math.prod(st.shape) // st.blocksize, st.blocksize))
    return lib.functional.dequantize_4bit(weight.data, flat).reshape(st.shape)


@functools.cache
def linear4bit_class() -> type:
    """bitsandbytes' `Linear4bit`, computing on the CPU through `dequantize_4bit` above when its rows
    split blocks (see `_rows_split_blocks`); otherwise exactly bitsandbytes' forward. The stored tensors
    and the state-dict layout are bitsandbytes' own."""
    lib = bnb_nn()

    class Linear4bit(lib.Linear4bit):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.device.type != "cpu" or not _rows_split_blocks(self.weight):
                return super().forward(x)
            dtype = self.compute_dtype or x.dtype
            bias = None if self.bias is None else self.bias.to(dtype)
            return F.linear(x.to(dtype), dequantize_4bit(self.weight).to(dtype), bias).to(x.dtype)

    return Linear4bit
