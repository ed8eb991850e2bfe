// Gemma 4's chat template pieces (see chat.h).
#include "models/gemma4/chat.h"

namespace g4::gemma4 {

ChatTemplate chat_template() {
    ChatTemplate t;
    t.bos               = "<bos>";
    t.system_roles      = {"system", "developer"};
    t.system_start      = "<|turn>system\n";
    t.system_end        = "<turn|>\n";
    t.turn_start        = "<|turn>";
    t.role_end          = "\n";
    t.turn_end          = "<turn|>\n";
    t.role_names        = {{"assistant", "model"}};
    t.generation_prompt = "<|turn>model\n";
    t.trim              = true;
    t.reasoning         = {"model", "<|channel>", "<channel|>"};
    t.image             = {"\n\n", "<|image|>", "\n\n"};
    t.audio             = {"", "<|audio|>", ""};
    t.tools             = {"<|tool>declaration:",
                           "<tool|>",
                           "<|tool_call>call:",
                           "<tool_call|>",
                           "<|tool_response>response:",
                           "<tool_response|>",
                           "<|\"|>",
                           true};
    return t;
}

} // namespace g4::gemma4
