// compiler/placement: size and --place parsing, validation against the model and the device, and the
// budget decision (PLE table to host memory, refusal with the smallest budget and --max-context).
#include "compiler/error.h"
#include "compiler/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace {

using namespace g4::placement;

// The CompileError message of f(), or "" if it did not throw.
template <class F> std::string error_of(F&& f) {
    try {
        f();
    } catch (const g4::CompileError& e) {
        return e.what();
    }
    return "";
}

void expect_error(const std::string& msg, const std::vector<std::string>& needles) {
    ASSERT_FALSE(msg.empty()) << "expected an error";
    for (const auto& n : needles)
        EXPECT_NE(msg.find(n), std::string::npos) << "expected '" << n << "' in: " << msg;
}

TEST(Placement, ParseSizeUnits) {
    EXPECT_EQ(parse_size("12GiB", "--gpu-mem"), 12ull << 30);
    EXPECT_EQ(parse_size("4GB", "--gpu-mem"), 4000000000ull);
    EXPECT_EQ(parse_size("512MiB", "--gpu-mem"), 512ull << 20);
    EXPECT_EQ(parse_size("3.5GiB", "--gpu-mem"), 7ull << 29);
    EXPECT_EQ(parse_size("1000000", "--gpu-mem"), 1000000ull);
    EXPECT_EQ(parse_size("1000000B", "--gpu-mem"), 1000000ull);
    EXPECT_EQ(parse_size("2 mb", "--cpu-mem"), 2000000ull);
    EXPECT_EQ(parse_size("0.5KiB", "--cpu-mem"), 512ull);
    EXPECT_EQ(parse_size("1TiB", "--cpu-mem"), 1ull << 40);
    // Fractions round down to whole bytes: 7.31 GiB = 7849052733.44 bytes.
    EXPECT_EQ(parse_size("7.31GiB", "--gpu-mem"), 7849052733ull);
}

TEST(Placement, ParseSizeRejectsMalformed) {
    for (const char* bad : {"", "GiB", "-1GiB", "1e9", ".5GiB", "1.GiB", "1..5GiB", "12 XB", "0", "0GiB",
                            "1.5", "99999999999999999GiB"}) {
        std::string m = error_of([&] { parse_size(bad, "--gpu-mem"); });
        expect_error(m, {"--gpu-mem"});
    }
    expect_error(error_of([] { parse_size("12XB", "--cpu-mem"); }),
                 {"--cpu-mem", "unknown unit 'XB'", "12GiB"});
    expect_error(error_of([] { parse_size("1.5", "--cpu-mem"); }), {"whole number"});
    expect_error(error_of([] { parse_size("0MiB", "--cpu-mem"); }), {"more than zero"});
}

// size_arg gives the smallest two-decimal value that reads back as at least the figure.
TEST(Placement, SizeArgRoundTripsUpward) {
    std::mt19937_64 rng(7);
    for (int i = 0; i < 2000; ++i) {
        uint64_t n = rng() >> (2 + rng() % 62);
        if (n == 0) n = 1;
        std::string a = size_arg(n);
        uint64_t back = parse_size(a, "--gpu-mem");
        EXPECT_GE(back, n) << a;
        size_t dot = a.find('.');
        if (dot == std::string::npos) {
            EXPECT_EQ(back, n) << a;
            continue;
        }
        // One hundredth less no longer fits.
        uint64_t hundredths = std::stoull(a.substr(0, dot)) * 100 + std::stoull(a.substr(dot + 1, 2));
        std::string unit    = a.substr(dot + 3);
        std::string less    = std::to_string((hundredths - 1) / 100) + "." +
                           (((hundredths - 1) % 100) < 10 ? "0" : "") +
                           std::to_string((hundredths - 1) % 100) + unit;
        if (hundredths > 1) {
            EXPECT_LT(parse_size(less, "--gpu-mem"), n) << less << " vs " << n;
        }
    }
    EXPECT_EQ(size_arg(40701632), "38.82MiB");
    EXPECT_EQ(size_arg(1ull << 30), "1.00GiB");
    EXPECT_EQ(size_arg(1000), "1000");
}

TEST(Placement, ParseGpuMem) {
    GpuBudget a = parse_gpu_mem("0:6GiB");
    EXPECT_EQ(a.index, 0);
    EXPECT_EQ(a.bytes, 6ull << 30);
    EXPECT_EQ(a.arg, "0:6GiB");
    GpuBudget b = parse_gpu_mem("512MiB");
    EXPECT_EQ(b.index, -1);
    EXPECT_EQ(b.bytes, 512ull << 20);
    EXPECT_EQ(parse_gpu_mem("3:1000").index, 3);
    expect_error(error_of([] { parse_gpu_mem("gpu0:6GiB"); }), {"--gpu-mem", "IDX:SIZE"});
    expect_error(error_of([] { parse_gpu_mem("1:"); }), {"--gpu-mem", "not a size"});
}

TEST(Placement, ParsePlaceGrammar) {
    PlaceSpec s =
        parse_place("vision=cpu, audio=cpu,ple=host,embed=gpu,lm_head=cuda:0,layers=0-29:gpu0,30-34:cpu");
    ASSERT_EQ(s.components.size(), 5u);
    EXPECT_EQ(s.components["vision"].kind, Target::Kind::Cpu);
    EXPECT_EQ(s.components["ple"].kind, Target::Kind::Host);
    EXPECT_EQ(s.components["embed"].kind, Target::Kind::Gpu);
    EXPECT_EQ(s.components["embed"].gpu, -1);
    EXPECT_EQ(s.components["lm_head"].gpu, 0);
    ASSERT_EQ(s.layers.size(), 2u);
    EXPECT_EQ(s.layers[0].first, 0);
    EXPECT_EQ(s.layers[0].last, 29);
    EXPECT_EQ(s.layers[0].target.gpu, 0);
    EXPECT_EQ(s.layers[1].first, 30);
    EXPECT_EQ(s.layers[1].last, 34);
    EXPECT_EQ(s.layers[1].target.kind, Target::Kind::Cpu);
    EXPECT_FALSE(s.layers_all);

    PlaceSpec t = parse_place("layers=GPU1");
    ASSERT_TRUE(t.layers_all);
    EXPECT_EQ(t.layers_all->gpu, 1);
    PlaceSpec u = parse_place("layers=0-4:cuda:1,5:gpu,6-9:cuda:1,ple=gpu");
    ASSERT_EQ(u.layers.size(), 3u);
    EXPECT_EQ(u.layers[0].target.gpu, 1);
    EXPECT_EQ(u.layers[1].first, 5);
    EXPECT_EQ(u.layers[1].last, 5);
    EXPECT_EQ(u.layers[2].first, 6);
    EXPECT_EQ(u.components.count("ple"), 1u);
}

TEST(Placement, ParsePlaceErrors) {
    struct Case {
        const char* list;
        std::vector<std::string> needles;
    };
    const Case cases[] = {
        {"tower=cpu", {"unknown component 'tower'", "vision, audio, ple, embed, lm_head, layers"}},
        {"ple=tpu", {"unknown target 'tpu'", "cpu, gpu, gpuN, cuda:N", "host"}},
        {"ple=gpux", {"unknown target 'gpux'"}},
        {"embed=host", {"'host' applies to ple only", "embed"}},
        {"layers=host", {"'host' applies to ple only"}},
        {"ple=host,,vision=cpu", {"empty item"}},
        {"ple", {"'ple' is not component=target"}},
        {"ple=host,0-3:gpu", {"'0-3:gpu' is not component=target", "layer ranges follow layers="}},
        {"layers=0-4", {"range '0-4' has no target", "A-B:TARGET"}},
        {"layers=5-3:gpu", {"ends before it starts", "3-5:gpu"}},
        {"layers=0-x:gpu", {"bad layer range '0-x:gpu'"}},
        {"layers=a-3:gpu", {"unknown target 'a-3:gpu'"}},
        {"ple=host,ple=gpu", {"names ple twice"}},
        {"layers=gpu,layers=cpu", {"names layers twice"}},
        {"ple=", {"missing target"}},
    };
    for (const auto& c : cases)
        expect_error(error_of([&] { parse_place(c.list); }), c.needles);
}

Placement resolve_str(const std::string& place, const std::vector<std::string>& gpu_mem, int layers,
                      int cuda_index, int gpu_count = -1, const std::string& cpu_mem = "") {
    return resolve(parse_request(gpu_mem, cpu_mem, place), layers, cuda_index, gpu_count);
}

TEST(Placement, ResolveChecksLayerRanges) {
    auto err = [](const std::string& place) { return error_of([&] { resolve_str(place, {}, 35, 0); }); };
    expect_error(err("layers=0-29:gpu0,29-34:gpu0"), {"overlap", "layer 29", "0-29:gpu0", "29-34:gpu0"});
    expect_error(err("layers=0-27:gpu0,30-34:gpu0"), {"layer(s) 28-29 have no target", "0-34"});
    expect_error(err("layers=1-34:gpu0"), {"layer(s) 0 have no target"});
    expect_error(err("layers=0-30:gpu0"), {"layer(s) 31-34 have no target"});
    expect_error(err("layers=0-29:gpu0,30-40:gpu0"), {"30-40:gpu0", "goes past", "35 layers, 0-34"});
    EXPECT_EQ(err("layers=30-34:gpu0,0-29:gpu"), ""); // order does not matter; gpu = the --device GPU
}

TEST(Placement, LayersSplitBetweenTheGpuAndTheCpu) {
    Placement p = resolve_str("layers=0-29:gpu0,30-34:cpu", {}, 35, 0);
    ASSERT_TRUE(p.hybrid());
    for (int l = 0; l < 35; ++l)
        EXPECT_EQ(p.layer_on_cpu(l), l >= 30) << l;
    EXPECT_TRUE(p.has_cpu_layers());
    EXPECT_EQ(p.gpus(), std::vector<int>{0});
    Placement q = resolve_str("layers=0-9:cpu,10-34:gpu", {}, 35, 0);
    ASSERT_TRUE(q.hybrid());
    EXPECT_TRUE(q.layer_on_cpu(0) && q.layer_on_cpu(9) && !q.layer_on_cpu(10));
    EXPECT_FALSE(resolve_str("layers=0-34:gpu", {}, 35, 0).hybrid());
}

TEST(Placement, LayersSplitAcrossGpus) {
    Placement p = resolve_str("layers=0-17:gpu0,18-29:gpu1,30-34:cpu", {"0:8GiB", "1:4GiB"}, 35, 0);
    ASSERT_TRUE(p.hybrid());
    for (int l = 0; l < 35; ++l)
        EXPECT_EQ(p.layer_device[l], l < 18 ? 0 : l < 30 ? 1 : -1) << l;
    EXPECT_EQ(p.gpus(), (std::vector<int>{0, 1}));
    // The plan's GPU comes first even when it runs no layer (it keeps the embeddings and the LM head).
    Placement q = resolve_str("layers=0-9:gpu2,10-34:gpu1", {}, 35, 0);
    EXPECT_EQ(q.gpus(), (std::vector<int>{0, 1, 2}));
    EXPECT_FALSE(q.has_cpu_layers());
    expect_error(error_of([] { resolve_str("layers=0-29:gpu0,30-34:gpu1", {"0:8GiB"}, 35, 0); }),
                 {"layers=0-29:gpu0,30-34:gpu1", "cuda:1", "no --gpu-mem budget", "--gpu-mem 1:SIZE"});
    expect_error(error_of([] { resolve_str("layers=0-29:gpu0,30-34:gpu3", {}, 35, 0, 2); }),
                 {"no GPU 3", "2 CUDA device(s)"});
}

TEST(Placement, ResolveRefusesWhatThisBuildCannotRun) {
    expect_error(error_of([] { resolve_str("layers=cpu", {}, 35, 0); }), {"--device cpu", "layers=cpu"});
    expect_error(error_of([] { resolve_str("layers=gpu1", {}, 35, 0); }), {"cuda:1", "--device cuda:1"});
    expect_error(error_of([] { resolve_str("embed=cpu", {}, 35, 0); }),
                 {"not supported by this build yet", "embed=cpu"});
    expect_error(error_of([] { resolve_str("lm_head=gpu2", {}, 35, 0); }),
                 {"not supported by this build yet", "lm_head=gpu2"});
    expect_error(error_of([] { resolve_str("ple=cpu", {}, 35, 0); }),
                 {"not supported by this build yet", "ple=host"});
    expect_error(error_of([] { resolve_str("layers=gpu", {}, 35, -1); }), {"CPU plan", "--device cuda"});
    expect_error(error_of([] { resolve_str("", {"8GiB"}, 35, -1); }),
                 {"--gpu-mem 8GiB", "CPU plan", "--cpu-mem"});
}

TEST(Placement, ResolveBudgetsEveryGpuUsed) {
    // Nothing ever lands on a GPU that was not given a budget.
    expect_error(error_of([] { resolve_str("", {"1:8GiB"}, 35, 0); }),
                 {"cuda:0", "no --gpu-mem budget", "nothing ever lands on a GPU that was not given a budget",
                  "--gpu-mem 0:SIZE"});
    expect_error(error_of([] { resolve_str("vision=gpu1", {"0:8GiB"}, 35, 0); }),
                 {"vision tower", "cuda:1", "--gpu-mem 1:SIZE"});
    expect_error(error_of([] { resolve_str("audio=gpu1", {"0:8GiB"}, 35, 0); }),
                 {"the audio tower (--place audio=gpu1)", "cuda:1", "--gpu-mem 1:SIZE"});
    expect_error(error_of([] {
                     resolve_str("", {"8GiB", "0:6GiB"}, 35, 0);
                 }),
                 {"two budgets for cuda:0", "'8GiB'", "'0:6GiB'"});
    // Indices are checked against the GPUs of this machine when they could be queried.
    expect_error(error_of([] {
                     resolve_str("", {"0:8GiB", "2:8GiB"}, 35, 0, 2);
                 }),
                 {"--gpu-mem 2:8GiB", "no GPU 2", "2 CUDA device(s)", "--target"});
    expect_error(error_of([] { resolve_str("", {}, 35, 3, 2); }), {"--device cuda:3", "no GPU 3"});
    Placement p = resolve_str("", {"0:8GiB", "2:8GiB"}, 35, 0, -1);
    EXPECT_EQ(p.gpu_budgets.size(), 2u);
    bool noted = false;
    for (const auto& n : p.notes)
        noted |= n.find("nothing is placed on cuda:2") != std::string::npos;
    EXPECT_TRUE(noted);
}

bool d_cpu_plan_auto() { // a CPU plan places nothing automatically on a GPU
    Placement p = resolve_str("", {}, 35, -1);
    return p.vision_auto || p.audio_auto;
}

TEST(Placement, ResolveDefaultsAndTowers) {
    Placement a = resolve_str("", {}, 35, 0);
    EXPECT_FALSE(a.ple_host);
    EXPECT_FALSE(a.ple_auto);
    Placement b = resolve_str("", {"6GiB"}, 35, 1);
    EXPECT_TRUE(b.ple_auto);
    ASSERT_EQ(b.gpu_budgets.count(1), 1u);
    Placement c =
        resolve_str("ple=host,vision=cpu,audio=cpu,embed=gpu,lm_head=cuda:1,layers=gpu1", {"6GiB"}, 35, 1);
    EXPECT_TRUE(c.ple_host);
    EXPECT_FALSE(c.ple_auto);
    EXPECT_EQ(c.towers.at("vision"), "cpu");
    std::string notes;
    for (const auto& n : c.notes)
        notes += n + "\n";
    EXPECT_NE(notes.find("vision tower runs on the CPU"), std::string::npos) << notes;
    EXPECT_FALSE(c.vision_gpu);
    EXPECT_FALSE(c.vision_auto); // placed by --place: decide() does not move it
    EXPECT_FALSE(c.audio_auto);
    EXPECT_TRUE(b.vision_auto); // not placed: decide() puts it on the GPU when it fits
    EXPECT_TRUE(b.audio_auto);
    EXPECT_FALSE(d_cpu_plan_auto());
    // Either tower on the plan's GPU (CUDA plans, gpu / gpuN / cuda:N naming it); another GPU, host: refused.
    Placement v = resolve_str("vision=gpu", {"6GiB"}, 35, 0);
    EXPECT_TRUE(v.vision_gpu);
    EXPECT_FALSE(v.vision_auto);
    EXPECT_TRUE(v.audio_auto);
    for (const char* item : {"audio=gpu", "audio=gpu1", "audio=cuda:1"}) {
        Placement a = resolve_str(item, {"6GiB"}, 35, 1);
        EXPECT_TRUE(a.audio_gpu) << item;
        EXPECT_FALSE(a.audio_auto) << item;
        EXPECT_FALSE(a.vision_gpu) << item;
        EXPECT_TRUE(a.vision_auto) << item;
    }
    expect_error(error_of([] {
                     resolve_str("vision=gpu1", {"0:6GiB", "1:4GiB"}, 35, 0, 2);
                 }),
                 {"--place vision=gpu1", "the plan's GPU, cuda:0"});
    expect_error(error_of([] {
                     resolve_str("audio=gpu1", {"0:6GiB", "1:4GiB"}, 35, 0, 2);
                 }),
                 {"--place audio=gpu1",
                  "the audio tower runs on the plan's GPU, cuda:0, or on the CPU: audio=gpu or audio=cpu"});
    expect_error(error_of([] { resolve_str("vision=host", {"6GiB"}, 35, 0); }),
                 {"--place vision=host", "'host' applies to ple only"});
    expect_error(error_of([] { resolve_str("audio=host", {"6GiB"}, 35, 0); }),
                 {"--place audio=host", "'host' applies to ple only"});
    expect_error(error_of([] { resolve_str("audio=gpu", {}, 35, -1); }), {"--place audio=gpu", "CPU plan"});
    Placement d = resolve_str("ple=host,layers=cpu", {}, 35, -1, -1, "16GiB");
    EXPECT_FALSE(d.ple_host); // a CPU plan keeps everything in host memory anyway
    EXPECT_EQ(*d.cpu_budget, 16ull << 30);
}

// A plan whose KV cache grows by 100 bytes per position (full-attention layers) over a fixed part.
Figures fake(int max_context) {
    Figures f;
    f.weights             = 10000;
    f.ple_table           = 3000;
    f.activations         = 500;
    f.kv_cache            = 2000 + 100ull * max_context;
    f.attention_workspace = 10ull * max_context;
    f.scratch_per_thread  = 40;
    f.pinned              = 64;
    return f;
}
uint64_t gpu_need(int n, bool ple_host) {
    return 10000 - (ple_host ? 3000 : 0) + 500 + 2000 + 110ull * n;
}

TEST(Placement, DecideKeepsEverythingOnTheGpuWhenItFits) {
    const int n = 100; // needs 23500 with the PLE table, 20500 without
    Placement p = resolve_str("", {"0:23500"}, 35, 0);
    Decision d  = decide(p, fake(n), n, fake, 0);
    EXPECT_FALSE(d.placement.ple_host);
    ASSERT_EQ(d.memory.size(), 2u);
    EXPECT_EQ(d.memory[0].device, "cuda:0");
    EXPECT_EQ(d.memory[0].need(), gpu_need(n, false));
    EXPECT_EQ(d.memory[1].device, "host");
    EXPECT_EQ(d.memory[1].need(), 64u);
    g4::plan::Meta meta;
    d.to_meta(&meta);
    EXPECT_EQ(meta.placement->ple, "device");
    EXPECT_EQ(meta.placement->ple_auto, true);
    EXPECT_EQ(meta.memory[0].total(), gpu_need(n, false));
    EXPECT_EQ(meta.memory[0].budget, 23500u);
    EXPECT_NE(d.placement_line().find("PLE table on cuda:0"), std::string::npos);
}

// The LM head's screening copy: planned on the GPU where it fits beside everything else, the first thing
// given up under a budget (the PLE table stays on the GPU before it); CPU plans likewise in host memory.
TEST(Placement, DecidePlansTheLmHeadScreeningCopyWhereItFits) {
    const int n    = 100; // needs 23500 with the PLE table, 20500 without
    auto with_copy = [](int m) {
        Figures f   = fake(m);
        f.lm_screen = 700;
        return f;
    };
    Placement p = resolve_str("", {"0:24200"}, 35, 0);
    Decision d  = decide(p, with_copy(n), n, with_copy, 0);
    EXPECT_TRUE(d.placement.lm_screen);
    EXPECT_FALSE(d.placement.ple_host);
    EXPECT_EQ(d.memory[0].need(), gpu_need(n, false) + 700);
    EXPECT_EQ(d.memory[0].parts.back(), (std::pair<std::string, uint64_t>{"LM head screening copy", 700}));
    g4::plan::Meta meta;
    d.to_meta(&meta);
    ASSERT_TRUE(meta.placement->lm_head_screen.has_value());
    EXPECT_TRUE(*meta.placement->lm_head_screen);
    EXPECT_EQ(meta.memory[0].total(), gpu_need(n, false) + 700);

    Placement q = resolve_str("", {"0:24199"}, 35, 0);
    Decision e  = decide(q, with_copy(n), n, with_copy, 0);
    EXPECT_FALSE(e.placement.lm_screen);
    EXPECT_FALSE(e.placement.ple_host);
    EXPECT_EQ(e.memory[0].need(), gpu_need(n, false));
    std::string notes;
    for (const std::string& s : e.placement.notes)
        notes += s + "\n";
    EXPECT_NE(notes.find("screening copy"), std::string::npos) << notes;
    EXPECT_NE(notes.find("does not fit --gpu-mem 0:24199"), std::string::npos) << notes;
    e.to_meta(&meta);
    EXPECT_FALSE(*meta.placement->lm_head_screen);

    // CPU plans: in host memory, the same way under --cpu-mem.
    Placement c = resolve_str("", {}, 35, -1);
    Decision cd = decide(c, with_copy(n), n, with_copy, 0);
    EXPECT_TRUE(cd.placement.lm_screen);
    EXPECT_EQ(cd.memory[0].device, "cpu");
    EXPECT_EQ(cd.memory[0].parts.back(), (std::pair<std::string, uint64_t>{"LM head screening copy", 700}));
    cd.to_meta(&meta);
    ASSERT_TRUE(meta.placement->lm_head_screen.has_value());
    EXPECT_TRUE(*meta.placement->lm_head_screen);
    const uint64_t cpu_need = cd.memory[0].need();
    Placement cb            = resolve_str("", {}, 35, -1, -1, std::to_string(cpu_need - 1));
    Decision cbd            = decide(cb, with_copy(n), n, with_copy, 0);
    EXPECT_FALSE(cbd.placement.lm_screen);
    EXPECT_EQ(cbd.memory[0].need(), cpu_need - 700);
    notes.clear();
    for (const std::string& s : cbd.placement.notes)
        notes += s + "\n";
    EXPECT_NE(notes.find("does not fit --cpu-mem"), std::string::npos) << notes;
    cbd.to_meta(&meta);
    EXPECT_FALSE(*meta.placement->lm_head_screen);
}

TEST(Placement, DecideMovesThePleTableToHostWhenThatFits) {
    const int n = 100;
    Placement p = resolve_str("", {"0:23499"}, 35, 0);
    Decision d  = decide(p, fake(n), n, fake, 0);
    EXPECT_TRUE(d.placement.ple_host);
    EXPECT_EQ(d.memory[0].need(), gpu_need(n, true));
    EXPECT_EQ(d.memory[1].need(), 64u + 3000u);
    g4::plan::Meta meta;
    d.to_meta(&meta);
    EXPECT_EQ(meta.placement->ple, "host");
    EXPECT_NE(d.placement_line().find("chosen automatically"), std::string::npos) << d.placement_line();
    // ... unless the host budget cannot take it.
    Placement q   = resolve_str("", {"0:23499"}, 35, 0, -1, "3000");
    std::string m = error_of([&] { decide(q, fake(n), n, fake, 0); });
    expect_error(m,
                 {"cuda:0 needs", "--gpu-mem 0:23499 was given", "host needs", "--cpu-mem 3000 was given"});
}

TEST(Placement, DecideRefusesWithTheSmallestBudgetAndMaxContext) {
    const int n   = 1000; // 122500 with the PLE table on the GPU, 119500 without
    Placement p   = resolve_str("", {"0:100000"}, 35, 0);
    std::string m = error_of([&] { decide(p, fake(n), n, fake, 0); });
    expect_error(
        m, {"cuda:0 needs 119.6 KiB",
            "(weights 9.8 KiB + activations 500 B + KV cache 99.6 KiB + workspaces 9.8 KiB)",
            "but --gpu-mem 0:100000 was given", "(ple=host, tried automatically) cuda:0 needs 116.7 KiB",
            "the smallest budget that fits this plan is --gpu-mem 0:116.70KiB (119500 bytes) with ple=host"});
    // Largest context that fits 100000 bytes: with ple=host 9500 + 110 n <= 100000 -> n = 822.
    expect_error(m, {"at --max-context 822 cuda:0 needs " + human(gpu_need(822, true)) + " with ple=host"});
    // Exactly the smallest budget fits; a byte less does not.
    EXPECT_TRUE(decide(resolve_str("", {"0:119500"}, 35, 0), fake(n), n, fake, 0).placement.ple_host);
    EXPECT_NE(error_of([&] { decide(resolve_str("", {"0:119499"}, 35, 0), fake(n), n, fake, 0); }), "");
    // An explicit ple is not moved; the weights alone may not fit at any context.
    Placement q    = resolve_str("ple=gpu", {"0:12000"}, 35, 0);
    std::string m2 = error_of([&] { decide(q, fake(n), n, fake, 0); });
    expect_error(m2, {"--gpu-mem 0:119.63KiB (122500 bytes)", "reducing --max-context does not help",
                      "--max-context 1"});
    EXPECT_EQ(m2.find("tried automatically"), std::string::npos) << m2;
}

// fake()'s plan with towers: 700 bytes of tower weights (vision 400, audio 300) taken from the GPU's weights;
// device buffers vision 200, audio 50; the towers' host buffers 1000 (both on the CPU), 900 (vision on the
// GPU), 800 (audio), 700 (both). At n = 100 the GPU needs 22800 with neither tower and the PLE table, 19800
// without the table; the vision tower adds 600, the audio tower 350.
Figures fake_towers(int max_context) {
    Figures f                  = fake(max_context);
    f.tower_weights            = 700;
    f.vision_weights           = 400;
    f.audio_weights            = 300;
    f.vision_gpu_buffers       = 200;
    f.audio_gpu_buffers        = 50;
    f.tower_buffers            = 1000;
    f.tower_buffers_vision_gpu = 900;
    f.tower_buffers_audio_gpu  = 800;
    f.tower_buffers_both_gpu   = 700;
    return f;
}

TEST(Placement, DecidePutsTheTowersOnTheGpuByBudget) {
    const int n = 100;
    struct Case {
        uint64_t budget;
        bool ple_host, vision, audio;
        uint64_t gpu, host;
    } cases[] = {
        {23750, false, true, true, 23750, 64 + 700},          // everything fits
        {23749, false, true, false, 23400, 64 + 300 + 900},   // room for one tower: the vision tower
        {23399, false, false, true, 23150, 64 + 400 + 800},   // the audio tower alone where only it fits
        {23149, false, false, false, 22800, 64 + 700 + 1000}, // the PLE table before either tower
        {22799, true, true, true, 20750,
         64 + 3000 + 700}, // the PLE table cannot stay: the towers go on the GPU
        {20400, true, true, false, 20400, 64 + 3000 + 300 + 900},
    };
    for (const Case& c : cases) {
        Placement p        = resolve_str("", {"0:" + std::to_string(c.budget)}, 35, 0);
        Decision d         = decide(p, fake_towers(n), n, fake_towers, 0);
        const Placement& q = d.placement;
        EXPECT_EQ(q.ple_host, c.ple_host) << c.budget;
        EXPECT_EQ(q.vision_gpu, c.vision) << c.budget;
        EXPECT_EQ(q.audio_gpu, c.audio) << c.budget;
        EXPECT_EQ(d.memory[0].need(), c.gpu) << c.budget;
        EXPECT_EQ(d.memory[1].need(), c.host) << c.budget;
        EXPECT_EQ(q.vision_why.empty(), c.vision) << c.budget << ": " << q.vision_why;
        EXPECT_EQ(q.audio_why.empty(), c.audio) << c.budget << ": " << q.audio_why;
        std::string notes;
        for (const auto& s : q.notes)
            notes += s + "\n";
        EXPECT_EQ(notes.find("the audio tower runs on cuda:0 (chosen automatically: it fits") !=
                      std::string::npos,
                  c.audio)
            << notes;
        bool audio_part = false;
        for (const auto& [what, bytes] : d.memory[0].parts)
            if (what == "audio tower") audio_part = bytes == 350;
        EXPECT_EQ(audio_part, c.audio) << c.budget;
    }
    // Why each stayed on the CPU: the vision tower on its own, the audio tower beside the vision tower if
    // that went on.
    Decision one = decide(resolve_str("", {"0:23749"}, 35, 0), fake_towers(n), n, fake_towers, 0);
    EXPECT_EQ(one.placement.audio_why, "with it on cuda:0 beside the vision tower the plan needs " +
                                           human(23750) + " but --gpu-mem 0:23749 was given");
    Decision other = decide(resolve_str("", {"0:23399"}, 35, 0), fake_towers(n), n, fake_towers, 0);
    EXPECT_EQ(other.placement.vision_why,
              "with it on cuda:0 the plan needs " + human(23400) + " but --gpu-mem 0:23399 was given");
    // A tower placed by --place stays; the other is still decided by the budget.
    Decision fixed = decide(resolve_str("vision=cpu", {"0:23749"}, 35, 0), fake_towers(n), n, fake_towers, 0);
    EXPECT_FALSE(fixed.placement.vision_gpu);
    EXPECT_TRUE(fixed.placement.audio_gpu);
    EXPECT_TRUE(fixed.placement.vision_why.empty());
    std::string m = error_of(
        [&] { decide(resolve_str("audio=gpu", {"0:20000"}, 35, 0), fake_towers(n), n, fake_towers, 0); });
    expect_error(m, {"cuda:0 needs", "audio tower 350 B", "--gpu-mem 0:20000 was given",
                     "the smallest budget that fits this plan is"});
    // Nothing fits at all: the refusal names the plan without the automatic towers.
    m = error_of([&] { decide(resolve_str("", {"0:19000"}, 35, 0), fake_towers(n), n, fake_towers, 0); });
    expect_error(m, {"cuda:0 needs", "the smallest budget that fits this plan is --gpu-mem 0:",
                     "(19800 bytes) with ple=host"});
    EXPECT_EQ(m.find("audio tower"), std::string::npos) << m;
    // Without budgets both go on the GPU.
    Decision free = decide(resolve_str("", {}, 35, 0), fake_towers(n), n, fake_towers, 0);
    EXPECT_TRUE(free.placement.vision_gpu && free.placement.audio_gpu);
}

TEST(Placement, CpuPlanCountsScratchPerThread) {
    const int n = 100;
    Placement p = resolve_str("", {}, 35, -1, -1, "23500");
    Decision d  = decide(p, fake(n), n, fake, 4);
    ASSERT_EQ(d.memory.size(), 1u);
    EXPECT_EQ(d.memory[0].device, "cpu");
    EXPECT_EQ(d.memory[0].need(), 10000u + 500 + 12000 + 4 * 40); // workspaces are CUDA only
    std::string m = error_of([&] { decide(resolve_str("", {}, 35, -1, -1, "22659"), fake(n), n, fake, 4); });
    expect_error(m, {"cpu needs", "scratch 4 threads x 40 B", "--cpu-mem 22659 was given",
                     "--cpu-mem 22.13KiB (22660 bytes)"});
    g4::plan::Meta meta;
    d.to_meta(&meta);
    ASSERT_EQ(meta.memory.size(), 1u);
    EXPECT_EQ(meta.memory[0].scratch_per_thread, 40u);
    EXPECT_EQ(*meta.memory[0].budget, 23500u);
}

// --max-sessions N: each session's parts N times (named with the count), weights and the screening copy once;
// the budget check and META see the total.
TEST(Placement, SessionsCountEachSessionsParts) {
    const int n = 100;
    auto figs   = [](int m) {
        Figures f           = fake(m);
        f.lm_screen         = 700;
        f.lm_screen_session = 30;
        return f;
    };
    const uint64_t one = gpu_need(n, false) + 700 + 30; // one session, the copy and its bounds
    const uint64_t per = 500 + 2000 + 110ull * n + 30;  // what each further session adds on the GPU
    Placement p        = resolve_str("", {"0:" + std::to_string(one + 2 * per)}, 35, 0);
    p.sessions         = 3;
    Decision d         = decide(p, figs(n), n, figs, 0);
    EXPECT_TRUE(d.placement.lm_screen);
    EXPECT_FALSE(d.placement.ple_host);
    EXPECT_EQ(d.memory[0].need(), one + 2 * per);
    EXPECT_EQ(d.memory[1].need(), 3u * 64); // pinned buffers, per session
    const auto& parts = d.memory[0].parts;
    EXPECT_NE(
        std::find(parts.begin(), parts.end(),
                  std::make_pair(std::string("KV cache (3 sessions)"), uint64_t(3 * (2000 + 100ull * n)))),
        parts.end());
    EXPECT_NE(std::find(parts.begin(), parts.end(), std::make_pair(std::string("weights"), uint64_t(10000))),
              parts.end());
    EXPECT_NE(std::find(parts.begin(), parts.end(),
                        std::make_pair(std::string("LM head screening copy"), uint64_t(700))),
              parts.end());
    g4::plan::Meta meta;
    d.to_meta(&meta);
    EXPECT_EQ(meta.placement->sessions, 3);
    EXPECT_EQ(meta.memory[0].total(), one + 2 * per);
    // One byte less: the screening copy is given up first, then the PLE table goes to the host.
    Placement q = resolve_str("", {"0:" + std::to_string(one + 2 * per - 1)}, 35, 0);
    q.sessions  = 3;
    EXPECT_FALSE(decide(q, figs(n), n, figs, 0).placement.lm_screen);

    // CPU plans: every session's threads have their scratch.
    Placement c = resolve_str("", {}, 35, -1);
    c.sessions  = 2;
    Decision cd = decide(c, fake(n), n, fake, 4);
    EXPECT_EQ(cd.memory[0].need(), 10000u + 2 * (500 + 12000) + 2 * 4 * 40);
    std::ostringstream table;
    print_memory(table, cd.memory, "");
    EXPECT_NE(table.str().find("scratch 2 sessions x 4 threads x 40 B"), std::string::npos) << table.str();
}

TEST(Placement, KvCacheLabelNamesItsDtype) {
    Figures f  = fake(100);
    f.kv_dtype = "bf16";
    for (int cuda : {0, -1}) {
        auto mem = memory_plan(f, resolve_str("", {}, 35, cuda), false, 1);
        ASSERT_FALSE(mem.empty());
        EXPECT_EQ(mem[0].parts[2], std::make_pair(std::string("KV cache (bf16)"), f.kv_cache));
    }
}

// The CPU encoder programs' arenas are host memory: on the CPU of a CPU plan, on the host of a CUDA plan
// unless the vision tower runs on the GPU (then the CPU does not run the vision program).
TEST(Placement, EncoderArenasAreCountedOnTheHost) {
    Figures f        = fake(100);
    f.encoder_arenas = 4096;
    const auto part  = std::make_pair(std::string("encoder programs' activations"), f.encoder_arenas);
    auto has         = [&](const std::vector<DeviceMemory>& mem, const std::string& dev) {
        for (const auto& d : mem)
            if (d.device == dev) return std::find(d.parts.begin(), d.parts.end(), part) != d.parts.end();
        return false;
    };
    EXPECT_TRUE(has(memory_plan(f, resolve_str("", {}, 35, -1), false, 1), "cpu"));
    Placement p = resolve_str("", {}, 35, 0);
    EXPECT_TRUE(has(memory_plan(f, p, false, 1), "host"));
    p.vision_gpu = true;
    EXPECT_FALSE(has(memory_plan(f, p, false, 1), "host"));
    f.encoder_arenas = 0;
    EXPECT_FALSE(has(memory_plan(f, resolve_str("", {}, 35, -1), false, 1), "cpu"));
}

} // namespace
