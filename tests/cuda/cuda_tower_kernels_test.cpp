// The audio tower's CUDA kernels (g4_at_*) against the CPU tower's loops. Needs an NVIDIA GPU: each test
// is skipped where no driver or GPU is present (CI); with a GPU they run in full. Kernels are compiled
// with NVRTC for the GPU present, exactly as `g4 compile --device cuda` does.
#include "cuda_test_util.h"

namespace {

using namespace g4test_cuda;

// ---- the audio tower's kernels (g4_at_*) against the CPU tower's loops (runtime/src/towers/audio.cpp),
// written out here, at the real E2B/E4B shapes: 128 mel bins, SSCP channels 128 / 32, hidden 1024, 8 heads
// of 128, a 12-key window with 13 relative positions, depthwise kernel 5. fp32 throughout: the kernels
// differ from the loops only in summation order.

std::vector<float> widen(const std::vector<uint16_t>& b) {
    std::vector<float> v(b.size());
    for (size_t i = 0; i < b.size(); ++i)
        v[i] = bf16_to_f32(b[i]);
    return v;
}

// AudioTower::conv_layer: 3x3 stride-2 conv (w [c_out, c_in, 3, 3]), LayerNorm over channels, ReLU.
std::vector<float> conv_loops(const std::vector<float>& in, int t_valid, int f_in, int c_in,
                              const std::vector<float>& w, const std::vector<float>& norm, float eps,
                              int t_out, int f_out, int c_out) {
    std::vector<float> out((size_t)t_out * f_out * c_out);
    for (int t = 0; t < t_out; ++t)
        for (int f = 0; f < f_out; ++f) {
            float* y = out.data() + ((size_t)t * f_out + f) * c_out;
            for (int co = 0; co < c_out; ++co) {
                float acc = 0;
                for (int ci = 0; ci < c_in; ++ci)
                    for (int r = 0; r < 9; ++r) {
                        const int ti = 2 * t - 1 + r / 3, fi = 2 * f - 1 + r % 3;
                        if (ti >= 0 && ti < t_valid && fi >= 0 && fi < f_in)
                            acc += w[((size_t)co * c_in + ci) * 9 + r] *
                                   in[((size_t)ti * f_in + fi) * c_in + ci];
                    }
                y[co] = acc;
            }
            double mean = 0, var = 0;
            for (int c = 0; c < c_out; ++c)
                mean += y[c];
            mean /= c_out;
            for (int c = 0; c < c_out; ++c)
                var += (y[c] - mean) * (y[c] - mean);
            var /= c_out;
            const float r = (float)(1.0 / std::sqrt(var + eps));
            for (int c = 0; c < c_out; ++c)
                y[c] = std::max(0.0f, ((y[c] - (float)mean) * r) * norm[c]);
        }
    return out;
}

TEST(AudioTowerKernels, SubsampleConvsMatchTheLoops) {
    NEED_GPU();
    Dev dev;
    int V0 = 101, M = 128, C0 = 128, C1 = 32, V1 = (V0 + 1) / 2, T = (V1 + 1) / 2, F1 = 64, F2 = 32, one = 1,
        bf                        = 1;
    float eps                     = 1e-6f;
    const std::vector<float> feat = randn((size_t)V0 * M, 11);
    const auto w0 = to_bf16(randn((size_t)C0 * 9, 12, 0.3f)), n0 = to_bf16(randn(C0, 13, 1.0f));
    const auto w1 = to_bf16(randn((size_t)C1 * C0 * 9, 14, 0.05f)), n1 = to_bf16(randn(C1, 15, 1.0f));
    const std::vector<float> l0 = conv_loops(feat, V0, M, 1, widen(w0), widen(n0), eps, V1, F1, C0);
    const std::vector<float> l1 = conv_loops(l0, V1, F1, C0, widen(w1), widen(n1), eps, T, F2, C1);
    CUdeviceptr dfeat = dev.up(feat), dw0 = dev.up(w0), dn0 = dev.up(n0), dw1 = dev.up(w1), dn1 = dev.up(n1);
    CUdeviceptr dl0 = dev.alloc(l0.size() * 4), dl1 = dev.alloc(l1.size() * 4);
    launch_smem("g4_at_conv", V1, F1, 256, 4 * (9 + C0),
                {&dfeat, &V0, &M, &one, &dw0, &bf, &dn0, &bf, &eps, &dl0, &F1, &C0});
    launch_smem("g4_at_conv", T, F2, 256, 4 * (9 * C0 + C1),
                {&dl0, &V1, &F1, &C0, &dw1, &bf, &dn1, &bf, &eps, &dl1, &F2, &C1});
    const double e0 = rel(dev.down<float>(dl0, l0.size()), l0);
    // The second conv from the first's loop output, so that its error is its own.
    CUdeviceptr dl0r = dev.up(l0);
    launch_smem("g4_at_conv", T, F2, 256, 4 * (9 * C0 + C1),
                {&dl0r, &V1, &F1, &C0, &dw1, &bf, &dn1, &bf, &eps, &dl1, &F2, &C1});
    const double e1 = rel(dev.down<float>(dl1, l1.size()), l1);
    std::printf("audio SSCP conv 0 [%d, %d, %d]: rel %.2e; conv 1 [%d, %d, %d]: rel %.2e\n", V1, F1, C0, e0,
                T, F2, C1, e1);
    EXPECT_LT(e0, 1e-5);
    EXPECT_LT(e1, 1e-5);
}

TEST(AudioTowerKernels, ChunkedAttentionMatchesTheLoops) {
    NEED_GPU();
    Dev dev;
    int T = 750, H = 1024, NH = 8, D = 128, W = 12, NR = 13, bf = 1;
    float cap            = 50.0f;
    std::vector<float> q = randn((size_t)T * H, 21, 2.0f), k = randn((size_t)T * H, 22, 2.0f),
                       v           = randn((size_t)T * H, 23);
    const std::vector<float> rel_k = randn((size_t)NR * H, 24, 2.0f);
    const auto pds                 = to_bf16(randn(D, 25, 2.0f));
    // q/k scaling (softplus of per_dim_scale; one value above torch's threshold of 20).
    std::vector<uint16_t> pd = pds;
    pd[3]                    = f32_to_bf16(25.0f);
    const float q_scale      = (float)(std::pow((double)D, -0.5) / std::log(2.0)),
                k_scale      = (float)(std::log1p(std::exp(1.0)) / std::log(2.0));
    CUdeviceptr dq = dev.up(q), dk = dev.up(k), dv = dev.up(v), drel = dev.up(rel_k), dpd = dev.up(pd),
                dout = dev.alloc(q.size() * 4);
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < H; ++i) {
            const double p       = bf16_to_f32(pd[i % D]);
            const float sp       = (float)(p > 20.0 ? p : std::log1p(std::exp(p)));
            q[(size_t)t * H + i] = q[(size_t)t * H + i] * q_scale * sp;
            k[(size_t)t * H + i] = k[(size_t)t * H + i] * k_scale;
        }
    float qs = q_scale, ks = k_scale;
    launch("g4_at_qk_scale", T, (H + 255) / 256, 256, {&dq, &dk, &H, &D, &dpd, &bf, &qs, &ks});
    const double eq = rel(dev.down<float>(dq, q.size()), q), ek = rel(dev.down<float>(dk, k.size()), k);
    // AudioTower::attention's loop over (t, h).
    std::vector<float> want((size_t)T * H), logit(W);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < NH; ++h) {
            const int j0    = std::max(0, t - W + 1);
            const float* qh = q.data() + (size_t)t * H + h * D;
            float mx        = -INFINITY;
            for (int j = j0; j <= t; ++j) {
                const float* kh = k.data() + (size_t)j * H + h * D;
                float ac = 0, bd = 0;
                for (int d = 0; d < D; ++d)
                    ac += qh[d] * kh[d];
                const int p = W - (t - j);
                if (p < NR)
                    for (int d = 0; d < D; ++d)
                        bd += qh[d] * rel_k[(size_t)p * H + h * D + d];
                logit[j - j0] = std::tanh((ac + bd) / cap) * cap;
                mx            = std::max(mx, logit[j - j0]);
            }
            float sum = 0;
            for (int i = 0; i <= t - j0; ++i)
                sum += (logit[i] = std::exp(logit[i] - mx));
            float* oh = want.data() + (size_t)t * H + h * D;
            for (int j = j0; j <= t; ++j)
                for (int d = 0; d < D; ++d)
                    oh[d] += logit[j - j0] / sum * v[(size_t)j * H + h * D + d];
        }
    // The kernel from the loops' scaled q and k (each kernel's error its own).
    CUdeviceptr dqs = dev.up(q), dks = dev.up(k);
    launch_smem("g4_at_attention", T, NH, 32, 4 * W, {&dqs, &dks, &dv, &drel, &H, &D, &W, &NR, &cap, &dout});
    const double ea = rel(dev.down<float>(dout, want.size()), want);
    std::printf("audio q/k scaling: rel %.2e / %.2e; chunked attention %d x %d heads of %d: rel %.2e\n", eq,
                ek, T, NH, D, ea);
    EXPECT_LT(eq, 1e-6);
    EXPECT_LT(ek, 1e-6);
    EXPECT_LT(ea, 1e-5);
}

TEST(AudioTowerKernels, NormsLightConvAndResidualsMatchTheLoops) {
    NEED_GPU();
    Dev dev;
    int T = 300, H = 1024, K = 5, P = 1536, bf = 1;
    long ldH = H, ldP = P;
    float eps = 1e-6f, clip = 1.5f;
    const std::vector<float> x = randn((size_t)T * H, 31), big = randn((size_t)T * 2 * H, 32);
    const auto w = to_bf16(randn(H, 33, 1.0f)), dw = to_bf16(randn((size_t)H * K, 34, 0.5f)),
               bias             = to_bf16(randn(P, 35, 1.0f));
    const std::vector<float> wf = widen(w), dwf = widen(dw), bf_ = widen(bias);
    // RMS with the gradient clip (clamps before the norm, as HF) and a weight; without either.
    std::vector<float> r1((size_t)T * H), r2((size_t)T * H);
    for (int t = 0; t < T; ++t) {
        double s1 = 0, s2 = 0;
        for (int i = 0; i < H; ++i) {
            const float v = x[(size_t)t * H + i], c = std::min(std::max(v, -clip), clip);
            s1 += (double)c * c, s2 += (double)v * v;
        }
        const float q1 = std::pow((float)(s1 / H) + eps, -0.5f), q2 = std::pow((float)(s2 / H) + eps, -0.5f);
        for (int i = 0; i < H; ++i) {
            const float v = x[(size_t)t * H + i], c = std::min(std::max(v, -clip), clip);
            r1[(size_t)t * H + i] = c * q1 * wf[i];
            r2[(size_t)t * H + i] = v * q2;
        }
    }
    CUdeviceptr dx = dev.up(x), dw_ = dev.up(w), dy = dev.alloc(x.size() * 4), none = 0;
    float noclip = 0.0f;
    int zero     = 0;
    launch("g4_at_rms", T, 1, 256, {&dx, &ldH, &dw_, &bf, &dy, &ldH, &H, &eps, &clip});
    const double e1 = rel(dev.down<float>(dy, r1.size()), r1);
    launch("g4_at_rms", T, 1, 256, {&dx, &ldH, &none, &zero, &dx, &ldH, &H, &eps, &noclip}); // in place
    const double e2 = rel(dev.down<float>(dx, r2.size()), r2);
    // GLU, causal depthwise conv, SiLU.
    std::vector<float> g((size_t)T * H), c((size_t)T * H);
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < H; ++i) {
            const float a = big[(size_t)t * 2 * H + i], b = big[(size_t)t * 2 * H + H + i];
            g[(size_t)t * H + i] = a / (1.0f + std::exp(-b));
        }
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < H; ++i) {
            float acc = 0;
            for (int j = 0; j < K; ++j)
                if (t - (K - 1) + j >= 0)
                    acc += dwf[(size_t)i * K + j] * g[(size_t)(t - (K - 1) + j) * H + i];
            c[(size_t)t * H + i] = acc;
        }
    std::vector<float> sl = c;
    for (float& v : sl)
        v = v / (1.0f + std::exp(-v));
    CUdeviceptr dbig = dev.up(big), dg = dev.alloc(g.size() * 4), dc = dev.alloc(c.size() * 4),
                ddw = dev.up(dw);
    launch("g4_at_glu", T, (H + 255) / 256, 256, {&dbig, &H, &dg});
    const double eg = rel(dev.down<float>(dg, g.size()), g);
    CUdeviceptr dgr = dev.up(g);
    launch("g4_at_dwconv", T, (H + 255) / 256, 256, {&dgr, &ddw, &bf, &H, &K, &dc});
    const double ec = rel(dev.down<float>(dc, c.size()), c);
    CUdeviceptr dcr = dev.up(c);
    launch("g4_at_silu", T, (H + 255) / 256, 256, {&dcr, &ldH, &H});
    const double es = rel(dev.down<float>(dcr, sl.size()), sl);
    // Residuals (x = n * f + x) and the output projection's bias.
    const std::vector<float> n = randn((size_t)T * H, 36);
    std::vector<float> res     = x;
    for (size_t i = 0; i < res.size(); ++i)
        res[i] = n[i] * 0.5f + res[i];
    CUdeviceptr dres = dev.up(x), dn = dev.up(n);
    float half = 0.5f;
    launch("g4_at_residual", T, (H + 255) / 256, 256, {&dres, &dn, &H, &half});
    const double er             = rel(dev.down<float>(dres, res.size()), res);
    const std::vector<float> pr = randn((size_t)T * P, 37);
    std::vector<float> pb       = pr;
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < P; ++i)
            pb[(size_t)t * P + i] += bf_[i];
    CUdeviceptr dp = dev.up(pr), db = dev.up(bias);
    launch("g4_at_bias", T, (P + 255) / 256, 256, {&dp, &ldP, &db, &bf, &P});
    const double eb = rel(dev.down<float>(dp, pb.size()), pb);
    std::printf("audio rms (clip, weight) %.2e, rms in place %.2e, GLU %.2e, depthwise conv %.2e, SiLU %.2e, "
                "residual %.2e, bias %.2e\n",
                e1, e2, eg, ec, es, er, eb);
    for (double e : {e1, e2, eg, ec, es})
        EXPECT_LT(e, 1e-6);
    EXPECT_EQ(er, 0.0);
    EXPECT_EQ(eb, 0.0);
}

} // namespace
