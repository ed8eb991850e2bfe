// Fuzz target: tokenizer.json [NUL text] (runtime/src/tokenizer.h): load, encode the text (a fixed sentence
// when there is none) with and without special tokens, and decode the ids back.
#include "fuzz_util.h"
#include "runtime/src/tokenizer.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto parts = g4fuzz::split_nul(data, size, 2);
    g4::Tokenizer tok;
    std::string err;
    if (!g4::Tokenizer::load_from_json(parts[0], &tok, &err)) return 0;
    const std::string text =
        parts.size() > 1 ? parts[1] : "The capital of France is Paris.\n<bos> caf\xc3\xa9 \xff";
    std::vector<int32_t> ids;
    std::string out;
    for (bool special : {false, true})
        if (tok.encode(text, special, &ids, &err)) {
            tok.decode(ids.data(), ids.size(), false, &out);
            tok.decode(ids.data(), ids.size(), true, &out);
        }
    // Ids around the vocabulary's ends, and negative ones, are skipped, never read out of bounds.
    const int32_t v     = tok.vocab_size();
    const int32_t odd[] = {-1, 0, v - 1, v, v + 1, INT32_MAX, INT32_MIN};
    tok.decode(odd, sizeof odd / sizeof odd[0], false, &out);
    for (int32_t id : odd) {
        (void)tok.token_to_piece(id);
        (void)tok.is_special(id);
    }
    (void)tok.id_of(text);
    return 0;
}
