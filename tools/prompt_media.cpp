// Placement of image, audio and video blocks in a CLI prompt (see prompt_media.h).
#include "tools/prompt_media.h"

#include <algorithm>
#include <array>

namespace g4::tools {

const char* media_kind_name(MediaKind k) {
    return k == MediaKind::Image ? "image" : k == MediaKind::Audio ? "audio" : "video";
}

namespace {

int32_t placeholder(MediaKind k, const MediaIds& ids) {
    return k == MediaKind::Image ? ids.image : k == MediaKind::Audio ? ids.audio : ids.video;
}

int32_t opener(MediaKind k, const MediaIds& ids) {
    return k == MediaKind::Audio ? ids.boa : ids.boi;
}

constexpr std::array<std::pair<std::string_view, MediaKind>, 3> kMarkers = {
    std::pair{std::string_view("<|image|>"), MediaKind::Image},
    std::pair{std::string_view("<|audio|>"), MediaKind::Audio},
    std::pair{std::string_view("<|video|>"), MediaKind::Video}};

} // namespace

std::vector<int32_t> media_block_ids(const MediaBlock& b, const MediaIds& ids) {
    std::vector<int32_t> out;
    const int32_t ph = placeholder(b.kind, ids);
    auto one         = [&] {
        out.push_back(opener(b.kind, ids));
        out.insert(out.end(), (size_t)std::max(b.n, 0), ph);
        out.push_back(b.kind == MediaKind::Audio ? ids.eoa : ids.eoi);
    };
    if (b.kind != MediaKind::Video) {
        one();
        return out;
    }
    for (size_t f = 0; f < b.prefix.size(); ++f) {
        if (f) out.insert(out.end(), b.separator.begin(), b.separator.end());
        out.insert(out.end(), b.prefix[f].begin(), b.prefix[f].end());
        one();
    }
    return out;
}

std::string place_media(std::vector<int32_t>* prompt, const std::vector<MediaBlock>& blocks,
                        const MediaIds& ids, bool written_out_ok) {
    std::vector<int32_t>& p = *prompt;
    enum Mode { Keep, Markers, Prepend };
    std::array<Mode, 3> mode{Keep, Keep, Keep};
    std::array<std::vector<const MediaBlock*>, 3> files;
    for (const MediaBlock& b : blocks)
        files[(int)b.kind].push_back(&b);
    for (int k = 0; k < 3; ++k) {
        const auto kind  = (MediaKind)k;
        const int32_t ph = placeholder(kind, ids), open = opener(kind, ids);
        if (files[k].empty()) {
            if (ph >= 0 && std::count(p.begin(), p.end(), ph) > 0)
                return std::string("the prompt has ") + media_kind_name(kind) + " placeholders (<|" +
                       media_kind_name(kind) + "|>, id " + std::to_string(ph) + ") but no " +
                       media_kind_name(kind) + " file was given (--" + media_kind_name(kind) + " FILE)";
            continue;
        }
        int64_t need = 0, given = 0;
        for (const MediaBlock* b : files[k])
            need += (int64_t)b->n * (kind == MediaKind::Video ? (int64_t)b->prefix.size() : 1);
        bool written = false;
        for (size_t i = 0; i < p.size(); ++i)
            if (p[i] == ph) {
                ++given;
                written = written || (i > 0 && p[i - 1] == open);
            }
        const int64_t n_files = (int64_t)files[k].size();
        // Blocks written out: as many placeholders as the files' soft tokens, the opener before them (or
        // another opener id, as a stand-in, when the count cannot also mean one marker per file).
        if (written_out_ok && given == need && (written || given != n_files))
            mode[k] = Keep;
        else if (given == n_files)
            mode[k] = Markers;
        else if (given == 0)
            mode[k] = Prepend;
        else {
            const std::string what = media_kind_name(kind), id = std::to_string(ph);
            return "the prompt has " + std::to_string(given) + " " + what + " placeholders (id " + id +
                   ") but " + std::to_string(n_files) + " " + what + " file" + (n_files == 1 ? "" : "s") +
                   " (" + std::to_string(need) + " soft tokens) were given: put one <|" + what +
                   "|> (a lone " + id +
                   " in --tokens) where each file goes, or none (the files then follow " +
                   "<bos>), or in --tokens write every block out (" + std::to_string(open) +
                   ", the file's soft tokens x " + id + ", " +
                   std::to_string(kind == MediaKind::Audio ? ids.eoa : ids.eoi) + ")";
        }
    }
    std::vector<int32_t> out;
    out.reserve(p.size());
    std::array<size_t, 3> next{0, 0, 0};
    for (int32_t t : p) {
        int k = -1;
        for (int j = 0; j < 3; ++j)
            if (!files[j].empty() && mode[j] == Markers && t == placeholder((MediaKind)j, ids)) k = j;
        if (k < 0) {
            out.push_back(t);
            continue;
        }
        std::vector<int32_t> b = media_block_ids(*files[k][next[k]++], ids);
        out.insert(out.end(), b.begin(), b.end());
    }
    std::vector<int32_t> front;
    for (const MediaBlock& b : blocks)
        if (mode[(int)b.kind] == Prepend) {
            std::vector<int32_t> ids_b = media_block_ids(b, ids);
            front.insert(front.end(), ids_b.begin(), ids_b.end());
        }
    const size_t at = !out.empty() && out[0] == ids.bos ? 1 : 0;
    out.insert(out.begin() + (long)at, front.begin(), front.end());
    p = std::move(out);
    return "";
}

MarkedText split_media_markers(std::string_view text) {
    MarkedText m;
    size_t at = 0, from = 0;
    while (true) {
        size_t best = std::string_view::npos;
        MediaKind kind{};
        size_t len = 0;
        for (const auto& [s, k] : kMarkers) {
            size_t f = text.find(s, from);
            if (f < best) {
                best = f;
                kind = k;
                len  = s.size();
            }
        }
        if (best == std::string_view::npos) break;
        m.segments.emplace_back(text.substr(at, best - at));
        m.markers.push_back(kind);
        at = from = best + len;
    }
    m.segments.emplace_back(text.substr(at));
    return m;
}

} // namespace g4::tools
