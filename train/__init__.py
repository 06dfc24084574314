"""Train stage: Qwen-architecture megatron-core GPTModels on qwen-data prefixes.

    qwen-data train --data out/pretrain_blend.json --model qwen2.5-0.5b --seq-length 4096
    torchrun --nproc-per-node 8 -m qwen_data_train --data out/sft_blend.json --model qwen3-1.7b --tp 2
    torchrun --nproc-per-node 4 -m qwen_data_train --data out/sft_blend.json --hf-model models/Qwen3-8B --tp 4 --save-hf out/hf

(installed as `qwen_data_train`; at the repo root `python -m train` works too)

Modules, in the order a run uses them:
  config       the command line (`qwen-data train --help`) and the frozen `TrainConfig` made of it
  patches      scoped stand-ins for CUDA and a process group where megatron-core assumes them
  distributed  process groups and the parallel `Layout` of a step
  model        presets with the real shapes, the GPTModel build
  hf_config    a Hugging Face config.json ↔ the model shape (unsupported checkpoints refused)
  attention    fused core attention and the document mask for packed rows
  data         datasets through megatron-core's builder
  loader       the run's splits and each rank's micro-batches
  step         forward, gradient clipping, AdamW and its schedule, validation loss
  hf_weights   which HF tensors make each megatron parameter, and each TP rank's slice of them
  hf_checkpoint  HF folders: streamed load per TP slice, gathered sharded save
  checkpoint   `Checkpointer`: dist_checkpointing save and resume, --save-hf exports
  metrics      `Metrics`: the log line, the JSON records, the steady-state summary
  loop         `Trainer` (set-up, `run`, `train_step`) and `main`
  convert      `qwen-data convert`: HF folder ↔ checkpoint on its own
"""
