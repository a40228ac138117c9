"""Command line of the core, usable without Dagster or MLflow.

    python -m components.core generate --model <export folder> --prompt "The history of" \
        [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S] [--device cpu|cuda]
    w2t-generate --model <export folder> --prompt "…"          # the same, installed as a script

The folder is one written by `components.core.export.export_model` (the `model_export` asset's
folders under .state/artifacts/model_export/<run id>/exports/<variant>/): it is checked (hashes,
shapes, scheme, tokenizer) and loaded on its own; unset sampling settings come from its
generation_config.json. At most 4096 new tokens per call; a prompt longer than the model's context
is cut to its last tokens, with a notice on stderr. The continuation is printed to stdout; errors go
to stderr (exit code 2).
"""

from __future__ import annotations

import argparse
import sys

MAX_NEW_TOKENS = 4096  # the export's bound (components.core.export.folder.MAX_NEW_TOKENS), stated in --help


def _generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="export folder (model.safetensors, config.json, tokenizer.json, generation_config.json)",
    )
    p.add_argument("--prompt", default="", help="text to continue (empty: start a new document)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"new tokens, at most {MAX_NEW_TOKENS} (default: generation_config.json)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="softmax temperature, 0 = greedy (default: generation_config.json)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="sample among the k most likely tokens (default: generation_config.json)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler (default: unseeded)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--stats", action="store_true", help="also print tokens, time and variant to stderr")


def _run_generate(args: argparse.Namespace) -> int:
    from .errors import ConfigError, PipelineInputError
    from .export import generate

    try:
        out = generate(
            args.model,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
            device=args.device,
        )
    except (ConfigError, PipelineInputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if out.prompt_tokens_dropped:
        total = out.prompt_tokens + out.prompt_tokens_dropped
        print(
            f"notice: the prompt is {total} tokens, longer than the model's context: only its last {out.prompt_tokens} "
            f"tokens were used (the first {out.prompt_tokens_dropped} were cut)",
            file=sys.stderr,
        )
    print(args.prompt + out.text)
    if args.stats:
        print(
            f"[{out.variant}] {out.new_tokens} new tokens after {out.prompt_tokens} prompt tokens in {out.seconds:.2f} "
            f"s",
            file=sys.stderr,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.core", description="The pipeline's ML core, without Dagster."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_args(sub.add_parser("generate", help="generate text from an export folder"))
    args = parser.parse_args(argv)
    if args.command == "generate":
        return _run_generate(args)
    return 2  # pragma: no cover (argparse refuses unknown commands)


def generate_main(argv: list[str] | None = None) -> int:
    """`w2t-generate`: the generate command on its own."""
    parser = argparse.ArgumentParser(prog="w2t-generate", description="Generate text from an export folder.")
    _generate_args(parser)
    return _run_generate(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
