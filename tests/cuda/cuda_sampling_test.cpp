// The sampling kernels (argmax, LM-head screening, penalties and top-k, softmax normaliser) against the
// CPU sampler and the full LM head. Needs an NVIDIA GPU: each test
// is skipped where no driver or GPU is present (CI); with a GPU they run in full. Kernels are compiled
// with NVRTC for the GPU present, exactly as `g4 compile --device cuda` does.
#include "cuda_test_util.h"

namespace {

using namespace g4test_cuda;

// ---- greedy sampling: multi-block argmax, ties to the lowest index, counter reset for the next call;
// with a step, the feed of the next decode step (its id, its position, the host slot of this one)
TEST(Argmax, MatchesHostAcrossCalls) {
    NEED_GPU();
    Dev dev;
    const int vocab = 262144;
    for (int trial = 0; trial < 3; ++trial) {
        std::vector<float> l = randn(vocab, 30 + trial);
        int want             = trial == 2 ? 5 : 200000 - trial * 77777;
        l[want]              = 9.0f;
        if (trial == 1) l[want + 1000] = 9.0f; // a tie: the lower index wins
        if (trial == 2) l[vocab - 1] = 9.0f;
        CUdeviceptr gl = dev.up(l), ws = dev.alloc((2 + 2 * 128) * 4);
        CUdeviceptr none = 0;
        for (int rep = 0; rep < 2; ++rep) { // the second call reuses the counter the first one reset
            int v = vocab, limit = 0;
            launch("g4_argmax", 128, 1, 1024, {&gl, &v, &ws, &none, &none, &none, &limit});
            auto got = dev.down<int>(ws, 2);
            EXPECT_EQ(got[0], want) << "trial " << trial;
            EXPECT_EQ(got[1], 0);
        }
        // Feeding: slot pos & 1 of the (here device) token buffer, ids[0] (0 past the limit), pos + 1.
        for (int limit : {vocab, want}) {
            const int pos    = 7 + trial;
            CUdeviceptr step = dev.step(1, pos, 1), ids = dev.up(std::vector<int>{-1, -1}),
                        slots = dev.up(std::vector<int>{-1, -1});
            int v             = vocab;
            launch("g4_argmax", 128, 1, 1024, {&gl, &v, &ws, &step, &ids, &slots, &limit});
            auto st = dev.down<int>(step, 4), id = dev.down<int>(ids, 2), sl = dev.down<int>(slots, 2);
            EXPECT_EQ(sl[pos & 1], want) << "trial " << trial;
            EXPECT_EQ(sl[(pos + 1) & 1], -1);
            EXPECT_EQ(id[0], want < limit ? want : 0) << "limit " << limit;
            EXPECT_EQ(id[1], -1);
            EXPECT_EQ(st[1], pos + 1);
            EXPECT_EQ(st[0], 1);
            EXPECT_EQ(st[2], 1);
        }
    }
}

// ---- LM-head screening (g4_lm_screen_build, g4_lm_screen, g4_lm_exact_l*): every logit between its
// bounds, the rows computed bit-equal to the head GEMV's, the greedy token equal to g4_argmax's over the
// whole head (ties to the lowest index), the feed of the next step as g4_argmax makes it.
struct LmCase {
    const char* name;
    int v, k, lanes; // lanes 0: as the compiler chooses
    bool bias;       // a LoRA bias on the head
};
class LmScreen : public ::testing::TestWithParam<LmCase> {};
TEST_P(LmScreen, ExactRowsAndTokenMatchFullHead) {
    NEED_GPU();
    const LmCase c = GetParam();
    Dev dev;
    Weight w = make_weight(dev, DType::BF16, c.v, c.k, 500 + c.k);
    // Exact ties: rows copied over others, the lower index first; one of them the top row below.
    const uint16_t* wb = (const uint16_t*)w.blob.data();
    auto copy_row      = [&](int from, int to) {
        std::memcpy(w.blob.data() + (size_t)to * c.k * 2, wb + (size_t)from * c.k, (size_t)c.k * 2);
        ASSERT_EQ(
                 gpu().d->cuMemcpyHtoD(w.dev + (uint64_t)to * c.k * 2, wb + (size_t)to * c.k, (size_t)c.k * 2), 0);
    };
    auto bf16_f = [](uint16_t h) {
        const uint32_t u = (uint32_t)h << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    };
    const int lanes = c.lanes ? c.lanes : cuda::gemv_lanes(c.k, false, (c.v + 3) / 4);
    int sms         = 0;
    gpu().d->cuDeviceGetAttribute(&sms, cu::kAttrSmCount, gpu().dev);
    const unsigned nb1 = (unsigned)sms * 4;
    CUdeviceptr q = dev.alloc((size_t)c.v * c.k), sc = dev.alloc((size_t)c.v * 4),
                bd = dev.alloc((size_t)c.v * 4);
    int V = c.v, K = c.k;
    for (int trial = 0; trial < 3; ++trial) {
        std::vector<float> x = randn((size_t)c.k, 60 + trial);
        if (trial == 2) // logits past 4 x the cap: every row is computed
            for (float& v : x)
                v *= 400.0f;
        // The head as the decode step runs it: pre-softcap values (epilogue 0) and softcapped (3).
        CUdeviceptr gx = dev.up(x), pre = dev.alloc((size_t)c.v * 4), full = dev.alloc((size_t)c.v * 4);
        CUdeviceptr bias = c.bias ? dev.up(randn((size_t)c.v, 70 + trial, 2.0f)) : 0;
        cuda_rt::GemvArgsH a{};
        a.m[0] = w.mat(pre, bias), a.x = gx, a.nmat = 1, a.k = c.k, a.epi = 0, a.cap = 30.0f;
        run_gemv(a, false, lanes, false, c.v);
        std::vector<float> pre_h = dev.down<float>(pre, c.v);
        int top                  = -1;
        if (trial == 1) { // the top row tied by a copy at a lower and a higher index
            top = (int)(std::max_element(pre_h.begin(), pre_h.end()) - pre_h.begin());
            copy_row(top, top / 2);
            copy_row(top, std::min(c.v - 1, top + 3));
            run_gemv(a, false, lanes, false, c.v);
            pre_h = dev.down<float>(pre, c.v);
        }
        a.m[0].y = full, a.epi = 3;
        run_gemv(a, false, lanes, false, c.v);
        const std::vector<float> full_h = dev.down<float>(full, c.v);
        CUdeviceptr ws = dev.alloc((2 + 2 * 128) * 4), none = 0;
        int zero = 0;
        launch("g4_argmax", 128, 1, 1024, {&full, &V, &ws, &none, &none, &none, &zero});
        const int want = dev.down<int>(ws, 1)[0];

        launch("g4_lm_screen_build", (unsigned)(c.v + 7) / 8, 1, 256, {&w.dev, &V, &K, &q, &sc, &bd});
        if (trial == 0) { // the stored bound covers each row's rounding error
            const auto qh = dev.down<uint8_t>(q, (size_t)c.v * c.k);
            const auto sh = dev.down<float>(sc, c.v), bh = dev.down<float>(bd, c.v);
            for (int r = 0; r < c.v; r += 997) {
                double e2 = 0;
                for (int i = 0; i < c.k; ++i) {
                    const double d = (double)bf16_f(wb[(size_t)r * c.k + i]) -
                                     (double)sh[r] * ((int)qh[(size_t)r * c.k + i] - 128);
                    e2 += d * d;
                }
                ASSERT_GE((double)bh[r], std::sqrt(e2)) << "row " << r;
                ASSERT_LE((double)bh[r], std::sqrt(e2) * 1.001 + 1e-30) << "row " << r;
            }
        }
        CUdeviceptr lohi = dev.alloc((size_t)(c.v + 1) * 8), tmax = dev.alloc(4);
        launch("g4_lm_screen", nb1, 1, 256, {&gx, &q, &sc, &bd, &bias, &V, &K, &lohi, &tmax});
        const auto lh = dev.down<float>(lohi, (size_t)c.v * 2);
        for (int r = 0; r < c.v; ++r) {
            ASSERT_LE(lh[2 * r], pre_h[r]) << "row " << r;
            ASSERT_GE(lh[2 * r + 1], pre_h[r]) << "row " << r;
        }
        // The exact pass into a row of NaNs: computed rows bit-equal, the token and the feed.
        std::vector<float> nans(c.v, std::nanf(""));
        CUdeviceptr part = dev.up(nans);
        a.m[0].y         = part;
        const int pos    = 11 + trial;
        CUdeviceptr step = dev.step(1, pos, 1), ids = dev.up(std::vector<int>{-1, -1}),
                    slots    = dev.up(std::vector<int>{-1, -1});
        int limit            = c.v;
        const std::string ex = "g4_lm_exact_l" + std::to_string(lanes);
        launch(ex.c_str(), 128, 1, 128, {&a, &lohi, &tmax, &ws, &step, &ids, &slots, &limit});
        EXPECT_EQ(dev.down<uint32_t>(tmax, 1)[0], 0u) << "the largest lower bound is reset for the next step";
        const auto got = dev.down<float>(part, c.v);
        int computed   = 0;
        for (int r = 0; r < c.v; ++r) {
            if (std::isnan(got[r])) continue;
            ++computed;
            ASSERT_EQ(std::memcmp(&got[r], &full_h[r], 4), 0)
                << "row " << r << ": " << got[r] << " vs " << full_h[r];
        }
        const auto sl = dev.down<int>(slots, 2), id = dev.down<int>(ids, 2), st = dev.down<int>(step, 4),
                   w0 = dev.down<int>(ws, 2);
        EXPECT_EQ(w0[0], want) << c.name << " trial " << trial;
        EXPECT_EQ(w0[1], 0);
        EXPECT_EQ(sl[pos & 1], want);
        EXPECT_EQ(id[0], want);
        EXPECT_EQ(st[1], pos + 1);
        EXPECT_FALSE(std::isnan(got[want]));
        if (trial == 1 && top > 1 && !c.bias) {
            EXPECT_EQ(want, top / 2);
        } // (a bias breaks the copies' ties)
        if (trial == 2) {
            EXPECT_EQ(computed, c.v);
        }
        std::printf("LM screen %s trial %d: token %d, %d of %d rows computed\n", c.name, trial, want,
                    computed, c.v);
    }
}
INSTANTIATE_TEST_SUITE_P(
    Shapes, LmScreen,
    ::testing::Values(LmCase{"e2b", 262144, 1536, 0, false}, LmCase{"e4b", 262144, 2560, 0, false},
                      LmCase{"e2b_bias", 262144, 1536, 0, true}, LmCase{"odd_l8", 1003, 256, 8, false},
                      LmCase{"odd_l16_bias", 2051, 512, 16, true}, LmCase{"odd_l32", 4099, 640, 32, false},
                      LmCase{"k4096_l128", 3001, 4096, 128, false}),
    [](const ::testing::TestParamInfo<LmCase>& i) { return std::string(i.param.name); });

// ---- sampling on the GPU: repetition penalty and top-k rounds against the CPU sampler's arithmetic
// and order (value descending, ties to the lower index), at Gemma's vocabulary.
struct TopkCase {
    int k;
    float temp, penalty;
};
class TopK : public ::testing::TestWithParam<TopkCase> {};
TEST_P(TopK, RoundsMatchHostPartialSort) {
    NEED_GPU();
    const TopkCase c = GetParam();
    const int vocab  = 262144;
    Dev dev;
    std::vector<float> l = randn(vocab, 41);
    for (int i = 0; i < 3000; ++i)
        l[(i * 7919 + 13) % vocab] = l[(i * 104729 + 5) % vocab]; // ties
    l[262000] = l[5]      = 6.5f;                                 // a tie at the top
    std::vector<int> hist = {5, 17, 5, 262143, 100000, 17, 99};
    // Host: the CPU sampler's penalty, temperature and partial sort.
    std::vector<float> buf = l;
    if (c.penalty != 1.0f)
        for (int t : hist)
            buf[t] = l[t] < 0 ? l[t] * c.penalty : l[t] / c.penalty;
    if (c.temp > 0)
        for (float& v : buf)
            v /= c.temp;
    std::vector<int> idx(vocab);
    for (int i = 0; i < vocab; ++i)
        idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + c.k, idx.end(),
                      [&](int a, int b) { return buf[a] > buf[b] || (buf[a] == buf[b] && a < b); });

    CUdeviceptr gl = dev.up(l), src = gl;
    if (c.penalty != 1.0f) {
        CUdeviceptr pen = dev.alloc(vocab * 4), gh = dev.up(hist);
        long n = vocab;
        int nh = (int)hist.size(), v = vocab;
        float pe = c.penalty;
        launch("g4_copy_f32", vocab / 256, 1, 256, {&gl, &pen, &n});
        launch("g4_penalize", 1, 1, 256, {&gl, &pen, &gh, &nh, &v, &pe});
        src = pen;
    }
    const uint64_t cap  = cuda_ws::topk_candidates(vocab);
    CUdeviceptr bufs[2] = {dev.alloc(cap * 8), dev.alloc(cap * 8)}, vals = src, ids = 0;
    long n     = vocab;
    float temp = c.temp;
    int k = c.k, rounds = 0;
    for (;; ++rounds) {
        const unsigned blocks = (unsigned)((n + cuda_ws::kTopkBlock - 1) / cuda_ws::kTopkBlock);
        CUdeviceptr ov = bufs[rounds & 1], oi = ov + cap * 4;
        launch("g4_topk_round", blocks, 1, 1024, {&vals, &ids, &n, &temp, &k, &ov, &oi});
        vals = ov, ids = oi, n = (long)blocks * k, temp = 0.0f;
        if (blocks == 1) break;
    }
    auto gv = dev.down<float>(vals, c.k);
    auto gi = dev.down<int>(ids, c.k);
    int bad = 0;
    for (int i = 0; i < c.k; ++i)
        bad += gi[i] != idx[i] || gv[i] != buf[idx[i]];
    std::printf("top-%d temp %.2f penalty %.2f: %d rounds, %d mismatches\n", c.k, c.temp, c.penalty,
                rounds + 1, bad);
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(gi[0], c.penalty != 1.0f ? 262000 : 5); // 5 is penalised; else the tie goes to the lower index
}
INSTANTIATE_TEST_SUITE_P(GemmaVocab, TopK,
                         ::testing::Values(TopkCase{1, 0.0f, 1.3f}, TopkCase{40, 0.7f, 1.0f},
                                           TopkCase{64, 1.0f, 1.3f}, TopkCase{1024, 0.8f, 1.1f},
                                           TopkCase{777, 1.7f, 1.0f}),
                         [](const ::testing::TestParamInfo<TopkCase>& i) {
                             return "k" + std::to_string(i.param.k) +
                                    (i.param.penalty != 1.0f ? "_penalty" : "");
                         });

// Through the C API on a CUDA plan: every token g4_session_sample draws from the GPU's candidates
// equals the CPU sampler's draw from the same logits with the same seed.
TEST(GpuSampling, SameTokensAsTheCpuSampler) {
    NEED_GPU();
    g4test::TempDir td;
    const std::string plan = td.file("tiny.g4plan");
    g4test::CmdResult r    = g4test::run_g4("compile --model '" + g4test::fixture("e2b_tiny") +
                                            "' --device cuda --no-fidelity -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    std::vector<g4_sampling_params> sets(5, g4_sampling_params_default());
    sets[0].temperature = 0.8f, sets[0].top_k = 40, sets[0].top_p = 0.9f, sets[0].min_p = 0.02f,
    sets[0].repeat_penalty = 1.3f, sets[0].repeat_last_n = 16, sets[0].seed = 11;
    sets[1].repeat_penalty = 1.5f, sets[1].repeat_last_n = -1; // greedy with a penalty: top-1 on the GPU
    sets[2].temperature = 1.2f, sets[2].top_k = 300, sets[2].seed = 5;
    // No top-k: top-p / min-p from the GPU's best candidates with the row's normalizer (sample_prefix).
    sets[3].temperature = 1.0f, sets[3].top_k = 0, sets[3].top_p = 0.9f, sets[3].seed = 21;
    sets[4].temperature = 0.8f, sets[4].top_k = 0, sets[4].min_p = 0.05f, sets[4].repeat_penalty = 1.3f,
    sets[4].repeat_last_n = -1, sets[4].seed = 4;
    for (const g4_sampling_params& p : sets) {
        g4_session* s = nullptr;
        ASSERT_EQ(g4_session_create(e, nullptr, &s), G4_OK) << g4_last_error_message();
        std::vector<int32_t> fed = {2, 10, 11, 12, 13};
        ASSERT_EQ(g4_session_append_tokens(s, fed.data(), fed.size(), nullptr, 0), G4_OK);
        std::mt19937_64 rng(p.seed);
        std::vector<float> buf(512);
        std::vector<int32_t> idx(512), tmp(512);
        for (int step = 0; step < 24; ++step) {
            int32_t tok = -1, vocab = 0;
            ASSERT_EQ(g4_session_sample(s, &p, &tok), G4_OK) << g4_last_error_message();
            const float* logits = nullptr;
            ASSERT_EQ(g4_session_get_logits(s, &logits, &vocab), G4_OK);
            ASSERT_EQ(vocab, 512);
            const int32_t want = rt::sample_token(logits, vocab, p, fed.data(), (int32_t)fed.size(),
                                                  buf.data(), idx.data(), tmp.data(), rng);
            EXPECT_EQ(tok, want) << "step " << step << ", temperature " << p.temperature;
            fed.push_back(tok);
            ASSERT_EQ(g4_session_append_tokens(s, &tok, 1, nullptr, 0), G4_OK);
        }
        g4_session_destroy(s);
    }
    g4_engine_close(e);
}

// The softmax normalizer of a whole row at Gemma's vocabulary (top-p / min-p without top-k): the
// blocks' (max, sum) merged on the host equal the CPU sampler's normalizer to double rounding.
TEST(GpuSampling, SoftmaxPartialsGiveTheRowNormalizer) {
    NEED_GPU();
    const int vocab = 262144;
    Dev dev;
    std::vector<float> l = randn(vocab, 77, 4.0f);
    CUdeviceptr gl = dev.up(l), out = dev.alloc(cuda_ws::kSoftmaxBlocks * 16);
    for (float temp : {0.7f, 1.0f, 1.6f}) {
        long n = vocab;
        launch("g4_softmax_partial", cuda_ws::kSoftmaxBlocks, 1, 256, {&gl, &n, &temp, &out});
        auto part = dev.down<double>(out, 2 * cuda_ws::kSoftmaxBlocks);
        double mx = -INFINITY, sum = 0, want = 0;
        for (int b = 0; b < cuda_ws::kSoftmaxBlocks; ++b)
            mx = std::max(mx, part[2 * b]);
        for (int b = 0; b < cuda_ws::kSoftmaxBlocks; ++b)
            sum += part[2 * b + 1] * std::exp(part[2 * b] - mx);
        float hmx = -INFINITY;
        for (float v : l)
            hmx = std::max(hmx, v / temp);
        for (float v : l)
            want += std::exp((double)(v / temp) - hmx);
        EXPECT_EQ((float)mx, hmx) << "temperature " << temp;
        EXPECT_NEAR(sum / want, 1.0, 1e-12) << "temperature " << temp;
    }
}

} // namespace
