// The hand-written audio tower (runtime/src/towers/audio.*: the weights, features and buffers the GPU audio
// tower uses) against Hugging Face float32 numbers from tools/make_audio_fixtures.py
// (tests/fixtures/towers/audio, tiny checkpoint tests/fixtures/e2b_tiny).
#include "compiler/safetensors.h"
#include "kernels/cpu/cpu.h"
#include "runtime/src/towers/audio.h"
#include "test_util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <gtest/gtest.h>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

using json = nlohmann::json;
using namespace g4;

namespace {

std::string dir() {
    return g4test::fixture("towers/audio");
}
json meta() {
    return json::parse(g4test::read_file(dir() + "/audio.json"));
}

std::vector<int32_t> read_i32(const std::string& path) {
    std::string b = g4test::read_file(path);
    std::vector<int32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

// The tiny checkpoint's tensors as towers::Tensor, looked up relative to "model.".
struct Weights {
    st::Checkpoint ck;
    std::map<std::string, towers::Tensor> map;
    std::set<std::string> hide;                          // names reported missing
    std::map<std::string, std::vector<int64_t>> reshape; // names reported with another shape
    explicit Weights(const std::string& ckpt_dir = g4test::fixture("e2b_tiny"))
        : ck(st::Checkpoint::open(ckpt_dir)) {
        for (const auto& name : ck.names()) {
            const st::TensorView& v = ck.get(name);
            towers::Tensor t;
            t.data  = v.data;
            t.dtype = v.dtype == st::DType::BF16 ? DType::BF16 : DType::F32;
            t.ndim  = (int)v.shape.size();
            for (int i = 0; i < t.ndim; ++i)
                t.dims[i] = v.shape[i];
            if (v.dtype == st::DType::BF16 || v.dtype == st::DType::F32)
                map[name.substr(6)] = t; // drop "model."
        }
    }
    towers::Lookup lookup() {
        return [this](const std::string& n) -> const towers::Tensor* {
            if (hide.count(n)) return nullptr;
            auto it = map.find(n);
            if (it == map.end()) return nullptr;
            if (auto r = reshape.find(n); r != reshape.end()) {
                static thread_local towers::Tensor t;
                t      = it->second;
                t.ndim = (int)r->second.size();
                for (int i = 0; i < t.ndim; ++i)
                    t.dims[i] = r->second[i];
                return &t;
            }
            return &it->second;
        };
    }
};

towers::AudioHParams tiny_hparams() {
    json cfg = json::parse(g4test::read_file(g4test::fixture("e2b_tiny/config.json")));
    towers::AudioHParams hp{};
    std::string err =
        towers::parse_audio_hparams(cfg["audio_config"].dump(), cfg["text_config"]["hidden_size"], &hp);
    EXPECT_EQ(err, "");
    return hp;
}

// A thread pool and the per-thread scratch the features take.
struct Runner {
    std::unique_ptr<cpu::ThreadPool> pool;
    std::vector<float> thread_scratch;
    cpu::Context ctx;
    Runner(const towers::AudioTower& tower, int threads) {
        pool               = std::make_unique<cpu::ThreadPool>(threads);
        ctx.pool           = pool.get();
        ctx.scratch_stride = tower.gpu_thread_scratch_floats();
        thread_scratch.resize(ctx.scratch_stride * threads + 16);
        ctx.scratch = thread_scratch.data() + (16 - ((uintptr_t)thread_scratch.data() / 4) % 16) % 16;
    }
};

double max_abs_diff(const float* a, const float* b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; ++i)
        m = std::max(m, (double)std::fabs(a[i] - b[i]));
    return m;
}

} // namespace

TEST(AudioTower, ParsesHParamsAndNamesEveryWeight) {
    towers::AudioHParams hp = tiny_hparams();
    EXPECT_EQ(hp.hidden_size, 32);
    EXPECT_EQ(hp.num_hidden_layers, 2);
    EXPECT_EQ(hp.num_attention_heads, 2);
    EXPECT_EQ(hp.subsampling_conv_channels[0], 8);
    EXPECT_EQ(hp.subsampling_conv_channels[1], 4);
    EXPECT_EQ(hp.attention_context_left, 13);
    EXPECT_EQ(hp.output_proj_dims, 32);
    EXPECT_EQ(hp.text_hidden_size, 64);
    EXPECT_TRUE(hp.use_clipped_linears);
    EXPECT_EQ(hp.mel_bins, meta()["mel_bins"].get<int>()); // 8: what HF builds input_proj_linear for

    Weights w;
    std::set<std::string> expected;
    for (const auto& n : w.map)
        if (n.first.rfind("audio_tower.", 0) == 0 || n.first.rfind("embed_audio.", 0) == 0)
            expected.insert(n.first);
    auto names = towers::audio_weight_names(hp);
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);
    EXPECT_EQ(names.size(), expected.size());

    // Released-model defaults: an empty audio_config is HF's Gemma4AudioConfig().
    towers::AudioHParams def{};
    ASSERT_EQ(towers::parse_audio_hparams("{}", 1536, &def), "");
    EXPECT_EQ(def.hidden_size, 1024);
    EXPECT_EQ(def.mel_bins, 128);
    EXPECT_EQ(def.output_proj_dims, 1536);
    EXPECT_FLOAT_EQ(def.gradient_clipping, 1e10f);

    std::string e = towers::parse_audio_hparams("{\"attention_context_right\": 2}", 64, &def);
    EXPECT_NE(e.find("attention_context_right"), std::string::npos) << e;
    e = towers::parse_audio_hparams("{\"hidden_size\": \"big\"}", 64, &def);
    EXPECT_NE(e.find("audio_config.hidden_size"), std::string::npos) << e;
    e = towers::parse_audio_hparams("{\"hidden_size\": 30, \"num_attention_heads\": 4}", 64, &def);
    EXPECT_NE(e.find("num_attention_heads"), std::string::npos) << e;
    EXPECT_NE(towers::parse_audio_hparams("not json", 64, &def), "");
    // Values past int's range are refused before any conversion (found by fuzzing config.json).
    e = towers::parse_audio_hparams("{\"num_attention_heads\": 21474836482}", 64, &def);
    EXPECT_NE(e.find("audio_config.num_attention_heads: expected an integer"), std::string::npos) << e;
    e = towers::parse_audio_hparams("{\"hidden_size\": 1e300}", 64, &def);
    EXPECT_NE(e.find("audio_config.hidden_size"), std::string::npos) << e;
    e = towers::parse_audio_hparams("{\"subsampling_conv_channels\": [4294967304, 8]}", 64, &def);
    EXPECT_NE(e.find("subsampling_conv_channels"), std::string::npos) << e;
}

TEST(AudioTower, FeaturesMatchHf) {
    towers::AudioHParams hp = tiny_hparams();
    Weights w;
    towers::AudioTower tower;
    ASSERT_EQ(tower.init(hp, w.lookup(), 480000), "");
    Runner r(tower, 2);
    const json m = meta();
    for (const auto& c : m["clips"]) {
        auto pcm    = g4test::read_f32(dir() + "/" + c["pcm"].get<std::string>());
        auto ref    = g4test::read_f32(dir() + "/" + c["features"].get<std::string>());
        auto mask   = read_i32(dir() + "/" + c["mask"].get<std::string>());
        const int M = hp.mel_bins;
        ASSERT_EQ(pcm.size(), c["n_samples"].get<size_t>());
        ASSERT_EQ(ref.size(), mask.size() * M);
        int valid = 0;
        for (size_t f = 0; f < mask.size(); ++f) {
            if (mask[f]) {
                EXPECT_EQ((int)f, valid);
                ++valid;
            } // the valid frames are a prefix
            else
                for (int m = 0; m < M; ++m)
                    EXPECT_EQ(ref[f * M + m], 0.0f);
        }
        std::vector<float> feat((size_t)towers::AudioTower::valid_frames((int64_t)pcm.size()) * M);
        int nf = 0;
        ASSERT_EQ(tower.features(r.ctx, pcm.data(), (int64_t)pcm.size(), feat.data(), &nf), "");
        ASSERT_EQ(nf, valid);
        double e  = g4test::rel_l2(feat.data(), ref.data(), (size_t)nf * M);
        double mx = max_abs_diff(feat.data(), ref.data(), (size_t)nf * M);
        std::printf("%s features: %d frames, rel L2 %.3g, max abs %.3g\n",
                    c["name"].get<std::string>().c_str(), nf, e, mx);
        EXPECT_LT(e, 2e-6);
        EXPECT_LT(mx, 2e-4);
    }
}

// The released model's front end (128 mel bins, SSCP channels [128, 32]): its weights resolve and its
// features match HF's.
TEST(AudioTower, ReleasedFrontEndMatchesHf) {
    const json m  = meta();
    const json& c = m["mid"];
    json cfg      = json::parse(g4test::read_file(dir() + "/mid/config.json"));
    towers::AudioHParams hp{};
    ASSERT_EQ(towers::parse_audio_hparams(cfg["audio_config"].dump(), cfg["text_config"]["hidden_size"], &hp),
              "");
    ASSERT_EQ(hp.mel_bins, 128);
    Weights w(dir() + "/mid");
    towers::AudioTower tower;
    ASSERT_EQ(tower.init(hp, w.lookup(), 480000), "");
    Runner r(tower, 2);
    auto pcm     = g4test::read_f32(dir() + "/clip0.pcm.f32");
    auto ref_f   = g4test::read_f32(dir() + "/" + c["features"].get<std::string>());
    const int nv = c["n_valid_frames"];
    std::vector<float> feat((size_t)nv * 128);
    int nf = 0;
    ASSERT_EQ(tower.features(r.ctx, pcm.data(), (int64_t)pcm.size(), feat.data(), &nf), "");
    ASSERT_EQ(nf, nv);
    EXPECT_LT(g4test::rel_l2(feat.data(), ref_f.data(), feat.size()), 2e-6);
    EXPECT_EQ(tower.max_soft_tokens(), towers::audio_soft_tokens(hp, 480000));
}

TEST(AudioTower, BadInputIsAnError) {
    towers::AudioHParams hp = tiny_hparams();
    Weights w;
    towers::AudioTower tower;
    ASSERT_EQ(tower.init(hp, w.lookup(), 16000), "");
    Runner r(tower, 2);
    auto pcm = g4test::randn(16001, 3, 0.1f);
    std::vector<float> feat((size_t)200 * hp.mel_bins);
    int nf        = -1;
    std::string e = tower.features(r.ctx, pcm.data(), 16001, feat.data(), &nf);
    EXPECT_NE(e.find("longer than"), std::string::npos) << e;
    e = tower.features(r.ctx, pcm.data(), 0, feat.data(), &nf);
    EXPECT_NE(e.find("empty"), std::string::npos) << e;
    e = tower.features(r.ctx, nullptr, 100, feat.data(), &nf);
    EXPECT_NE(e.find("empty"), std::string::npos) << e;
    e = tower.features(r.ctx, pcm.data(), 160, feat.data(), &nf);
    EXPECT_NE(e.find("shorter than one"), std::string::npos) << e;
    pcm[500] = NAN;
    e        = tower.features(r.ctx, pcm.data(), 1000, feat.data(), &nf);
    EXPECT_NE(e.find("sample 500"), std::string::npos) << e;
    pcm[500]             = 0;
    cpu::Context small   = r.ctx;
    small.scratch_stride = tower.gpu_thread_scratch_floats() - 16;
    e                    = tower.features(small, pcm.data(), 1000, feat.data(), &nf);
    EXPECT_NE(e.find("scratch floats per thread"), std::string::npos) << e;
    EXPECT_EQ(nf, -1);

    // Weights: missing, wrong shape, and a checkpoint built for another mel count.
    towers::AudioTower t2;
    w.hide.insert("audio_tower.layers.1.self_attn.k_proj.output_max");
    e = t2.init(hp, w.lookup(), 16000);
    EXPECT_NE(e.find("missing tensor model.audio_tower.layers.1.self_attn.k_proj.output_max"),
              std::string::npos)
        << e;
    w.hide.clear();
    w.reshape["audio_tower.layers.0.lconv1d.depthwise_conv1d.weight"] = {32, 1, 4};
    e                                                                 = t2.init(hp, w.lookup(), 16000);
    EXPECT_NE(e.find("model.audio_tower.layers.0.lconv1d.depthwise_conv1d.weight has shape [32, 1, 4], "
                     "expected [32, 1, 5]"),
              std::string::npos)
        << e;
    w.reshape.clear();
    towers::AudioHParams hp128 = hp;
    hp128.mel_bins             = 128;
    e                          = t2.init(hp128, w.lookup(), 16000);
    EXPECT_NE(e.find("mel_bins mismatch"), std::string::npos) << e;
    e = t2.features(r.ctx, pcm.data(), 1000, feat.data(), &nf);
    EXPECT_NE(e.find("init"), std::string::npos) << e;
}
