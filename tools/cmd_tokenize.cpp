// `g4 tokenize`: text -> token ids with a tokenizer.json or a plan's embedded tokenizer.
#include "runtime/src/tokenizer.h"
#include "tools/cli_common.h"

#include <cstdio>

namespace g4::cli {

const Command kTokenize = {
    "tokenize",
    "--tokenizer FILE|PLAN [--add-special] -- TEXT",
    "Prints the token ids of TEXT, comma-separated, as the model sees them.",
    {{"--tokenizer", "FILE|PLAN", "a Hugging Face tokenizer.json, or a plan (its embedded tokenizer)"},
     {"--add-special", nullptr,
      "apply the tokenizer's template (Gemma: <bos> first). Default: the text alone"}},
    "Put -- before TEXT so that a text starting with - is not read as an option."};

int cmd_tokenize(int argc, char** argv) {
    Args a(argc, argv, 2, kTokenize);
    if (!a.has("--tokenizer")) throw UsageError("missing --tokenizer FILE|PLAN");
    if (a.pos.size() != 1) throw UsageError("expected the text to tokenize after --");
    std::string path = a.get("--tokenizer");
    std::string head(8, '\0');
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
        head.resize(std::fread(head.data(), 1, 8, f));
        std::fclose(f);
    } else {
        throw RunError("cannot open " + path);
    }
    std::vector<int32_t> ids;
    bool add = a.flag.count("--add-special") > 0;
    if (head == std::string("G4PLAN\0\0", 8)) {
        Engine e;
        open_engine(path, &e);
        ids = tokenize(e.e, a.pos[0], add);
    } else {
        std::string json = read_whole_file(path, "tokenizer"), err;
        g4::Tokenizer tk;
        if (!g4::Tokenizer::load_from_json(json, &tk, &err)) throw RunError(path + ": " + err);
        if (!tk.encode(a.pos[0], add, &ids, &err)) throw RunError(err);
    }
    std::printf("%s\n", join_ids(ids).c_str());
    return 0;
}

} // namespace g4::cli
