attention sdpa (auto: PyTorch's attention measured faster than Transformer Engine's on an H100 (pretraining 1.05×, packed SFT 1.10×)), compile layers, float32 weights (split bf16 weights: it is not built with --fp8), FP8 tensorwise (Transformer Engine's linear layers)
[rank0]:[W1128 15:27:43.196154629 ProcessGroupNCCL.cpp:5188] Guessing device ID based on global rank. This can cause a hang if rank to GPU mapping is heterogeneous. You can specify device_id in init_process_group()
data .gpu/web: no certificate (made before qwen-data recorded one)
data .gpu/code: no certificate (made before qwen-data recorded one)
GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes, no new features. Please reference the migration guide `docs/user-guide/hybrid-model-migration.md` for details on how to use `HybridModel`
model qwen2.5-3b: 3085.9M parameters, cross-entropy fused, TP 1 × PP 1 × DP 1, micro batch 2 × 4 accumulation, global batch 8 × seq 4096, 80 train samples, device NVIDIA H200, bf16 autocast
optimizer AdamW, whole on each DP rank: 22.992 GiB of state a GPU, recompute selective (mlp)
3017 ms/step over 2 profiled steps; GPU kernels 1206 ms/step (40%)
----------------------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
                                                                  Name    Self CPU %      Self CPU   CPU total %     CPU total  CPU time avg     Self CUDA   Self CUDA %    CUDA total  CUDA time avg    # of Calls  
----------------------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
      autograd::engine::evaluate_function: _CheckpointFunctionBackward         0.09%       3.849ms        20.14%     882.263ms       3.063ms       0.000us         0.00%        1.073s       3.725ms           288  
                                           _CheckpointFunctionBackward         4.68%     204.777ms        20.05%     878.414ms       3.050ms       0.000us         0.00%        1.073s       3.725ms           288  
                  autograd::engine::evaluate_function: _LinearBackward         0.61%      26.902ms        14.97%     655.890ms     569.349us       0.000us         0.00%     742.782ms     644.776us          1152  
                                                       _LinearBackward         9.06%     396.806ms        12.82%     561.661ms     487.553us     637.363ms        26.98%     645.795ms     560.586us          1152  
                                            Torch-Compiled Region: 0/0         0.19%       8.431ms        56.14%        2.459s       8.537ms       0.000us         0.00%     511.185ms       1.775ms           288  
                                                               _Linear         9.17%     401.538ms        13.36%     585.279ms     508.055us     338.566ms        14.33%     338.964ms     294.240us          1152  
                                           Torch-Compiled Region: 15/0         0.14%       6.221ms        19.90%     871.418ms       3.026ms       0.000us         0.00%     331.595ms       1.151ms           288  
                                           Torch-Compiled Region: 16/0         0.92%      40.119ms        19.38%     848.755ms       2.947ms       0.000us         0.00%     331.595ms       1.151ms           288  
               nvjet_sm90_qrtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT         0.00%       0.000us         0.00%       0.000us       0.000us     318.134ms        13.47%     318.134ms     276.158us          1152  
                                           Torch-Compiled Region: 17/0         0.67%      29.319ms        13.77%     603.117ms       2.094ms       0.000us         0.00%     311.625ms       1.082ms           288  
                                                   _CheckpointFunction         8.64%     378.325ms        13.10%     573.799ms       1.992ms     276.374ms        11.70%     311.625ms       1.082ms           288  
                     nvjet_sm90_qqtst_192x192_128x4_2x1_v_bz_coopB_TNN         0.00%       0.000us         0.00%       0.000us       0.000us     306.897ms        12.99%     306.897ms     532.807us           576  
autograd::engine::evaluate_function: ScaledDotProductCudnnAttention...         0.23%       9.892ms         1.41%      61.933ms     215.046us       0.000us         0.00%     241.949ms     840.102us           288  
                               ScaledDotProductCudnnAttentionBackward0         0.07%       2.959ms         1.19%      52.041ms     180.699us       0.000us         0.00%     241.949ms     840.102us           288  
                    aten::_scaled_dot_product_cudnn_attention_backward         0.10%       4.207ms         1.12%      49.082ms     170.423us       0.000us         0.00%     241.949ms     840.102us           288  
                                       aten::_cudnn_attention_backward         0.54%      23.435ms         1.02%      44.875ms     155.815us     241.949ms        10.24%     241.949ms     840.102us           288  
cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26...         0.00%       0.000us         0.00%       0.000us       0.000us     215.464ms         9.12%     215.464ms     748.138us           288  
               nvjet_sm90_qrtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT         0.00%       0.000us         0.00%       0.000us       0.000us     199.512ms         8.45%     199.512ms     173.188us          1152  
                                                   _LinearCrossEntropy         0.15%       6.713ms         0.84%      36.879ms       4.610ms       0.000us         0.00%     191.251ms      23.906ms             8  
                                            Torch-Compiled Region: 1/0         7.34%     321.298ms        35.50%        1.555s       5.400ms       0.000us         0.00%     179.461ms     623.129us           288  
                     nvjet_sm90_qqtst_256x128_128x4_1x2_h_bz_coopA_TNT         0.00%       0.000us         0.00%       0.000us       0.000us     151.594ms         6.42%     151.594ms     175.456us           864  
                                                          aten::matmul         0.01%     241.485us         0.14%       5.972ms     124.418us       0.000us         0.00%     142.389ms       2.966ms            48  
                                                              aten::mm         0.11%       4.620ms         0.13%       5.731ms     119.387us     142.389ms         6.03%     142.389ms       2.966ms            48  
         autograd::engine::evaluate_function: CompiledFunctionBackward         0.59%      25.931ms         9.61%     420.755ms     208.708us       0.000us         0.00%     111.778ms      55.445us          2016  
                                                           aten::copy_         0.92%      40.492ms         1.61%      70.412ms      25.438us     105.589ms         4.47%     105.589ms      38.146us          2768  
                                                            aten::add_         0.50%      21.953ms         0.89%      39.019ms      18.081us     103.791ms         4.39%     103.791ms      48.096us          2158  
           autograd::engine::evaluate_function: SwiGLUFunctionBackward         0.08%       3.614ms         1.59%      69.809ms     242.393us       0.000us         0.00%     101.834ms     353.590us           288  
                                                SwiGLUFunctionBackward         0.30%      13.033ms         1.51%      66.195ms     229.843us       0.000us         0.00%     101.834ms     353.590us           288  
                                           Torch-Compiled Region: 23/0         0.36%      15.556ms         1.07%      46.870ms     162.744us       0.000us         0.00%     101.834ms     353.590us           288  
## Call CompiledFxGraph f3efmclcvppqlehxw7sgwobupu4iugxzxv3bnnculfe...         0.35%      15.204ms         0.62%      27.364ms      95.014us       0.000us         0.00%     101.834ms     353.590us           288  
----------------------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
Self CPU time total: 4.380s
Self CUDA time total: 2.362s

