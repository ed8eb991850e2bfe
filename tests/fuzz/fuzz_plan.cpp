// Fuzz target: a plan file through the C API (runtime/include/g4/g4.h): open and validate it, query it,
// and when it opens, run two tokens on the CPU (prefill of two ids, one greedy sample, one decode step),
// the text functions if it carries a tokenizer, and one tiny image and clip if it has the towers.
// Before writing the file the harness makes the header's file size and the checksums match the mutated
// bytes, so that mutations reach the validation behind them (a checksum mismatch is tested by the suite).
#include "fuzz_util.h"
#include "g4/g4.h"
#include "runtime/plan/plan_format.h"

#include <cstring>
#include <vector>

namespace {

// Sessions of real plans are large; a fuzzed plan declaring more than this is opened and queried but not run.
constexpr uint64_t kMaxSessionBytes = 256ull << 20;

void fix_checksums(std::vector<uint8_t>& f) {
    using namespace g4::plan;
    PlanHeader h;
    if (f.size() < sizeof h || std::memcmp(f.data(), kMagic, 8) != 0) return;
    std::memcpy(&h, f.data(), sizeof h);
    h.file_size = f.size();
    if (h.section_count <= 64 && h.section_table_offset <= f.size() &&
        h.section_count * sizeof(PlanSection) <= f.size() - h.section_table_offset)
        for (uint32_t i = 0; i < h.section_count; ++i) {
            PlanSection s;
            uint8_t* at = f.data() + h.section_table_offset + i * sizeof s;
            std::memcpy(&s, at, sizeof s);
            if (s.kind == (uint32_t)SectionKind::Weights || s.offset > f.size() ||
                s.size > f.size() - s.offset)
                continue;
            s.checksum = fnv1a64(f.data() + s.offset, s.size);
            std::memcpy(at, &s, sizeof s);
        }
    h.header_checksum = 0;
    h.header_checksum = (uint32_t)fnv1a64(&h, sizeof h);
    std::memcpy(f.data(), &h, sizeof h);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<uint8_t> file(data, data + size);
    fix_checksums(file);
    const std::string path = g4fuzz::write_scratch("fuzz.g4plan", file.data(), file.size());
    g4_engine* e           = nullptr;
    if (g4_engine_open(path.c_str(), nullptr, &e) != G4_OK) return 0;
    g4_engine_info info{};
    g4_media_info media{};
    g4_sampling_params sp{};
    if (g4_engine_get_info(e, &info) != G4_OK || g4_engine_get_media_info(e, &media) != G4_OK ||
        g4_sampling_params_from_plan(e, &sp) != G4_OK) {
        g4_engine_close(e);
        return 0;
    }
    if (info.has_tokenizer) {
        int32_t ids[64];
        size_t n          = 0;
        const char text[] = "Hello, world! \xe2\x96\x81<bos>";
        if (g4_tokenize(e, text, sizeof text - 1, 1, ids, 64, &n) == G4_OK) {
            char out[512];
            g4_detokenize(e, ids, n, 0, out, sizeof out, &n);
        }
        g4_chat_message msgs[] = {{"system", " be brief "}, {"user", "hi"}};
        char out[512];
        g4_chat_render(e, msgs, 2, 1, out, sizeof out, &n);
    }
    g4_session* s         = nullptr;
    g4_session_params prm = g4_session_params_default();
    prm.n_threads         = 1;
    if (info.session_bytes <= kMaxSessionBytes && info.vocab_size > 0 &&
        g4_session_create(e, &prm, &s) == G4_OK) {
        if (media.has_vision) {
            std::vector<uint8_t> rgb(16 * 16 * 3, 128);
            g4_session_add_image(s, rgb.data(), 16, 16, nullptr);
        }
        if (media.has_audio) {
            std::vector<float> pcm(1600, 0.25f);
            g4_session_add_audio(s, pcm.data(), (int64_t)pcm.size(), nullptr);
        }
        const int32_t bos =
            info.bos_token_id >= 0 && info.bos_token_id < info.vocab_size ? info.bos_token_id : 0;
        int32_t ids[2] = {bos, 1 % info.vocab_size};
        int32_t tok    = 0;
        if (g4_session_append_tokens(s, ids, 2, nullptr, 0) == G4_OK &&
            g4_session_sample(s, nullptr, &tok) == G4_OK) {
            if (tok < 0 || tok >= info.vocab_size)
                __builtin_trap(); // a sampled id is always in the vocabulary
            g4_session_append_tokens(s, &tok, 1, nullptr, 0);
        }
        g4_session_destroy(s);
    }
    g4_engine_close(e);
    return 0;
}
