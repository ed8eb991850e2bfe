// Gemma 4's chat template (E2B/E4B chat_template.jinja) as the pieces the runtime's generic renderer
// (runtime/src/chat_template.h) assembles; the compiler records them in the plan (META "chat").
#pragma once
#include "runtime/src/chat_template.h"

namespace g4::gemma4 {

// <bos>, an optional system/developer preamble as a "system" turn, "<|turn>{role}\n...<turn|>\n" turns with
// "assistant" written "model" and the thinking (<|channel>...<channel|>) stripped from model turns, contents
// trimmed, "\n\n<|image|>\n\n" per image and "<|audio|>" per clip before a message's text, and
// "<|turn>model\n" as the generation prompt. Tools: "<|tool>declaration:NAME{...}<tool|>" per tool in the
// system turn, "<|tool_call>call:NAME{ARGS}<tool_call|>" per call and
// "<|tool_response>response:NAME{...}<tool_response|>" per result in the model turn, strings quoted with
// <|"|>, schema types upper-cased.
ChatTemplate chat_template();

} // namespace g4::gemma4
