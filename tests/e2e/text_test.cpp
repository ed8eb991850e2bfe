// Text in, text out: `g4 run -p`, `g4 chat`, `g4 tokenize`, the C API's text functions, streaming
// generation with stop strings, and the embedding example program, on the embedded tiny model
// (tests/fixtures/e2b_tiny with its 512-token tokenizer).
#include "g4/g4.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using namespace g4test;
using json = nlohmann::json;

class Text : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_  = new TempDir();
        plan_ = dir_->file("tiny.g4plan");
        CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' --weights bf16 -o '" + plan_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        open_ = g4_engine_open(plan_.c_str(), nullptr, &engine_);
        ASSERT_EQ(open_, G4_OK) << g4_last_error_message();
    }
    static void TearDownTestSuite() {
        g4_engine_close(engine_);
        delete dir_;
    }
    static std::vector<int32_t> tokenize(const std::string& text, bool special) {
        size_t n = 0;
        EXPECT_EQ(g4_tokenize(engine_, text.data(), text.size(), special, nullptr, 0, &n), text.empty() && !special ? G4_OK : G4_ERR_BUFFER_TOO_SMALL);
        std::vector<int32_t> ids(n);
        EXPECT_EQ(g4_tokenize(engine_, text.data(), text.size(), special, ids.data(), ids.size(), &n), G4_OK);
        return ids;
    }
    static std::string detok(const std::vector<int32_t>& ids, bool skip) {
        size_t n = 0;
        g4_detokenize(engine_, ids.data(), ids.size(), skip, nullptr, 0, &n);
        std::string s(n, '\0');
        EXPECT_EQ(g4_detokenize(engine_, ids.data(), ids.size(), skip, s.data(), s.size(), &n), G4_OK);
        return s;
    }
    static TempDir* dir_;
    static std::string plan_;
    static g4_engine* engine_;
    static g4_status open_;
};
TempDir* Text::dir_ = nullptr;
std::string Text::plan_;
g4_engine* Text::engine_ = nullptr;
g4_status Text::open_    = G4_OK;

TEST_F(Text, TokenizerInPlanMatchesHF) {
    json cases = json::parse(read_file(fixture("tokenizer/tiny_cases.json")));
    auto& list = cases.is_array() ? cases : cases.at("cases");
    int checked = 0;
    for (auto& c : list) {
        if (!c.contains("text") || !c.contains("ids") || !c["text"].is_string()) continue;
        std::string text = c["text"];
        EXPECT_EQ(tokenize(text, false), c["ids"].get<std::vector<int32_t>>()) << text;
        if (++checked >= 40) break;
    }
    EXPECT_GT(checked, 10);
    std::vector<int32_t> with_bos = tokenize("hello", true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos[0], 2);
    EXPECT_EQ(detok(tokenize("The cat sat.\nOn the mat!", false), false), "The cat sat.\nOn the mat!");
}

TEST_F(Text, TokenizeCommandWithPlanAndWithTokenizerJson) {
    CmdResult a = run_g4("tokenize --tokenizer '" + plan_ + "' --add-special -- 'the cat'");
    CmdResult b = run_g4("tokenize --tokenizer '" + fixture("e2b_tiny/tokenizer.json") + "' --add-special -- 'the cat'");
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(parse_ids(a.out), tokenize("the cat", true));
}

TEST_F(Text, InvalidUtf8IsReplacedLikeHF) {
    // HF sees only valid strings: bytes.decode("utf-8", errors="replace") turns each invalid byte into U+FFFD.
    std::string bad = std::string("ok") + "\xff" + "\xc3";
    EXPECT_EQ(tokenize(bad, false), tokenize("ok\xEF\xBF\xBD\xEF\xBF\xBD", false));
}

TEST_F(Text, RunWithPromptPrintsTheDecodedContinuation) {
    CmdResult ids = run_g4("run '" + plan_ + "' -p 'Hello there' -n 12 --temp 0 --ignore-eos --print-ids");
    CmdResult txt = run_g4("run '" + plan_ + "' -p 'Hello there' -n 12 --temp 0 --ignore-eos");
    ASSERT_EQ(ids.exit_code, 0) << ids.err;
    ASSERT_EQ(txt.exit_code, 0) << txt.err;
    std::vector<int32_t> gen = parse_ids(ids.out);
    EXPECT_EQ(gen.size(), 12u);
    EXPECT_EQ(txt.out, detok(gen, true) + "\n");
    // Same as feeding the ids of "<bos>Hello there" explicitly.
    std::string csv;
    for (int32_t t : tokenize("Hello there", true)) csv += (csv.empty() ? "" : ",") + std::to_string(t);
    CmdResult viaids = run_g4("run '" + plan_ + "' --tokens " + csv + " -n 12 --temp 0 --ignore-eos");
    EXPECT_EQ(viaids.out, ids.out);
}

TEST_F(Text, BenchMeasuresPromptAndDecodeInOneProcess) {
    CmdResult r = run_g4("bench '" + plan_ + "' -p 8,40 -n 6 -d 0,30 -r 2 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json j = json::parse(r.out);
    ASSERT_EQ(j.size(), 4u);
    const char* names[] = {"pp8", "pp40", "tg6@d0", "tg6@d30"};
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(j[i]["test"], names[i]);
        EXPECT_EQ(j[i]["ms"].size(), 2u);
        const double a = j[i]["ms"][0].get<double>(), b = j[i]["ms"][1].get<double>(), lo = a < b ? a : b, hi = a < b ? b : a;
        EXPECT_GT(lo, 0.0);
        EXPECT_NEAR((double)j[i]["median_ms"], 0.5 * (lo + hi), 1e-9);
        EXPECT_NEAR((double)j[i]["tok_s"], (int)j[i]["tokens"] * 1000.0 / (double)j[i]["median_ms"], 1e-6);
    }
    CmdResult table = run_g4("bench '" + plan_ + "' -p 8 -n 2 -r 1");
    ASSERT_EQ(table.exit_code, 0) << table.err;
    EXPECT_NE(table.out.find("tg2@d0"), std::string::npos) << table.out;
    CmdResult big = run_g4("bench '" + plan_ + "' -d 100000");
    EXPECT_NE(big.exit_code, 0);
    EXPECT_NE(big.err.find("max context"), std::string::npos) << big.err;
}

TEST_F(Text, PromptLongerThanContext) {
    TempDir td;
    std::string small = td.file("small.g4plan");
    ASSERT_EQ(run_g4("compile --model '" + fixture("e2b_tiny") + "' --weights bf16 --max-context 24 -o '" + small + "'").exit_code, 0);
    std::string longp(200, 'a');
    for (size_t i = 0; i < longp.size(); i += 2) longp[i] = ' ';
    CmdResult r = run_g4("run '" + small + "' -p '" + longp + "' -n 4");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("max context is 24"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--truncate"), std::string::npos) << r.err;
    CmdResult t = run_g4("run '" + small + "' -p '" + longp + "' -n 4 --truncate --temp 0 --print-ids");
    EXPECT_EQ(t.exit_code, 0) << t.err;
    EXPECT_NE(t.err.find("truncated"), std::string::npos);
    EXPECT_LE(parse_ids(t.out).size(), 4u);
}

TEST_F(Text, PlanWithoutTokenizerRefusesText) {
    TempDir td;
    std::string p = td.file("notok.g4plan");
    ASSERT_EQ(run_g4("compile --model '" + fixture("e4b_tiny") + "' --weights bf16 -o '" + p + "'").exit_code, 0);
    CmdResult r = run_g4("run '" + p + "' -p 'hi'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("no tokenizer"), std::string::npos) << r.err;
    CmdResult t = run_g4("run '" + p + "' --tokens 2,5 -n 3 --temp 0 --ignore-eos");
    EXPECT_EQ(t.exit_code, 0) << t.err;
    EXPECT_EQ(parse_ids(t.out).size(), 3u);
}

TEST_F(Text, OutOfRangeSamplingValuesAreErrors) {
    for (std::string bad : {"--temp -1", "--top-p 0", "--top-p 1.5", "--min-p 2", "--repeat-penalty 0", "--top-k -3"}) {
        CmdResult r = run_g4("run '" + plan_ + "' -p hi -n 2 " + bad);
        EXPECT_NE(r.exit_code, 0) << bad;
        EXPECT_FALSE(r.err.empty()) << bad;
    }
}

struct Collected {
    std::vector<int32_t> ids;
    std::string text;
};
int32_t collect(void* u, int32_t tok, const char* text, size_t len) {
    auto* c = (Collected*)u;
    if (tok >= 0) c->ids.push_back(tok);
    c->text.append(text, len);
    return 0;
}

TEST_F(Text, GenerateStreamsTheDetokenizedTextAndHonoursStopStrings) {
    g4_session* s = nullptr;
    ASSERT_EQ(g4_session_create(engine_, nullptr, &s), G4_OK);
    std::vector<int32_t> p = tokenize("Once upon a time", true);
    ASSERT_EQ(g4_session_append_tokens(s, p.data(), p.size(), nullptr, 0), G4_OK);
    g4_generate_params gp = g4_generate_params_default();
    gp.max_tokens = 24;
    gp.ignore_eos = 1;
    Collected all;
    int32_t n = 0;
    ASSERT_EQ(g4_session_generate(s, nullptr, &gp, collect, &all, &n), G4_OK);
    EXPECT_EQ(n, 24);
    EXPECT_EQ(all.text, detok(all.ids, true));
    EXPECT_EQ(g4_session_position(s), (int32_t)(p.size() + 24));

    // Stop at a substring of that text: the text before it is delivered, not the stop string.
    ASSERT_GE(all.text.size(), 6u);
    std::string stop = all.text.substr(all.text.size() / 2, 2);
    size_t at        = all.text.find(stop);
    const char* stops[] = {stop.c_str()};
    gp.stop   = stops;
    gp.n_stop = 1;
    ASSERT_EQ(g4_session_reset(s), G4_OK);
    ASSERT_EQ(g4_session_append_tokens(s, p.data(), p.size(), nullptr, 0), G4_OK);
    Collected cut;
    ASSERT_EQ(g4_session_generate(s, nullptr, &gp, collect, &cut, &n), G4_OK);
    EXPECT_EQ(cut.text, all.text.substr(0, at));
    EXPECT_LT(n, 24);
    g4_session_destroy(s);
}

TEST_F(Text, DestroyedHandlesAreRejected) {
    g4_session* s = nullptr;
    ASSERT_EQ(g4_session_create(engine_, nullptr, &s), G4_OK);
    g4_session_destroy(s);
    int32_t t = 2;
    EXPECT_EQ(g4_session_append_tokens(s, &t, 1, nullptr, 0), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_session_generate(s, nullptr, nullptr, nullptr, nullptr, nullptr), G4_ERR_INVALID_ARGUMENT);
    g4_session_destroy(s);   // double destroy is a no-op
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan_.c_str(), nullptr, &e), G4_OK);
    g4_engine_close(e);
    size_t n;
    EXPECT_EQ(g4_tokenize(e, "x", 1, 0, nullptr, 0, &n), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_session_create(e, nullptr, &s), G4_ERR_INVALID_ARGUMENT);
}

TEST_F(Text, ChatRendersGemmaTurnsAndRunsMultiTurn) {
    g4_chat_message msgs[] = {{"system", "Be brief."}, {"user", "  Hi  "}, {"assistant", "Hello."}, {"user", "Again"}};
    size_t n = 0;
    ASSERT_EQ(g4_chat_render(engine_, msgs, 4, 1, nullptr, 0, &n), G4_ERR_BUFFER_TOO_SMALL);
    std::string out(n, '\0');
    ASSERT_EQ(g4_chat_render(engine_, msgs, 4, 1, out.data(), out.size(), &n), G4_OK);
    EXPECT_EQ(out, "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello.<turn|>\n"
                   "<|turn>user\nAgain<turn|>\n<|turn>model\n");

    CmdResult r = run_cmd("(printf 'Hello\\nHow are you\\n/reset\\nHi\\n/exit\\nignored\\n' | '" + cli_path() + "' chat '" + plan_ +
                          "' -n 8 --temp 0)");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // Three replies (one line each) and the reset notice, nothing after /exit.
    size_t lines = std::count(r.out.begin(), r.out.end(), '\n');
    EXPECT_EQ(lines, 4u) << r.out;
    EXPECT_NE(r.out.find("[conversation reset]"), std::string::npos);
    // After /reset, "Hi" gets the same reply as a fresh conversation with "Hi".
    CmdResult fresh = run_cmd("(printf 'Hi\\n' | '" + cli_path() + "' chat '" + plan_ + "' -n 8 --temp 0)");
    ASSERT_EQ(fresh.exit_code, 0);
    EXPECT_EQ(r.out.substr(r.out.rfind("]\n") + 2), fresh.out);
}

TEST_F(Text, ExampleProgramEmbedsTheRuntime) {
    CmdResult r = run_cmd(std::string("'") + G4_EXAMPLE_PATH + "' '" + plan_ + "' 'Hello'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("[16 tokens]"), std::string::npos) << r.out;
    CmdResult bad = run_cmd(std::string("'") + G4_EXAMPLE_PATH + "' /nonexistent.g4plan hi");
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("/nonexistent.g4plan"), std::string::npos);
}

} // namespace
