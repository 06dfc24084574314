"""Train stage: Qwen-architecture megatron-core GPTModels on qwen-data prefixes.

    python -m train --data out/pretrain_blend.json --model qwen2.5-0.5b --seq-length 4096
    torchrun --nproc-per-node 8 -m train --data out/sft_blend.json --model qwen3-1.7b --tp 2

Modules: `train.model` (presets, GPTModel build), `train.attention` (fused core attention and the
document mask for packed rows), `train.data` (datasets through megatron-core's builder),
`train.loop` (the loop, checkpoints, logging; `python -m train --help`).
"""
