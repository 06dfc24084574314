"""`qwen-data` command line: pretrain, sft, blend."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .records import DEFAULT_CHUNK_BYTES
from .tokenizer import BACKENDS, EOD_TOKEN, SPECIAL_POLICIES, TokenizerConfig

EXAMPLES = os.path.join(os.path.dirname(__file__), "examples")


def _add_common(p: argparse.ArgumentParser, default_output: str) -> None:
    p.add_argument("-o", "--output-prefix", default=default_output,
                   help=f"output prefix: writes PREFIX.bin/.idx/.json (default {default_output})")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="worker processes")
    p.add_argument("--tokenizer", default=None,
                   help="local tokenizer directory or a Hub name already in the local HF cache "
                        "(default: the bundled Qwen tokenizer; nothing is ever downloaded)")
    p.add_argument("--flavour", choices=["qwen2", "qwen2.5", "qwen3"], default=None,
                   help="which Qwen added-token set is special (default: as the tokenizer files say)")
    p.add_argument("--backend", choices=BACKENDS, default="gigatoken",
                   help="gigatoken (fast, id-identical to HF) or hf (HF tokenizers itself)")
    p.add_argument("--max-rejects", type=int, default=None,
                   help="fail once more than this many records were rejected (default: never)")
    p.add_argument("--chunk-mb", type=float, default=DEFAULT_CHUNK_BYTES / (1 << 20),
                   help="input is handed to workers in pieces of about this size")
    p.add_argument("--quiet", action="store_true", help="no progress display")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qwen-data", description=__doc__)
    parser.add_argument("--version", action="version", version=f"qwen-data {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pretrain", help="jsonl text → Megatron indexed dataset (.bin/.idx)")
    p.add_argument("inputs", nargs="*", help=".jsonl / .jsonl.gz files (default: the bundled example corpus)")
    _add_common(p, "out/web")
    p.add_argument("--text-key", nargs="+", default=["text"],
                   help="json key(s) holding the text; several keys give one dataset each, PREFIX_KEY")
    p.add_argument("--special-tokens", choices=SPECIAL_POLICIES, default="text",
                   help="literal special-token strings in text (<|im_start|>, <think> ...): encode as plain "
                        "text (default), parse as control tokens (as HF and Megatron do), or reject the record")
    p.add_argument("--eod-token", default=EOD_TOKEN, help=f"end-of-document token (default {EOD_TOKEN})")
    p.set_defaults(func=_run_pretrain)

    try:
        from . import sft
    except ImportError:  # pragma: no cover - while the SFT pipeline is absent
        sft = None
    if sft is not None:
        p = sub.add_parser("sft", help="chat/instruction records → tokens + loss mask indexed datasets")
        p.add_argument("inputs", nargs="*", help=".jsonl / .jsonl.gz / .json files (default: the bundled example chats)")
        _add_common(p, "out/chat")
        sft.add_arguments(p)
        p.set_defaults(func=sft.run_cli)

    try:
        from . import blend
    except ImportError:  # pragma: no cover - while the blend step is absent
        blend = None
    if blend is not None:
        p = sub.add_parser("blend", help="weighted prefixes → Megatron --data-args-path / --per-split-data-args-path")
        blend.add_arguments(p)
        p.set_defaults(func=blend.run)
    return parser


def tokenizer_config(args) -> TokenizerConfig:
    return TokenizerConfig(name=args.tokenizer, flavour=args.flavour, backend=args.backend)


def _run_pretrain(args) -> int:
    from .pretrain import PretrainConfig, run

    inputs = args.inputs or [os.path.join(EXAMPLES, "corpus.jsonl")]
    config = PretrainConfig(
        inputs=inputs,
        output_prefix=args.output_prefix,
        text_keys=args.text_key,
        workers=args.workers,
        tokenizer=tokenizer_config(args),
        special_tokens=args.special_tokens,
        eod_token=args.eod_token,
        max_rejects=args.max_rejects,
        chunk_bytes=int(args.chunk_mb * (1 << 20)),
        quiet=args.quiet,
    )
    manifests = run(config)
    for prefix, m in zip(config.prefixes(), manifests):
        print(
            f"{prefix}: {m['documents']:,} documents, {m['tokens']:,} tokens ({m['dtype']}), "
            f"{m['rejects']['count']:,} rejected, {m['wall_seconds']:.1f} s"
        )
    if manifests[0]["rejects"]["count"]:
        print(f"rejected records: {config.output_prefix}.rejects.jsonl {manifests[0]['rejects']['by_reason']}")
    m = manifests[0]
    print("Megatron-LM flags:")
    print(f"  --data-path {' '.join(config.prefixes())} --split 99,1,0 --tokenizer-type HuggingFaceTokenizer "
          f"--tokenizer-model {m['tokenizer']['path']}")
    print(f"  End of document is {m['eod_id']}. Megatron's HF tokenizer takes eod from eos (151645 for Qwen3 and "
          f"instruct files) and may treat pad 151643 as padding; `python -m train` takes eod {m['eod_id']} and "
          f"pad {m['pad_id']} from {config.prefixes()[0]}.json.")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted: no output was committed", file=sys.stderr)
        return 130
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"qwen-data {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
