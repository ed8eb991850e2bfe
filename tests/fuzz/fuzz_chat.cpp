// Fuzz target: the chat renderer (runtime/src/chat_template.h) with Gemma 4's template pieces. The input is a
// conversation: messages separated by NUL, each one byte of role and media flags followed by its content.
#include "fuzz_util.h"
#include "models/gemma4/chat.h"
#include "runtime/src/chat_template.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const char* const roles[] = {"system", "developer", "user", "assistant", "model", "tool"};
    auto parts                       = g4fuzz::split_nul(data, size, 64);
    std::vector<g4::ChatMessage> msgs;
    for (const std::string& p : parts) {
        if (p.empty()) continue;
        const uint8_t h = (uint8_t)p[0];
        g4::ChatMessage m;
        m.role    = roles[(h & 7) % 6];
        m.content = p.substr(1);
        for (int i = 0; i < ((h >> 3) & 3); ++i)
            m.media.push_back((h >> (5 + i)) & 1 ? g4::ChatMedia::Audio : g4::ChatMedia::Image);
        msgs.push_back(std::move(m));
    }
    static const g4::ChatTemplate tpl = g4::gemma4::chat_template();
    std::string out, err;
    std::vector<g4::ChatMediaMark> marks;
    for (bool gen : {false, true}) {
        g4::ChatOptions o;
        o.add_generation_prompt = gen;
        if (g4::render_chat(tpl, msgs, o, &out, &err, &marks))
            for (const auto& mk : marks)
                if (mk.offset + mk.length > out.size() || mk.message >= msgs.size() ||
                    mk.item >= msgs[mk.message].media.size())
                    __builtin_trap(); // a mark must point into the output and at a media item
    }
    for (const auto& m : msgs)
        (void)g4::strip_python_whitespace(m.content);
    return 0;
}
