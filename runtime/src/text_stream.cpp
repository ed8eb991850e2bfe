// Streaming detokenization (text_stream.h).
#include "runtime/src/text_stream.h"

#include <algorithm>

namespace g4 {
namespace {

bool is_byte_token(const Tokenizer& tk, int32_t id) {
    std::string_view p = tk.token_to_piece(id);
    return p.size() == 6 && p.substr(0, 3) == "<0x" && p[5] == '>';
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t stop_holdback(std::string_view text, const std::vector<std::string>& stops) {
    size_t best = 0;
    for (const auto& st : stops)
        for (size_t k = std::min(st.size() - 1, text.size()); k > best; --k)
            if (text.compare(text.size() - k, k, st, 0, k) == 0) {
                best = k;
                break;
            }
    return best;
}

} // namespace

TextStream::TextStream(const Tokenizer* tk, std::vector<std::string> stops, bool incremental)
    : tk_(tk), stops_(std::move(stops)), concat_(incremental && tk && tk->decode_concatenates()) {}

std::string_view TextStream::push(int32_t tok, bool* stop) {
    *stop = false;
    gen_.push_back(tok);
    if (!tk_) return {};
    const Tokenizer& tk = *tk_;
    // A run of byte-fallback tokens decodes as a unit (invalid UTF-8 becomes one U+FFFD per byte), so
    // text is final only up to the last token that is neither a byte token nor one the decoding skips
    // (a special token between two bytes would join their run).
    size_t final_n = gen_.size();
    while (final_n > base_tok_ && (is_byte_token(tk, gen_[final_n - 1]) || tk.is_special(gen_[final_n - 1]) ||
                                   tk.token_to_piece(gen_[final_n - 1]).empty()))
        --final_n;
    std::string_view settled;
    if (concat_) {
        // final_n is base_tok_ or just after a kept token that is not a byte, so the text splits there:
        // the newly settled tokens and the still open ones decode apart, each once.
        tk.decode(gen_.data() + base_tok_, final_n - base_tok_, true, &tail_settled_);
        tk.decode(gen_.data() + final_n, gen_.size() - final_n, true, &tail_);
        text_.resize(base_len_);
        text_ += tail_settled_;
        base_tok_ = final_n, base_len_ = text_.size();
        text_ += tail_;
        settled = std::string_view(text_).substr(0, base_len_);
    } else {
        tk.decode(gen_.data(), gen_.size(), true, &text_);
        tk.decode(gen_.data(), final_n, true, &tail_settled_);
        settled = tail_settled_;
    }
    size_t hit = std::string::npos;
    for (const auto& sp : stops_) {
        size_t at = text_.find(sp, emitted_ > sp.size() ? emitted_ - sp.size() : 0);
        if (at != std::string::npos && at < hit) hit = at;
    }
    size_t ready;
    if (hit != std::string::npos) {
        ready = std::max(hit, emitted_);
        *stop = true;
    } else {
        ready = settled.size();
        ready = std::max(emitted_, ready - std::min(ready, stop_holdback(settled, stops_)));
    }
    std::string_view piece = std::string_view(text_).substr(emitted_, ready - emitted_);
    emitted_               = ready;
    return piece;
}

std::string_view TextStream::flush() const {
    if (!tk_ || emitted_ >= text_.size()) return {};
    for (const auto& sp : stops_)
        if (text_.find(sp) != std::string::npos) return {};
    return std::string_view(text_).substr(emitted_);
}

} // namespace g4
