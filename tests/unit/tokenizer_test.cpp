// Tokenizer tests: ids and decodes against HF `tokenizers` references (tools/make_tokenizer_fixtures.py)
// for the real Gemma tokenizer and the tiny fixture tokenizer, invalid UTF-8, and malformed JSON.
#include "runtime/src/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <random>

namespace {

using json = nlohmann::json;

// Extracted at configure time from tests/fixtures/tokenizer/gemma3/tokenizer.json.tar.xz (CMakeLists.txt).
const std::string kGemmaPath = G4_GEMMA_TOKENIZER;

std::string from_hex(const std::string& hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
        out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return out;
}

std::string show(const std::string& s) {
    std::string out = s.substr(0, 60);
    return "\"" + out + (s.size() > 60 ? "...\"" : "\"") + " (" + std::to_string(s.size()) + " bytes)";
}

json load_json(const std::string& rel) {
    return json::parse(g4test::read_file(g4test::fixture(rel)));
}

// Checks every case of a *_cases.json file against `tok`; returns the number of cases checked.
size_t check_cases(const g4::Tokenizer& tok, const json& doc, bool expect_roundtrip) {
    size_t n = 0;
    for (const json& c : doc["cases"]) {
        const std::string text = c["text"];
        const auto want        = c["ids"].get<std::vector<int32_t>>();
        std::vector<int32_t> ids;
        std::string err;
        EXPECT_TRUE(tok.encode(text, false, &ids, &err)) << err;
        EXPECT_EQ(ids, want) << "encode " << show(text);

        std::string dec;
        EXPECT_TRUE(tok.decode(want.data(), want.size(), false, &dec));
        EXPECT_EQ(dec, c["decoded"].get<std::string>()) << "decode " << show(text);
        if (expect_roundtrip) {
            // decode(encode(x)) == x, except that a literal "▁" in the input decodes to " " (as in HF).
            std::string want_text;
            for (size_t i = 0; i < text.size(); ++i) {
                if (text.compare(i, 3, "\xE2\x96\x81") == 0)
                    want_text += ' ', i += 2;
                else
                    want_text += text[i];
            }
            EXPECT_EQ(dec, want_text) << "round trip " << show(text);
        }

        std::string dec_skip;
        EXPECT_TRUE(tok.decode(want.data(), want.size(), true, &dec_skip));
        EXPECT_EQ(dec_skip, c.value("decoded_skip_special", c["decoded"].get<std::string>())) << show(text);

        if (c.contains("ids_with_special")) {
            EXPECT_TRUE(tok.encode(text, true, &ids));
            EXPECT_EQ(ids, c["ids_with_special"].get<std::vector<int32_t>>()) << "add_special " << show(text);
        }
        ++n;
    }
    for (const json& c : doc.value("invalid_utf8", json::array())) {
        const std::string bytes = from_hex(c["hex"]);
        EXPECT_EQ(g4::sanitize_utf8(bytes), c["replaced"].get<std::string>()) << c["hex"];
        std::vector<int32_t> ids;
        EXPECT_TRUE(tok.encode(bytes, false, &ids));
        EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << "invalid UTF-8 " << c["hex"];
        ++n;
    }
    for (const json& c : doc.value("decode", json::array())) {
        const auto ids = c["ids"].get<std::vector<int32_t>>();
        std::string dec;
        EXPECT_TRUE(tok.decode(ids.data(), ids.size(), false, &dec));
        EXPECT_EQ(dec, c["decoded"].get<std::string>()) << c["ids"];
        EXPECT_TRUE(tok.decode(ids.data(), ids.size(), true, &dec));
        EXPECT_EQ(dec, c["decoded_skip_special"].get<std::string>()) << c["ids"];
        ++n;
    }
    return n;
}

// ---- real Gemma tokenizer ----------------------------------------------------------------------

class GemmaTokenizer : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (!g4test::file_exists(kGemmaPath)) return;
        tok_ = std::make_unique<g4::Tokenizer>();
        std::string err;
        auto t0 = std::chrono::steady_clock::now();
        ASSERT_TRUE(g4::Tokenizer::load_from_json(g4test::read_file(kGemmaPath), tok_.get(), &err)) << err;
        load_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    static void TearDownTestSuite() { tok_.reset(); }
    void SetUp() override {
        ASSERT_TRUE(tok_)
            << "Gemma tokenizer not found at " << kGemmaPath
            << " (re-run cmake to extract tests/fixtures/tokenizer/gemma3/tokenizer.json.tar.xz)";
    }
    static std::unique_ptr<g4::Tokenizer> tok_;
    static double load_s_;
};
std::unique_ptr<g4::Tokenizer> GemmaTokenizer::tok_;
double GemmaTokenizer::load_s_ = 0;

TEST_F(GemmaTokenizer, Metadata) {
    const json doc = load_json("tokenizer/gemma3_cases.json");
    EXPECT_EQ(tok_->vocab_size(), doc["vocab_size_with_added"].get<int32_t>());
    EXPECT_EQ(tok_->bos_id(), 2);
    EXPECT_EQ(tok_->eos_id(), 1);
    EXPECT_EQ(tok_->pad_id(), 0);
    EXPECT_EQ(tok_->unk_id(), 3);
    EXPECT_EQ(tok_->id_of("<start_of_turn>"), 105);
    EXPECT_EQ(tok_->id_of("\n"), 107);
    EXPECT_EQ(tok_->id_of("<0x0A>"), 248);
    EXPECT_EQ(tok_->id_of("no such token, surely"), -1);
    EXPECT_EQ(tok_->token_to_piece(105), "<start_of_turn>");
    EXPECT_EQ(tok_->token_to_piece(-1), "");
    EXPECT_EQ(tok_->token_to_piece(tok_->vocab_size()), "");
    EXPECT_TRUE(tok_->is_special(2));
    EXPECT_FALSE(tok_->is_special(107));
    std::cout << "[ INFO     ] Gemma tokenizer.json loaded in " << load_s_ << " s\n";
}

TEST_F(GemmaTokenizer, MatchesHuggingFace) {
    const json doc = load_json("tokenizer/gemma3_cases.json");
    size_t n       = check_cases(*tok_, doc, /*expect_roundtrip=*/true);
    EXPECT_GE(doc["cases"].size(), 200u);
    std::cout << "[ INFO     ] " << n << " Gemma reference cases checked\n";
}

TEST_F(GemmaTokenizer, UnknownIdsAreSkippedWhenDecoding) {
    const int32_t ids[] = {-5, 9259, 1 << 30, 1902, tok_->vocab_size()};
    std::string out;
    ASSERT_TRUE(tok_->decode(ids, 5, false, &out));
    EXPECT_EQ(out, "Hello world");
    EXPECT_TRUE(tok_->decode(nullptr, 0, false, &out));
    EXPECT_EQ(out, "");
}

TEST_F(GemmaTokenizer, LongInputWithoutSpacesIsFast) {
    std::mt19937 rng(5);
    std::string s;
    for (int i = 0; i < 200000; ++i)
        s.push_back(static_cast<char>('a' + rng() % 26));
    std::vector<int32_t> ids;
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(tok_->encode(s, false, &ids));
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string back;
    ASSERT_TRUE(tok_->decode(ids.data(), ids.size(), false, &back));
    EXPECT_EQ(back, s);
    EXPECT_LT(sec, 2.0) << "200 KB without separators took " << sec << " s";
}

// Random byte strings never crash and always decode back to the sanitized input.
TEST_F(GemmaTokenizer, RandomBytesRoundTripThroughSanitizer) {
    std::mt19937 rng(11);
    for (int iter = 0; iter < 300; ++iter) {
        std::string s(rng() % 64, '\0');
        const char alphabet[] = "ab <\n\t\xE4\xB8\xAD>";
        for (char& c : s)
            c = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : alphabet[rng() % (sizeof alphabet - 1)]);
        std::vector<int32_t> ids;
        ASSERT_TRUE(tok_->encode(s, iter % 2 == 0, &ids));
        std::string back;
        ASSERT_TRUE(tok_->decode(ids.data(), ids.size(), true, &back));
        EXPECT_EQ(back, g4::sanitize_utf8(s));
    }
}

// One-off throughput measurement: 1 MB of mixed text on one core.
TEST_F(GemmaTokenizer, DISABLED_Speed) {
    const json doc = load_json("tokenizer/gemma3_cases.json");
    std::string text;
    while (text.size() < (1u << 20))
        for (const json& c : doc["cases"])
            text += c["text"].get<std::string>() + " ";
    text.resize(1u << 20);
    text = g4::sanitize_utf8(text);
    std::vector<int32_t> ids;
    double best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        ASSERT_TRUE(tok_->encode(text, false, &ids));
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::string back;
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(tok_->decode(ids.data(), ids.size(), false, &back));
    double dsec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "[ INFO     ] encode " << text.size() << " bytes -> " << ids.size() << " ids in "
              << best * 1e3 << " ms (" << text.size() / best / 1e6 << " MB/s); decode " << dsec * 1e3
              << " ms\n";
}

// ---- tiny fixture tokenizer ------------------------------------------------------------------

class TinyTokenizer : public ::testing::Test {
protected:
    void SetUp() override {
        std::string err;
        ASSERT_TRUE(g4::Tokenizer::load_from_json(
            g4test::read_file(g4test::fixture("tokenizer/tiny/tokenizer.json")), &tok_, &err))
            << err;
    }
    g4::Tokenizer tok_;
};

TEST_F(TinyTokenizer, Layout) {
    EXPECT_EQ(tok_.vocab_size(), 512);
    EXPECT_EQ(tok_.pad_id(), 0);
    EXPECT_EQ(tok_.eos_id(), 1);
    EXPECT_EQ(tok_.bos_id(), 2);
    EXPECT_EQ(tok_.unk_id(), 3);
    EXPECT_EQ(tok_.id_of("<|turn>"), 105);
    EXPECT_EQ(tok_.id_of("<turn|>"), 106);
    EXPECT_EQ(tok_.id_of("\n"), 107);
    EXPECT_EQ(tok_.id_of("<0x00>"), 108);
    EXPECT_EQ(tok_.id_of("<0xFF>"), 363);
    EXPECT_TRUE(tok_.is_special(105));
    EXPECT_TRUE(tok_.is_special(106));
    EXPECT_FALSE(tok_.is_special(107));
}

TEST_F(TinyTokenizer, MatchesHuggingFace) {
    const json doc = load_json("tokenizer/tiny_cases.json");
    EXPECT_EQ(tok_.vocab_size(), doc["vocab_size_with_added"].get<int32_t>());
    size_t n = check_cases(tok_, doc, /*expect_roundtrip=*/true);
    std::cout << "[ INFO     ] " << n << " tiny reference cases checked\n";
}

// HF ByteFallback decoding: an invalid run of byte tokens gives one U+FFFD per byte token.
TEST_F(TinyTokenizer, ByteFallbackDecoding) {
    const int32_t b = tok_.id_of("<0x00>");
    auto dec        = [&](std::vector<int32_t> ids) {
        std::string out;
        EXPECT_TRUE(tok_.decode(ids.data(), ids.size(), false, &out));
        return out;
    };
    EXPECT_EQ(dec({b + 0xE4, b + 0xB8, b + 0xAD}), "\xE4\xB8\xAD");
    EXPECT_EQ(dec({b + 0xE4}), "\xEF\xBF\xBD");
    EXPECT_EQ(dec({b + 0xE4, b + 0xB8}), "\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(dec({b + 0xE4, b + 0xB8, b + 0xAD, b + 0xFF}),
              "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(dec({b + 0xC3, 105, b + 0xA9}), "\xEF\xBF\xBD<|turn>\xEF\xBF\xBD");
}

// Pipeline options Gemma does not use (added-token flags, Split behaviors, Sequence steps, Strip,
// no decoder, unk without byte fallback, ignore_merges), each checked against HF.
TEST(TinyVariants, MatchHuggingFace) {
    const json doc  = load_json("tokenizer/tiny_cases.json");
    const json base = load_json("tokenizer/tiny/tokenizer.json");
    ASSERT_GE(doc["variants"].size(), 5u);
    for (const json& v : doc["variants"]) {
        SCOPED_TRACE(v["name"].get<std::string>());
        json j = base;
        for (auto it = v["patch"].begin(); it != v["patch"].end(); ++it) {
            if (it.key().rfind("model.", 0) == 0)
                j["model"][it.key().substr(6)] = it.value();
            else
                j[it.key()] = it.value();
        }
        for (const json& t : v["extra_added"])
            j["added_tokens"].push_back(t);
        g4::Tokenizer tok;
        std::string err;
        ASSERT_TRUE(g4::Tokenizer::load_from_json(j.dump(), &tok, &err)) << err;
        check_cases(tok, v, /*expect_roundtrip=*/false);
    }
}

TEST_F(TinyTokenizer, EncodeIsThreadSafeAndMovable) {
    g4::Tokenizer moved = std::move(tok_);
    EXPECT_FALSE(tok_.loaded());
    std::vector<int32_t> ids;
    EXPECT_FALSE(tok_.encode("x", false, &ids));
    ASSERT_TRUE(moved.encode("Hello world", true, &ids));
    EXPECT_EQ(ids.front(), 2);
}

// ---- malformed input -------------------------------------------------------------------------

bool load(const std::string& text, std::string* err) {
    g4::Tokenizer t;
    bool ok = g4::Tokenizer::load_from_json(text, &t, err);
    EXPECT_EQ(ok, t.loaded());
    return ok;
}

json tiny_json() {
    return load_json("tokenizer/tiny/tokenizer.json");
}

TEST(TokenizerLoad, MalformedJsonIsAnError) {
    std::string err;
    for (const char* bad :
         {"", "{", "[]", "null", "42", "{\"model\": 5}", "{\"model\": {}}", "{\"version\": \"1.0\"}"}) {
        err.clear();
        EXPECT_FALSE(load(bad, &err)) << bad;
        EXPECT_FALSE(err.empty()) << bad;
    }
    EXPECT_FALSE(g4::Tokenizer::load_from_json("{}", nullptr, &err));
    EXPECT_FALSE(g4::Tokenizer::load_from_json("{", nullptr, nullptr));
}

TEST(TokenizerLoad, UnknownModelTypeIsAnError) {
    json j             = tiny_json();
    j["model"]["type"] = "WordPiece";
    std::string err;
    EXPECT_FALSE(load(j.dump(), &err));
    EXPECT_NE(err.find("WordPiece"), std::string::npos) << err;
}

TEST(TokenizerLoad, UnsupportedComponentsAreErrors) {
    auto expect_error = [](json j, const char* what) {
        std::string err;
        EXPECT_FALSE(load(j.dump(), &err)) << what;
        EXPECT_FALSE(err.empty()) << what;
    };
    json j          = tiny_json();
    j["normalizer"] = {{"type", "NFKC"}};
    expect_error(j, "NFKC normalizer");
    j                  = tiny_json();
    j["pre_tokenizer"] = {{"type", "ByteLevel"}};
    expect_error(j, "ByteLevel pre_tokenizer");
    j            = tiny_json();
    j["decoder"] = {{"type", "WordPiece"}};
    expect_error(j, "WordPiece decoder");
    j = tiny_json();
    j["model"]["merges"].push_back("nosuch token");
    expect_error(j, "merge out of vocab");
    j = tiny_json();
    j["model"]["merges"].push_back("abc");
    expect_error(j, "merge without space");
    j                          = tiny_json();
    j["model"]["vocab"]["bad"] = "x";
    expect_error(j, "string vocab id");
    j                       = tiny_json();
    j["model"]["unk_token"] = "<nope>";
    expect_error(j, "unk not in vocab");
    j               = tiny_json();
    j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "x"}};
    expect_error(j, "regex pattern");
    j                 = tiny_json();
    j["added_tokens"] = 3;
    expect_error(j, "added_tokens not an array");
}

TEST(TokenizerLoad, MergesInPairFormAreAccepted) {
    json j = tiny_json();
    for (json& m : j["model"]["merges"]) {
        if (m.is_array()) {
            m = m[0].get<std::string>() + " " + m[1].get<std::string>();
        } else {
            std::string s = m;
            m             = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
        }
    }
    g4::Tokenizer a, b;
    std::string err;
    ASSERT_TRUE(g4::Tokenizer::load_from_json(j.dump(), &a, &err)) << err;
    ASSERT_TRUE(g4::Tokenizer::load_from_json(
        g4test::read_file(g4test::fixture("tokenizer/tiny/tokenizer.json")), &b, &err));
    std::vector<int32_t> ia, ib;
    a.encode("The model reads the book today.", false, &ia);
    b.encode("The model reads the book today.", false, &ib);
    EXPECT_EQ(ia, ib);
    EXPECT_GT(ia.size(), 0u);
}

// Truncations and byte flips of a valid file must never crash.
TEST(TokenizerLoad, CorruptedFilesDoNotCrash) {
    const std::string good = g4test::read_file(g4test::fixture("tokenizer/tiny/tokenizer.json"));
    std::mt19937 rng(3);
    std::string err;
    for (size_t cut = 0; cut < good.size(); cut += 1 + good.size() / 97)
        EXPECT_FALSE(load(good.substr(0, cut), &err));
    for (int iter = 0; iter < 200; ++iter) {
        std::string s = good;
        for (int k = 0; k < 4; ++k)
            s[rng() % s.size()] = static_cast<char>(rng() % 256);
        g4::Tokenizer t;
        if (g4::Tokenizer::load_from_json(s, &t, &err)) {
            std::vector<int32_t> ids;
            EXPECT_TRUE(t.encode("Hello <|turn> world \xFF", true, &ids));
            std::string out;
            EXPECT_TRUE(t.decode(ids.data(), ids.size(), false, &out));
        }
    }
}

// Every value of the tiny file (outside the vocab and merges) replaced by values of other types.
TEST(TokenizerLoad, WrongTypesDoNotCrash) {
    const json good           = tiny_json();
    const json replacements[] = {
        nullptr, 0, -1, 1.5, "x", json::array(), json::object(), json::array({1, "a"})};
    std::vector<json::json_pointer> paths;
    std::function<void(const json&, const json::json_pointer&)> walk = [&](const json& j,
                                                                           const json::json_pointer& p) {
        paths.push_back(p);
        if (p.to_string() == "/model/vocab" || p.to_string() == "/model/merges") return;
        if (j.is_object())
            for (auto it = j.begin(); it != j.end(); ++it)
                walk(it.value(), p / it.key());
        else if (j.is_array())
            for (size_t i = 0; i < j.size() && i < 3; ++i)
                walk(j[i], p / i);
    };
    walk(good, json::json_pointer());
    paths.push_back(json::json_pointer("/model/merges/0"));
    paths.push_back(json::json_pointer("/model/merges/0/0"));
    paths.push_back(json::json_pointer("/model/vocab/<bos>"));
    std::string err;
    for (const auto& p : paths) {
        for (const json& r : replacements) {
            json j = good;
            j[p]   = r;
            g4::Tokenizer t;
            if (g4::Tokenizer::load_from_json(j.dump(), &t, &err)) {
                std::vector<int32_t> ids;
                EXPECT_TRUE(t.encode("Hello <|turn> world \xFF", true, &ids));
                std::string out;
                EXPECT_TRUE(t.decode(ids.data(), ids.size(), true, &out));
            }
        }
    }
    EXPECT_GT(paths.size(), 50u);
}

TEST(TokenizerLoad, UnloadedTokenizerReportsErrors) {
    g4::Tokenizer t;
    std::vector<int32_t> ids{1, 2};
    std::string err, out = "x";
    EXPECT_FALSE(t.encode("hi", false, &ids, &err));
    EXPECT_FALSE(err.empty());
    EXPECT_FALSE(t.decode(ids.data(), ids.size(), false, &out));
    EXPECT_EQ(t.id_of("<bos>"), -1);
    EXPECT_EQ(t.vocab_size(), 0);
    EXPECT_EQ(t.token_to_piece(0), "");
}

} // namespace
