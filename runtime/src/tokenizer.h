// The plan's tokenizer: a Hugging Face tokenizer.json (BPE with byte fallback) loaded from its JSON text,
// with encode/decode that reproduce HF `tokenizers` exactly for the subset below.
//
// Supported tokenizer.json subset (anything else is rejected at load time):
//   model          BPE: vocab, merges ("a b" or ["a","b"]), unk_token, fuse_unk, byte_fallback,
//                  ignore_merges; dropout must be null/0; no continuing_subword_prefix/end_of_word_suffix
//   normalizer     null | Replace(String pattern) | Sequence of those
//   pre_tokenizer  null | Split(String pattern, any behavior, invert=false) | Sequence of those
//   post_processor null | TemplateProcessing (the "single" template: special tokens around $A)
//   decoder        null | Replace(String pattern) | ByteFallback | Fuse | Strip | Sequence of those
//   added_tokens   matched leftmost-longest in the raw text (normalized=false) or in the normalized
//                  text (normalized=true) before BPE; honours special, lstrip, rstrip, single_word
//                  (single_word's \w test is approximated: ASCII alnum/_ or any non-space non-ASCII).
//
// Invalid UTF-8 input is not an error: each maximal invalid subsequence becomes U+FFFD first, exactly
// as Python's bytes.decode("utf-8", errors="replace") (the only way HF can see such input). Decoding
// follows HF's ByteFallback decoder: a run of <0xNN> tokens that is not valid UTF-8 becomes one U+FFFD
// per byte token. Ids outside the vocabulary are skipped when decoding, as HF does.
//
// All member functions are noexcept in effect: errors are reported through return values.
// A loaded Tokenizer is immutable, so concurrent encode/decode calls are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace g4 {

class Tokenizer {
public:
    Tokenizer();
    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    Tokenizer(const Tokenizer&)            = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    // Parses tokenizer.json text into *out. On failure returns false, sets *err (if non-null) and
    // leaves *out unloaded.
    static bool load_from_json(std::string_view json_text, Tokenizer* out, std::string* err);

    bool loaded() const { return impl_ != nullptr; }

    // *ids is replaced by the encoding of `text` (the UTF-8 sanitized text, see above). With
    // add_special, the post_processor's single-sequence template is applied (e.g. <bos> first).
    bool encode(std::string_view text, bool add_special, std::vector<int32_t>* ids,
                std::string* err = nullptr) const;
    // *out is replaced by the decoded text. skip_special drops tokens marked special.
    bool decode(const int32_t* ids, size_t n, bool skip_special, std::string* out) const;
    // True when decoding concatenates: decode(a ++ b) == decode(a) + decode(b) whenever a's last token
    // is one the decoding keeps and is not a byte-fallback token (decoders of Replace, ByteFallback and
    // Fuse steps; not with Strip, or without a decoder, which joins tokens with spaces).
    bool decode_concatenates() const;

    // The raw vocabulary string of `id` (e.g. "▁the", "<0x0A>", "<bos>"); empty if id is unknown.
    std::string_view token_to_piece(int32_t id) const;
    // The id of a vocabulary string (added tokens first, then the model vocab); -1 if none.
    int32_t id_of(std::string_view token) const;
    bool is_special(int32_t id) const;

    // One past the largest id (model vocab and added tokens together).
    int32_t vocab_size() const;
    int32_t bos_id() const; // "<bos>", or the first special token of the post_processor template
    int32_t eos_id() const; // "<eos>"; stop ids for generation come from generation_config
    int32_t pad_id() const; // "<pad>"
    int32_t unk_id() const; // the BPE model's unk_token

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Returns `bytes` with every maximal invalid UTF-8 subsequence replaced by U+FFFD (the Unicode
// "substitution of maximal subparts" practice, identical to Python's errors="replace").
std::string sanitize_utf8(std::string_view bytes);

} // namespace g4
