// The fidelity stage of `g4 compile` (compiler/stages.h): for lossy plans (NF4, an adapter) the logits of a
// calibration prompt through the runtime's C API on the plan (its CPU twin for a CUDA plan) and on a
// full-precision reference plan, compared.
#include "compiler/stages.h"
#include "g4/g4.h"
#include "kernels/q16.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>

namespace g4::stage {
namespace {

// Logits of a fixed calibration prompt through the CPU runtime, fed `step` tokens a step: q16::kMaxRows, the
// row counts of decode steps, which `--cpu-precision fast` runs with integer matmuls (kernels/q16.h), so
// that the figure measures that path too; or the whole prompt, the prefill path (`--cpu-precision bf16`).
std::vector<float> calibration_logits(const std::string& plan, int vocab, int n_tokens, int step) {
    g4_engine* e = nullptr;
    if (g4_engine_open(plan.c_str(), nullptr, &e) != G4_OK)
        throw CompileError(std::string("fidelity check: ") + g4_last_error_message());
    g4_session* s = nullptr;
    if (g4_session_create(e, nullptr, &s) != G4_OK) {
        g4_engine_close(e);
        throw CompileError(std::string("fidelity check: ") + g4_last_error_message());
    }
    std::vector<int32_t> ids(n_tokens);
    for (int i = 0; i < n_tokens; ++i)
        ids[i] =
            i == 0 ? 2 : 3 + (int32_t)((i * 7919ull + 13) % (uint64_t)std::max(1, std::min(vocab, 4096) - 3));
    std::vector<float> logits((size_t)n_tokens * vocab);
    g4_status st = G4_OK;
    for (int i = 0; i < n_tokens && st == G4_OK; i += step) {
        const int n = std::min(step, n_tokens - i);
        st          = g4_session_append_tokens(s, ids.data() + i, n, logits.data() + (size_t)i * vocab,
                                               (size_t)n * vocab);
    }
    std::string err = g4_last_error_message();
    g4_session_destroy(s);
    g4_engine_close(e);
    if (st != G4_OK) throw CompileError("fidelity check: " + err);
    return logits;
}

} // namespace

void measure_fidelity(std::ostream& log, const Inputs& in, PlanFile& out, CompileReport* report) {
    const CompileOptions& opt = in.opt;
    const auto& hp            = in.mc.text;
    // Fidelity: logits of the plan vs the full-precision (fp32-merged, unquantized) model.
    bool lossy = in.adapter || opt.weights == "nf4" || !opt.quantize_regex.empty();
    if (opt.fidelity && lossy) {
        // The reference plan and the CPU twin are temporary files beside the plan, never committed.
        PlanFile ref(opt.out_path);
        Report ref_rep;
        write_plan(in, &ref, Mode::Reference, &ref_rep);
        const int n_tok      = std::min(32, in.max_context);
        std::string measured = out.f.temp_path();
        std::optional<PlanFile> twin;
        if (in.cuda_index >= 0) { // measured on the CPU path: a CPU twin with the same weights
            Report twin_rep;
            twin.emplace(opt.out_path);
            write_plan(in, &*twin, Mode::CpuTwin, &twin_rep);
            measured = twin->f.temp_path();
        }
        if (opt.progress) opt.progress("fidelity", 0.5);
        auto b = calibration_logits(ref.f.temp_path(), hp.vocab_size, n_tok, q16::kMaxRows);
        if (opt.progress) opt.progress("fidelity", 0.6);
        // The decode path; for `--cpu-precision bf16` also the prefill path, and the larger error of the two.
        // A prompt of q16::kMaxRows tokens or fewer is one step on both paths: then the decode pass alone.
        const bool prefill = in.cuda_index < 0 && opt.cpu_precision == "bf16" && n_tok > q16::kMaxRows;
        double rel         = 0;
        int agree          = n_tok;
        double den         = 0;
        for (int pass = 0; pass < (prefill ? 2 : 1); ++pass) {
            const int step = pass == 0 ? q16::kMaxRows : n_tok;
            auto a         = calibration_logits(measured, hp.vocab_size, n_tok, step);
            double num     = 0;
            int same       = 0;
            den            = 0;
            for (int r = 0; r < n_tok; ++r) {
                const float* x = a.data() + (size_t)r * hp.vocab_size;
                const float* y = b.data() + (size_t)r * hp.vocab_size;
                same +=
                    std::max_element(x, x + hp.vocab_size) - x == std::max_element(y, y + hp.vocab_size) - y;
                for (int i = 0; i < hp.vocab_size; ++i)
                    num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]), den += (double)y[i] * y[i];
            }
            const double r = std::sqrt(num / std::max(den, 1e-300));
            rel            = std::isfinite(r) ? std::max(rel, r) : r;
            agree          = std::min(agree, same);
            if (!std::isfinite(rel)) break;
        }
        if (opt.progress) opt.progress("fidelity", 1.0);
        if (!std::isfinite(rel)) { // never reported as a figure: the plan just written is unusable
            std::remove(opt.out_path.c_str());
            throw CompileError(
                "fidelity check: the " +
                std::string(std::isfinite(den) ? "plan's" : "full-precision model's") +
                " logits on the calibration prompt are not finite (NaN or infinity): the weights overflow "
                "float32; " +
                opt.out_path + " was not kept");
        }
        char line[256];
        std::snprintf(line, sizeof line,
                      "  fidelity: relative L2 logit error %.3e, top-1 agreement %d/%d, vs the "
                      "full-precision merged model "
                      "(%d-token calibration prompt, CPU)\n",
                      rel, agree, n_tok, n_tok);
        log << line
            << "    (the distance ||plan - reference|| / ||reference|| of the two models' logits, 0 = "
               "identical;"
               " top-1:\n"
               "    positions where both pick the same next token. A low error and near-full agreement mean "
               "the\n"
               "    quantization kept the model's choices; an error near 1 means the logits changed about as "
               "much\n"
               "    as their size: expected for random-weight test checkpoints, on a trained model try "
               "--weights bf16\n"
               "    or --keep REGEX for the sensitive weights)\n";
        if (report) {
            report->fidelity_measured   = true;
            report->fidelity_rel_l2     = rel;
            report->fidelity_top1_agree = agree;
            report->fidelity_tokens     = n_tok;
        }
    }
}

} // namespace g4::stage
