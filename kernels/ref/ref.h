// Scalar reference kernels: the oracle every faster kernel is tested against. Obvious loops,
// double-precision accumulation, no threads, no tricks. Same argument structs as kernels/cpu.
#pragma once
#include "kernels/ops.h"

namespace g4::ref {

float load_weight(const void* w, DType dt, int64_t i); // element i of a dense F32/BF16/F16 tensor

void embed(const EmbedArgs& a);
void matmul(const MatmulArgs& a);
void rms_norm(const RmsNormArgs& a);
void add(const BinaryArgs& a);
void gelu_mul(const BinaryArgs& a);
void scale(const ScaleArgs& a);
void softcap(const ScaleArgs& a);
void rope(const RopeArgs& a);
void kv_store(const KvStoreArgs& a);
void attention(const AttentionArgs& a); // uses a.scratch for at least `slots` floats

float gelu_tanh(float x);

// Encoder-program ops (kernels/ref/encoder_ops.cpp).
void clamp(const ClampArgs& a);
void add_position_2d(const AddPosition2DArgs& a);
void rope_2d(const Rope2DArgs& a);
void self_attention(const SelfAttentionArgs& a); // ignores a.work
void pool_rows(const PoolRowsArgs& a);

} // namespace g4::ref
