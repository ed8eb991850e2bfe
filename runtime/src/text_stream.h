// Streaming detokenization for g4_session_generate: the text each generated token completes, held back
// while a byte-fallback run or a possible stop string is unfinished, cut before the first stop string.
#pragma once
#include "runtime/src/tokenizer.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace g4 {

class TextStream {
public:
    // tk may be null (no text: every piece empty, never a stop). incremental: decode only the tokens
    // after the last settled boundary when the tokenizer's decoding concatenates (each token then
    // costs its own decode, not the whole generation's); false always decodes everything (the
    // reference the tests compare against).
    TextStream(const Tokenizer* tk, std::vector<std::string> stops, bool incremental = true);
    // Adds a generated token. Returns the text it completes (valid until the next call; may be empty)
    // and sets *stop when the text now holds a stop string: the piece then ends just before it.
    std::string_view push(int32_t tok, bool* stop);
    // After the last push: the text held back (an incomplete character or a partial stop string), or
    // empty when a stop string was found.
    std::string_view flush() const;
    // The text of every token pushed.
    const std::string& text() const { return text_; }

private:
    const Tokenizer* tk_;
    std::vector<std::string> stops_;
    bool concat_;
    std::vector<int32_t> gen_;
    std::string text_, tail_, tail_settled_;
    size_t emitted_  = 0;                // bytes of text_ already delivered
    size_t base_tok_ = 0, base_len_ = 0; // concat_: gen_[0, base_tok_) decodes to text_[0, base_len_)
};

} // namespace g4
