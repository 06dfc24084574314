"""Train stage: Qwen-architecture megatron-core GPTModels on qwen-data prefixes.

    qwen-data train --data out/pretrain_blend.json --model qwen2.5-0.5b --seq-length 4096
    torchrun --nproc-per-node 8 -m qwen_data_train --data out/sft_blend.json --model qwen3-1.7b --tp 2
    torchrun --nproc-per-node 4 -m qwen_data_train --data out/sft_blend.json --hf-model models/Qwen3-8B --tp 4 --save-hf out/hf

(installed as `qwen_data_train`; at the repo root `python -m train` works too)

Modules, in the order a run uses them:
  config          the command line (`qwen-data train --help`): config sections that own their options,
                  and the frozen `TrainConfig` made of them
  patches         scoped stand-ins for CUDA and a process group where megatron-core assumes them
  distributed     process groups, the `ParallelLayout` of a step, the gradient reductions across ranks
  model           presets with the real shapes, the GPTModel build
  hf/config       a Hugging Face config.json ↔ the model shape (unsupported checkpoints refused), a folder's model
  attention       fused core attention and the document mask for packed rows
  loss            the output layer and cross-entropy fused by chunks (no logits kept)
  data            datasets through megatron-core's builder (the blend read by `qwen_data.blend.read`)
  loader          the run's splits and each rank's micro-batches
  step            what one step computes: forward (`ForwardSpec`), backward, validation loss
  optimizer       AdamW, its warmup + cosine schedule, gradient clipping
  hf/weights      which HF tensors make each megatron parameter (`TensorSlicing`), each TP rank's slice
  hf/checkpoint   HF folders: streamed load per TP slice, gathered sharded save
  checkpoint      `Checkpointer`: dist_checkpointing save and resume, --save-hf exports
  metrics         `Metrics`: the log line, the JSON records, the steady-state summary
  loop            `Trainer` (set-up, `run`, `train_step`) and `main`
  convert         `qwen-data convert`: HF folder ↔ checkpoint on its own (no trainer)
  __main__        `python -m qwen_data_train`
"""
