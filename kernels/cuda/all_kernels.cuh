// Every CUDA kernel source in the order of G4_CUDA_KERNEL_SOURCES (compiler/CMakeLists.txt, which checks that
// the two lists agree), for programs built with nvcc that include the kernels (bench/labs,
// bench/scripts/sass_count.py). The compiler embeds the files themselves, concatenated, for NVRTC.
#pragma once
// The order is the concatenation order:
// clang-format off
#include "common.cu"
#include "embed.cu"
#include "matmul.cu"
#include "gemm.cu"
#include "norm_elementwise.cu"
#include "rope_kv.cu"
#include "attention.cu"
#include "flash_attention.cu"
#include "attention_merge.cu"
#include "sampling.cu"
#include "decode_gemv.cu"
#include "decode_mlp.cu"
#include "decode_attn_out.cu"
#include "gated_proj.cu"
#include "lm_screen.cu"
#include "resnorm.cu"
#include "decode_attention.cu"
#include "nf4_convert.cu"
#include "sequence_ops.cu"
#include "encoder_ops.cu"
#include "matmul_rows.cu"
#include "matmul_rows_tc.cu"
#include "batch_rows.cu"
#include "decode_rows.cu"
// clang-format on
