// UTF-8 and code point helpers of the tokenizer: validation with Unicode's maximal-subpart rule, decoding,
// and the whitespace / word classes its pre-tokenizer regexes use.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace g4::utf8 {

// Scans the UTF-8 sequence starting at s[i]. Returns its length and sets *valid, or, when it is
// ill-formed, the length of its maximal subpart (at least 1; Unicode's U+FFFD substitution unit).
inline size_t scan_utf8(const unsigned char* s, size_t n, size_t i, bool* valid) {
    unsigned char b = s[i];
    *valid          = true;
    if (b < 0x80) return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF)
        need = 1;
    else if (b == 0xE0)
        need = 2, lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
        need = 2;
    else if (b == 0xED)
        need = 2, hi = 0x9F;
    else if (b == 0xF0)
        need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3)
        need = 3;
    else if (b == 0xF4)
        need = 3, hi = 0x8F;
    else
        return *valid = false, 1;
    size_t j = i + 1;
    for (size_t k = 0; k < need; ++k, ++j) {
        if (j >= n || s[j] < lo || s[j] > hi) return *valid = false, j - i;
        lo = 0x80, hi = 0xBF;
    }
    return j - i;
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is ill-formed there.
inline size_t valid_seq_len(const unsigned char* s, size_t n, size_t i) {
    bool valid;
    size_t len = scan_utf8(s, n, i, &valid);
    return valid ? len : 0;
}

inline bool is_valid_utf8(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    size_t n = s.size(), i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            ++i;
            continue;
        }
        size_t len = valid_seq_len(p, n, i);
        if (len == 0) return false;
        i += len;
    }
    return true;
}

// Decodes the code point at s[i] of a valid UTF-8 string and returns its byte length.
inline size_t decode_cp(std::string_view s, size_t i, uint32_t* cp) {
    auto b = static_cast<unsigned char>(s[i]);
    auto c = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
    if (b < 0x80) return *cp = b, 1;
    if (b < 0xE0) return *cp = ((b & 0x1Fu) << 6) | c(1), 2;
    if (b < 0xF0) return *cp = ((b & 0x0Fu) << 12) | (c(1) << 6) | c(2), 3;
    *cp = ((b & 0x07u) << 18) | (c(1) << 12) | (c(2) << 6) | c(3);
    return 4;
}

// Start of the code point that ends just before byte `end` (end > 0) of a valid UTF-8 string.
inline size_t prev_cp_start(std::string_view s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80)
        --i;
    return i;
}

// Unicode White_Space (what Rust's regex \s matches).
inline bool is_unicode_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

// Approximation of Rust's Unicode \w (see tokenizer.h).
inline bool is_word_cp(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    return !is_unicode_space(cp);
}

} // namespace g4::utf8
