"""4-bit dequantization error against the matrix's width: bitsandbytes' native CPU kernel, its own generic
implementation on the same codes, and the project's `bnb_layers.dequantize_4bit` (what its layers use).

bitsandbytes quantizes a matrix in blocks of `blocksize` consecutive weights of the flat tensor. Its
native CPU `dequantize_4bit` (0.50, on an AVX512 Xeon) indexes the blocks per row instead, so a matrix
whose rows are not whole blocks comes back wrong (the default Transformer is 144 wide).

    python benchmarks/nf4_row_blocks.py --out benchmarks/results/nf4_row_blocks_cpu_avx512.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.result_file import emit  # noqa: E402

SHAPES = [
    (432, 144),
    (576, 144),
    (144, 144),
    (260, 144),
    (10, 96),
    (10, 160),
    (256, 128),
    (10, 192),
    (144, 576),
    (10, 200),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quant-type", default="nf4", choices=["nf4", "fp4"])
    ap.add_argument("--out")
    args = ap.parse_args()

    import bitsandbytes
    import torch
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute  # bitsandbytes' generic reference
    from bitsandbytes.backends.utils import _get_4bit_code

    from components.core.export.bnb_layers import _rows_split_blocks, bnb, dequantize_4bit
    from components.core.export.precision import eager

    lib = bnb()
    torch.manual_seed(0)
    rows = []
    for shape in SHAPES:
        w = torch.randn(*shape) * 0.05
        p = lib.nn.Params4bit(
            w.clone(),
            requires_grad=False,
            blocksize=64,
            compress_statistics=False,
            quant_type=args.quant_type,
            quant_storage=torch.uint8,
        )
        p = p.to("cpu")  # quantizes
        st = p.quant_state
        with eager():  # bitsandbytes compiles its generic path otherwise (one compile per shape)
            native = lib.functional.dequantize_4bit(p.data, st).float()
            generic = _dequantize_4bit_compute(
                p.data.view(torch.uint8).reshape(-1),
                st.absmax,
                _get_4bit_code(args.quant_type, p.device),
                64,
                shape,
                torch.float32,
            )
            ours = dequantize_4bit(p).float()
        err = {
            k: float((a - w).norm() / w.norm())
            for k, a in (("native", native), ("generic", generic), ("project", ours))
        }
        rows.append({"shape": list(shape), "rows_split_blocks": _rows_split_blocks(p), **err})
        print(f"{shape}: " + ", ".join(f"{k} {v:.3f}" for k, v in err.items()), flush=True)
    emit(
        {
            "benchmark": "nf4_row_blocks",
            "quant_type": args.quant_type,
            "blocksize": 64,
            "bitsandbytes": bitsandbytes.__version__,
            "what": "relative Frobenius error of the dequantized matrix",
            "rows": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
