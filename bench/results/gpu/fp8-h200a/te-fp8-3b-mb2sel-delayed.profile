attention sdpa (auto: PyTorch's attention measured faster than Transformer Engine's on an H100 (pretraining 1.05×, packed SFT 1.10×)), compile layers, float32 weights (split bf16 weights: it is not built with --fp8), FP8 delayed (Transformer Engine's linear layers)
[rank0]:[W1128 15:30:34.317852764 ProcessGroupNCCL.cpp:5188] Guessing device ID based on global rank. This can cause a hang if rank to GPU mapping is heterogeneous. You can specify device_id in init_process_group()
data .gpu/web: no certificate (made before qwen-data recorded one)
data .gpu/code: no certificate (made before qwen-data recorded one)
GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes, no new features. Please reference the migration guide `docs/user-guide/hybrid-model-migration.md` for details on how to use `HybridModel`
model qwen2.5-3b: 3085.9M parameters, cross-entropy fused, TP 1 × PP 1 × DP 1, micro batch 2 × 4 accumulation, global batch 8 × seq 4096, 80 train samples, device NVIDIA H200, bf16 autocast
optimizer AdamW, whole on each DP rank: 22.992 GiB of state a GPU, recompute selective (mlp)
2938 ms/step over 2 profiled steps; GPU kernels 1150 ms/step (39%)
----------------------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
                                                                  Name    Self CPU %      Self CPU   CPU total %     CPU total  CPU time avg     Self CUDA   Self CUDA %    CUDA total  CUDA time avg    # of Calls  
----------------------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
      autograd::engine::evaluate_function: _CheckpointFunctionBackward         0.09%       4.035ms        29.16%        1.262s       4.383ms       0.000us         0.00%        1.027s       3.566ms           288  
                                           _CheckpointFunctionBackward         7.23%     313.094ms        29.07%        1.258s       4.369ms       1.939ms         0.09%        1.027s       3.566ms           288  
                  autograd::engine::evaluate_function: _LinearBackward         0.71%      30.866ms        17.79%     769.853ms     668.275us       0.000us         0.00%     691.633ms     600.376us          1152  
                                                       _LinearBackward        11.49%     497.198ms        15.36%     664.539ms     576.857us     594.864ms        26.45%     596.739ms     518.003us          1152  
                                            Torch-Compiled Region: 0/0         0.15%       6.598ms        47.44%        2.053s       7.128ms       0.000us         0.00%     480.651ms       1.669ms           288  
               nvjet_sm90_qrtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT         0.00%       0.000us         0.00%       0.000us       0.000us     316.197ms        14.06%     316.197ms     274.476us          1152  
                                                               _Linear         8.24%     356.590ms        10.93%     472.918ms     410.519us     309.645ms        13.77%     310.030ms     269.123us          1152  
                                           Torch-Compiled Region: 15/0         0.12%       5.392ms        17.47%     756.078ms       2.625ms       0.000us         0.00%     309.017ms       1.073ms           288  
                                           Torch-Compiled Region: 16/0         0.77%      33.123ms        17.05%     737.803ms       2.562ms       0.000us         0.00%     309.017ms       1.073ms           288  
                     nvjet_sm90_qqtst_192x192_128x4_2x1_v_bz_coopB_TNN         0.00%       0.000us         0.00%       0.000us       0.000us     304.186ms        13.52%     304.186ms     528.101us           576  
                                           Torch-Compiled Region: 17/0         0.59%      25.547ms        12.38%     535.905ms       1.861ms       0.000us         0.00%     289.075ms       1.004ms           288  
                                                   _CheckpointFunction         7.35%     318.098ms        11.79%     510.358ms       1.772ms     252.278ms        11.22%     289.075ms       1.004ms           288  
autograd::engine::evaluate_function: ScaledDotProductCudnnAttention...         0.25%      10.833ms         1.62%      70.224ms     243.835us       0.000us         0.00%     232.098ms     805.896us           288  
                               ScaledDotProductCudnnAttentionBackward0         0.08%       3.336ms         1.37%      59.392ms     206.221us       0.000us         0.00%     232.098ms     805.896us           288  
                    aten::_scaled_dot_product_cudnn_attention_backward         0.11%       4.743ms         1.30%      56.055ms     194.637us       0.000us         0.00%     232.098ms     805.896us           288  
                                       aten::_cudnn_attention_backward         0.63%      27.237ms         1.19%      51.313ms     178.169us     232.098ms        10.32%     232.098ms     805.896us           288  
cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26...         0.00%       0.000us         0.00%       0.000us       0.000us     205.673ms         9.14%     205.673ms     714.143us           288  
               nvjet_sm90_qrtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT         0.00%       0.000us         0.00%       0.000us       0.000us     197.408ms         8.78%     197.408ms     171.361us          1152  
                                                   _LinearCrossEntropy         0.12%       5.107ms         0.56%      24.322ms       3.040ms       0.000us         0.00%     191.773ms      23.972ms             8  
                                            Torch-Compiled Region: 1/0         6.13%     265.399ms        29.37%        1.271s       4.414ms       0.000us         0.00%     171.506ms     595.508us           288  
                     nvjet_sm90_qqtst_256x128_128x4_1x2_h_bz_coopA_TNT         0.00%       0.000us         0.00%       0.000us       0.000us     150.679ms         6.70%     150.679ms     174.396us           864  
                                                          aten::matmul         0.00%     192.746us         0.08%       3.669ms      76.435us       0.000us         0.00%     142.904ms       2.977ms            48  
                                                              aten::mm         0.06%       2.592ms         0.08%       3.476ms      72.419us     142.904ms         6.35%     142.904ms       2.977ms            48  
         autograd::engine::evaluate_function: CompiledFunctionBackward         0.67%      29.169ms        10.35%     448.123ms     222.283us       0.000us         0.00%     110.185ms      54.655us          2016  
                                                           aten::copy_         1.78%      76.881ms         4.11%     178.049ms      24.139us     108.570ms         4.83%     108.570ms      14.719us          7376  
                                                            aten::add_         0.53%      22.933ms         0.94%      40.510ms      18.772us     103.646ms         4.61%     103.646ms      48.029us          2158  
                                                              aten::to         0.13%       5.536ms         2.32%     100.460ms      39.739us       0.000us         0.00%      99.511ms      39.363us          2528  
                                                        aten::_to_copy         0.41%      17.758ms         2.19%      94.924ms      39.031us       0.000us         0.00%      99.511ms      40.917us          2432  
           autograd::engine::evaluate_function: SwiGLUFunctionBackward         0.09%       4.044ms         1.75%      75.870ms     263.438us       0.000us         0.00%      97.786ms     339.534us           288  
                                                SwiGLUFunctionBackward         0.35%      15.170ms         1.66%      71.826ms     249.396us       0.000us         0.00%      97.786ms     339.534us           288  
----------------------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
Self CPU time total: 4.328s
Self CUDA time total: 2.249s

