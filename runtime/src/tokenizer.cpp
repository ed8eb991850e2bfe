// Implementation of g4::Tokenizer (see tokenizer.h): tokenizer.json parsing, added-token matching,
// normalization, pre-tokenization, BPE merging with byte fallback, and the decoder pipeline.
#include "runtime/src/tokenizer.h"
#include "runtime/src/json_limits.h"
#include "runtime/src/utf8.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <new>
#include <queue>
#include <unordered_map>
#include <utility>

namespace g4 {
namespace {
using namespace utf8;

using json = nlohmann::json;

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD"; // U+FFFD

// A vocab string for a one-line message: control bytes as \xNN, at most 40 bytes.
std::string printable(std::string_view s) {
    std::string r;
    for (unsigned char c : s.substr(0, 40)) {
        if (c < 0x20 || c == 0x7f) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02X", c);
            r += b;
        } else {
            r += char(c);
        }
    }
    return s.size() > 40 ? r + "..." : r;
}

void replace_all(std::string_view s, std::string_view pat, std::string_view with, std::string* out) {
    out->clear();
    out->reserve(s.size());
    size_t i = 0;
    while (true) {
        size_t j = s.find(pat, i);
        if (j == std::string_view::npos) break;
        out->append(s.data() + i, j - i);
        out->append(with);
        i = j + pat.size();
    }
    out->append(s.data() + i, s.size() - i);
}

// ---- containers ------------------------------------------------------------------------------

// Open-addressing hash map from uint64 keys to uint64 values (keys must not be ~0).
class U64Map {
public:
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2)
            cap <<= 1;
        keys_.assign(cap, kEmpty);
        vals_.assign(cap, 0);
        mask_ = cap - 1;
        size_ = 0;
    }
    // Inserts or overwrites.
    void set(uint64_t key, uint64_t val) {
        if ((size_ + 1) * 2 > keys_.size()) grow();
        size_t i = slot(key);
        if (keys_[i] == kEmpty) keys_[i] = key, ++size_;
        vals_[i] = val;
    }
    const uint64_t* get(uint64_t key) const {
        if (keys_.empty()) return nullptr;
        size_t i = slot(key);
        return keys_[i] == kEmpty ? nullptr : &vals_[i];
    }

private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static uint64_t mix(uint64_t k) {
        k ^= k >> 33;
        k *= 0xff51afd7ed558ccdULL;
        k ^= k >> 33;
        return k;
    }
    size_t slot(uint64_t key) const {
        size_t i = mix(key) & mask_;
        while (keys_[i] != kEmpty && keys_[i] != key)
            i = (i + 1) & mask_;
        return i;
    }
    void grow() {
        std::vector<uint64_t> k = std::move(keys_), v = std::move(vals_);
        reserve(std::max<size_t>(size_ + 1, k.size()));
        for (size_t i = 0; i < k.size(); ++i)
            if (k[i] != kEmpty) set(k[i], v[i]);
    }
    std::vector<uint64_t> keys_, vals_;
    size_t mask_ = 0, size_ = 0;
};

struct SvHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StrIdMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

int32_t find_id(const StrIdMap& m, std::string_view s) {
    auto it = m.find(s);
    return it == m.end() ? -1 : it->second;
}

// String -> id index over strings stored elsewhere (keys[id]); open addressing with hash tags.
class StrIndex {
public:
    explicit StrIndex(const std::vector<std::string>* keys) : keys_(keys) {}
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2)
            cap <<= 1;
        ids_.assign(cap, -1);
        tags_.assign(cap, 0);
        mask_ = cap - 1;
    }
    // (*keys_)[id] must already hold the string; it must not be in the index yet.
    void insert(int32_t id) {
        std::string_view k = (*keys_)[id];
        size_t h = hash(k), i = h & mask_;
        while (ids_[i] >= 0)
            i = (i + 1) & mask_;
        ids_[i]  = id;
        tags_[i] = static_cast<uint32_t>(h >> 32);
    }
    int32_t find(std::string_view k) const {
        if (ids_.empty()) return -1;
        size_t h = hash(k), i = h & mask_;
        auto tag = static_cast<uint32_t>(h >> 32);
        for (; ids_[i] >= 0; i = (i + 1) & mask_)
            if (tags_[i] == tag && (*keys_)[ids_[i]] == k) return ids_[i];
        return -1;
    }

private:
    static size_t hash(std::string_view k) {
        uint64_t h = std::hash<std::string_view>{}(k);
        h ^= h >> 29;
        return static_cast<size_t>(h * 0x9E3779B97F4A7C15ULL);
    }
    const std::vector<std::string>* keys_;
    std::vector<int32_t> ids_;
    std::vector<uint32_t> tags_;
    size_t mask_ = 0;
};

// Byte trie over added-token patterns; values index Impl::added.
class Trie {
public:
    bool empty() const { return values_.size() <= 1; }
    void insert(std::string_view pat, int32_t value) {
        if (values_.empty()) values_.push_back(-1);
        uint32_t node = 0;
        for (unsigned char c : pat) {
            const uint64_t* child = edges_.get(key(node, c));
            if (child) {
                node = static_cast<uint32_t>(*child);
            } else {
                auto next = static_cast<uint32_t>(values_.size());
                values_.push_back(-1);
                edges_.set(key(node, c), next);
                node = next;
            }
        }
        first_[static_cast<unsigned char>(pat[0])] = true;
        values_[node]                              = value;
    }
    // Longest pattern starting at s[pos]: returns its value and sets *end, or -1.
    int32_t longest(std::string_view s, size_t pos, size_t* end) const {
        if (!first_[static_cast<unsigned char>(s[pos])]) return -1;
        uint32_t node = 0;
        int32_t best  = -1;
        for (size_t j = pos; j < s.size(); ++j) {
            const uint64_t* child = edges_.get(key(node, static_cast<unsigned char>(s[j])));
            if (!child) break;
            node = static_cast<uint32_t>(*child);
            if (values_[node] >= 0) best = values_[node], *end = j + 1;
        }
        return best;
    }

private:
    static uint64_t key(uint32_t node, unsigned char c) { return (uint64_t{node} << 8) | c; }
    U64Map edges_;
    std::vector<int32_t> values_;
    bool first_[256] = {};
};

// ---- pipeline descriptions -------------------------------------------------------------------

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitStep {
    std::string pattern;
    SplitBehavior behavior;
};

struct ReplaceStep {
    std::string pattern, content;
};

struct DecodeStep {
    enum Kind { Replace, ByteFallback, Fuse, Strip } kind;
    std::string pattern, content; // Replace; Strip uses content (one char)
    size_t start = 0, stop = 0;   // Strip
};

struct AddedToken {
    int32_t id;
    std::string content;
    bool special, normalized, lstrip, rstrip, single_word;
};

struct Segment {
    size_t begin, end;
    int32_t added; // index into Impl::added, or -1 for ordinary text
};

struct Merge {
    uint32_t rank, pos;
    int32_t new_id;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct Symbol {
    int32_t id, prev, next;
    bool alive;
};

bool parse_string_pattern(const json& j, std::string* out, std::string* err, const char* where) {
    if (!j.is_object() || !j.contains("String") || !j["String"].is_string()) {
        *err = std::string("tokenizer.json: ") + where + ": only {\"String\": ...} patterns are supported";
        return false;
    }
    *out = j["String"].get<std::string>();
    if (out->empty()) {
        *err = std::string("tokenizer.json: ") + where + ": empty pattern";
        return false;
    }
    return true;
}

} // namespace

// ---- Impl ------------------------------------------------------------------------------------

struct Tokenizer::Impl {
    std::vector<std::string> model_pieces; // id -> model vocab string
    StrIndex vocab{&model_pieces};
    size_t vocab_count = 0;
    StrIdMap added_ids;                                       // added-token content -> id
    std::vector<std::string_view> pieces;                     // id -> added content, else model vocab string
    std::unordered_map<int32_t, std::string> decode_override; // normalized form of normalized added tokens
    std::vector<uint8_t> present, special;
    std::vector<AddedToken> added;
    Trie raw_trie, normalized_trie;

    U64Map merges;                // (a << 32 | b) -> (rank << 32 | new_id)
    std::vector<int32_t> bmp_ids; // code point < 0x10000 -> id of the 1-char token, or -1
    std::unordered_map<uint32_t, int32_t> astral_ids;
    int32_t byte_ids[256];
    int32_t unk   = -1;
    bool fuse_unk = false, byte_fallback = false, ignore_merges = false;

    std::vector<ReplaceStep> normalizer;
    std::vector<SplitStep> pre_tokenizer;
    bool has_decoder = false;
    std::vector<DecodeStep> decoder;
    std::vector<int32_t> prefix, suffix; // post_processor single template
    int32_t bos = -1, eos = -1, pad = -1;

    bool load(std::string_view text, std::string* err);
    bool load_model(const json& m, std::string* err);
    bool load_added(const json& a, std::string* err);
    bool load_normalizer(const json& n, std::string* err);
    bool load_pre_tokenizer(const json& p, std::string* err);
    bool load_post_processor(const json& p, std::string* err);
    bool load_decoder(const json& d, std::string* err);

    void normalize(std::string_view s, std::string* out) const;
    void split_added(std::string_view s, const Trie& trie, std::vector<Segment>* out) const;
    void pre_tokenize(std::string_view s, std::vector<std::pair<size_t, size_t>>* words) const;
    void bpe(std::string_view word, std::vector<int32_t>* out) const;
    void encode(std::string_view text, bool add_special, std::vector<int32_t>* ids) const;
    void decode(const int32_t* ids, size_t n, bool skip_special, std::string* out) const;

    int32_t char_id(uint32_t cp) const {
        if (cp < 0x10000) return bmp_ids[cp];
        auto it = astral_ids.find(cp);
        return it == astral_ids.end() ? -1 : it->second;
    }
};

bool Tokenizer::Impl::load(std::string_view text, std::string* err) {
    // The depth bound also bounds the recursive walks of normalizer, pre_tokenizer and decoder Sequences.
    if (std::string e = json_depth_error(text); !e.empty()) return *err = "tokenizer.json: " + e, false;
    json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return *err = "tokenizer.json is not valid JSON", false;
    if (!j.is_object()) return *err = "tokenizer.json: top level is not an object", false;
    if (j.contains("version") && !(j["version"].is_string() && j["version"] == "1.0"))
        return *err = "tokenizer.json: unsupported version (expected \"1.0\")", false;
    for (const char* k : {"truncation", "padding"})
        if (j.contains(k) && !j[k].is_null())
            return *err = std::string("tokenizer.json: ") + k + " is not supported", false;
    if (!j.contains("model")) return *err = "tokenizer.json: no model", false;
    if (!load_model(j["model"], err)) return false;
    if (!load_added(j.contains("added_tokens") ? j["added_tokens"] : json::array(), err)) return false;
    if (!load_normalizer(j.contains("normalizer") ? j["normalizer"] : json(), err)) return false;
    if (!load_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), err)) return false;
    if (!load_post_processor(j.contains("post_processor") ? j["post_processor"] : json(), err)) return false;
    if (!load_decoder(j.contains("decoder") ? j["decoder"] : json(), err)) return false;

    // Added tokens with normalized=true are matched (and decoded) in their normalized form.
    for (size_t i = 0; i < added.size(); ++i) {
        AddedToken& t = added[i];
        if (!t.normalized) {
            raw_trie.insert(t.content, static_cast<int32_t>(i));
            continue;
        }
        std::string norm;
        normalize(t.content, &norm);
        if (norm.empty()) continue;
        normalized_trie.insert(norm, static_cast<int32_t>(i));
        if (norm != t.content) decode_override[t.id] = norm;
    }
    auto lookup = [&](std::string_view s) {
        int32_t id = find_id(added_ids, s);
        return id >= 0 ? id : vocab.find(s);
    };
    bos = lookup("<bos>");
    if (bos < 0 && !prefix.empty()) bos = prefix[0];
    eos = lookup("<eos>");
    pad = lookup("<pad>");
    return true;
}

bool Tokenizer::Impl::load_model(const json& m, std::string* err) {
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string())
        return *err = "tokenizer.json: model has no type", false;
    if (m["type"] != "BPE")
        return *err =
                   "tokenizer.json: unsupported model type '" + m["type"].get<std::string>() + "' (only BPE)",
               false;
    auto flag     = [&](const char* k) { return m.contains(k) && m[k].is_boolean() && m[k].get<bool>(); };
    fuse_unk      = flag("fuse_unk");
    byte_fallback = flag("byte_fallback");
    ignore_merges = flag("ignore_merges");
    if (m.contains("dropout") && !m["dropout"].is_null() &&
        !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
        return *err = "tokenizer.json: BPE dropout is not supported", false;
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
            return *err = std::string("tokenizer.json: BPE ") + k + " is not supported", false;

    if (!m.contains("vocab") || !m["vocab"].is_object())
        return *err = "tokenizer.json: BPE vocab missing", false;
    const json& v  = m["vocab"];
    int64_t max_id = -1;
    // Ids are 0..N-1 for N entries: an id past that leaves a hole (and would size the tables by a hostile
    // number); one id twice is caught below.
    const int64_t n_vocab = static_cast<int64_t>(v.size());
    for (auto it = v.begin(); it != v.end(); ++it) {
        if (!it.value().is_number_integer())
            return *err = "tokenizer.json: vocab id of '" + printable(it.key()) + "' is not an integer",
                   false;
        int64_t id = it.value().get<int64_t>();
        if (it.value().is_number_unsigned() && it.value().get<uint64_t>() > uint64_t(INT64_MAX))
            id = INT64_MAX;
        if (id < 0 || id >= n_vocab || id >= (int64_t{1} << 30))
            return *err = "tokenizer.json: vocab id " + std::to_string(id) + " of '" + printable(it.key()) +
                          "' is outside 0.." + std::to_string(n_vocab - 1) + " (the vocab has " +
                          std::to_string(n_vocab) + " entries, so its ids must be 0..N-1 without gaps)",
                   false;
        max_id = std::max(max_id, id);
    }
    model_pieces.assign(static_cast<size_t>(max_id + 1), std::string());
    present.assign(model_pieces.size(), 0);
    special.assign(model_pieces.size(), 0);
    bmp_ids.assign(0x10000, -1);
    vocab.reserve(v.size());
    vocab_count = v.size();
    for (auto it = v.begin(); it != v.end(); ++it) {
        auto id = it.value().get<int32_t>();
        if (present[id])
            return *err = "tokenizer.json: two vocab entries share id " + std::to_string(id), false;
        const std::string& s = it.key();
        model_pieces[id]     = s;
        present[id]          = 1;
        vocab.insert(id);
        uint32_t cp;
        if (!s.empty() && is_valid_utf8(s) && decode_cp(s, 0, &cp) == s.size()) {
            if (cp < 0x10000)
                bmp_ids[cp] = id;
            else
                astral_ids[cp] = id;
        }
    }
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        byte_ids[b] = vocab.find(name);
    }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
        unk = vocab.find(m["unk_token"].get<std::string>());
        if (unk < 0) return *err = "tokenizer.json: unk_token is not in the vocab", false;
    } else if (m.contains("unk_token") && !m["unk_token"].is_null()) {
        return *err = "tokenizer.json: unk_token is not a string", false;
    }

    if (!m.contains("merges") || !m["merges"].is_array())
        return *err = "tokenizer.json: BPE merges missing", false;
    const json& ms = m["merges"];
    merges.reserve(ms.size());
    std::string ab;
    for (size_t rank = 0; rank < ms.size(); ++rank) {
        const json& e = ms[rank];
        std::string_view a, b;
        if (e.is_string()) {
            std::string_view s = e.get_ref<const std::string&>();
            size_t sp          = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                return *err = "tokenizer.json: merge '" + std::string(s) + "' is not of the form 'a b'",
                       false;
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            a = e[0].get_ref<const std::string&>();
            b = e[1].get_ref<const std::string&>();
        } else {
            return *err = "tokenizer.json: malformed merge entry " + std::to_string(rank), false;
        }
        ab.assign(a).append(b);
        int32_t ia = vocab.find(a), ib = vocab.find(b), inew = vocab.find(ab);
        if (ia < 0 || ib < 0 || inew < 0)
            return *err = "tokenizer.json: merge '" + std::string(a) + " " + std::string(b) +
                          "' uses a token not in the vocab",
                   false;
        merges.set((uint64_t(uint32_t(ia)) << 32) | uint32_t(ib), (uint64_t(rank) << 32) | uint32_t(inew));
    }
    return true;
}

bool Tokenizer::Impl::load_added(const json& a, std::string* err) {
    if (!a.is_array()) return *err = "tokenizer.json: added_tokens is not an array", false;
    // Ids follow HF's AddedVocabulary: the model vocab id when the content is in the vocab,
    // otherwise the next free id after the model vocab (the JSON "id" is informational there).
    int64_t next_id = static_cast<int64_t>(vocab_count);
    std::unordered_map<int32_t, size_t> index_of_id;
    for (const json& t : a) {
        if (!t.is_object() || !t.contains("content") || !t["content"].is_string())
            return *err = "tokenizer.json: malformed added token", false;
        AddedToken tok;
        tok.content = t["content"].get<std::string>();
        auto flag   = [&](const char* k, bool dflt) {
            return t.contains(k) && t[k].is_boolean() ? t[k].get<bool>() : dflt;
        };
        tok.special     = flag("special", false);
        tok.normalized  = flag("normalized", !tok.special);
        tok.lstrip      = flag("lstrip", false);
        tok.rstrip      = flag("rstrip", false);
        tok.single_word = flag("single_word", false);
        if (tok.content.empty()) continue;
        if (!is_valid_utf8(tok.content))
            return *err = "tokenizer.json: added token is not valid UTF-8", false;
        int32_t id = find_id(added_ids, tok.content);
        if (id < 0) id = vocab.find(tok.content);
        if (id < 0) {
            if (next_id >= (int64_t{1} << 30)) return *err = "tokenizer.json: too many added tokens", false;
            id = static_cast<int32_t>(next_id++);
        }
        tok.id                 = id;
        added_ids[tok.content] = id;
        auto [it, inserted]    = index_of_id.emplace(id, added.size());
        if (inserted)
            added.push_back(std::move(tok));
        else
            added[it->second] = std::move(tok);
    }
    size_t n = model_pieces.size();
    for (const AddedToken& t : added)
        n = std::max(n, static_cast<size_t>(t.id) + 1);
    present.resize(n, 0);
    special.resize(n, 0);
    pieces.assign(model_pieces.begin(), model_pieces.end());
    pieces.resize(n);
    for (const AddedToken& t : added) {
        pieces[t.id]  = t.content;
        present[t.id] = 1;
        special[t.id] = t.special;
    }
    return true;
}

bool Tokenizer::Impl::load_normalizer(const json& n, std::string* err) {
    if (n.is_null()) return true;
    if (!n.is_object() || !n.contains("type") || !n["type"].is_string())
        return *err = "tokenizer.json: malformed normalizer", false;
    const std::string type = n["type"].get<std::string>();
    if (type == "Sequence") {
        if (!n.contains("normalizers") || !n["normalizers"].is_array())
            return *err = "tokenizer.json: malformed normalizer Sequence", false;
        for (const json& s : n["normalizers"])
            if (!load_normalizer(s, err)) return false;
        return true;
    }
    if (type == "Replace") {
        ReplaceStep r;
        if (!n.contains("pattern") ||
            !parse_string_pattern(n["pattern"], &r.pattern, err, "normalizer Replace"))
            return false;
        if (!n.contains("content") || !n["content"].is_string())
            return *err = "tokenizer.json: normalizer Replace has no content", false;
        r.content = n["content"].get<std::string>();
        normalizer.push_back(std::move(r));
        return true;
    }
    return *err = "tokenizer.json: unsupported normalizer '" + type + "'", false;
}

bool Tokenizer::Impl::load_pre_tokenizer(const json& p, std::string* err) {
    if (p.is_null()) return true;
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
        return *err = "tokenizer.json: malformed pre_tokenizer", false;
    const std::string type = p["type"].get<std::string>();
    if (type == "Sequence") {
        if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
            return *err = "tokenizer.json: malformed pre_tokenizer Sequence", false;
        for (const json& s : p["pretokenizers"])
            if (!load_pre_tokenizer(s, err)) return false;
        return true;
    }
    if (type == "Split") {
        SplitStep s;
        if (!p.contains("pattern") ||
            !parse_string_pattern(p["pattern"], &s.pattern, err, "pre_tokenizer Split"))
            return false;
        if (p.contains("invert") && p["invert"].is_boolean() && p["invert"].get<bool>())
            return *err = "tokenizer.json: pre_tokenizer Split with invert=true is not supported", false;
        static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
            {"Removed", SplitBehavior::Removed},
            {"Isolated", SplitBehavior::Isolated},
            {"MergedWithPrevious", SplitBehavior::MergedWithPrevious},
            {"MergedWithNext", SplitBehavior::MergedWithNext},
            {"Contiguous", SplitBehavior::Contiguous},
        };
        if (!p.contains("behavior") || !p["behavior"].is_string())
            return *err = "tokenizer.json: pre_tokenizer Split has no behavior", false;
        const std::string b = p["behavior"].get<std::string>();
        auto it             = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                                           [&](const auto& kv) { return b == kv.first; });
        if (it == std::end(kBehaviors))
            return *err = "tokenizer.json: unknown Split behavior '" + b + "'", false;
        s.behavior = it->second;
        pre_tokenizer.push_back(std::move(s));
        return true;
    }
    return *err = "tokenizer.json: unsupported pre_tokenizer '" + type + "'", false;
}

bool Tokenizer::Impl::load_post_processor(const json& p, std::string* err) {
    if (p.is_null()) return true;
    if (!p.is_object() || !p.contains("type") || p["type"] != "TemplateProcessing")
        return *err = "tokenizer.json: unsupported post_processor (only TemplateProcessing)", false;
    if (!p.contains("single") || !p["single"].is_array())
        return *err = "tokenizer.json: TemplateProcessing has no single template", false;
    const json& specials = p.contains("special_tokens") ? p["special_tokens"] : json::object();
    bool seen_seq        = false;
    for (const json& item : p["single"]) {
        if (item.is_object() && item.contains("Sequence")) {
            if (seen_seq) return *err = "tokenizer.json: TemplateProcessing single has two sequences", false;
            seen_seq = true;
            continue;
        }
        if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
            !item["SpecialToken"]["id"].is_string())
            return *err = "tokenizer.json: malformed TemplateProcessing item", false;
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
            !specials[name]["ids"].is_array())
            return *err = "tokenizer.json: TemplateProcessing special token '" + name + "' is undefined",
                   false;
        for (const json& id : specials[name]["ids"]) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
                id.get<int64_t>() >= int64_t(pieces.size()))
                return *err = "tokenizer.json: TemplateProcessing id out of range", false;
            (seen_seq ? suffix : prefix).push_back(id.get<int32_t>());
        }
    }
    if (!seen_seq) return *err = "tokenizer.json: TemplateProcessing single has no sequence", false;
    return true;
}

bool Tokenizer::Impl::load_decoder(const json& d, std::string* err) {
    if (d.is_null()) return true;
    has_decoder = true;
    if (!d.is_object() || !d.contains("type") || !d["type"].is_string())
        return *err = "tokenizer.json: malformed decoder", false;
    const std::string type = d["type"].get<std::string>();
    DecodeStep s{};
    if (type == "Sequence") {
        if (!d.contains("decoders") || !d["decoders"].is_array())
            return *err = "tokenizer.json: malformed decoder Sequence", false;
        for (const json& x : d["decoders"])
            if (!load_decoder(x, err)) return false;
        return true;
    } else if (type == "Replace") {
        s.kind = DecodeStep::Replace;
        if (!d.contains("pattern") || !parse_string_pattern(d["pattern"], &s.pattern, err, "decoder Replace"))
            return false;
        if (!d.contains("content") || !d["content"].is_string())
            return *err = "tokenizer.json: decoder Replace has no content", false;
        s.content = d["content"].get<std::string>();
    } else if (type == "ByteFallback") {
        s.kind = DecodeStep::ByteFallback;
    } else if (type == "Fuse") {
        s.kind = DecodeStep::Fuse;
    } else if (type == "Strip") {
        s.kind = DecodeStep::Strip;
        if (!d.contains("content") || !d["content"].is_string() || !d.contains("start") ||
            !d["start"].is_number_unsigned() || !d.contains("stop") || !d["stop"].is_number_unsigned())
            return *err = "tokenizer.json: malformed decoder Strip", false;
        s.content = d["content"].get<std::string>();
        uint32_t cp;
        if (s.content.empty() || !is_valid_utf8(s.content) ||
            decode_cp(s.content, 0, &cp) != s.content.size())
            return *err = "tokenizer.json: decoder Strip content must be one character", false;
        s.start = d["start"].get<size_t>();
        s.stop  = d["stop"].get<size_t>();
    } else {
        return *err = "tokenizer.json: unsupported decoder '" + type + "'", false;
    }
    decoder.push_back(std::move(s));
    return true;
}

// ---- encoding --------------------------------------------------------------------------------

void Tokenizer::Impl::normalize(std::string_view s, std::string* out) const {
    out->assign(s);
    std::string tmp;
    for (const ReplaceStep& r : normalizer) {
        replace_all(*out, r.pattern, r.content, &tmp);
        out->swap(tmp);
    }
}

// HF AddedVocabulary::find_matches: leftmost-longest matches, then single_word/lstrip/rstrip.
void Tokenizer::Impl::split_added(std::string_view s, const Trie& trie, std::vector<Segment>* out) const {
    if (trie.empty()) {
        if (!s.empty()) out->push_back({0, s.size(), -1});
        return;
    }
    size_t start_offset = 0, pos = 0;
    while (pos < s.size()) {
        size_t mend = 0;
        int32_t idx = trie.longest(s, pos, &mend);
        if (idx < 0) {
            ++pos;
            continue;
        }
        size_t start = pos, stop = mend;
        pos                   = mend;
        const AddedToken& tok = added[idx];
        uint32_t cp;
        if (tok.single_word) {
            bool start_space = start == 0 || (decode_cp(s, prev_cp_start(s, start), &cp), !is_word_cp(cp));
            bool stop_space  = stop == s.size() || (decode_cp(s, stop, &cp), !is_word_cp(cp));
            if (!start_space || !stop_space) continue;
        }
        if (tok.lstrip) {
            size_t ns = start;
            while (ns > start_offset) {
                size_t p = prev_cp_start(s, ns);
                decode_cp(s, p, &cp);
                if (!is_unicode_space(cp)) break;
                ns = p;
            }
            start = std::max(ns, start_offset);
        }
        if (tok.rstrip) {
            while (stop < s.size()) {
                size_t len = decode_cp(s, stop, &cp);
                if (!is_unicode_space(cp)) break;
                stop += len;
            }
        }
        start = std::max(start, start_offset);
        stop  = std::max(stop, start);
        if (start_offset < start) out->push_back({start_offset, start, -1});
        out->push_back({start, stop, idx});
        start_offset = stop;
    }
    if (start_offset < s.size()) out->push_back({start_offset, s.size(), -1});
}

// HF Split pre-tokenizer with a literal pattern, applied step by step.
void Tokenizer::Impl::pre_tokenize(std::string_view s, std::vector<std::pair<size_t, size_t>>* words) const {
    words->clear();
    if (s.empty()) return;
    words->push_back({0, s.size()});
    std::vector<std::pair<size_t, size_t>> next;
    std::vector<std::pair<std::pair<size_t, size_t>, bool>> parts;
    for (const SplitStep& step : pre_tokenizer) {
        next.clear();
        for (auto [b, e] : *words) {
            parts.clear();
            std::string_view w = s.substr(b, e - b);
            size_t i           = 0;
            while (true) {
                size_t j = w.find(step.pattern, i);
                if (j == std::string_view::npos) break;
                if (j > i) parts.push_back({{b + i, b + j}, false});
                parts.push_back({{b + j, b + j + step.pattern.size()}, true});
                i = j + step.pattern.size();
            }
            if (i < w.size()) parts.push_back({{b + i, e}, false});

            std::vector<std::pair<size_t, size_t>> pieces_out;
            bool prev_match = false;
            switch (step.behavior) {
            case SplitBehavior::Removed:
                for (auto& [r, m] : parts)
                    if (!m) pieces_out.push_back(r);
                break;
            case SplitBehavior::Isolated:
                for (auto& [r, m] : parts)
                    pieces_out.push_back(r);
                break;
            case SplitBehavior::MergedWithPrevious:
                for (auto& [r, m] : parts) {
                    if (m && !prev_match && !pieces_out.empty())
                        pieces_out.back().second = r.second;
                    else
                        pieces_out.push_back(r);
                    prev_match = m;
                }
                break;
            case SplitBehavior::MergedWithNext:
                for (size_t k = parts.size(); k-- > 0;) {
                    auto& [r, m] = parts[k];
                    if (m && !prev_match && !pieces_out.empty())
                        pieces_out.back().first = r.first;
                    else
                        pieces_out.push_back(r);
                    prev_match = m;
                }
                std::reverse(pieces_out.begin(), pieces_out.end());
                break;
            case SplitBehavior::Contiguous:
                for (size_t k = 0; k < parts.size(); ++k) {
                    auto& [r, m] = parts[k];
                    if (k > 0 && m == prev_match)
                        pieces_out.back().second = r.second;
                    else
                        pieces_out.push_back(r);
                    prev_match = m;
                }
                break;
            }
            for (auto& r : pieces_out)
                if (r.second > r.first) next.push_back(r);
        }
        words->swap(next);
    }
}

// HF BPE::merge_word + Word::merge_all: per-character ids (byte fallback / fused unk), then
// merges in (rank, position) order from a priority queue over a linked list of symbols.
void Tokenizer::Impl::bpe(std::string_view w, std::vector<int32_t>* out) const {
    if (w.empty()) return;
    if (ignore_merges) {
        int32_t id = vocab.find(w);
        if (id >= 0) return out->push_back(id);
    }
    std::vector<Symbol> sym;
    sym.reserve(w.size());
    auto add = [&](int32_t id) {
        auto n = static_cast<int32_t>(sym.size());
        if (n > 0) sym.back().next = n;
        sym.push_back({id, n - 1, -1, true});
    };
    bool pending_unk = false;
    for (size_t i = 0; i < w.size();) {
        uint32_t cp;
        size_t len = decode_cp(w, i, &cp);
        int32_t id = char_id(cp);
        if (id >= 0) {
            if (pending_unk) add(unk), pending_unk = false;
            add(id);
        } else {
            bool fell_back = byte_fallback;
            for (size_t k = 0; fell_back && k < len; ++k)
                fell_back = byte_ids[static_cast<unsigned char>(w[i + k])] >= 0;
            if (fell_back) {
                for (size_t k = 0; k < len; ++k)
                    add(byte_ids[static_cast<unsigned char>(w[i + k])]);
            } else if (unk >= 0) {
                if (pending_unk && !fuse_unk) add(unk);
                pending_unk = true;
            }
        }
        i += len;
    }
    if (pending_unk) add(unk);

    auto lookup = [&](int32_t a, int32_t b) {
        return merges.get((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
    };
    std::vector<Merge> heap_storage;
    heap_storage.reserve(sym.size());
    std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> queue(std::greater<Merge>{},
                                                                              std::move(heap_storage));
    for (size_t i = 0; i + 1 < sym.size(); ++i)
        if (const uint64_t* m = lookup(sym[i].id, sym[i + 1].id))
            queue.push({uint32_t(*m >> 32), uint32_t(i), int32_t(uint32_t(*m))});
    while (!queue.empty()) {
        Merge top = queue.top();
        queue.pop();
        Symbol& cur = sym[top.pos];
        if (!cur.alive || cur.next < 0) continue;
        Symbol right      = sym[cur.next];
        const uint64_t* m = lookup(cur.id, right.id);
        if (!m || int32_t(uint32_t(*m)) != top.new_id) continue;
        sym[cur.next].alive = false;
        cur.id              = top.new_id;
        cur.next            = right.next;
        if (right.next >= 0) sym[right.next].prev = static_cast<int32_t>(top.pos);
        if (cur.prev >= 0)
            if (const uint64_t* pm = lookup(sym[cur.prev].id, cur.id))
                queue.push({uint32_t(*pm >> 32), uint32_t(cur.prev), int32_t(uint32_t(*pm))});
        if (cur.next >= 0)
            if (const uint64_t* nm = lookup(cur.id, sym[cur.next].id))
                queue.push({uint32_t(*nm >> 32), top.pos, int32_t(uint32_t(*nm))});
    }
    for (const Symbol& s : sym)
        if (s.alive) out->push_back(s.id);
}

void Tokenizer::Impl::encode(std::string_view input, bool add_special, std::vector<int32_t>* ids) const {
    ids->clear();
    std::string sanitized;
    std::string_view text = input;
    if (!is_valid_utf8(input)) {
        sanitized = sanitize_utf8(input);
        text      = sanitized;
    }
    if (add_special) ids->insert(ids->end(), prefix.begin(), prefix.end());

    std::vector<Segment> raw, norm_segs;
    split_added(text, raw_trie, &raw);
    std::string normalized;
    std::vector<std::pair<size_t, size_t>> words;
    for (const Segment& seg : raw) {
        if (seg.added >= 0) {
            ids->push_back(added[seg.added].id);
            continue;
        }
        normalize(text.substr(seg.begin, seg.end - seg.begin), &normalized);
        norm_segs.clear();
        split_added(normalized, normalized_trie, &norm_segs);
        for (const Segment& ns : norm_segs) {
            if (ns.added >= 0) {
                ids->push_back(added[ns.added].id);
                continue;
            }
            std::string_view part = std::string_view(normalized).substr(ns.begin, ns.end - ns.begin);
            pre_tokenize(part, &words);
            for (auto [b, e] : words)
                bpe(part.substr(b, e - b), ids);
        }
    }
    if (add_special) ids->insert(ids->end(), suffix.begin(), suffix.end());
}

// ---- decoding --------------------------------------------------------------------------------

void Tokenizer::Impl::decode(const int32_t* ids, size_t n, bool skip_special, std::string* out) const {
    out->clear();
    std::vector<std::string> toks;
    toks.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        int32_t id = ids[i];
        if (id < 0 || static_cast<size_t>(id) >= pieces.size() || !present[id]) continue;
        if (skip_special && special[id]) continue;
        if (!decode_override.empty()) {
            auto it = decode_override.find(id);
            if (it != decode_override.end()) {
                toks.push_back(it->second);
                continue;
            }
        }
        toks.emplace_back(pieces[id]);
    }
    if (!has_decoder) {
        for (size_t i = 0; i < toks.size(); ++i) {
            if (i) out->push_back(' ');
            out->append(toks[i]);
        }
        return;
    }
    std::string tmp;
    for (const DecodeStep& step : decoder) {
        switch (step.kind) {
        case DecodeStep::Replace:
            for (std::string& t : toks) {
                if (t.find(step.pattern) == std::string::npos) continue;
                replace_all(t, step.pattern, step.content, &tmp);
                t.swap(tmp);
            }
            break;
        case DecodeStep::ByteFallback: {
            std::vector<std::string> res;
            res.reserve(toks.size());
            std::string bytes;
            size_t nbytes = 0;
            auto flush    = [&] {
                if (nbytes == 0) return;
                if (is_valid_utf8(bytes)) {
                    res.push_back(bytes);
                } else {
                    for (size_t k = 0; k < nbytes; ++k)
                        res.emplace_back(kReplacementChar);
                }
                bytes.clear();
                nbytes = 0;
            };
            for (std::string& t : toks) {
                // Rust's u8::from_str_radix(&t[3..5], 16): two hex digits, or '+' and one digit.
                auto hex = [](char c) {
                    if (c >= '0' && c <= '9') return c - '0';
                    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
                    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
                    return -1;
                };
                int value = -1;
                if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
                    int hi = hex(t[3]), lo = hex(t[4]);
                    if (hi >= 0 && lo >= 0)
                        value = hi * 16 + lo;
                    else if (t[3] == '+' && lo >= 0)
                        value = lo;
                }
                if (value >= 0) {
                    bytes.push_back(static_cast<char>(value));
                    ++nbytes;
                } else {
                    flush();
                    res.push_back(std::move(t));
                }
            }
            flush();
            toks.swap(res);
            break;
        }
        case DecodeStep::Fuse: {
            std::string all;
            for (const std::string& t : toks)
                all += t;
            toks.assign(1, std::move(all));
            break;
        }
        case DecodeStep::Strip:
            for (std::string& t : toks) {
                std::vector<size_t> starts; // byte offset of each code point
                const auto* p = reinterpret_cast<const unsigned char*>(t.data());
                for (size_t i = 0; i < t.size(); i += std::max<size_t>(1, valid_seq_len(p, t.size(), i)))
                    starts.push_back(i);
                size_t nchars = starts.size(), cut_start = 0, cut_stop = nchars;
                auto char_is = [&](size_t k) {
                    size_t e = k + 1 < nchars ? starts[k + 1] : t.size();
                    return std::string_view(t).substr(starts[k], e - starts[k]) == step.content;
                };
                for (size_t k = 0; k < std::min(step.start, nchars) && char_is(k); ++k)
                    cut_start = k + 1;
                for (size_t k = 0; k < std::min(step.stop, nchars) && char_is(nchars - 1 - k); ++k)
                    cut_stop = nchars - 1 - k;
                if (cut_stop <= cut_start) {
                    t.clear();
                } else {
                    size_t b = starts[cut_start], e = cut_stop < nchars ? starts[cut_stop] : t.size();
                    t = t.substr(b, e - b);
                }
            }
            break;
        }
    }
    for (const std::string& t : toks)
        out->append(t);
}

// ---- public API ------------------------------------------------------------------------------

Tokenizer::Tokenizer()                                = default;
Tokenizer::~Tokenizer()                               = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept            = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

bool Tokenizer::load_from_json(std::string_view json_text, Tokenizer* out, std::string* err) {
    std::string local;
    std::string* e = err ? err : &local;
    if (!out) return *e = "Tokenizer::load_from_json: null output", false;
    out->impl_.reset();
    try {
        auto impl = std::make_unique<Impl>();
        if (!impl->load(json_text, e)) return false;
        out->impl_ = std::move(impl);
        return true;
    } catch (const std::bad_alloc&) {
        *e = "tokenizer.json: out of memory";
    } catch (const std::exception& ex) {
        *e = std::string("tokenizer.json: ") + ex.what();
    } catch (...) {
        *e = "tokenizer.json: unknown error";
    }
    return false;
}

bool Tokenizer::encode(std::string_view text, bool add_special, std::vector<int32_t>* ids,
                       std::string* err) const {
    std::string local;
    std::string* e = err ? err : &local;
    if (!impl_) return *e = "tokenizer not loaded", false;
    if (!ids) return *e = "encode: null output", false;
    try {
        impl_->encode(text, add_special, ids);
        return true;
    } catch (const std::exception& ex) {
        *e = std::string("encode: ") + ex.what();
    } catch (...) {
        *e = "encode: unknown error";
    }
    ids->clear();
    return false;
}

bool Tokenizer::decode(const int32_t* ids, size_t n, bool skip_special, std::string* out) const {
    if (!impl_ || !out || (!ids && n)) return false;
    try {
        impl_->decode(ids, n, skip_special, out);
        return true;
    } catch (...) {
        out->clear();
        return false;
    }
}

bool Tokenizer::decode_concatenates() const {
    return impl_ && impl_->has_decoder &&
           std::none_of(impl_->decoder.begin(), impl_->decoder.end(),
                        [](const DecodeStep& d) { return d.kind == DecodeStep::Strip; });
}

std::string_view Tokenizer::token_to_piece(int32_t id) const {
    if (!impl_ || id < 0 || static_cast<size_t>(id) >= impl_->pieces.size()) return {};
    return impl_->pieces[id];
}

int32_t Tokenizer::id_of(std::string_view token) const {
    if (!impl_) return -1;
    int32_t id = find_id(impl_->added_ids, token);
    return id >= 0 ? id : impl_->vocab.find(token);
}

bool Tokenizer::is_special(int32_t id) const {
    return impl_ && id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}

int32_t Tokenizer::vocab_size() const {
    return impl_ ? static_cast<int32_t>(impl_->pieces.size()) : 0;
}
int32_t Tokenizer::bos_id() const {
    return impl_ ? impl_->bos : -1;
}
int32_t Tokenizer::eos_id() const {
    return impl_ ? impl_->eos : -1;
}
int32_t Tokenizer::pad_id() const {
    return impl_ ? impl_->pad : -1;
}
int32_t Tokenizer::unk_id() const {
    return impl_ ? impl_->unk : -1;
}

std::string sanitize_utf8(std::string_view bytes) {
    std::string out;
    try {
        out.reserve(bytes.size());
        const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
        size_t n = bytes.size(), i = 0;
        while (i < n) {
            bool valid;
            size_t len = scan_utf8(p, n, i, &valid);
            if (valid)
                out.append(bytes.data() + i, len);
            else
                out.append(kReplacementChar);
            i += len;
        }
    } catch (...) {
        out.clear();
    }
    return out;
}

} // namespace g4
