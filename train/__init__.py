"""Train stage: Qwen-architecture megatron-core GPTModels on qwen-data prefixes.

    qwen-data train --data out/pretrain_blend.json --model qwen2.5-0.5b --seq-length 4096
    torchrun --nproc-per-node 8 -m qwen_data_train --data out/sft_blend.json --model qwen3-1.7b --tp 2
    torchrun --nproc-per-node 4 -m qwen_data_train --data out/sft_blend.json --hf-model models/Qwen3-8B --tp 4 --save-hf out/hf

(installed as `qwen_data_train`; at the repo root `python -m train` works too)

Modules, in the order a run uses them:
  commands        `qwen-data train` / `convert`: options parsed before torch and megatron-core are imported
  config          the command lines (`qwen-data train --help`): config sections that own their options,
                  and the frozen `TrainConfig` made of them
  shapes          `ModelShape` and the presets with the real models' shapes
  marks           the marks set on parameters and on the model and read elsewhere, one accessor each
  plan            `RunPlan`: every choice of a run resolved (the layout of a step included), and every
                  cross-feature rule checked, before anything is built; every builder takes it
  patches/        what megatron-core needs around it, entered once (`megatron_core()`): cpu stand-ins,
                  compat backports, autocast fixes for float32 masters
  distributed     process groups, the data-parallel wrapper, the gradient reductions across ranks
  model/          the GPTModel build of a plan: layers, experts, balance loss, the layer spec as converters
  hf/config       a Hugging Face config.json ↔ the model shape (unsupported checkpoints refused), a folder's model
  thd             packed rows as Transformer Engine's THD stream, in the fixed form a CUDA graph replays
  attention       fused core attention and the document mask for packed rows
  loss            the output layer and cross-entropy fused by chunks (no logits kept)
  data            datasets through megatron-core's builder (the blend read by `qwen_data.blend.read`)
  loader          the run's splits and each rank's micro-batches
  step            what one step computes: forward (`ForwardSpec`), backward, validation loss
  graphs          a micro-batch's forward and backward captured once as a CUDA graph and replayed
  optimizer       AdamW (whole, or megatron-core's distributed optimizer), its warmup + cosine schedule,
                  gradient clipping
  hf/weights      which HF tensors make each megatron parameter (`TensorSlicing`), each TP rank's slice
  hf/checkpoint   HF folders: streamed load per TP slice, gathered sharded save
  checkpoint      `Checkpointer`: dist_checkpointing save and resume, --save-hf exports
  metrics         `Metrics`: the log line, the JSON records, the steady-state summary
  loop            `Trainer` (set-up, `run`, `train_step`) and `train`
  convert         `qwen-data convert`: HF folder ↔ checkpoint on its own (no trainer)
  __main__        `python -m qwen_data_train`

The notices of megatron-core (and of the torch API it calls) that are no news to a user of this stage, and its
dataset warnings of the same kind, are silenced here, before any of its modules is imported:
`QWEN_DATA_VERBOSE=1` shows them, and its INFO log.
"""

import logging
import os
import re
import warnings

VERBOSE = "QWEN_DATA_VERBOSE"
# (category, message, module) of what is said whatever the run: optional accelerator libraries missing (this
# stage has its own fallbacks), the deprecation of megatron-core's own default cuda_graph_scope, a CUDA tuning
# hint under tensor parallelism, and the deprecations of the torch API that megatron-core calls (checkpoint
# loads, sequence-parallel collectives).
DEPENDENCY_NOTICES = (
    (UserWarning, r"(Transformer Engine and )?Apex (is|are) not installed", "megatron"),
    (UserWarning, r"full scope is deprecated", "megatron"),
    (UserWarning, r"When using (async grad allreduce|sequence parallelism) it is recommended to set the environment "
                  r"variable CUDA_DEVICE_MAX_CONNECTIONS", "megatron"),
    (FutureWarning, r"`load_state_dict` is deprecated", "megatron"),
    (FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor", "torch.distributed"),
    (FutureWarning, r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
     "torch.distributed"),
)

# (logger, message) of megatron-core's dataset warnings that are no news here: a blend of one source (each
# split of a per-split blend, a .txt blend's lone prefix) is built as a BlendedDataset all the same, and no
# index cache is saved where none was asked for (--data-cache: none).
DATASET_NOTICES = (
    ("megatron.core.datasets.blended_dataset", r"Building a BlendedDataset for a single MegatronDataset"),
    ("megatron.core.datasets.blended_dataset", r"Cannot save the \w+ indexes because path_to_cache is None"),
    ("megatron.core.datasets.gpt_dataset", r"Unable to save \w+ indexes because path_to_cache is None"),
)


class _Notice(logging.Filter):
    """Drops a logger's records whose message matches `pattern`."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


def _quiet_dependencies() -> None:
    if os.environ.get(VERBOSE, "0") not in ("", "0"):
        logging.basicConfig(format="%(name)s: %(message)s")
        logging.getLogger("megatron").setLevel(logging.INFO)
        return
    for category, message, module in DEPENDENCY_NOTICES:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, message in DATASET_NOTICES:  # a logger's filters see only its own records: each is named
        logging.getLogger(name).addFilter(_Notice(message))


_quiet_dependencies()


def _one_cudnn_for_transformer_engine() -> None:
    """Transformer Engine (imported by megatron-core when installed) loads the first cuDNN it finds
    under CUDA_HOME or /usr/local/cuda, and cuDNN's own parts are then found by name in the system's
    library path. Where a CUDA toolkit there holds another cuDNN than the one torch bundles, the
    process ends up with parts of both: torch refuses every cuDNN call ("cuDNN version
    incompatibility") or a part fails to load (undefined symbol). Loading all of torch's cuDNN
    first, each part after the parts it needs (which would otherwise be looked up by name, in the
    system's), makes every later lookup by name find it. A CUDNN_HOME or CUDNN_PATH the user set is
    left alone."""
    import ctypes
    import glob
    import importlib.util
    if "CUDNN_HOME" in os.environ or "CUDNN_PATH" in os.environ or not importlib.util.find_spec("transformer_engine"):
        return
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except ModuleNotFoundError:
        return
    if not spec or not spec.submodule_search_locations:
        return
    root = list(spec.submodule_search_locations)[0]
    os.environ["CUDNN_PATH"] = root
    needs_first = ("graph", "engines_precompiled", "engines_runtime_compiled", "heuristic", "ops", "cnn", "adv")
    parts = glob.glob(os.path.join(root, "lib", "libcudnn*.so.*"))
    order = {f"libcudnn_{name}": i for i, name in enumerate(needs_first)}
    for path in sorted(parts, key=lambda p: order.get(os.path.basename(p).split(".")[0], len(order))):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            return


_one_cudnn_for_transformer_engine()
