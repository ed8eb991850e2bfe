// g4 serve: prompt prefix reuse (see prefix.h).
#include "tools/serve/prefix.h"

#include "compiler/sha256.h"
#include "g4/g4.h"

#include <algorithm>

namespace g4::serve {

PrefixMatch match_prefix(const SlotHistory& held, const std::vector<int32_t>& probe,
                         const std::vector<MediaKey>& probe_media, const MediaTokens& mt, size_t keep) {
    const std::vector<int32_t>& h = held.tokens;
    keep                          = std::max<size_t>(keep, 1);
    const size_t limit            = probe.size() > keep ? probe.size() - keep : 0;
    auto is_marker                = [&](int32_t t) {
        return t >= 0 && (t == mt.eoi || t == mt.image || t == mt.eoa || t == mt.audio);
    };
    size_t i = 0, j = 0, k = 0;
    while (i < limit && j < h.size() && probe[i] == h[j]) {
        const int32_t t = probe[i];
        if (t < 0 || is_marker(t)) break;
        if (t != mt.boi && t != mt.boa) {
            ++i;
            ++j;
            continue;
        }
        const bool image    = t == mt.boi;
        const int32_t close = image ? mt.eoi : mt.eoa;
        const int32_t fill  = image ? mt.image : mt.audio;
        const int32_t kind  = image ? G4_MEDIA_IMAGE : G4_MEDIA_AUDIO;
        if (k >= probe_media.size() || k >= held.media.size() || i + 1 >= limit || probe[i + 1] != close)
            break;
        const MediaKey& a = probe_media[k];
        const MediaKey& b = held.media[k];
        if (a.kind != kind || b.kind != kind || a.digest != b.digest || b.n_tokens < 0) break;
        const size_t n = (size_t)b.n_tokens;
        if (j + n + 1 >= h.size() || h[j + n + 1] != close ||
            !std::all_of(h.begin() + (long)j + 1, h.begin() + (long)(j + n + 1),
                         [&](int32_t x) { return x == fill; }))
            break;
        i += 2;
        j += n + 2;
        ++k;
    }
    return {(int32_t)j, k};
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i       = 0;
    while (i < n && a[i] == b[i])
        ++i;
    return i;
}

std::string image_digest(const uint8_t* rgb, int32_t width, int32_t height) {
    Sha256 h;
    const int32_t dims[2] = {width, height};
    h.update(dims, sizeof dims);
    h.update(rgb, (size_t)width * (size_t)height * 3);
    return h.hex();
}

std::string audio_digest(const float* samples, int64_t n) {
    Sha256 h;
    h.update(&n, sizeof n);
    h.update(samples, (size_t)n * sizeof(float));
    return h.hex();
}

} // namespace g4::serve
