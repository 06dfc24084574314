"""Run under torchrun (2 processes, gloo): logits of Hugging Face folders imported into megatron-core
under TP=1 and TP=2, against transformers' logits on the same token ids.

    torchrun --nproc-per-node 2 tests/_hf_logits.py OUT.json TOKENS.json HF_DIR [HF_DIR ...]

Writes {HF_DIR: {"1": max abs diff, "2": max abs diff}} to OUT.json (rank 0).
"""

import json
import sys
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")


def main(out, tokens_file, *folders):
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
    from transformers import AutoModelForCausalLM

    from qwen_data_train.distributed import init_distributed
    from qwen_data_train.hf.checkpoint import load_hf_weights
    from qwen_data_train.hf.config import read_config, shape_from_config
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.patches import megatron_core

    with open(tokens_file) as f:
        tokens = torch.tensor(json.load(f))
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    results = {}
    with megatron_core(), torch.no_grad():
        for folder in folders:
            expected = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(tokens).logits
            shape = shape_from_config(read_config(folder), folder)
            for tp in (1, 2):
                init_distributed(tp)
                model = build_model(RunPlan.for_model(shape, attention="sdpa", tp=tp, initialize=False)).eval()
                load_hf_weights(model, folder, shape)
                logits = gather_from_tensor_model_parallel_region(model(tokens, positions, None))
                results.setdefault(folder, {})[str(tp)] = (logits - expected).abs().max().item()
                parallel_state.destroy_model_parallel()
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
