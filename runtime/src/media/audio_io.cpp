// WAV (RIFF) reader (see audio_io.h). Walks the RIFF chunks ("fmt ", "data", anything else
// skipped), checks every size against the bytes present, converts to float and averages the channels.
#include "runtime/src/media/audio_io.h"
#include "runtime/src/media/read_file.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace g4::media {
namespace {

constexpr const char* kConvert = "convert it with: ffmpeg -i in.wav -ar 16000 -ac 1 -c:a pcm_s16le out.wav";

uint16_t le16(const unsigned char* p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
uint32_t le32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// A chunk id for a message: non-printable bytes as '?'.
std::string printable(const unsigned char* id) {
    std::string s((const char*)id, 4);
    for (char& c : s)
        if ((unsigned char)c < 0x20 || (unsigned char)c > 0x7e) c = '?';
    return s;
}

} // namespace

std::string load_wav(const std::string& path, AudioPcm* out, int64_t max_frames) {
    *out = AudioPcm{};
    std::vector<uint8_t> bytes;
    // RIFF sizes are 32-bit: a WAV file is at most 4 GiB and 8 bytes.
    if (std::string err = read_file_bytes(path, "audio file", 0xFFFFFFFFull + 8, &bytes); !err.empty())
        return err;
    return decode_wav(bytes.data(), bytes.size(), "audio file " + path, out, max_frames);
}

std::string decode_wav(const uint8_t* bytes, size_t size, const std::string& what, AudioPcm* out,
                       int64_t max_frames) {
    const std::string where = what + ": ";
    *out                    = AudioPcm{};
    const unsigned char* b  = bytes;
    const size_t len        = bytes ? size : 0;
    if (len < 12 || std::memcmp(b, "RIFF", 4) != 0 || std::memcmp(b + 8, "WAVE", 4) != 0)
        return where + "not a WAV file (no RIFF/WAVE header); g4 reads 16 kHz WAV audio, " + kConvert;

    bool have_fmt = false;
    int format = 0, channels = 0, bits = 0, block = 0;
    uint32_t rate             = 0;
    const unsigned char* data = nullptr;
    size_t data_len           = 0;
    size_t pos                = 12;
    while (pos + 8 <= len) {
        const unsigned char* id = b + pos;
        uint64_t size           = le32(b + pos + 4);
        pos += 8;
        const size_t avail = len - pos;
        if (std::memcmp(id, "data", 4) == 0) {
            if (!have_fmt) return where + "the data chunk comes before the fmt chunk (corrupt file)";
            if (size == 0xFFFFFFFFu) size = avail - avail % (size_t)block; // streamed writer: size unknown
            if (size > avail)
                return where + "truncated: the data chunk declares " + std::to_string(size) +
                       " bytes but only " + std::to_string(avail) + " are present";
            data = b + pos, data_len = (size_t)size;
            break;
        }
        if (size > avail)
            return where + "truncated: chunk '" + printable(id) + "' declares " + std::to_string(size) +
                   " bytes but only " + std::to_string(avail) + " are present";
        if (std::memcmp(id, "fmt ", 4) == 0) {
            if (have_fmt) return where + "two fmt chunks (corrupt file)";
            if (size < 16)
                return where + "fmt chunk too short (" + std::to_string(size) + " bytes; corrupt file)";
            const unsigned char* p = b + pos;
            format                 = le16(p);
            channels               = le16(p + 2);
            rate                   = le32(p + 4);
            block                  = le16(p + 12);
            bits                   = le16(p + 14);
            if (format == 0xFFFE) { // WAVE_FORMAT_EXTENSIBLE: the sub-format GUID starts with the format code
                if (size < 40) return where + "extensible fmt chunk too short (corrupt file)";
                format = le16(p + 24);
            }
            // Every field is checked here, before the data chunk's size is interpreted in block units.
            if (format != 1 && format != 3)
                return where + "unsupported WAV encoding (format code " + std::to_string(format) +
                       "); g4 reads PCM 16/24/32-bit integer or 32-bit float, " + kConvert;
            if ((format == 1 && bits != 16 && bits != 24 && bits != 32) || (format == 3 && bits != 32))
                return where + "unsupported sample size: " + std::to_string(bits) + "-bit " +
                       (format == 3 ? "float" : "integer") +
                       "; g4 reads 16/24/32-bit integer or 32-bit float PCM, " + kConvert;
            if (channels < 1) return where + "fmt chunk says 0 channels (corrupt file)";
            if (block != channels * bits / 8)
                return where + "fmt chunk block size " + std::to_string(block) + " does not match " +
                       std::to_string(channels) + " channels x " + std::to_string(bits) +
                       " bits (corrupt file)";
            if (rate != 16000)
                return where + "sample rate is " + std::to_string(rate) +
                       " Hz; the audio tower needs 16000 Hz mono, " + kConvert;
            have_fmt = true;
        }
        pos += (size_t)size + (size & 1); // chunks are padded to an even size
    }
    if (!have_fmt) return where + "no fmt chunk (truncated or not a WAV file)";
    if (!data) return where + "no data chunk (truncated file?)";
    if (data_len % (size_t)block != 0)
        return where + "truncated: the data chunk (" + std::to_string(data_len) +
               " bytes) is not a whole number of " + std::to_string(block) + "-byte sample frames";
    const size_t frames = data_len / (size_t)block;
    if (frames == 0) return where + "contains no audio samples";
    if (max_frames >= 0 && frames > (uint64_t)max_frames) {
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "%.2f s of audio but the plan takes at most %.2f s (g4 compile --max-audio-seconds)",
                      (double)frames / rate, (double)max_frames / rate);
        return where + buf;
    }

    std::vector<float> samples(frames);
    const int bps = bits / 8;
    for (size_t i = 0; i < frames; ++i) {
        const unsigned char* fr = data + i * (size_t)block;
        double acc              = 0;
        for (int c = 0; c < channels; ++c) {
            const unsigned char* s = fr + (size_t)c * bps;
            if (format == 3) {
                float v;
                std::memcpy(&v, s, 4);
                if (!std::isfinite(v))
                    return where + "sample " + std::to_string(i) + " of channel " + std::to_string(c) +
                           " is not a finite number (NaN or infinity; corrupt float WAV)";
                acc += v;
            } else if (bits == 16) {
                acc += (int16_t)le16(s) / 32768.0;
            } else if (bits == 24) {
                int32_t v = (int32_t)((uint32_t)s[0] << 8 | (uint32_t)s[1] << 16 | (uint32_t)s[2] << 24) >> 8;
                acc += v / 8388608.0;
            } else {
                acc += (int32_t)le32(s) / 2147483648.0;
            }
        }
        samples[i] = (float)(acc / channels);
    }
    out->sample_rate = (int)rate;
    out->channels    = channels;
    out->samples     = std::move(samples);
    return "";
}

} // namespace g4::media
