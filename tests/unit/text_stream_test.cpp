// TextStream (runtime/src/text_stream.h): the incremental decoding g4_session_generate uses gives, token by
// token, exactly the pieces, stops and held-back text of decoding the whole generation every step, with
// the real 262K Gemma tokenizer and the tiny fixture's, over random generations full of byte-fallback
// runs, special tokens between bytes, unknown ids and stop strings.
#include "runtime/src/text_stream.h"
#include "runtime/src/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

// Extracted at configure time from tests/fixtures/tokenizer/gemma3/tokenizer.json.tar.xz (CMakeLists.txt).
const std::string kGemmaPath = G4_GEMMA_TOKENIZER;

struct Streamed {
    std::vector<std::string> pieces;
    int stop_at = -1; // push index that reported a stop
    std::string rest; // flush()
};

Streamed run(const g4::Tokenizer& tk, const std::vector<int32_t>& ids, const std::vector<std::string>& stops,
             bool incremental) {
    g4::TextStream ts(&tk, stops, incremental);
    Streamed r;
    for (size_t i = 0; i < ids.size(); ++i) {
        bool stop = false;
        r.pieces.emplace_back(ts.push(ids[i], &stop));
        if (stop) {
            r.stop_at = (int)i;
            break;
        }
    }
    r.rest = std::string(ts.flush());
    return r;
}

// Random generations: mostly ordinary tokens, runs of byte tokens (valid UTF-8 sequences and broken
// ones), special tokens (also between two bytes), ids the vocabulary does not have.
std::vector<int32_t> random_ids(std::mt19937& rng, const g4::Tokenizer& tk, int n, int32_t byte0,
                                const std::vector<int32_t>& specials) {
    std::vector<int32_t> ids;
    while ((int)ids.size() < n) {
        const int k = rng() % 10;
        if (k < 5) {
            ids.push_back(byte0 + 260 + (int32_t)(rng() % (uint32_t)(tk.vocab_size() - byte0 - 260)));
        } else if (k < 7) { // a UTF-8 sequence as byte tokens: 2-4 bytes, sometimes cut short
            const int len  = 2 + rng() % 3;
            const int lead = len == 2 ? 0xC3 : len == 3 ? 0xE4 : 0xF0;
            ids.push_back(byte0 + lead);
            for (int b = 1; b < len; ++b)
                if (rng() % 6) ids.push_back(byte0 + 0x80 + (int32_t)(rng() % 0x30));
        } else if (k < 8) {
            ids.push_back(byte0 + (int32_t)(rng() % 256));
        } else if (k < 9) {
            ids.push_back(specials[rng() % specials.size()]);
        } else {
            ids.push_back(rng() % 2 ? tk.vocab_size() + 5 : byte0 + 0x41);
        }
    }
    ids.resize(n);
    return ids;
}

void check_tokenizer(const g4::Tokenizer& tk, int32_t byte0, const std::vector<int32_t>& specials, int trials,
                     int len) {
    ASSERT_TRUE(tk.decode_concatenates());
    std::mt19937 rng(17);
    size_t stops_hit = 0, pieces = 0;
    for (int t = 0; t < trials; ++t) {
        std::vector<int32_t> ids = random_ids(rng, tk, len, byte0, specials);
        std::string whole;
        ASSERT_TRUE(tk.decode(ids.data(), ids.size(), true, &whole));
        // No stops: every piece in order plus the flush is the whole text, both ways.
        Streamed a = run(tk, ids, {}, true), b = run(tk, ids, {}, false);
        ASSERT_EQ(a.pieces, b.pieces) << "trial " << t;
        EXPECT_EQ(a.rest, b.rest);
        std::string joined;
        for (const auto& p : a.pieces)
            joined += p;
        EXPECT_EQ(joined + a.rest, whole) << "trial " << t;
        pieces += a.pieces.size();
        // Stop strings taken from the text (and one that never occurs): the same pieces and stop both
        // ways, and the delivered text is the text before the first stop string.
        // (ASCII stops: a transient U+FFFD of an unfinished byte run can never match them.)
        if (whole.size() < 8) continue;
        std::string stop0;
        for (int tries = 0; tries < 50 && stop0.empty(); ++tries) {
            const size_t at  = rng() % (whole.size() - 4);
            std::string cand = whole.substr(at, 1 + rng() % 4);
            if (std::all_of(cand.begin(), cand.end(), [](char ch) { return (unsigned char)ch < 0x80; }))
                stop0 = cand;
        }
        if (stop0.empty()) continue;
        std::vector<std::string> stops = {stop0, "\x01never\x02"};
        Streamed c = run(tk, ids, stops, true), d = run(tk, ids, stops, false);
        ASSERT_EQ(c.pieces, d.pieces) << "trial " << t;
        EXPECT_EQ(c.stop_at, d.stop_at);
        EXPECT_EQ(c.rest, d.rest);
        std::string got;
        for (const auto& p : c.pieces)
            got += p;
        got += c.rest;
        const size_t first = whole.find(stops[0]);
        if (c.stop_at >= 0) {
            ++stops_hit;
            EXPECT_EQ(got, whole.substr(0, std::min(first, got.size()))) << "trial " << t;
            EXPECT_EQ(got.find(stops[0]), std::string::npos);
        }
    }
    EXPECT_GT(stops_hit, (size_t)trials / 4);
    EXPECT_GT(pieces, (size_t)trials);
}

} // namespace

TEST(TextStream, IncrementalMatchesWholeDecodesWithTheGemmaTokenizer) {
    auto tk = std::make_unique<g4::Tokenizer>();
    std::string err;
    ASSERT_TRUE(std::ifstream(kGemmaPath).good())
        << "Gemma tokenizer not found at " << kGemmaPath
        << " (re-run cmake to extract tests/fixtures/tokenizer/gemma3/tokenizer.json.tar.xz)";
    const std::string json = g4test::read_file(kGemmaPath);
    ASSERT_TRUE(g4::Tokenizer::load_from_json(json, tk.get(), &err)) << err;
    const int32_t byte0 = tk->id_of("<0x00>");
    ASSERT_EQ(tk->id_of("<0x0A>"), byte0 + 10);
    check_tokenizer(*tk, byte0, {1, 2, 105, 106}, 60, 300);
}

TEST(TextStream, IncrementalMatchesWholeDecodesWithTheTinyTokenizer) {
    g4::Tokenizer tk;
    std::string err;
    ASSERT_TRUE(g4::Tokenizer::load_from_json(
        g4test::read_file(g4test::fixture("tokenizer/tiny/tokenizer.json")), &tk, &err))
        << err;
    const int32_t byte0 = tk.id_of("<0x00>");
    ASSERT_EQ(byte0, 108);
    // The tiny vocabulary's ordinary tokens start after the bytes (108 + 256 = 364).
    check_tokenizer(tk, byte0, {1, 2, 105, 106}, 200, 120);
}

TEST(TextStream, NoTokenizerGivesNoText) {
    g4::TextStream ts(nullptr, {"x"});
    bool stop = true;
    EXPECT_TRUE(ts.push(5, &stop).empty());
    EXPECT_FALSE(stop);
    EXPECT_TRUE(ts.flush().empty());
}
