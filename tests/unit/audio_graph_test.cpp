// The audio encoder program (models/gemma4/audio_graph.*) interpreted op by op on the scalar reference
// kernels (kernels/ref) against Hugging Face float32 numbers (tests/fixtures/towers/audio, from
// tools/make_audio_fixtures.py on the tiny checkpoint tests/fixtures/e2b_tiny): the graph itself, apart from
// any runtime. Also the audio configuration parser.
#include "compiler/safetensors.h"
#include "kernels/ref/ref.h"
#include "models/gemma4/audio_graph.h"
#include "runtime/plan/op_params.h"
#include "test_util.h"

#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <set>

using json = nlohmann::json;
using namespace g4;

namespace {

std::string dir() {
    return g4test::fixture("towers/audio");
}
json meta() {
    return json::parse(g4test::read_file(dir() + "/audio.json"));
}

gemma4::AudioHParams hparams(const std::string& config) {
    json cfg = json::parse(g4test::read_file(config));
    gemma4::AudioHParams hp{};
    EXPECT_EQ(gemma4::parse_audio_hparams(cfg["audio_config"].dump(), cfg["text_config"]["hidden_size"], &hp),
              "");
    return hp;
}

std::vector<float> widen(const st::TensorView& v) {
    std::vector<float> f((size_t)v.numel());
    for (size_t i = 0; i < f.size(); ++i) {
        if (v.dtype == st::DType::BF16) {
            uint16_t h;
            std::memcpy(&h, v.data + 2 * i, 2);
            f[i] = bf16_to_f32(h);
        } else {
            std::memcpy(&f[i], v.data + 4 * i, 4);
        }
    }
    return f;
}

// Runs the program on the reference kernels: every tensor in its own float32 buffer (weights widened).
struct Interpreter {
    st::Checkpoint ck;
    gemma4::AudioProgram ap;
    std::vector<std::vector<float>> buf;
    explicit Interpreter(const std::string& ckpt, const gemma4::AudioHParams& hp)
        : ck(st::Checkpoint::open(ckpt)) {
        auto read = [&](const std::string& name, std::vector<float>* v) -> std::string {
            if (!ck.has("model." + name)) return "missing tensor model." + name;
            *v = widen(ck.get("model." + name));
            return "";
        };
        EXPECT_EQ(gemma4::build_audio_program(hp, {}, read, &ap), "");
        for (const gemma4::TensorDesc& d : ap.graph.tensors) {
            if (d.kind != plan::TensorKind::Weight) {
                buf.emplace_back((size_t)d.dims[0] * d.dims[1], NAN);
            } else if (d.role == gemma4::WeightRole::Constant) {
                buf.push_back(d.constant);
            } else {
                const st::TensorView& v = ck.get("model." + d.name);
                EXPECT_EQ(v.shape, d.dims) << d.name;
                buf.push_back(widen(v));
            }
        }
    }
    float* at(int t, int col) { return t < 0 ? nullptr : buf[t].data() + col; }
    int64_t ld(int t) { return ap.graph.tensors[t].dims.size() == 2 ? ap.graph.tensors[t].dims[1] : 0; }

    std::vector<float> run(const std::vector<float>& features, int frames) {
        const int32_t counts[4] = {frames, (frames + 1) / 2, ((frames + 1) / 2 + 1) / 2, ap.max_rows[3]};
        std::copy(features.begin(), features.begin() + (size_t)frames * ld(ap.features),
                  buf[ap.features].begin());
        for (const gemma4::OpDesc& d : ap.graph.ops) {
            const plan::PlanOp& op = d.op;
            const int32_t n        = counts[op.row_mode - 16];
            float *x = at(op.in[0], op.in_col[0]), *y = at(op.out[0], op.out_col[0]);
            const int64_t lx = op.in[0] >= 0 ? ld(op.in[0]) : 0, ly = ld(op.out[0]);
            switch ((OpCode)op.code) {
            case OpCode::Matmul: {
                const auto& w = ap.graph.tensors[op.in[1]];
                ref::matmul({x, lx, at(op.in[1], 0), DType::F32, w.dims[0], w.dims[1], y, ly, n});
                if (op.in[2] >= 0)
                    for (int32_t r = 0; r < n; ++r)
                        for (int64_t i = 0; i < w.dims[0]; ++i)
                            y[r * ly + i] += buf[op.in[2]][i];
                break;
            }
            case OpCode::RmsNorm:
                ref::rms_norm({x, lx, at(op.in[1], 0), DType::F32, y, ly, n, op.ip[0], op.ip[1], op.fp[0]});
                break;
            case OpCode::Add:
                ref::add({x, lx, at(op.in[1], op.in_col[1]), ld(op.in[1]), y, ly, n, op.ip[0]});
                break;
            case OpCode::Scale:
                ref::scale({x, lx, y, ly, n, op.ip[0], op.fp[0], nullptr, DType::F32, 0.0f});
                break;
            case OpCode::Clamp:
                for (int32_t r = 0; r < n; ++r)
                    for (int32_t i = 0; i < op.ip[0]; ++i)
                        y[r * ly + i] = std::min(std::max(x[r * lx + i], op.fp[0]), op.fp[1]);
                break;
            case OpCode::Conv2dNormRelu: {
                const auto c = plan::params<plan::Conv2dNormReluParams>(op);
                ref::conv2d_norm_relu({x, counts[c.src_count], c.f_in, c.c_in, at(op.in[1], 0), DType::F32,
                                       at(op.in[2], 0), DType::F32, c.eps, y, n, c.f_out, c.c_out});
                break;
            }
            case OpCode::Silu:
                ref::silu({x, lx, y, ly, n, plan::params<plan::SiluParams>(op).cols});
                break;
            case OpCode::SigmoidMul:
                ref::sigmoid_mul({x, lx, at(op.in[1], op.in_col[1]), ld(op.in[1]), y, ly, n,
                                  plan::params<plan::SigmoidMulParams>(op).cols});
                break;
            case OpCode::CausalConv1d: {
                const auto c = plan::params<plan::CausalConv1dParams>(op);
                ref::causal_conv1d({x, lx, at(op.in[1], 0), DType::F32, y, ly, n, c.cols, c.k});
                break;
            }
            case OpCode::LocalAttention: {
                const auto a = plan::params<plan::LocalAttentionParams>(op);
                ref::local_attention({x, lx, at(op.in[1], 0), ld(op.in[1]), at(op.in[2], 0), ld(op.in[2]),
                                      at(op.in[3], 0), ld(op.in[3]), y, ly, n, a.heads, a.dim, a.window,
                                      a.n_rel, a.cap});
                break;
            }
            case OpCode::SoftplusScale: {
                const auto a = plan::params<plan::SoftplusScaleParams>(op);
                ref::softplus_scale({x, lx, y, ly, n, a.cols, a.dim, at(op.in[1], 0), DType::F32, a.scale});
                break;
            }
            case OpCode::AddScaled: {
                const auto a = plan::params<plan::AddScaledParams>(op);
                ref::add_scaled({x, lx, at(op.in[1], op.in_col[1]), ld(op.in[1]), y, ly, n, a.cols, a.scale});
                break;
            }
            default:
                ADD_FAILURE() << "op " << op_name((OpCode)op.code) << " not expected in the audio program";
            }
        }
        return std::vector<float>(buf[ap.output].begin(),
                                  buf[ap.output].begin() + (size_t)counts[2] * ld(ap.output));
    }
};

} // namespace

TEST(AudioGraph, ParsesHParamsAndNamesEveryCheckpointTensor) {
    gemma4::AudioHParams hp = hparams(g4test::fixture("e2b_tiny/config.json"));
    EXPECT_EQ(hp.hidden_size, 32);
    EXPECT_EQ(hp.num_hidden_layers, 2);
    EXPECT_EQ(hp.subsampling_conv_channels[0], 8);
    EXPECT_EQ(hp.text_hidden_size, 64);
    EXPECT_EQ(hp.mel_bins, meta()["mel_bins"].get<int>()); // 8: what HF builds input_proj_linear for
    st::Checkpoint ck = st::Checkpoint::open(g4test::fixture("e2b_tiny"));
    std::set<std::string> expected;
    for (const auto& n : ck.names())
        if (n.rfind("model.audio_tower.", 0) == 0 || n.rfind("model.embed_audio.", 0) == 0)
            expected.insert(n.substr(6));
    auto names = gemma4::audio_weight_names(hp);
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);

    gemma4::AudioHParams def{}; // an empty audio_config is HF's Gemma4AudioConfig()
    ASSERT_EQ(gemma4::parse_audio_hparams("{}", 1536, &def), "");
    EXPECT_EQ(def.hidden_size, 1024);
    EXPECT_EQ(def.mel_bins, 128);
    EXPECT_FLOAT_EQ(def.gradient_clipping, 1e10f);
    std::string e = gemma4::parse_audio_hparams("{\"attention_context_right\": 2}", 64, &def);
    EXPECT_NE(e.find("attention_context_right"), std::string::npos) << e;
    e = gemma4::parse_audio_hparams("{\"hidden_size\": 30, \"num_attention_heads\": 4}", 64, &def);
    EXPECT_NE(e.find("num_attention_heads"), std::string::npos) << e;
    e = gemma4::parse_audio_hparams("{\"num_attention_heads\": 21474836482}", 64, &def);
    EXPECT_NE(e.find("audio_config.num_attention_heads: expected an integer"), std::string::npos) << e;
    EXPECT_NE(gemma4::parse_audio_hparams("not json", 64, &def), "");
    // Values past int's or float's range are refused before any conversion (found by fuzzing config.json).
    e = gemma4::parse_audio_hparams("{\"hidden_size\": \"big\"}", 64, &def);
    EXPECT_NE(e.find("audio_config.hidden_size"), std::string::npos) << e;
    e = gemma4::parse_audio_hparams("{\"hidden_size\": 1e300}", 64, &def);
    EXPECT_NE(e.find("audio_config.hidden_size"), std::string::npos) << e;
    e = gemma4::parse_audio_hparams("{\"subsampling_conv_channels\": [4294967304, 8]}", 64, &def);
    EXPECT_NE(e.find("subsampling_conv_channels"), std::string::npos) << e;
}

TEST(AudioGraph, SoftTokenCountsMatchHf) {
    const gemma4::AudioFrontEnd fe =
        gemma4::audio_front_end(hparams(g4test::fixture("e2b_tiny/config.json")));
    const json m = meta();
    ASSERT_GE(m["clips"].size(), 2u);
    for (const auto& c : m["clips"])
        EXPECT_EQ(gemma4::audio_soft_tokens(fe, c["n_samples"].get<int64_t>()), c["n_soft"].get<int>());
    EXPECT_EQ(gemma4::audio_soft_tokens(fe, 160), 0);
    EXPECT_EQ(gemma4::audio_soft_tokens(fe, 161), 1);
    EXPECT_EQ(gemma4::audio_soft_tokens(fe, 480000), 750);
    EXPECT_EQ(gemma4::audio_soft_tokens(fe, 10 * 480000), 750);
}

TEST(AudioGraph, ProgramOnTheReferenceKernelsMatchesHf) {
    gemma4::AudioHParams hp = hparams(g4test::fixture("e2b_tiny/config.json"));
    Interpreter in(g4test::fixture("e2b_tiny"), hp);
    EXPECT_EQ(in.ap.max_rows[gemma4::kAudioTokens], 750);
    const json m = meta();
    ASSERT_GE(m["clips"].size(), 2u);
    for (const auto& c : m["clips"]) {
        auto feat = g4test::read_f32(dir() + "/" + c["features"].get<std::string>());
        auto want = g4test::read_f32(dir() + "/" + c["tower"].get<std::string>());
        auto got  = in.run(feat, c["n_valid_frames"].get<int>());
        ASSERT_EQ(got.size(), want.size());
        const double e = g4test::rel_l2(got.data(), want.data(), want.size());
        std::printf("%s: %zu soft tokens, rel L2 vs HF %.3g\n", c["name"].get<std::string>().c_str(),
                    got.size() / hp.text_hidden_size, e);
        EXPECT_LT(e, 1e-5);
    }
}

// The released models' front-end shapes (128 mel bins, SSCP channels [128, 32]) with a small random
// conformer: the program on HF's features of clip0 gives HF's soft tokens.
TEST(AudioGraph, ReleasedFrontEndShapesMatchHf) {
    const json m            = meta();
    const json& c           = m["mid"];
    gemma4::AudioHParams hp = hparams(dir() + "/mid/config.json");
    ASSERT_EQ(hp.mel_bins, 128);
    Interpreter in(dir() + "/mid", hp);
    auto feat = g4test::read_f32(dir() + "/" + c["features"].get<std::string>());
    auto want = g4test::read_f32(dir() + "/" + c["tower"].get<std::string>());
    ASSERT_EQ(feat.size(), c["n_frames"].get<size_t>() * 128);
    auto got = in.run(feat, c["n_valid_frames"].get<int>());
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(got.size(), c["n_soft"].get<size_t>() * hp.text_hidden_size);
    const double e = g4test::rel_l2(got.data(), want.data(), want.size());
    std::printf("mid: %zu soft tokens, rel L2 vs HF %.3g\n", got.size() / hp.text_hidden_size, e);
    EXPECT_LT(e, 1e-5);
}
