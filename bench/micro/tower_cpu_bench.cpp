// tower_cpu_bench: the vision and audio towers' forward pass alone at their real E2B (= E4B) shapes, random
// bf16 weights, no checkpoint or plan: one 2394-patch image (57 x 42 grid, 266 soft tokens, the 1024x768
// image of bench/e2e/tower_bench.py) and one 30 s clip (750 soft tokens). Prints every rep and the median.
// Built with the project (build/bench/micro/tower_cpu_bench).
// Usage: tower_cpu_bench [vision|audio|both|gemm] [reps] [fp32|bf16|both]   (threads: G4_THREADS, else all
// cores; towers in both precisions by default, fp32 then bf16)
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/src/towers/audio.h"
#include "runtime/src/towers/vision.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace g4;

namespace {

struct Store { // random bf16 weights by name; shapes from a rule
    std::map<std::string, std::vector<uint16_t>> data;
    std::map<std::string, towers::Tensor> ts;
    std::mt19937 rng{1};
    void add(const std::string& name, std::vector<int64_t> shape, float sd, float mean = 0.0f) {
        int64_t numel = 1;
        for (int64_t d : shape)
            numel *= d;
        std::normal_distribution<float> nd(mean, sd);
        std::vector<uint16_t>& v = data[name];
        v.resize((size_t)numel);
        for (auto& x : v) {
            float f = nd(rng);
            uint32_t u;
            std::memcpy(&u, &f, 4);
            x = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
        }
        towers::Tensor t;
        t.data = v.data(), t.dtype = DType::BF16, t.ndim = (int)shape.size();
        for (size_t i = 0; i < shape.size(); ++i)
            t.dims[i] = shape[i];
        ts[name] = t;
    }
    void scalar(const std::string& name, float v) { add(name, {}, 0.0f, v); }
    towers::Lookup lookup() {
        return [this](const std::string& n) -> const towers::Tensor* {
            auto it = ts.find(n);
            return it == ts.end() ? nullptr : &it->second;
        };
    }
};

bool has(const std::string& s, const char* sub) {
    return s.find(sub) != std::string::npos;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <class F> double time_s(F&& f) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void bench_vision(cpu::ThreadPool& pool, int reps, towers::Precision prec) {
    towers::VisionHParams hp{};
    const char* cfg =
        R"({"hidden_size":768,"num_hidden_layers":16,"num_attention_heads":12,"num_key_value_heads":12,
        "head_dim":64,"intermediate_size":3072,"patch_size":16,"pooling_kernel_size":3,
        "position_embedding_size":10240,"use_clipped_linears":true})";
    if (std::string e = towers::parse_vision_hparams(cfg, 1536, &hp); !e.empty()) {
        std::printf("%s\n", e.c_str());
        std::exit(1);
    }
    hp.precision    = prec;
    const int64_t H = hp.hidden_size, I = hp.intermediate_size;
    Store st;
    for (const std::string& n : towers::vision_weight_names(hp)) {
        if (has(n, "_min"))
            st.scalar(n, -8.0f);
        else if (has(n, "_max"))
            st.scalar(n, 8.0f);
        else if (has(n, "position_embedding_table"))
            st.add(n, {2, hp.position_embedding_size, H}, 0.03f);
        else if (has(n, "input_proj"))
            st.add(n, {H, 3LL * hp.patch_size * hp.patch_size}, 0.03f);
        else if (has(n, "embed_vision"))
            st.add(n, {hp.text_hidden_size, H}, 0.03f);
        else if (has(n, "gate_proj") || has(n, "up_proj"))
            st.add(n, {I, H}, 0.03f);
        else if (has(n, "down_proj"))
            st.add(n, {H, I}, 0.03f);
        else if (has(n, ".linear.weight"))
            st.add(n, {H, H}, 0.03f);
        else if (has(n, "q_norm") || has(n, "k_norm"))
            st.add(n, {hp.head_dim}, 0.1f, 1.0f);
        else
            st.add(n, {H}, 0.1f, 1.0f);
    }
    const int gw = 57, gh = 42, n = gw * gh; // 1024x768 at the 280-token budget
    towers::VisionTower vt;
    if (std::string e = vt.init(hp, st.lookup(), 280 * 9); !e.empty()) {
        std::printf("%s\n", e.c_str());
        std::exit(1);
    }
    cpu::Context ctx;
    ctx.pool = &pool, ctx.scratch_stride = vt.thread_scratch_floats();
    std::vector<float> tscr(ctx.scratch_stride * pool.size() + 16), scr(vt.scratch_bytes() / 4 + 16);
    ctx.scratch = tscr.data();
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    std::vector<float> px((size_t)n * 3 * hp.patch_size * hp.patch_size);
    for (float& x : px)
        x = ud(rng);
    std::vector<int32_t> pos((size_t)n * 2);
    for (int i = 0; i < n; ++i)
        pos[2 * i] = i % gw, pos[2 * i + 1] = i / gw;
    std::vector<float> out((size_t)vt.max_soft_tokens() * hp.text_hidden_size);
    int n_soft = 0;
    std::vector<double> ts;
    for (int r = 0; r <= reps; ++r) { // rep 0 warms up
        std::string err;
        double s =
            time_s([&] { err = vt.forward(ctx, px.data(), pos.data(), n, scr.data(), out.data(), &n_soft); });
        if (!err.empty()) {
            std::printf("%s\n", err.c_str());
            std::exit(1);
        }
        if (r) ts.push_back(s);
        std::printf("  vision %s rep %d: %.3f s\n", towers::precision_name(prec), r, s);
    }
    double sum = 0;
    for (int i = 0; i < n_soft * hp.text_hidden_size; ++i)
        sum += std::fabs(out[i]);
    std::printf("vision %s: %d patches -> %d soft tokens, %d threads, median %.3f s (checksum %.6g, %zu "
                "floats/thread)\n",
                towers::precision_name(prec), n, n_soft, pool.size(), median(ts), sum,
                vt.thread_scratch_floats());
}

void bench_audio(cpu::ThreadPool& pool, int reps, towers::Precision prec) {
    towers::AudioHParams hp{};
    if (std::string e = towers::parse_audio_hparams("{}", 1536, &hp); !e.empty()) {
        std::printf("%s\n", e.c_str());
        std::exit(1);
    }
    hp.precision    = prec;
    const int64_t H = hp.hidden_size, C0 = hp.subsampling_conv_channels[0],
                  C1 = hp.subsampling_conv_channels[1];
    const int64_t f2 = ((hp.mel_bins + 1) / 2 + 1) / 2;
    Store st;
    for (const std::string& n : towers::audio_weight_names(hp)) {
        if (has(n, "_min"))
            st.scalar(n, -8.0f);
        else if (has(n, "_max"))
            st.scalar(n, 8.0f);
        else if (has(n, "layer0.conv"))
            st.add(n, {C0, 1, 3, 3}, 0.3f);
        else if (has(n, "layer0.norm"))
            st.add(n, {C0}, 0.1f, 1.0f);
        else if (has(n, "layer1.conv"))
            st.add(n, {C1, C0, 3, 3}, 0.03f);
        else if (has(n, "layer1.norm"))
            st.add(n, {C1}, 0.1f, 1.0f);
        else if (has(n, "input_proj_linear"))
            st.add(n, {H, f2 * C1}, 0.03f);
        else if (has(n, "ffw_layer_1"))
            st.add(n, {4 * H, H}, 0.03f);
        else if (has(n, "ffw_layer_2"))
            st.add(n, {H, 4 * H}, 0.03f);
        else if (has(n, "linear_start"))
            st.add(n, {2 * H, H}, 0.03f);
        else if (has(n, "per_dim_scale"))
            st.add(n, {H / hp.num_attention_heads}, 0.1f);
        else if (has(n, "depthwise_conv1d"))
            st.add(n, {H, 1, hp.conv_kernel_size}, 0.3f);
        else if (has(n, "output_proj.weight"))
            st.add(n, {hp.output_proj_dims, H}, 0.03f);
        else if (has(n, "output_proj.bias"))
            st.add(n, {hp.output_proj_dims}, 0.03f);
        else if (has(n, "embed_audio"))
            st.add(n, {hp.text_hidden_size, hp.output_proj_dims}, 0.03f);
        else if (has(n, "linear.weight") || has(n, "relative_k_proj"))
            st.add(n, {H, H}, 0.03f);
        else
            st.add(n, {H}, 0.1f, 1.0f);
    }
    const int64_t samples = 480000;
    towers::AudioTower at;
    if (std::string e = at.init(hp, st.lookup(), samples); !e.empty()) {
        std::printf("%s\n", e.c_str());
        std::exit(1);
    }
    cpu::Context ctx;
    ctx.pool = &pool, ctx.scratch_stride = at.thread_scratch_floats();
    std::vector<float> tscr(ctx.scratch_stride * pool.size() + 16), scr(at.scratch_bytes() / 4 + 16);
    ctx.scratch = tscr.data();
    std::mt19937 rng(9);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    std::vector<float> pcm((size_t)samples);
    for (size_t i = 0; i < pcm.size(); ++i)
        pcm[i] = 0.3f * std::sin(0.01f * (float)i) + nd(rng);
    std::vector<float> out((size_t)at.max_soft_tokens() * hp.text_hidden_size);
    int n_soft = 0;
    std::vector<double> ts;
    for (int r = 0; r <= reps; ++r) {
        std::string err;
        double s =
            time_s([&] { err = at.forward(ctx, pcm.data(), samples, scr.data(), out.data(), &n_soft); });
        if (!err.empty()) {
            std::printf("%s\n", err.c_str());
            std::exit(1);
        }
        if (r) ts.push_back(s);
        std::printf("  audio %s rep %d: %.3f s\n", towers::precision_name(prec), r, s);
    }
    double sum = 0;
    for (int i = 0; i < n_soft * hp.text_hidden_size; ++i)
        sum += std::fabs(out[i]);
    std::printf(
        "audio %s: 30 s -> %d soft tokens, %d threads, median %.3f s (checksum %.6g, %zu floats/thread)\n",
        towers::precision_name(prec), n_soft, pool.size(), median(ts), sum, at.thread_scratch_floats());
}

// cpu::matmul against cpu::matmul_gemm at one tower shape (bf16 weights): GFLOPS and their relative
// difference.
void bench_gemm(cpu::ThreadPool& pool, int reps, int rows, int64_t n, int64_t k) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x((size_t)rows * k), y0((size_t)rows * n), y1((size_t)rows * n), y2((size_t)rows * n);
    for (float& v : x)
        v = nd(rng);
    Store st;
    st.add("w", {n, k}, 0.03f);
    size_t stride = std::max(
        {cpu::scratch_floats_per_thread(k, 0), cpu::gemm_scratch_floats(), cpu::gemm_bf16_scratch_floats()});
    std::vector<float> tscr(stride * pool.size());
    cpu::Context ctx{&pool, tscr.data(), stride};
    MatmulArgs a{};
    a.x = x.data(), a.ldx = k, a.w = st.ts["w"].data, a.dt = DType::BF16, a.n = n, a.k = k, a.ldy = n,
    a.rows = rows;
    std::vector<double> t0, t1, t2;
    for (int r = 0; r <= reps; ++r) {
        a.y       = y0.data();
        double s0 = time_s([&] { cpu::matmul(ctx, a); });
        a.y       = y1.data();
        double s1 = time_s([&] { cpu::matmul_gemm(ctx, a); });
        a.y       = y2.data();
        double s2 = time_s([&] { cpu::matmul_gemm_bf16(ctx, a); });
        if (r) t0.push_back(s0), t1.push_back(s1), t2.push_back(s2);
    }
    double num = 0, den = 0, num2 = 0;
    for (size_t i = 0; i < y0.size(); ++i)
        num += (double)(y1[i] - y0[i]) * (y1[i] - y0[i]), den += (double)y0[i] * y0[i],
            num2 += (double)(y2[i] - y0[i]) * (y2[i] - y0[i]);
    const double fl = 2.0 * rows * n * k / 1e9;
    std::printf("gemm %d x %lld x %lld: matmul %.1f ms (%.0f GFLOPS), matmul_gemm %.1f ms (%.0f GFLOPS), rel "
                "diff %.2e; "
                "matmul_gemm_bf16 %.1f ms (%.0f GFLOPS), rel diff %.2e\n",
                rows, (long long)n, (long long)k, median(t0) * 1e3, fl / median(t0), median(t1) * 1e3,
                fl / median(t1), std::sqrt(num / den), median(t2) * 1e3, fl / median(t2),
                std::sqrt(num2 / den));
}

} // namespace

int main(int argc, char** argv) {
    const std::string what = argc > 1 ? argv[1] : "both";
    const int reps         = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
    cpu::ThreadPool pool(cpu::default_thread_count());
    if (what == "gemm") {
        bench_gemm(pool, reps, 2394, 3072, 768);
        bench_gemm(pool, reps, 2394, 768, 3072);
        bench_gemm(pool, reps, 750, 4096, 1024);
        bench_gemm(pool, reps, 750, 1024, 4096);
        bench_gemm(pool, reps, 37, 100, 45);
    }
    const std::string prec = argc > 3 ? argv[3] : "both"; // fp32 | bf16 | both (side by side)
    std::vector<towers::Precision> precs;
    if (prec != "bf16") precs.push_back(towers::Precision::F32);
    if (prec != "fp32") precs.push_back(towers::Precision::BF16);
    for (towers::Precision p : precs)
        if (what == "vision" || what == "both") bench_vision(pool, reps, p);
    for (towers::Precision p : precs)
        if (what == "audio" || what == "both") bench_audio(pool, reps, p);
    return 0;
}
