// PackedWeights (packed_weights.h): the CPU encoder programs' bf16 matmul weights in the layout of the CPU
// GEMM of the level in use, packed once at engine open.
#include "runtime/src/packed_weights.h"

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/plan/op_params.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sys/mman.h>
#include <unistd.h>

namespace g4::rt {

PackedWeights::~PackedWeights() {
    std::free(block_);
}

void PackedWeights::pack(const plan::Plan& p, int threads) {
    struct Weight {
        size_t tensor;
        uint64_t offset; // in block_, bytes
    };
    std::map<size_t, Weight> weights; // by tensor
    std::vector<std::pair<size_t, size_t>> uses; // (op, tensor)
    uint64_t total = 0;
    for (size_t g = 1; g < p.n_programs(); ++g) {
        const plan::PlanProgram& pr = p.program(g);
        if (pr.device >= 0) continue;
        for (size_t i = pr.op_begin; i < pr.op_end; ++i) {
            const plan::PlanOp& op = p.op(i);
            if ((OpCode)op.code != OpCode::Matmul || plan::params<plan::MatmulParams>(op).cpu_kernel != 2)
                continue;
            const size_t t           = (size_t)op.in[1];
            const plan::PlanTensor& w = p.tensor(t);
            if ((DType)w.dtype != DType::BF16 && (DType)w.dtype != DType::F32) continue;
            const size_t words = cpu::gemm_bf16_packed_words(w.dims[0], w.dims[1]);
            if (words == 0) continue;
            if (!weights.count(t)) {
                weights[t] = {t, total};
                total += (words * 4 + 63) / 64 * 64;
            }
            uses.emplace_back(i, t);
        }
    }
    if (total == 0) return;
    block_ = std::aligned_alloc(64, total);
    if (!block_) return;
    bytes_ = total;
    // Work items of a few column strips each, spread over the pool.
    constexpr int64_t kStrips = 4;
    struct Item {
        size_t tensor;
        int64_t s0, s1;
    };
    std::vector<Item> items;
    for (const auto& [t, wt] : weights) {
        const int64_t strips = (p.tensor(t).dims[0] + cpu::kGemmNr - 1) / cpu::kGemmNr;
        for (int64_t s = 0; s < strips; s += kStrips)
            items.push_back({t, s, std::min(strips, s + kStrips)});
    }
    cpu::ThreadPool pool(std::max(1, threads), 0);
    pool.parallel_for((int64_t)items.size(), [&](int64_t i, int) {
        const Item& it            = items[(size_t)i];
        const plan::PlanTensor& w = p.tensor(it.tensor);
        cpu::gemm_bf16_pack(p.weight_data(w), (DType)w.dtype, w.dims[0], w.dims[1], it.s0, it.s1,
                            (uint32_t*)((uint8_t*)block_ + weights[it.tensor].offset));
    });
    op_.assign(p.n_ops_all(), nullptr);
    for (const auto& [i, t] : uses)
        op_[i] = (const uint32_t*)((const uint8_t*)block_ + weights[t].offset);
    // The plan's pages wholly inside each packed weight.
    const uintptr_t page = (uintptr_t)::sysconf(_SC_PAGESIZE);
    for (const auto& [t, wt] : weights) {
        const plan::PlanTensor& w = p.tensor(t);
        const uintptr_t a         = ((uintptr_t)p.weight_data(w) + page - 1) & ~(page - 1);
        const uintptr_t b         = ((uintptr_t)p.weight_data(w) + w.nbytes) & ~(page - 1);
        if (a < b) ::madvise((void*)a, b - a, MADV_DONTNEED);
    }
}

} // namespace g4::rt
