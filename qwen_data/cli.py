"""qwen-data: Megatron datasets for training Qwen (pretrain, sft, blend, verify), and a train stage.

Every argument and every printed summary lives here; the pipelines take typed configs, return
manifests (blend: a BlendResult) and print nothing but their progress line. `qwen-data train` hands
its arguments to the train stage (`qwen_data_train`, the repo's train/)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading

# Nothing here does linear algebra: numpy's BLAS would start a thread per core at its import, and
# they spin for a while (~0.1 s of CPU each), taking cores from the workers as they start. Set
# before anything imports numpy; workers inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from . import __version__
from .errors import describe
from .inputs.chunks import DEFAULT_CHUNK_BYTES
from .inputs.files import Shard
from .options import INT32_MAX, DefaultsHelpFormatter, bounded
from .qwen import DEFAULT_PAD_ID, DEFAULT_PAD_TOKEN, EOD_TOKEN, IM_END, LONGEST_CONTEXT, MAX_SEQ_LENGTH
from .text.tokenizer import BACKENDS, SPECIAL_POLICIES, TokenizerConfig

EXAMPLES = os.path.join(os.path.dirname(__file__), "examples")

SPECIAL_HELP = ("literal special-token strings in the text: text = all as plain text; safe = <|...|> tokens "
                "(end of text, turn markers, vision/fim/pad) as plain text, <tool_call>/<think>/<tool_response> "
                "keep their ids; parse = all as control ids (exactly what HF does); reject = set aside records "
                "holding a <|...|> literal")


# -- argument types: nonsense is refused while parsing (numbers: `bounded`, a range each) ---------
MAX_WORKERS = 1024  # processes on one machine
MAX_CHUNK_MB = 1024  # a piece of input is held whole by the reader and by a worker
MAX_SHARDS = 1_000_000
COUNT = bounded(int, 1)  # a budget's count: samples, tokens, iterations



def _split(text: str) -> str:
    from .blend.weights import split_argument  # imported when a split is given: start-up

    return split_argument(text)


def _temperature(text: str) -> float:
    from .blend.weights import temperature_argument

    return temperature_argument(text)

def _shard(text: str):
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _prefix(text: str) -> str:
    """An output prefix; a data file's name stands for its prefix (out/web.bin: out/web)."""
    from .formats.manifest import strip_suffix

    prefix = strip_suffix(text)
    if not prefix or prefix.endswith(("/", os.sep)) or os.path.basename(prefix) in (".", ".."):
        raise argparse.ArgumentTypeError(f"{text!r} names no file: a prefix is the start of the files' names "
                                         "(PREFIX.bin, PREFIX.idx, PREFIX.json), e.g. out/web")
    return prefix


def _keys(text: str) -> list[str]:
    keys = text.split(",")
    if not all(keys):
        raise argparse.ArgumentTypeError(f"{text!r}: empty key")
    return keys


# -- parsers --------------------------------------------------------------------------------------
def _subparser(sub, name: str, help: str, description: str | None = None, **keywords) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description or help, formatter_class=DefaultsHelpFormatter,
                          **keywords)


def _add_common(p: argparse.ArgumentParser, default_output: str, example: str) -> None:
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="input files (.jsonl or .ndjson, .json arrays, either also .gz/.zst/.xz/.bz2; .parquet, .arrow; in "
                        "any case), directories, globs, - for "
                        "standard input, a datasets save_to_disk folder, or hf:NAME[:CONFIG] from the local Hugging "
                        f"Face cache; with none at all, the bundled example {example} is used")
    p.add_argument("--hf-split", default=None,
                   help="split of a hf:NAME dataset (default train) or of a saved DatasetDict")
    p.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                   help="process only part K (from 0) of N of the inputs, for `qwen-data merge` to join (none: all)")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: worker processes here; ray: shards as Ray tasks across a cluster's nodes, then merged "
                        "(-o must be on a file system every node sees)")
    p.add_argument("--ray-address", default=None,
                   help="Ray cluster to join (e.g. auto, or ray://head:10001); none: a local Ray starts")
    p.add_argument("--ray-shards", type=bounded(int, 1, MAX_SHARDS), default=None,
                   help="shards (Ray tasks), each taking parts of the inputs in turn (none: one a CPU of the cluster)")
    p.add_argument("-o", "--output-prefix", type=_prefix, default=default_output,
                   help="output prefix: writes PREFIX.bin/.idx/.json (out/web.bin or .idx or .json means out/web)")
    p.add_argument("--workers", type=bounded(int, 1, MAX_WORKERS), default=min(8, os.cpu_count() or 1),
                   help="worker processes")
    p.add_argument("--tokenizer", default=None,
                   help="local tokenizer directory or a Hub name already in the local HF cache "
                        "(none: the bundled Qwen tokenizer; nothing is ever downloaded)")
    p.add_argument("--flavour", choices=["qwen2", "qwen2.5", "qwen3"], default=None,
                   help="which Qwen added-token set is special (none: as the tokenizer files say)")
    p.add_argument("--backend", choices=BACKENDS, default="gigatoken",
                   help="gigatoken (fast, id-identical to HF) or hf (HF tokenizers itself)")
    p.add_argument("--max-rejects", type=bounded(int, 0), default=None,
                   help="fail once more than this many records were rejected (none: never)")
    p.add_argument("--chunk-mb", type=bounded(float, above=0, maximum=MAX_CHUNK_MB),
                   default=DEFAULT_CHUNK_BYTES / (1 << 20),
                   help="input is handed to workers in pieces of about this size")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--no-certify", dest="certify", action="store_false",
                   help="do not check a sample of records against the reference libraries (HF tokenizers; for "
                        "SFT also jinja2 rendering the template's official Jinja); the manifest then records the "
                        "data as uncertified")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command is listed; with `command`, only its options are built (sft's import its
    templates and formats: time that a run of another command would spend for nothing)."""
    parser = argparse.ArgumentParser(prog="qwen-data", description=__doc__.split("\n")[0],
                                     epilog="`qwen-data COMMAND --help` gives each command's options and defaults.",
                                     formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=f"qwen-data {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help, description, own_help, add_options) in COMMANDS.items():
        p = _subparser(sub, name, help, description, add_help=own_help)
        if command in (None, name):
            add_options(p)
    return parser


def _pretrain_options(p: argparse.ArgumentParser) -> None:
    _add_common(p, "out/web", "corpus.jsonl")
    p.add_argument("--text-key", type=_keys, action="append", default=None, metavar="KEY[,KEY...]",
                   help="json key holding the text (repeat the flag or give a comma-separated list; several keys "
                        "give one dataset each, PREFIX_KEY, as Megatron's --json-keys) (none: text)")
    p.add_argument("--special-tokens", choices=SPECIAL_POLICIES, default="text", help=SPECIAL_HELP)
    p.add_argument("--eod-token", default=EOD_TOKEN, help="end-of-document token")
    p.set_defaults(func=_run_pretrain)


def _sft_options(p: argparse.ArgumentParser) -> None:
    from .text.conversations import FORMATS
    from .text.masking import MASK_POLICIES
    from .text.templates import HISTORY_MODES, SPAN_KINDS, TEMPLATE_NAMES

    _add_common(p, "out/chat", "chats.jsonl")
    p.add_argument("--template", default="qwen2p5", choices=TEMPLATE_NAMES + ("auto",),
                   help="chat template: qwen2, qwen2p5, qwen3, or auto (the --tokenizer directory's chat_template)")
    p.add_argument("--format", default="auto", choices=FORMATS, help="record format (auto: detected per record)")
    _sft_layout_options(p)
    p.add_argument("--input-separator", default=None, metavar="TEXT",
                   help="between an alpaca instruction and its input (default: a newline; nothing with --layout pai)")
    p.add_argument("--mask", default="assistant", choices=MASK_POLICIES,
                   help="train every assistant turn, only the last one, or all tokens (prompt too)")
    p.add_argument("--assistant-span", default=None, choices=sorted(SPAN_KINDS),
                   help="what of an assistant turn is trained: im_end_nl = content + <|im_end|> + newline "
                        "(as LLaMA-Factory; the default); im_end = content + <|im_end|> (ms-swift); trl = newline after "
                        "the role + content + <|im_end|> + newline (TRL's generation templates); turn = all of it from "
                        "<|im_start|> (Pai-Megatron-Patch; the default with --layout pai)")
    p.add_argument("--history", default="rendered", choices=HISTORY_MODES,
                   help="multi-turn samples: rendered (one sample, as the template renders it), last (only the final "
                        "turn trained), split (one sample per assistant turn, each rendered as at inference: what "
                        "Qwen3's history-reasoning stripping calls for)")
    p.add_argument("--no-thinking", dest="enable_thinking", action="store_const", const=False, default=None,
                   help="render with enable_thinking=False (Qwen3)")
    p.add_argument("--parse-tool-arguments", action="store_true",
                   help="tool-call arguments given as JSON strings are parsed to objects before rendering")
    p.add_argument("--special-tokens", default="safe", choices=SPECIAL_POLICIES, help=SPECIAL_HELP)
    p.add_argument("--reference-template", default=None, metavar="FILE",
                   help="the template's official Jinja (a .jinja file, or a tokenizer_config.json holding it) for the "
                        "certificate, where neither the tokenizer folder nor the local Hugging Face cache holds it; "
                        "one that is not the template's official Jinja is refused, naming it (none: look there)")
    _add_column_options(p)
    p.set_defaults(func=_run_sft)


def _sft_layout_options(p: argparse.ArgumentParser) -> None:
    """How samples are cut, packed, padded and laid out in the files."""
    from .formats.indexed import MASK_SUFFIX
    from .formats.manifest import LAYOUTS
    from .formats.packing import DEFAULT_PACKING, PACKINGS

    p.add_argument("--seq-length", type=bounded(int, 2, MAX_SEQ_LENGTH), default=None,
                   help=f"longest sample / packed row length in tokens, at most {MAX_SEQ_LENGTH:,} (four times the "
                        f"longest Qwen context, Qwen2.5-1M's {LONGEST_CONTEXT:,}; with --layout pai a row holds 2 x "
                        "--seq-length values) (none: no limit)")
    p.add_argument("--pack", action="store_true", help="pack samples into rows of exactly --seq-length tokens")
    p.add_argument("--packing", default=DEFAULT_PACKING, choices=sorted(PACKINGS),
                   help="how --pack fills rows: best-fit (fewest rows) or next-fit (input order, as Pai-Megatron-Patch)")
    p.add_argument("--layout", default="mask", choices=LAYOUTS,
                   help=f"mask: ids + a loss-mask dataset (PREFIX{MASK_SUFFIX}); pai: "
                        "Pai-Megatron-Patch's rows of 2 x --seq-length (ids, then labels with -100), with its defaults "
                        "for --overlong, --assistant-span and --input-separator")
    p.add_argument("--overlong", default=None, choices=["drop", "truncate"],
                   help="samples over --seq-length: set aside in the rejects file (drop) or truncate "
                        "(default: drop; truncate with --layout pai)")
    p.add_argument("--pad-id", type=bounded(int, 0, INT32_MAX), default=None,
                   help=f"pad id (none: {DEFAULT_PAD_ID} {DEFAULT_PAD_TOKEN}; with --layout pai, "
                        "the tokenizer's first free id, where Pai-Megatron-Patch adds <|extra_0|>)")
    p.add_argument("--pad-token", default=None, help="pad token by its text, e.g. '<|fim_pad|>' (none: as --pad-id)")


def _add_column_options(p: argparse.ArgumentParser) -> None:
    columns = p.add_mutually_exclusive_group()
    columns.add_argument("--columns", default=None, metavar="KEY=COLUMN[,...]",
                         help="the records' own column names, e.g. instruction=prompt,output=answer (keys: "
                              "instruction, input, output, system, history, tools, messages, conversations; none: "
                              "the keys are the column names)")
    columns.add_argument("--dataset-info", default=None, metavar="FILE:NAME",
                         help="read the records as entry NAME of a LLaMA-Factory dataset_info.json says "
                              "(formatting, columns, tags; with no INPUT, its file_name or hf_hub_url; none: as "
                              "--columns says)")


def _train_options(p: argparse.ArgumentParser) -> None:
    # Every argument after `train` is the train stage's own (see `_main`).
    p.set_defaults(func=_run_train, debug=False)


def _convert_options(p: argparse.ArgumentParser) -> None:
    # Like train: every argument after `convert` is the converter's own.
    p.set_defaults(func=_run_convert, debug=False)


def _verify_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("prefixes", nargs="+", metavar="PREFIX", help="output prefixes (PREFIX.bin/.idx/.json)")
    p.add_argument("--certify", type=bounded(int, 1, INT32_MAX), default=None, metavar="N",
                   help="also encode the first N records of a prefix's inputs again with today's reference "
                        "libraries (HF tokenizers; for SFT the template's official Jinja rendered by jinja2) and compare with its "
                        "ids and loss mask; the outcome is added to its certificate (none: not)")
    p.add_argument("--reference-template", default=None, metavar="FILE",
                   help="SFT: the template's official Jinja, as sft --reference-template (none: the tokenizer "
                        "folder's chat template)")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.set_defaults(func=_run_verify)


def _merge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("prefixes", nargs="+", metavar="PREFIX", help="prefixes to join (shards: in any order)")
    p.add_argument("-o", "--output-prefix", type=_prefix, required=True,
                   help="the joined prefix (out/web.bin or .idx or .json means out/web)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.set_defaults(func=_run_merge)


def _blend_options(p: argparse.ArgumentParser) -> None:
    """`qwen-data blend`; what the options mean at length: `qwen_data.blend.files` and `qwen_data.blend.weights`."""
    p.add_argument("train", nargs="+", metavar="PREFIX[=W]",
                   help="train prefixes, each optionally with a weight (out/web=0.7)")
    p.add_argument("-o", "--output", default="out/blend.json",
                   help="NAME.json: writes NAME.json (--per-split-data-args-path), NAME.txt "
                        "(--data-args-path) and NAME.qwen-data.json (our record); default out/blend.json")
    p.add_argument("--by", choices=["ratio", "tokens"], default=None,
                   help="weights from the PREFIX=W ratios (default when given) or from the "
                        "manifests' token counts (default otherwise)")
    p.add_argument("--temperature", type=_temperature, default=None,
                   help="weigh by tokens**(1/T): 1 = by tokens, larger flattens towards uniform (none: as --by says)")
    p.add_argument("--ratio-unit", choices=["tokens", "trained-tokens", "samples"], default="tokens",
                   help="what ratios are shares of: training tokens (default; converted to Megatron's per-sample "
                        "weights for SFT), trained tokens (loss mask 1; for pretraining the same as tokens) or "
                        "samples (written unchanged)")
    p.add_argument("--valid", nargs="+", default=[], metavar="PREFIX[=W]",
                   help="separate validation prefixes (per-split blend; none: no validation data)")
    p.add_argument("--test", nargs="+", default=[], metavar="PREFIX[=W]",
                   help="separate test prefixes (per-split blend; none: no test data)")
    p.add_argument("--split", type=_split, default=None,
                   help="cut every prefix like Megatron's --split (e.g. 98,2,0); writes no per-split JSON (none: "
                        "no cut, all for training)")
    p.add_argument("--absolute", action="store_true", help="write absolute prefix paths")
    _add_budget(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.set_defaults(func=_run_blend)


def _add_budget(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train-tokens", type=COUNT, default=None,
                   help="budget: data tokens the run trains on (none: no budget)")
    p.add_argument("--train-samples", type=COUNT, default=None, help="budget: samples (none: no budget)")
    p.add_argument("--train-iters", type=COUNT, default=None,
                   help="budget: iterations (with --global-batch-size; none: no budget)")
    p.add_argument("--global-batch-size", type=COUNT, default=None,
                   help="samples per iteration (with --train-iters; none: no budget)")
    p.add_argument("--seq-length", type=bounded(int, 1, INT32_MAX), default=None,
                   help="the run's tokens per sample, which pretraining prefixes' budgets need (none: SFT "
                        "prefixes only)")


def _inspect_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("prefix", metavar="PREFIX", help="an output prefix (PREFIX.bin/.idx/.json)")
    rows = p.add_mutually_exclusive_group()
    rows.add_argument("--index", type=bounded(int, 0), nargs="+", default=None, metavar="N",
                      help="rows to show, numbered from 0 (default: 0)")
    rows.add_argument("--random", type=bounded(int, 1), default=None, metavar="K",
                      help="K rows drawn at random (none: --index)")
    p.add_argument("--seed", type=bounded(int, 0), default=0, help="for --random")
    p.add_argument("--plain", action="store_true",
                   help="no colour: trained tokens inside [[...]], each control id (added token, end of document, "
                        "pad) inside ⟨...⟩, so that ⟨<|endoftext|>⟩ is the id and <|endoftext|> the same characters "
                        "in the text (the default when not printing to a terminal)")
    p.add_argument("--ids", action="store_true", help="each token's id after it, as {id}")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="also write the report (stats, histogram, manifest) with these rows as one HTML file "
                        "(none: no report)")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.set_defaults(func=_run_inspect)


def _stats_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="+", metavar="PREFIX|BLEND",
                   help="output prefixes, or blend files written by `qwen-data blend` (NAME.json, NAME.txt)")
    _add_budget(p)
    p.add_argument("--html", default=None, metavar="FILE",
                   help="also write the report as one HTML file (one target only; none: no report)")
    p.add_argument("--png", default=None, metavar="FILE",
                   help="also write the sample-length histograms as a PNG (none: no PNG)")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.set_defaults(func=_run_stats)


# name: (its line in `qwen-data --help`, its own description (None: that line), whether it has -h (train
# and convert answer --help with the train stage's options), what adds its options); in this order.
COMMANDS = {
    "pretrain": ("jsonl text → Megatron indexed dataset (.bin/.idx)", None, True, _pretrain_options),
    "sft": ("chat/instruction records → tokens + loss mask indexed datasets", None, True, _sft_options),
    "merge": ("join prefixes (the shards of a --shard K/N run, or datasets made alike) into one; a sharded --pack "
              "run is packed here", None, True, _merge_options),
    "blend": ("weighted prefixes → Megatron --data-args-path / --per-split-data-args-path", None, True,
              _blend_options),
    "verify": ("re-read prefixes as a reader would and check them against their manifests",
               "Checks sizes, counts, dtype, ids, eod, loss mask, packing and the fingerprint; "
               "exit 0 when every prefix is ok, 1 with the list of problems.", True, _verify_options),
    "inspect": ("decoded rows of a prefix, trained tokens marked, pad and end of document shown, samples apart",
                None, True, _inspect_options),
    "stats": ("documents, tokens, trained share, sample lengths, packing fill and rejects of prefixes; for a blend "
              "file, what each source contributes and, with a budget, how many epochs of it the run takes",
              None, True, _stats_options),
    "train": ("train a Qwen-architecture GPTModel on prepared prefixes in this process (CPU or one GPU; on several: "
              "torchrun -m qwen_data_train); its options: qwen-data train --help", None, False, _train_options),
    "convert": ("convert between a Hugging Face Qwen folder and a megatron-core checkpoint (hf-to-mcore, "
                "mcore-to-hf); its options: qwen-data convert --help", None, False, _convert_options),
}


# -- commands -------------------------------------------------------------------------------------
def tokenizer_config(args) -> TokenizerConfig:
    return TokenizerConfig(name=args.tokenizer, flavour=args.flavour, backend=args.backend)


def _inputs(args, example: str) -> list[str]:
    if args.inputs:
        return args.inputs
    path = os.path.join(EXAMPLES, example)
    print(f"no input files given: using the bundled example {path}", file=sys.stderr)
    return [path]


def config_of(cls, args, **given):
    """A run's config: each field from the parsed option of its name, unless `given`; the options
    whose values are not the field's own type (tokenizer, chunk size) converted here."""
    given = dict(tokenizer=tokenizer_config(args), chunk_bytes=max(1, int(args.chunk_mb * (1 << 20)))) | given
    names = {f.name for f in dataclasses.fields(cls) if f.init} - set(given)
    return cls(**{name: getattr(args, name) for name in names if hasattr(args, name)}, **given)


def execute(step, args) -> list:
    """The step (`pretrain.Tokenize`, `sft.ChatSamples`) run here, or as shards on Ray; the manifest
    of each of its prefixes."""
    if args.executor == "local":
        from .run import pipeline

        return pipeline.run(step)
    if step.config.shard is not None:
        raise ValueError("--executor ray makes the shards itself: leave out --shard")
    from .run.ray import run_on_ray

    return run_on_ray(step, address=args.ray_address, shards=args.ray_shards)


def _print_rejects(prefix: str, manifest) -> None:
    rejects = manifest.rejects
    if rejects["count"]:
        print(f"{rejects['count']:,} records rejected (by reason {rejects['by_reason']}): {prefix}.rejects.jsonl "
              "lists each with its file and record number (counting from 1)")


def _run_pretrain(args) -> int:
    from .steps.pretrain import PretrainConfig, Tokenize

    text_keys = [k for group in args.text_key for k in group] if args.text_key else ["text"]
    config = config_of(PretrainConfig, args, inputs=_inputs(args, "corpus.jsonl"), text_keys=text_keys)
    step = Tokenize(config)
    manifests = execute(step, args)
    for prefix, m in zip(step.prefixes(), manifests):
        print(f"{prefix}: {m.documents:,} documents, {m.tokens:,} tokens ({m.dtype}), {m.wall_seconds:.1f} s")
    _print_rejects(config.output_prefix, manifests[0])
    print(_certificate_line(manifests[0].certificate))
    m = manifests[0]
    print("Megatron-LM flags:")
    print(f"  --data-path {' '.join(step.prefixes())} --split 99,1,0 --tokenizer-type HuggingFaceTokenizer "
          f"--tokenizer-model {m.tokenizer['path']}")
    print(f"  Every document ends with {m.eod_id} {m.eod_token}. Megatron's HF tokenizer takes eod from eos "
          f"({IM_END} for Qwen3 and instruct tokenizers); `qwen-data train` takes it from "
          f"{step.prefixes()[0]}.json.")
    return 0


def _column_map(args):
    """--columns / --dataset-info → (ColumnMap or None, the inputs the dataset_info entry names)."""
    from .inputs.columns import parse_columns, read_dataset_info

    if args.columns:
        return parse_columns(args.columns), []
    if not args.dataset_info:
        return None, []
    columns = read_dataset_info(args.dataset_info)
    if columns.folder:
        raise ValueError(f"{columns.origin}: a hf_hub_url entry with a 'folder' is not supported: give its files "
                         "as INPUT")
    if columns.location and columns.location.startswith("hf:"):
        args.hf_split = args.hf_split or columns.split
        return columns, [columns.location + (f":{columns.subset}" if columns.subset else "")]
    return columns, [columns.location] if columns.location else []


def _run_sft(args) -> int:
    from .formats.indexed import MASK_SUFFIX
    from .steps.sft import ChatSamples, SFTConfig

    columns, named = _column_map(args)
    if named and not args.inputs:
        args.inputs = named
    config = config_of(SFTConfig, args, columns=columns, inputs=_inputs(args, "chats.jsonl"))
    m = execute(ChatSamples(config), args)[0]
    s = m.sft
    packed = f", {s.rows:,} rows of {s.seq_length} (fill {s.fill:.2%}, {s.pad_tokens:,} pad)" if s.rows is not None else ""
    print(f"{config.output_prefix}: {s.samples:,} samples, {s.sample_tokens:,} tokens, "
          f"{s.trained_tokens:,} trained{packed}; {m.wall_seconds:.1f} s")
    _print_rejects(config.output_prefix, m)
    where = (f"loss mask in {config.output_prefix}{MASK_SUFFIX}.bin/.idx" if config.data_layout.has_mask else
             f"{s.layout} layout: rows of 2 x {s.seq_length} (ids, then labels)")
    print(f"template {s.template} (sha256 {s.template_sha256[:12]}), pad id {m.pad_id}, {where}")
    print(_certificate_line(m.certificate))
    return 0


def _certificate_line(certificate: dict) -> str:
    if not certificate.get("certified"):
        return f"not certified: {certificate.get('why')}"
    libraries = ", ".join(f"{name} {version}" for name, version in certificate["reference"].items())
    unmapped = certificate.get("records_not_mappable")
    return (f"certified: all {certificate['records_spelled']:,} records' ids spell their text; "
            f"{certificate['records_checked']:,} picked records encoded again by {libraries}, equal "
            f"(a fault in 0.1% of records would have been found with a chance of {_at_least(certificate)})"
            + (f"; {unmapped:,} picked records the reference cannot read were not checked" if unmapped else ""))


def _at_least(certificate: dict) -> str:
    """The sample's detection chance, rounded down: a claim never above what the records checked give."""
    percent = math.floor(certificate["detection"]["0.1%"] * 100)
    return "100%" if percent >= 100 else f"{percent}% or more"


def _run_merge(args) -> int:
    from .formats.manifest import strip_suffix
    from .run.merge import merge

    m = merge([strip_suffix(p) for p in args.prefixes], args.output_prefix, quiet=args.quiet)
    rows = f", {m.sft.rows:,} rows of {m.sft.seq_length}" if m.sft and m.sft.rows is not None else ""
    print(f"{args.output_prefix}: {m.documents:,} documents, {m.tokens:,} tokens{rows} from {len(args.prefixes)} "
          f"prefixes; {m.rejects['count']:,} rejected records")
    return 0


def _blend_budget(args):
    """The budget options → a `Budget`, or None without one."""
    from .blend.files import BlendError
    from .blend.weights import Budget

    if args.train_iters is not None or args.global_batch_size is not None:
        if args.train_iters is None or args.global_batch_size is None:
            raise BlendError("--train-iters and --global-batch-size go together")
        if args.train_samples is not None or args.train_tokens is not None:
            raise BlendError("give one budget: --train-tokens, --train-samples or --train-iters")
        samples = args.train_iters * args.global_batch_size
    elif args.train_samples is not None:
        if args.train_tokens is not None:
            raise BlendError("give one budget: --train-tokens, --train-samples or --train-iters")
        samples = args.train_samples
    elif args.train_tokens is not None:
        return Budget(tokens=args.train_tokens, seq_length=args.seq_length)
    else:
        return None
    return Budget(samples=samples, seq_length=args.seq_length)


def _run_blend(args) -> int:
    from .blend.build import BlendConfig, make_blend

    config = BlendConfig(train=args.train, valid=args.valid, test=args.test, output=args.output, by=args.by,
                         temperature=args.temperature, ratio_unit=args.ratio_unit, split=args.split,
                         absolute=args.absolute, budget=_blend_budget(args))
    result = make_blend(config)
    _print_blend(result)
    if result.budget is not None:
        for line in _format_budget(result.budget, approximate=result.blend.split is not None):
            print(line)
    return 0


def _print_blend(result) -> None:
    from .blend.files import SPLITS

    blend = result.blend
    print(f"{blend.kind} blend of {len(blend.splits['train'])} train source(s), weights by {blend.by}"
          + (f" (temperature {blend.temperature:g})" if blend.temperature else "") + f", shares of {blend.ratio_unit}")
    for name in SPLITS:
        if name not in blend.splits:
            continue
        drawn = zip(blend.splits[name], blend.drawn_shares(name, "tokens"), blend.drawn_shares(name, "trained-tokens"))
        for e, tokens, trained in drawn:
            print(f"  {name:<5}  {e.source.prefix}  weight {e.weight:.4g}  tokens {100 * tokens:.2f}%  "
                  f"trained {100 * trained:.2f}%  ({e.source.real_tokens:,} tokens, {e.source.trained_tokens:,} "
                  f"trained, {e.source.documents:,} documents)")
    print("wrote " + ", ".join(result.written))
    print("Megatron-LM flags: " + " ".join(result.megatron_args))
    if blend.split is None and "valid" not in blend.splits:
        print("note: no validation data (give --valid PREFIX ... or --split 98,2,0)")
    train = {e.source.prefix for e in blend.splits["train"]}
    for name in ("valid", "test"):
        shared = [e.source.prefix for e in blend.splits.get(name) or () if e.source.prefix in train]
        if shared:
            print(f"warning: {name} prefixes also trained on: {', '.join(shared)}")


def _format_budget(rows, approximate: bool) -> list[str]:
    """The budget table: one row per train source, and a note for each source seen more than once."""
    columns = [("source", "<", lambda r: r.prefix),
               ("weight", ">", lambda r: f"{r.weight:.4f}"),
               ("tokens%", ">", lambda r: f"{100 * r.share:.2f}%"),
               ("tokens avail" + (" (≈)" if approximate else ""), ">", lambda r: f"{r.available_tokens:,.0f}"),
               ("samples", ">", lambda r: "-" if r.samples is None else f"{r.samples:,.0f}"),
               ("tokens used", ">", lambda r: f"{r.tokens:,.0f}"),
               ("epochs", ">", lambda r: f"{r.epochs:.3f}")]
    cells = [[title for title, _, _ in columns]] + [[get(r) for _, _, get in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(f"{cell:{align}{w}}" for cell, (_, align, _), w in zip(row, columns, widths)).rstrip()
             for row in cells]
    lines += [f"note: {r.prefix} is repeated {r.epochs:.2f} times" for r in rows if r.epochs > 1]
    return lines


def _run_inspect(args) -> int:
    from .tools.inspect import Inspector, choose_rows, terminal
    from .tools.stats import prefix_of

    prefix = prefix_of(args.prefix)
    inspector = Inspector(prefix)
    rows = choose_rows(len(inspector), args.index, args.random, args.seed)
    colour = not args.plain and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    text = terminal(inspector, rows, colour=colour, ids=args.ids)
    if args.html:  # files first: `qwen-data inspect … | head` still writes them
        from .tools.report import write_report

        write_report(prefix, args.html, rows=rows)
    print(text + (f"wrote {args.html}\n" if args.html else ""), end="")
    return 0


def _run_stats(args) -> int:
    from .blend.files import resolve
    from .tools.stats import blend_lines, blend_stats, histogram_png, prefix_lines, prefix_stats

    if args.html and len(args.targets) > 1:
        raise ValueError("--html writes the report of one prefix or blend: give one")
    budget = _blend_budget(args)
    lines, plotted = [], []
    targets = [resolve(target) for target in args.targets]
    for kind, target in targets:
        if kind == "blend":
            b = blend_stats(target, budget)
            lines += ([""] if lines else []) + blend_lines(b)
            plotted += [s for _, _, s in b.sources]
        else:
            if budget is not None:
                raise ValueError(f"{target}: a budget (--train-tokens ...) is for blend files")
            s = prefix_stats(target)
            lines += ([""] if lines else []) + prefix_lines(s)
            plotted.append(s)
    # Files first: `qwen-data stats … | head` still writes them.
    if args.png:
        histogram_png(plotted, args.png)
        lines.append(f"wrote {args.png}")
    if args.html:
        from .tools.report import write_report

        write_report(targets[0][1], args.html, budget=budget)
        lines.append(f"wrote {args.html}")
    print("\n".join(lines))
    return 0


def _run_train(args) -> int:
    from qwen_data_train.commands import train

    return train(args.train_args)


def _run_convert(args) -> int:
    from qwen_data_train.commands import convert

    return convert(args.train_args)


def _run_verify(args) -> int:
    from .formats.manifest import strip_suffix
    from .formats.manifest import Manifest
    from .tools.verify import verify

    failed = 0
    for prefix in map(strip_suffix, args.prefixes):
        problems, last = verify(prefix), None
        if args.certify:
            from .certify.recheck import recheck

            found, last = recheck(prefix, args.certify, args.reference_template)
            problems += found
        if problems:
            failed += 1
            print(f"{prefix}: {len(problems)} problem(s)")
            print("".join(f"  - {problem}\n" for problem in problems), end="")
        else:
            m = Manifest.read(prefix)
            again = ""
            if last is not None:
                libraries = ", ".join(f"{name} {version}" for name, version in last["reference"].items())
                again = (f"; {last['records_checked']:,} records picked across it encoded again, equal to the ids "
                         f"of {libraries}")
            print(f"{prefix}: ok ({m.documents:,} documents, {m.tokens:,} tokens){again}")
        if last is not None and not last["recorded"]:
            print(f"{prefix}: the recheck is not recorded: {last['why']}")
    return 1 if failed else 0


# -- entry point (errors told in one line: errors.describe) --------------------------------------
def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader of our output went away (`qwen-data ... | head`): nothing more to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, a scheduler ending the job), taken as Ctrl-C is: the run unwinds, so its
    temporary files and locks go (`AtomicOutputs`) and its workers are ended."""


def _terminate(signum, frame) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises `Terminated` inside (SIGTERM's default would end the process where it stands,
    leaving .tmp and .lock files beside the outputs); put back on leaving, for a caller of `main`."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a handler
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The first word is the command: the options before it (--version, --help) take no value.
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    try:  # a refused option (argparse's usage and one line on stderr) is exit status 2, returned like the others
        args, rest = parser.parse_known_args(argv)
        if rest and args.command not in ("train", "convert"):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as exc:
        return exc.code
    args.train_args = rest
    try:
        if args.command in ("train", "convert"):  # the train stage's processes handle their own signals
            return args.func(args)
        with _sigterm_as_interrupt():
            return args.func(args)
    except Terminated:
        print("terminated (SIGTERM): no output was committed", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("interrupted: no output was committed", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise
    except (OSError, ValueError, RuntimeError, EOFError) as exc:
        if args.debug:
            raise
        print(f"qwen-data {args.command}: error: {describe(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
