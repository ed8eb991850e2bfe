// tower_cpu_bench: the audio tower alone at its real E2B (= E4B) shapes, random bf16 weights, no checkpoint
// or plan: one 30 s clip (750 soft tokens) through the log-mel front end (runtime/src/log_mel.*) and the
// compiler's audio program (models/gemma4/audio_graph.*, replayed op by op on the CPU kernels the executor
// uses). Prints every rep and the median. bench/e2e/tower_ab.py compares two builds' towers end to end
// through plans. Built with the project (build/bench/micro/tower_cpu_bench).
// The gemm mode times the tower matmul shapes (each call on a weight read from memory and an x the pool has
// just written, as in a program); the attention mode times the vision tower's bf16
// self-attention (cpu::self_attention with bf16 = true, 2394 patches, 12 heads x 64). Usage: tower_cpu_bench
// [audio|both|gemm|attention] [reps] [fp32|bf16|both]   (threads: G4_THREADS, else all cores; the tower in
// both precisions by default, fp32 then bf16)
#include "compiler/tower_lookup.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/ref.h"
#include "models/gemma4/audio_graph.h"
#include "runtime/src/log_mel.h"
#include "runtime/src/op_exec.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <unistd.h>
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

// The audio program on the CPU kernels: every tensor in its own buffer (weights from the store, widened
// bound scalars read at build time), ops dispatched as the executor dispatches them.
struct AudioProgramRun {
    gemma4::AudioProgram ap;
    std::vector<std::vector<float>> act;
    std::vector<const void*> wptr;
    std::vector<DType> wdt;
    std::vector<rt::BoundOp> ops;
    size_t thread_floats = 0;

    std::string init(Store& st, const gemma4::AudioHParams& hp, bool bf16) {
        auto read = [&](const std::string& n, std::vector<float>* v) -> std::string {
            auto it = st.ts.find(n);
            if (it == st.ts.end()) return "missing " + n;
            int64_t numel = 1;
            for (int i = 0; i < it->second.ndim; ++i)
                numel *= it->second.dims[i];
            v->resize((size_t)numel);
            for (int64_t i = 0; i < numel; ++i)
                (*v)[i] = towers::tensor_at(it->second, i);
            return "";
        };
        gemma4::AudioBuildOptions o;
        o.bf16_matmuls = bf16;
        if (std::string e = gemma4::build_audio_program(hp, o, read, &ap); !e.empty()) return e;
        thread_floats  = ap.thread_floats;
        const auto& ts = ap.graph.tensors;
        act.resize(ts.size());
        wptr.assign(ts.size(), nullptr);
        wdt.assign(ts.size(), DType::F32);
        for (size_t t = 0; t < ts.size(); ++t) {
            if (ts[t].kind != plan::TensorKind::Weight)
                act[t].assign((size_t)ts[t].dims[0] * ts[t].dims[1], 0.0f);
            else if (ts[t].role == gemma4::WeightRole::Constant)
                wptr[t] = ts[t].constant.data();
            else if (auto it = st.ts.find(ts[t].name); it != st.ts.end())
                wptr[t] = it->second.data, wdt[t] = it->second.dtype;
            else
                return "no weight " + ts[t].name;
        }
        for (const gemma4::OpDesc& d : ap.graph.ops) {
            rt::BoundOp b{};
            b.op = &d.op;
            for (int k = 0; k < 4; ++k)
                if (d.op.in[k] >= 0) {
                    const int t = d.op.in[k];
                    b.in_ld[k]  = ts[t].dims.size() == 2 ? ts[t].dims[1] : 0;
                    b.in_dt[k]  = ts[t].kind == plan::TensorKind::Weight ? wdt[t] : DType::F32;
                    b.in[k]     = ts[t].kind == plan::TensorKind::Weight
                                      ? (void*)wptr[t]
                                      : (void*)(act[t].data() + d.op.in_col[k]);
                }
            for (int k = 0; k < 2; ++k)
                if (d.op.out[k] >= 0) {
                    b.out[k]    = act[d.op.out[k]].data() + d.op.out_col[k];
                    b.out_ld[k] = ts[d.op.out[k]].dims[1];
                }
            ops.push_back(b);
        }
        return "";
    }
    // features [frames, mel_bins] -> soft tokens (the output tensor's first rows).
    const float* run(const cpu::Context& ctx, const float* features, int frames) {
        const int32_t counts[4] = {frames, (frames + 1) / 2, ((frames + 1) / 2 + 1) / 2, ap.max_rows[3]};
        std::memcpy(act[ap.features].data(), features,
                    sizeof(float) * frames * ap.graph.tensors[ap.features].dims[1]);
        for (const rt::BoundOp& b : ops) {
            const plan::PlanOp& op = *b.op;
            const int32_t n        = counts[op.row_mode - 16];
            float *x = (float*)b.in[0], *y = (float*)b.out[0];
            switch ((OpCode)op.code) {
            case OpCode::Matmul: {
                const auto& w = ap.graph.tensors[op.in[1]];
                MatmulArgs m{x, b.in_ld[0], b.in[1], b.in_dt[1], w.dims[0], w.dims[1], y, b.out_ld[0], n};
                if (op.ip[4] == 2)
                    cpu::matmul_gemm_bf16(ctx, m);
                else
                    cpu::matmul_gemm(ctx, m);
                if (b.in[2])
                    cpu::add(ctx, {y, b.out_ld[0], (const float*)b.in[2], 0, y, b.out_ld[0], n,
                                   (int32_t)w.dims[0]});
                break;
            }
            case OpCode::RmsNorm:
                cpu::rms_norm(ctx, {x, b.in_ld[0], b.in[1], b.in_dt[1], y, b.out_ld[0], n, op.ip[0], op.ip[1],
                                    op.fp[0]});
                break;
            case OpCode::Add:
                cpu::add(ctx,
                         {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], y, b.out_ld[0], n, op.ip[0]});
                break;
            case OpCode::Scale:
                cpu::scale(ctx,
                           {x, b.in_ld[0], y, b.out_ld[0], n, op.ip[0], op.fp[0], nullptr, DType::F32, 0.0f});
                break;
            case OpCode::Clamp:
                ctx.pool->parallel_for(n, [&](int64_t r, int) {
                    for (int32_t i = 0; i < op.ip[0]; ++i)
                        y[r * b.out_ld[0] + i] =
                            std::min(std::max(x[r * b.in_ld[0] + i], op.fp[0]), op.fp[1]);
                });
                break;
            default:
                rt::OpIo io;
                for (int k = 0; k < 4; ++k)
                    io.in[k] = b.in[k], io.in_ld[k] = b.in_ld[k], io.in_dt[k] = b.in_dt[k];
                for (int k = 0; k < 2; ++k)
                    io.out[k] = b.out[k], io.out_ld[k] = b.out_ld[k], io.out_dt[k] = DType::F32;
                io.rows   = n;
                io.counts = counts;
                if (!rt::run_op(op, ctx, io)) {
                    std::printf("op %s not handled\n", op_name((OpCode)op.code));
                    std::exit(1);
                }
            }
        }
        return act[ap.output].data();
    }
};

void bench_audio(cpu::ThreadPool& pool, int reps, towers::Precision prec) {
    gemma4::AudioHParams hp{};
    if (std::string e = gemma4::parse_audio_hparams("{}", 1536, &hp); !e.empty()) {
        std::printf("%s\n", e.c_str());
        std::exit(1);
    }
    const int64_t H = hp.hidden_size, C0 = hp.subsampling_conv_channels[0],
                  C1 = hp.subsampling_conv_channels[1];
    const int64_t f2 = ((hp.mel_bins + 1) / 2 + 1) / 2;
    Store st;
    for (const std::string& n : gemma4::audio_weight_names(hp)) {
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
    AudioProgramRun prog;
    if (std::string e = prog.init(st, hp, prec == towers::Precision::BF16); !e.empty()) {
        std::printf("audio program: %s\n", e.c_str());
        std::exit(1);
    }
    const gemma4::AudioFrontEnd fe = gemma4::audio_front_end(hp);
    media::LogMel mel;
    if (std::string e = mel.init({fe.sample_rate, fe.frame_length, fe.hop_length, fe.fft_length, fe.mel_bins,
                                  fe.min_hz, fe.max_hz, fe.mel_floor});
        !e.empty()) {
        std::printf("%s\n", e.c_str());
        std::exit(1);
    }
    cpu::Context ctx;
    ctx.pool = &pool, ctx.scratch_stride = std::max(mel.thread_floats(), prog.thread_floats);
    std::vector<float> tscr(ctx.scratch_stride * pool.size() + 16);
    ctx.scratch = tscr.data();
    std::mt19937 rng(9);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    std::vector<float> pcm((size_t)samples);
    for (size_t i = 0; i < pcm.size(); ++i)
        pcm[i] = 0.3f * std::sin(0.01f * (float)i) + nd(rng);
    const int frames = (int)mel.valid_frames(samples), n_soft = ((frames + 1) / 2 + 1) / 2;
    std::vector<float> feat((size_t)frames * hp.mel_bins);
    const float* pout = nullptr;
    std::vector<double> tp;
    for (int r = 0; r <= reps; ++r) {
        // As the runtime's front end runs it: the log-mel features, then the program.
        double sp = time_s([&] {
            mel.compute(ctx, pcm.data(), samples, feat.data());
            pout = prog.run(ctx, feat.data(), frames);
        });
        if (r) tp.push_back(sp);
        std::printf("  audio %s rep %d: %.3f s\n", towers::precision_name(prec), r, sp);
    }
    double sum = 0;
    for (int i = 0; i < n_soft * hp.text_hidden_size; ++i)
        sum += std::fabs(pout[i]);
    std::printf("audio %s: 30 s -> %d soft tokens, %d threads, median %.3f s (checksum %.6g)\n",
                towers::precision_name(prec), n_soft, pool.size(), median(tp), sum);
}

// Copies of a weight of `bytes` bytes that together are twice the last-level cache (at least 3; at most 1024
// copies and 2 GiB: a weight that small is a minor part of its call's memory traffic anyway), so that cycling
// through them each call reads its weight from memory, as a tower program does (each of its weights is read
// once a clip or an image).
int weight_copies(size_t bytes) {
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0) llc = 64L << 20;
    const size_t want = 2 * (size_t)llc / std::max<size_t>(bytes, 1) + 1;
    const size_t cap  = std::min<size_t>(1024, (2ULL << 30) / std::max<size_t>(bytes, 1));
    return (int)std::clamp<size_t>(want, 3, std::max<size_t>(3, cap));
}

// cpu::matmul against cpu::matmul_gemm and matmul_gemm_bf16 at one tower shape (bf16 weights): GFLOPS and the
// relative differences. As in a program, each call reads a weight no recent call has read (weight_copies)
// and an x the pool has just rewritten in blocks in another order than the GEMM's tasks (a previous op's
// output).
void bench_gemm(cpu::ThreadPool& pool, int reps, int rows, int64_t n, int64_t k) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x((size_t)rows * k), y0((size_t)rows * n), y1((size_t)rows * n), y2((size_t)rows * n);
    for (float& v : x)
        v = nd(rng);
    Store st;
    st.add("w", {n, k}, 0.03f);
    const std::vector<uint16_t>& w0 = st.data["w"];
    const int copies                = weight_copies(w0.size() * 2);
    std::vector<std::vector<uint16_t>> ws((size_t)copies, w0);
    size_t stride = std::max(
        {cpu::scratch_floats_per_thread(k, 0), cpu::gemm_scratch_floats(), cpu::gemm_bf16_scratch_floats()});
    std::vector<float> tscr(stride * pool.size());
    cpu::Context ctx{&pool, tscr.data(), stride};
    MatmulArgs a{};
    a.x = x.data(), a.ldx = k, a.dt = DType::BF16, a.n = n, a.k = k, a.ldy = n, a.rows = rows;
    volatile float one_v = 1.0f;
    const float one      = one_v;
    int next             = 0;
    auto call            = [&](float* y, auto&& kernel) {
        pool.parallel_for(64, [&](int64_t b, int) {
            const int64_t blk = b * 37 % 64;
            for (int64_t i = (int64_t)rows * k * blk / 64; i < (int64_t)rows * k * (blk + 1) / 64; ++i)
                x[i] = x[i] * one;
        });
        a.w = ws[(size_t)(next++ % copies)].data(), a.y = y;
        return time_s([&] { kernel(ctx, a); });
    };
    std::vector<double> t0, t1, t2;
    for (int r = 0; r <= reps; ++r) {
        double s0 = call(y0.data(), [](const cpu::Context& c, const MatmulArgs& m) { cpu::matmul(c, m); });
        double s1 =
            call(y1.data(), [](const cpu::Context& c, const MatmulArgs& m) { cpu::matmul_gemm(c, m); });
        double s2 =
            call(y2.data(), [](const cpu::Context& c, const MatmulArgs& m) { cpu::matmul_gemm_bf16(c, m); });
        if (r) t0.push_back(s0), t1.push_back(s1), t2.push_back(s2);
    }
    double num = 0, den = 0, num2 = 0;
    for (size_t i = 0; i < y0.size(); ++i)
        num += (double)(y1[i] - y0[i]) * (y1[i] - y0[i]), den += (double)y0[i] * y0[i],
            num2 += (double)(y2[i] - y0[i]) * (y2[i] - y0[i]);
    const double fl = 2.0 * rows * n * k / 1e9;
    std::printf("gemm %d x %lld x %lld: matmul %.1f ms (%.0f GFLOPS), matmul_gemm %.1f ms (%.0f GFLOPS), rel "
                "diff %.2e; "
                "matmul_gemm_bf16 %.1f ms (%.0f GFLOPS), rel diff %.2e (weights from memory: %d copies)\n",
                rows, (long long)n, (long long)k, median(t0) * 1e3, fl / median(t0), median(t1) * 1e3,
                fl / median(t1), std::sqrt(num / den), median(t2) * 1e3, fl / median(t2),
                std::sqrt(num2 / den), copies);
}

// cpu::self_attention with bf16 = true at one shape (q, k, v interleaved per row as a fused qkv projection
// writes them): median ms, GFLOP/s (4 rows^2 heads dim flops) and the relative L2 difference against
// ref::self_attention (fp32, double sums). Also the minimum ms and the median process CPU ms (all threads).
void bench_attention(cpu::ThreadPool& pool, int reps, int rows, int heads, int kv_heads, int dim,
                     float scale) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t qw = (int64_t)heads * dim, kvw = (int64_t)kv_heads * dim, ld = qw + 2 * kvw;
    std::vector<float> qkv((size_t)rows * ld), y_ref((size_t)rows * qw), y(y_ref.size());
    for (float& v : qkv)
        v = nd(rng);
    std::vector<float> work((size_t)self_attention_work_floats(rows, kv_heads, dim));
    const size_t stride = cpu::self_attention_thread_floats(rows);
    std::vector<float> tscr(stride * pool.size());
    cpu::Context ctx{&pool, tscr.data(), stride};
    SelfAttentionArgs a{
        qkv.data(), ld,  qkv.data() + qw, ld,     qkv.data() + qw + kvw, ld, y_ref.data(), qw, rows, heads,
        kv_heads,   dim, scale,           nullptr};
    pool.parallel_for(heads, [&](int64_t h, int) { // ref::self_attention one head at a time, over the pool
        SelfAttentionArgs ah = a;
        ah.q += h * dim, ah.k += h / (heads / kv_heads) * dim, ah.v += h / (heads / kv_heads) * dim,
            ah.y += h * dim, ah.heads = 1, ah.kv_heads = 1;
        ref::self_attention(ah);
    });
    a.y = y.data(), a.work = work.data(), a.bf16 = true;
    std::vector<double> t,
        cpu_t; // wall and process CPU seconds (the latter less sensitive to a busy machine)
    for (int r = 0; r <= reps; ++r) {
        const std::clock_t c0 = std::clock();
        const double s        = time_s([&] { cpu::self_attention(ctx, a); });
        if (r) t.push_back(s), cpu_t.push_back((double)(std::clock() - c0) / CLOCKS_PER_SEC);
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); ++i)
        num += (double)(y[i] - y_ref[i]) * (y[i] - y_ref[i]), den += (double)y_ref[i] * y_ref[i];
    const double gf = 4.0 * rows * rows * heads * dim / 1e9;
    std::printf(
        "attention bf16 %d rows, %d heads (%d kv) x %d, scale %g, %d threads: median %.2f ms (%.0f GFLOP/s), "
        "min %.2f ms, CPU time median %.2f ms, rel diff %.2e\n",
        rows, heads, kv_heads, dim, scale, pool.size(), median(t) * 1e3, gf / median(t),
        *std::min_element(t.begin(), t.end()) * 1e3, median(cpu_t) * 1e3, std::sqrt(num / den));
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
    if (what == "attention") {
        bench_attention(pool, reps, 2394, 12, 12, 64, 1.0f);
        bench_attention(pool, reps, 2394, 12, 12, 64, 0.125f);
        return 0;
    }
    const std::string prec = argc > 3 ? argv[3] : "both"; // fp32 | bf16 | both (side by side)
    std::vector<towers::Precision> precs;
    if (prec != "bf16") precs.push_back(towers::Precision::F32);
    if (prec != "fp32") precs.push_back(towers::Precision::BF16);
    for (towers::Precision p : precs)
        if (what == "audio" || what == "both") bench_audio(pool, reps, p);
    return 0;
}
