// Text in, text out: `g4 run -p`, `g4 chat` (with images and audio too), `g4 tokenize`, the C API's text
// functions, streaming generation with stop strings, and the embedding example program, on the embedded
// tiny model (tests/fixtures/e2b_tiny with its 512-token tokenizer).
#include "g4/g4.h"
#include "runtime/src/chat_template.h"
#include "runtime/src/media/audio_io.h"
#include "runtime/src/media/image_io.h"
#include "test_util.h"

#include <algorithm>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
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
        CmdResult r =
            run_g4("compile --model '" + fixture("e2b_tiny") + "' --weights bf16 -o '" + plan_ + "'");
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
        EXPECT_EQ(g4_tokenize(engine_, text.data(), text.size(), special, nullptr, 0, &n),
                  text.empty() && !special ? G4_OK : G4_ERR_BUFFER_TOO_SMALL);
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
    json cases  = json::parse(read_file(fixture("tokenizer/tiny_cases.json")));
    auto& list  = cases.is_array() ? cases : cases.at("cases");
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
    CmdResult b = run_g4("tokenize --tokenizer '" + fixture("e2b_tiny/tokenizer.json") +
                         "' --add-special -- 'the cat'");
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(parse_ids(a.out), tokenize("the cat", true));
}

TEST_F(Text, InvalidUtf8IsReplacedLikeHF) {
    // HF sees only valid strings: bytes.decode("utf-8", errors="replace") turns each invalid byte into
    // U+FFFD.
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
    for (int32_t t : tokenize("Hello there", true))
        csv += (csv.empty() ? "" : ",") + std::to_string(t);
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
        const double a = j[i]["ms"][0].get<double>(), b = j[i]["ms"][1].get<double>(), lo = a < b ? a : b,
                     hi = a < b ? b : a;
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
    ASSERT_EQ(run_g4("compile --model '" + fixture("e2b_tiny") + "' --weights bf16 --max-context 24 -o '" +
                     small + "'")
                  .exit_code,
              0);
    std::string longp(200, 'a');
    for (size_t i = 0; i < longp.size(); i += 2)
        longp[i] = ' ';
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
    ASSERT_EQ(run_g4("compile --model '" + fixture("e4b_tiny") + "' --weights bf16 -o '" + p + "'").exit_code,
              0);
    CmdResult r = run_g4("run '" + p + "' -p 'hi'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("no tokenizer"), std::string::npos) << r.err;
    CmdResult t = run_g4("run '" + p + "' --tokens 2,5 -n 3 --temp 0 --ignore-eos");
    EXPECT_EQ(t.exit_code, 0) << t.err;
    EXPECT_EQ(parse_ids(t.out).size(), 3u);
}

TEST_F(Text, OutOfRangeSamplingValuesAreErrors) {
    for (std::string bad :
         {"--temp -1", "--top-p 0", "--top-p 1.5", "--min-p 2", "--repeat-penalty 0", "--top-k -3"}) {
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
    gp.max_tokens         = 24;
    gp.ignore_eos         = 1;
    Collected all;
    int32_t n = 0;
    ASSERT_EQ(g4_session_generate(s, nullptr, &gp, collect, &all, &n), G4_OK);
    EXPECT_EQ(n, 24);
    EXPECT_EQ(all.text, detok(all.ids, true));
    EXPECT_EQ(g4_session_position(s), (int32_t)(p.size() + 24));

    // Stop at a substring of that text: the text before it is delivered, not the stop string.
    ASSERT_GE(all.text.size(), 6u);
    std::string stop    = all.text.substr(all.text.size() / 2, 2);
    size_t at           = all.text.find(stop);
    const char* stops[] = {stop.c_str()};
    gp.stop             = stops;
    gp.n_stop           = 1;
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
    g4_session_destroy(s); // double destroy is a no-op
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan_.c_str(), nullptr, &e), G4_OK);
    g4_engine_close(e);
    size_t n;
    EXPECT_EQ(g4_tokenize(e, "x", 1, 0, nullptr, 0, &n), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_session_create(e, nullptr, &s), G4_ERR_INVALID_ARGUMENT);
}

TEST_F(Text, ChatRendersGemmaTurnsAndRunsMultiTurn) {
    g4_chat_message msgs[] = {
        {"system", "Be brief."}, {"user", "  Hi  "}, {"assistant", "Hello."}, {"user", "Again"}};
    size_t n = 0;
    ASSERT_EQ(g4_chat_render(engine_, msgs, 4, 1, nullptr, 0, &n), G4_ERR_BUFFER_TOO_SMALL);
    std::string out(n, '\0');
    ASSERT_EQ(g4_chat_render(engine_, msgs, 4, 1, out.data(), out.size(), &n), G4_OK);
    EXPECT_EQ(out,
              "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello.<turn|>\n"
              "<|turn>user\nAgain<turn|>\n<|turn>model\n");

    CmdResult r = run_cmd("(printf 'Hello\\nHow are you\\n/reset\\nHi\\n/exit\\nignored\\n' | '" +
                          cli_path() + "' chat '" + plan_ + "' -n 8 --temp 0)");
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

// `g4 chat` with images and audio, on e2b_tiny_mm (f32, 70 soft tokens an image; its <boi>/<eoi>/<boa>/<eoa>
// are in the tiny vocabulary, so whole prompts can be fed). Each greedy reply must be what `g4 run --tokens`
// gives for the prompt Gemma 4's template and processor make of the conversation so far: an attachment goes
// before the text of its message, "\n\n<|image|>\n\n" per image and "<|audio|>" per clip, each marker
// expanded to <boi>/<boa>, n placeholders, <eoi>/<eoa>.
class ChatWithMedia : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_        = new TempDir();
        plan_       = dir_->file("mm.g4plan");
        CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny_mm") +
                             "' --weights f32 --image-tokens 70 -o '" + plan_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        ASSERT_EQ(g4_engine_open(plan_.c_str(), nullptr, &engine_), G4_OK) << g4_last_error_message();
        ASSERT_EQ(g4_engine_get_media_info(engine_, &mi_), G4_OK);
        // The soft tokens the fixture's image and clip give.
        g4_session_params sp = g4_session_params_default();
        sp.n_threads         = 2;
        g4_session* s        = nullptr;
        ASSERT_EQ(g4_session_create(engine_, &sp, &s), G4_OK);
        g4::media::ImageRGB8 img;
        ASSERT_EQ(g4::media::load_image(png(), &img), "");
        g4::media::AudioPcm pcm;
        ASSERT_EQ(g4::media::load_wav(wav(), &pcm), "");
        ASSERT_EQ(g4_session_add_image(s, img.rgb.data(), img.width, img.height, &n_img_), G4_OK)
            << g4_last_error_message();
        ASSERT_EQ(g4_session_add_audio(s, pcm.samples.data(), (int64_t)pcm.samples.size(), &n_aud_), G4_OK)
            << g4_last_error_message();
        g4_session_destroy(s);
    }
    static void TearDownTestSuite() {
        g4_engine_close(engine_);
        delete dir_;
    }
    static std::string png() { return fixture("towers/image/rgb_37x53.png"); }
    static std::string wav() { return fixture("towers/audio/clip0.wav"); }

    // A prompt built piece by piece: text (tokenized as a whole between media) and media blocks.
    struct Prompt {
        std::vector<int32_t> ids;
        Prompt& text(const std::string& t) {
            size_t n = 0;
            g4_tokenize(engine_, t.data(), t.size(), 0, nullptr, 0, &n);
            std::vector<int32_t> v(n);
            EXPECT_EQ(g4_tokenize(engine_, t.data(), t.size(), 0, v.data(), v.size(), &n), G4_OK);
            ids.insert(ids.end(), v.begin(), v.end());
            return *this;
        }
        Prompt& block(int32_t open, int32_t ph, int32_t n, int32_t close) {
            ids.push_back(open);
            ids.insert(ids.end(), (size_t)n, ph);
            ids.push_back(close);
            return *this;
        }
        Prompt& image() { return block(mi_.boi_token_id, mi_.image_token_id, n_img_, mi_.eoi_token_id); }
        Prompt& audio() { return block(mi_.boa_token_id, mi_.audio_token_id, n_aud_, mi_.eoa_token_id); }
        std::string csv() const {
            std::string c;
            for (int32_t t : ids) {
                if (!c.empty()) c += ',';
                c += std::to_string(t);
            }
            return c;
        }
    };

    // `g4 chat` on `plan` with `input` on stdin; greedy, replies printed as ids, --stats.
    static CmdResult chat(const std::string& input, const std::string& opts = "",
                          const std::string& plan = plan_, int n = 8) {
        static int k         = 0;
        const std::string in = dir_->file("input" + std::to_string(k++) + ".txt");
        write_file(in, input);
        return run_cmd("('" + cli_path() + "' chat '" + plan + "' -n " + std::to_string(n) +
                       " --temp 0 --threads 2 --print-ids --stats " + opts + " < '" + in + "')");
    }
    // The greedy continuation `g4 run` gives for p with the media files `media` ("--image F --audio G").
    static std::string run(const Prompt& p, const std::string& media, int n = 8) {
        CmdResult r = run_g4("run '" + plan_ + "' " + media + " --tokens " + p.csv() + " -n " +
                             std::to_string(n) + " --temp 0 --threads 2");
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.out.substr(0, r.out.find('\n'));
    }
    static std::vector<std::string> lines(const std::string& out) {
        std::vector<std::string> v;
        std::stringstream ss(out);
        for (std::string l; std::getline(ss, l);)
            v.push_back(l);
        return v;
    }
    // Every "<what> N" figure of --stats, in order ("prefill", "images").
    static std::vector<long> stats(const std::string& err, const std::string& what) {
        std::vector<long> v;
        const std::regex re("g4: (?:load .*; )?" + what + " ([0-9]+) ");
        for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end; ++it)
            v.push_back(std::stol((*it)[1]));
        return v;
    }
    static std::string reply_text(const std::string& ids_line) {
        std::vector<int32_t> ids = parse_ids(ids_line);
        size_t n                 = 0;
        g4_detokenize(engine_, ids.data(), ids.size(), 1, nullptr, 0, &n);
        std::string s(n, '\0');
        EXPECT_EQ(g4_detokenize(engine_, ids.data(), ids.size(), 1, s.data(), s.size(), &n), G4_OK);
        return s;
    }

    static TempDir* dir_;
    static std::string plan_;
    static g4_engine* engine_;
    static g4_media_info mi_;
    static int32_t n_img_, n_aud_;
};
TempDir* ChatWithMedia::dir_ = nullptr;
std::string ChatWithMedia::plan_;
g4_engine* ChatWithMedia::engine_ = nullptr;
g4_media_info ChatWithMedia::mi_{};
int32_t ChatWithMedia::n_img_ = 0, ChatWithMedia::n_aud_ = 0;

TEST_F(ChatWithMedia, ImageTurnGivesTheTokensOfRunWithTheSamePrompt) {
    ASSERT_GT(n_img_, 0);
    CmdResult c = chat("/image " + png() + "\nDescribe this\n");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    std::vector<std::string> out = lines(c.out);
    ASSERT_EQ(out.size(), 1u) << c.out;
    EXPECT_FALSE(out[0].empty());
    Prompt p;
    p.text("<bos><|turn>user\n\n\n").image().text("\n\nDescribe this<turn|>\n<|turn>model\n");
    EXPECT_EQ(out[0], run(p, "--image '" + png() + "'"));
    EXPECT_NE(c.err.find("rgb_37x53.png attached"), std::string::npos) << c.err;
    EXPECT_EQ(stats(c.err, "images"), std::vector<long>{n_img_}) << c.err;
    EXPECT_EQ(stats(c.err, "prefill"), std::vector<long>{(long)p.ids.size()}) << c.err;
    // --image on the command line goes with the first message.
    CmdResult o = chat("Describe this\n", "--image '" + png() + "'");
    ASSERT_EQ(o.exit_code, 0) << o.err;
    EXPECT_EQ(o.out, c.out);
}

// Later turns feed only their new tokens: the image's soft tokens stay in the KV cache, its tower does not
// run again, and each reply is that of the whole re-rendered conversation fed at once. The tiny model's
// replies are mostly byte tokens that decode to U+FFFD and re-tokenize otherwise; the first reply here (4
// tokens) re-tokenizes as generated, the second does not, so the third turn starts the session from scratch
// and encodes the image once more, just before its placeholders.
TEST_F(ChatWithMedia, LaterTurnsKeepTheImageInTheCache) {
    CmdResult c = chat("/image " + png() + "\nHow many\nAnd the colours?\nThanks\n", "", plan_, 4);
    ASSERT_EQ(c.exit_code, 0) << c.err;
    std::vector<std::string> out = lines(c.out);
    ASSERT_EQ(out.size(), 3u) << c.out;
    const std::string r1 = std::string(g4::strip_python_whitespace(reply_text(out[0])));
    const std::string r2 = std::string(g4::strip_python_whitespace(reply_text(out[1])));
    const std::string t1 = "\n\nHow many<turn|>\n<|turn>model\n";
    const std::string t2 = t1 + r1 + "<turn|>\n<|turn>user\nAnd the colours?<turn|>\n<|turn>model\n";
    const std::string t3 = t2 + r2 + "<turn|>\n<|turn>user\nThanks<turn|>\n<|turn>model\n";
    Prompt p1, p2, p3;
    p1.text("<bos><|turn>user\n\n\n").image().text(t1);
    p2.text("<bos><|turn>user\n\n\n").image().text(t2);
    p3.text("<bos><|turn>user\n\n\n").image().text(t3);
    EXPECT_EQ(out[0], run(p1, "--image '" + png() + "'", 4));
    EXPECT_EQ(out[1], run(p2, "--image '" + png() + "'", 4));
    EXPECT_EQ(out[2], run(p3, "--image '" + png() + "'", 4));
    // What the session holds after each reply against the next prompt.
    std::vector<int32_t> held1 = p1.ids, held2 = p2.ids;
    for (int32_t t : parse_ids(out[0]))
        held1.push_back(t);
    for (int32_t t : parse_ids(out[1]))
        held2.push_back(t);
    ASSERT_TRUE(std::equal(held1.begin(), held1.end(), p2.ids.begin()))
        << "the first reply no longer re-tokenizes as generated";
    ASSERT_FALSE(std::equal(held2.begin(), held2.end(), p3.ids.begin()))
        << "the second reply re-tokenizes as generated now";
    // --stats after each reply (a restart zeroes them): turn 2 adds its new tokens to turn 1's and encodes
    // nothing; turn 3 feeds its whole prompt and encodes the image again.
    const long n1 = (long)p1.ids.size(), n2 = n1 + (long)(p2.ids.size() - held1.size());
    EXPECT_EQ(stats(c.err, "prefill"), (std::vector<long>{n1, n2, (long)p3.ids.size()})) << c.err;
    EXPECT_EQ(stats(c.err, "images"), (std::vector<long>{n_img_, n_img_, n_img_})) << c.err;
}

// Audio and images in one message (in the order attached), a message of media alone (more soft tokens than
// the session queues at once), and /reset dropping an attachment not yet sent.
TEST_F(ChatWithMedia, AudioImagesMediaOnlyMessagesAndReset) {
    CmdResult c = chat("/audio " + wav() + "\n/image " + png() + "\nWhat is this?\n");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    Prompt p;
    p.text("<bos><|turn>user\n")
        .audio()
        .text("\n\n")
        .image()
        .text("\n\nWhat is this?<turn|>\n<|turn>model\n");
    EXPECT_EQ(c.out, run(p, "--image '" + png() + "' --audio '" + wav() + "'") + "\n");
    EXPECT_NE(c.err.find("audio " + std::to_string(n_aud_) + " soft tokens"), std::string::npos) << c.err;

    // Two images in a message of media alone, on a plan whose session queues one image's soft tokens at a
    // time (each image is encoded just before its placeholders are fed; `g4 run` queues both first).
    TempDir td;
    const std::string small_queue = td.file("queue.g4plan");
    CmdResult comp                = run_g4("compile --model '" + fixture("e2b_tiny_mm") +
                                           "' --weights f32 --image-tokens 70 --no-audio --max-media-tokens " +
                                           std::to_string(n_img_) + " -o '" + small_queue + "'");
    ASSERT_EQ(comp.exit_code, 0) << comp.err;
    CmdResult only = chat("/image " + png() + "\n/image " + png() + "\n\n", "", small_queue);
    ASSERT_EQ(only.exit_code, 0) << only.err;
    Prompt q;
    q.text("<bos><|turn>user\n\n\n").image().text("\n\n\n\n").image().text("\n\n<turn|>\n<|turn>model\n");
    EXPECT_EQ(only.out, run(q, "--image '" + png() + "' --image '" + png() + "'") + "\n");

    CmdResult r =
        chat("/image " + png() + "\n/reset\nDescribe this\n/reset\n/image " + png() + "\nDescribe this\n");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> out = lines(r.out);
    ASSERT_EQ(out.size(), 4u) << r.out;
    EXPECT_EQ(out[0], "[conversation reset]");
    EXPECT_EQ(out[2], "[conversation reset]");
    Prompt text_only, with_image;
    text_only.text("<bos><|turn>user\nDescribe this<turn|>\n<|turn>model\n");
    with_image.text("<bos><|turn>user\n\n\n").image().text("\n\nDescribe this<turn|>\n<|turn>model\n");
    EXPECT_EQ(out[1], run(text_only, ""));
    EXPECT_EQ(out[3], run(with_image, "--image '" + png() + "'"));
    EXPECT_NE(out[1], out[3]);
}

// Errors are reported and the chat goes on as if the failed command or message had not been typed: a missing
// file, a file that is no image, /image without a file, /audio on a plan compiled with --no-audio, a clip the
// tower refuses when the message is sent (too short for one soft token), and a turn that does not fit.
TEST_F(ChatWithMedia, ErrorsKeepTheChatGoing) {
    TempDir td;
    const std::string plan = td.file("noaudio.g4plan");
    CmdResult comp         = run_g4("compile --model '" + fixture("e2b_tiny_mm") +
                                    "' --weights f32 --image-tokens 70 --no-audio --max-context " +
                                    std::to_string(n_img_ + 12) + " -o '" + plan + "'");
    ASSERT_EQ(comp.exit_code, 0) << comp.err;
    const std::string missing = td.file("missing.png"), junk = td.file("junk.png"),
                      short_wav = td.file("short.wav");
    write_file(junk, "not an image at all");
    CmdResult fresh = chat("Hello\n", "", plan);
    ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
    ASSERT_EQ(lines(fresh.out).size(), 1u) << fresh.out;

    CmdResult c = chat("/image " + missing + "\n/image '" + junk + "'\n/image\n/audio " + wav() + "\nHello\n",
                       "", plan);
    ASSERT_EQ(c.exit_code, 0) << c.err;
    EXPECT_EQ(c.out, fresh.out);
    EXPECT_NE(c.err.find("g4 chat: error: cannot open image '" + missing + "': No such file"),
              std::string::npos)
        << c.err;
    EXPECT_NE(c.err.find("image '" + junk + "': unsupported or unrecognised format"), std::string::npos)
        << c.err;
    EXPECT_NE(c.err.find("/image needs a file"), std::string::npos) << c.err;
    EXPECT_NE(c.err.find("/audio " + wav() + ": the plan has no audio tower (compiled with --no-audio"),
              std::string::npos)
        << c.err;
    CmdResult opt = chat("Hello\n", "--audio '" + wav() + "'", plan);
    EXPECT_EQ(opt.exit_code, 1);
    EXPECT_NE(opt.err.find("no audio tower"), std::string::npos) << opt.err;

    // 100 samples at 16 kHz: decodes, but gives no soft token; the message is not sent, the next one is.
    std::string w = "RIFF____WAVEfmt ";
    auto u32 = [](uint32_t v) { return std::string{char(v), char(v >> 8), char(v >> 16), char(v >> 24)}; };
    auto u16 = [](uint16_t v) { return std::string{char(v), char(v >> 8)}; };
    w += u32(16) + u16(1) + u16(1) + u32(16000) + u32(32000) + u16(2) + u16(16) + "data" + u32(200) +
         std::string(200, '\x01');
    w.replace(4, 4, u32((uint32_t)w.size() - 8));
    write_file(short_wav, w);
    CmdResult s = chat("/audio " + short_wav + "\nHello\nHello\n");
    ASSERT_EQ(s.exit_code, 0) << s.err;
    CmdResult hello = chat("Hello\n");
    EXPECT_EQ(s.out, hello.out);
    EXPECT_NE(s.err.find("g4 chat: error: " + short_wav + ": "), std::string::npos) << s.err;
    EXPECT_NE(s.err.find("the message was not sent"), std::string::npos) << s.err;

    // An image turn longer than the context: reported with its figures, the conversation starts over.
    CmdResult big = chat("/image " + png() + "\nDescribe this\nHello\n", "", plan);
    ASSERT_EQ(big.exit_code, 0) << big.err;
    std::vector<std::string> out = lines(big.out);
    ASSERT_EQ(out.size(), 2u) << big.out;
    EXPECT_NE(out[0].find("[this turn does not fit: "), std::string::npos) << out[0];
    EXPECT_NE(out[0].find("(" + std::to_string(n_img_) +
                          " of them image and audio soft tokens), max context " +
                          std::to_string(n_img_ + 12) + "; conversation reset]"),
              std::string::npos)
        << out[0];
    EXPECT_EQ(out[1] + "\n", fresh.out);
}

} // namespace
