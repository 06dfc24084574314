attention sdpa (auto: PyTorch's attention measured faster than Transformer Engine's on an H100 (pretraining 1.05×, packed SFT 1.10×)), compile layers, bf16 weights split from their float32 masters (the default where they are built)
[rank0]:[W1128 15:24:42.504673916 ProcessGroupNCCL.cpp:5188] Guessing device ID based on global rank. This can cause a hang if rank to GPU mapping is heterogeneous. You can specify device_id in init_process_group()
data .gpu/web: no certificate (made before qwen-data recorded one)
data .gpu/code: no certificate (made before qwen-data recorded one)
GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes, no new features. Please reference the migration guide `docs/user-guide/hybrid-model-migration.md` for details on how to use `HybridModel`
model qwen2.5-3b: 3085.9M parameters, cross-entropy fused, TP 1 × PP 1 × DP 1, micro batch 2 × 4 accumulation, global batch 8 × seq 4096, 80 train samples, device NVIDIA H200, bf16 autocast
optimizer AdamW, whole on each DP rank: 22.992 GiB of state a GPU, recompute selective (mlp)
1959 ms/step over 2 profiled steps; GPU kernels 1645 ms/step (84%)
----------------------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
                                                                  Name    Self CPU %      Self CPU   CPU total %     CPU total  CPU time avg     Self CUDA   Self CUDA %    CUDA total  CUDA time avg    # of Calls  
----------------------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
                                                   Command Buffer Full        29.70%        1.173s        29.70%        1.173s     296.834us        8.083s       249.49%        8.083s       2.045ms          3953  
                                                      cudaLaunchKernel         7.52%     297.131ms        11.74%     463.952ms      87.013us       0.000us         0.00%        7.828s       1.468ms          5332  
                                             Optimizer.step#AdamW.step         0.08%       3.258ms         1.23%      48.526ms      24.263ms       0.000us         0.00%        5.176s        2.588s             2  
                                                   aten::_fused_adamw_         0.02%     977.049us         1.14%      44.931ms      11.233ms      50.046ms         1.54%        5.176s        1.294s             4  
                                                              aten::mm         4.26%     168.286ms        16.92%     668.387ms     163.820us        2.153s        66.45%        2.361s     578.672us          4080  
                                                          aten::matmul         0.49%      19.431ms        13.56%     535.632ms     227.735us       0.000us         0.00%        2.188s     930.189us          2352  
       autograd::engine::evaluate_function: CheckpointFunctionBackward         0.09%       3.536ms        25.78%        1.018s       3.536ms       0.000us         0.00%        1.602s       5.562ms           288  
                                            CheckpointFunctionBackward         5.28%     208.762ms        25.69%        1.015s       3.524ms       0.000us         0.00%        1.602s       5.562ms           288  
                                                   aten::_foreach_mul_         0.02%     869.230us         1.15%      45.267ms      22.633ms      13.531ms         0.42%        1.468s     734.067ms             2  
autograd::engine::evaluate_function: LinearWithGradAccumulationAndA...         0.24%       9.565ms         9.36%     369.867ms     642.130us       0.000us         0.00%     912.130ms       1.584ms           576  
                                            Torch-Compiled Region: 1/0         0.61%      23.981ms        18.41%     727.242ms       2.525ms       0.000us         0.00%     905.764ms       3.145ms           288  
               LinearWithGradAccumulationAndAsyncCommunicationBackward         1.21%      47.755ms         8.67%     342.605ms     594.801us       0.000us         0.00%     896.571ms       1.557ms           576  
                                                   aten::_foreach_norm         0.06%       2.510ms         1.09%      43.014ms      21.507ms       7.053ms         0.22%     687.751ms     343.875ms             2  
                                            Torch-Compiled Region: 2/0         0.63%      24.947ms         9.27%     366.115ms       1.271ms       0.000us         0.00%     640.151ms       2.223ms           288  
                                            Torch-Compiled Region: 3/0         0.07%       2.742ms         5.44%     215.053ms     746.713us       0.000us         0.00%     618.483ms       2.148ms           288  
                                            Torch-Compiled Region: 4/0         0.12%       4.634ms         5.29%     209.035ms     725.817us       0.000us         0.00%     618.483ms       2.148ms           288  
                                                    CheckpointFunction         0.17%       6.843ms         5.17%     204.401ms     709.726us       0.000us         0.00%     618.483ms       2.148ms           288  
                                            Torch-Compiled Region: 5/0         0.13%       5.079ms         4.93%     194.912ms     676.776us       0.000us         0.00%     618.483ms       2.148ms           288  
                                           Torch-Compiled Region: 10/0         0.38%      15.208ms         3.82%     150.925ms     524.047us       0.000us         0.00%     618.483ms       2.148ms           288  
## Call CompiledFxGraph fnnlwogxmpnxuu4pvcswfdrnbvlritkgxpyd5ebmuza...         0.73%      28.826ms         3.36%     132.565ms     460.295us       0.000us         0.00%     618.483ms       2.148ms           288  
                        nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN         0.00%       0.000us         0.00%       0.000us       0.000us     608.017ms        18.77%     608.017ms       1.056ms           576  
                                                  aten::_foreach_zero_         0.02%     984.312us         0.92%      36.372ms      18.186ms       5.978ms         0.18%     561.776ms     280.888ms             2  
         autograd::engine::evaluate_function: CompiledFunctionBackward         0.43%      17.091ms        19.96%     788.784ms     912.944us       0.000us         0.00%     544.308ms     629.986us           864  
                                              CompiledFunctionBackward         2.45%      96.682ms        18.70%     738.838ms     855.136us       0.000us         0.00%     530.992ms     614.574us           864  
## Call CompiledFxGraph fdiq6vpyokw6r3tj5qiwagvjf33bgfy3ens2cefxmbq...         2.95%     116.635ms        13.78%     544.495ms       1.891ms       0.000us         0.00%     502.540ms       1.745ms           288  
                       LinearWithGradAccumulationAndAsyncCommunication         0.48%      18.789ms         4.24%     167.489ms     290.780us       0.000us         0.00%     460.526ms     799.525us           576  
                        nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT         0.00%       0.000us         0.00%       0.000us       0.000us     409.852ms        12.65%     409.852ms     465.741us           880  
                        nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT         0.00%       0.000us         0.00%       0.000us       0.000us     318.789ms         9.84%     318.789ms     368.969us           864  
                                                   _LinearCrossEntropy         0.13%       4.968ms         1.06%      42.037ms       5.255ms       0.000us         0.00%     304.694ms      38.087ms             8  
                        nvjet_sm90_tst_128x192_64x5_2x1_v_bz_coopB_NTN         0.00%       0.000us         0.00%       0.000us       0.000us     290.552ms         8.97%     290.552ms       1.009ms           288  
----------------------------------------------------------------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
Self CPU time total: 3.951s
Self CUDA time total: 3.240s

