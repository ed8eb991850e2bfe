// JSON nesting bound (see json_limits.h): one pass over the bytes, tracking strings and escapes.
#include "runtime/src/json_limits.h"

namespace g4 {

std::string json_depth_error(std::string_view text, int max_depth) {
    int depth    = 0;
    bool in_str  = false;
    bool escaped = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_str) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth)
                return "JSON nests deeper than " + std::to_string(max_depth) + " levels (at byte " +
                       std::to_string(i) + "); real files nest fewer than 10: the file is corrupt";
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return "";
}

} // namespace g4
