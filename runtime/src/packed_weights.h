// The weights of the CPU encoder programs' bf16 matmuls packed once, at engine open, in the layout the CPU's
// bf16 GEMM reads (cpu::gemm_bf16_pack, MatmulArgs::w_packed), where the kernel level in use has one (the
// amx level); elsewhere nothing is packed. The GEMM then skips packing its weight panels on every call, with
// the same results bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace g4::plan {
class Plan;
}

namespace g4::rt {

class PackedWeights {
public:
    PackedWeights() = default;
    ~PackedWeights();
    PackedWeights(const PackedWeights&)            = delete;
    PackedWeights& operator=(const PackedWeights&) = delete;

    // Packs the weights of every Matmul op with the bf16 GEMM (MatmulParams cpu_kernel 2) in the plan's
    // encoder programs that run on the CPU, on `threads` threads; weights several ops read are packed once.
    // Each weight's pages of the mapped plan are then released (MADV_DONTNEED: the kernel reads them back
    // from the file if another kernel needs them), so the process keeps about the plan's resident bytes.
    // Packs nothing where cpu::gemm_bf16_packed_words is 0, or if the memory cannot be had (the GEMM then
    // packs on every call, as before). Called once, at engine open, before any session exists.
    void pack(const plan::Plan& p, int threads);
    // Op i's packed weights, or nullptr. Safe from any thread once pack has returned.
    const uint32_t* op(size_t i) const { return i < op_.size() ? op_[i] : nullptr; }
    uint64_t bytes() const { return bytes_; } // held, 0 when nothing was packed

private:
    std::vector<const uint32_t*> op_;
    void* block_    = nullptr;
    uint64_t bytes_ = 0;
};

} // namespace g4::rt
