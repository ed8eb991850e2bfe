// g4 chat's conversation state (tools/chat_state.h): rendering, media encoding, feeding, save and load.
#include "tools/chat_state.h"
#include "runtime/src/media/media_decode.h"

#include "compiler/output_file.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace g4::cli {

std::string Chat::attach(ChatKind kind, const std::string& path, const std::string& what) {
    ChatAttachment a;
    a.kind = kind;
    a.path = path;
    std::string err;
    if (kind == ChatKind::Video) {
        if (!mi.has_vision || mi.video_token_id < 0)
            return what + " " + path +
                   ": the plan has no vision tower or no video placeholder id (compile a Gemma 4 checkpoint "
                   "with vision_config and video_token_id, without --no-vision)";
        try {
            check_media_ids(info, mi, true);
        } catch (const RunError& e) {
            return what + " " + path + ": " + e.what();
        }
        // Decoded once now to check it (frames not kept), again when the message is sent.
        if (!(err = g4::media::load_video(path, video_limits, &a.video,
                                          [](size_t, const g4::media::ImageRGB8&) { return std::string(); }))
                 .empty())
            return err;
    } else if (kind == ChatKind::Image) {
        if (!mi.has_vision)
            return what + " " + path +
                   ": the plan has no vision tower (compiled with --no-vision, or from a checkpoint "
                   "without vision_config)";
        try {
            check_media_ids(info, mi, true);
        } catch (const RunError& e) {
            return what + " " + path + ": " + e.what();
        }
        if (!(err = g4::media::load_image(path, &a.image, mi.max_image_pixels)).empty()) return err;
        const int64_t px = (int64_t)a.image.width * a.image.height;
        if (px > mi.max_image_pixels)
            return path + ": " + std::to_string(a.image.width) + "x" + std::to_string(a.image.height) +
                   " is " + std::to_string(px) + " pixels but the plan takes at most " +
                   std::to_string(mi.max_image_pixels) + " (g4 compile --max-image-pixels)";
    } else {
        if (!mi.has_audio)
            return what + " " + path +
                   ": the plan has no audio tower (compiled with --no-audio, or from a checkpoint "
                   "without audio_config)";
        try {
            check_media_ids(info, mi, false);
        } catch (const RunError& e) {
            return what + " " + path + ": " + e.what();
        }
        if (!(err = g4::media::load_audio(path, mi.audio_sample_rate, mi.max_audio_samples, &a.audio))
                 .empty())
            return err;
        if ((int64_t)a.audio.samples.size() > mi.max_audio_samples) {
            char buf[160];
            std::snprintf(
                buf, sizeof buf,
                ": %.2f s of audio but the plan takes at most %.2f s (g4 compile --max-audio-seconds)",
                (double)a.audio.samples.size() / mi.audio_sample_rate,
                (double)mi.max_audio_samples / mi.audio_sample_rate);
            return path + buf;
        }
    }
    pending.push_back(std::move(a));
    return "";
}

void Chat::restart() {
    check(g4_session_reset(s));
    fed.clear();
}

void Chat::reset() {
    turns.erase(std::remove_if(turns.begin(), turns.end(), [](auto& t) { return t.role != "system"; }),
                turns.end());
    pending.clear();
    restart();
}

Chat::Prompt Chat::render() const {
    std::vector<g4::ChatMessage> msgs;
    for (const ChatTurn& t : turns) {
        msgs.push_back({t.role, t.text, {}});
        for (const ChatAttachment& a : t.media)
            msgs.back().media.push_back(a.kind == ChatKind::Audio ? g4::ChatMedia::Audio
                                                                  : g4::ChatMedia::Image);
    }
    std::string text, err;
    std::vector<g4::ChatMediaMark> marks;
    g4::ChatTemplate tpl;
    if (!g4::engine_chat_template(e, &tpl, &err) ||
        !g4::render_chat(tpl, msgs, g4::ChatOptions{}, &text, &err, &marks))
        throw RunError(err);
    Prompt p;
    size_t at     = 0;
    auto add_text = [&](size_t end) {
        if (end == at) return;
        std::vector<int32_t> ids = tokenize(e, text.substr(at, end - at), false);
        p.ids.insert(p.ids.end(), ids.begin(), ids.end());
    };
    for (const g4::ChatMediaMark& m : marks) {
        add_text(m.offset);
        const ChatAttachment& a = turns[m.message].media[m.item];
        const bool image        = a.kind == ChatKind::Image;
        const size_t begin      = p.ids.size();
        std::vector<size_t> frame_ends;
        if (a.kind == ChatKind::Video) {
            // As Hugging Face's processor: per frame "mm:ss " <boi> n x <|video|> <eoi>, joined by a space
            for (size_t f = 0; f < a.video.times.size(); ++f) {
                const std::vector<int32_t> t = tokenize(e, (f ? " " : "") + a.video.times[f] + " ", false);
                p.ids.insert(p.ids.end(), t.begin(), t.end());
                p.ids.push_back(mi.boi_token_id);
                p.ids.insert(p.ids.end(), (size_t)std::max(a.n, 0), mi.video_token_id);
                p.ids.push_back(mi.eoi_token_id);
                frame_ends.push_back(p.ids.size());
            }
        } else {
            p.ids.push_back(image ? mi.boi_token_id : mi.boa_token_id);
            p.ids.insert(p.ids.end(), (size_t)std::max(a.n, 0),
                         image ? mi.image_token_id : mi.audio_token_id);
            p.ids.push_back(image ? mi.eoi_token_id : mi.eoa_token_id);
        }
        p.blocks.push_back({begin, p.ids.size(), m.message, m.item, std::move(frame_ends)});
        at = m.offset + m.length;
    }
    add_text(text.size());
    return p;
}

void Chat::encode(ChatAttachment& a) {
    int32_t n = 0;
    const g4_status st =
        a.kind == ChatKind::Image
            ? g4_session_add_image(s, a.image.rgb.data(), a.image.width, a.image.height, &n)
            : g4_session_add_audio(s, a.audio.samples.data(), (int64_t)a.audio.samples.size(), &n);
    if (st != G4_OK) throw RunError(a.path + ": " + g4_last_error_message());
    if (a.n >= 0 && n != a.n)
        throw RunError(a.path + ": encoded again it gives " + std::to_string(n) + " soft tokens, not " +
                       std::to_string(a.n));
    a.n = n;
}

bool Chat::encode_video(Prompt& p, size_t k) {
    const Prompt::Block b = p.blocks[k];
    ChatAttachment& a     = turns[b.turn].media[b.item];
    bool fit              = true;
    g4::media::VideoFrames v;
    const std::string err = g4::media::load_video(
        a.path, video_limits, &v, [&](size_t f, const g4::media::ImageRGB8& img) -> std::string {
            int32_t n = 0;
            if (g4_session_add_video_frame(s, img.rgb.data(), img.width, img.height, &n) != G4_OK)
                return a.path + ": frame " + std::to_string(v.indices[f]) + ": " + g4_last_error_message();
            if (f >= b.frame_ends.size() || (a.n >= 0 && n != a.n))
                return a.path +
                       ": the file changed since it was attached (decoded again it gives other frames)";
            if (a.n < 0) {
                a.n = n; // every frame has the video's size: the same soft tokens
                if (!(fit = fits(p = render()))) return "-";
            }
            feed(p, p.blocks[k].frame_ends[f]);
            return "";
        });
    if (!fit) return false;
    if (!err.empty()) throw RunError(err);
    if (v.indices.size() != b.frame_ends.size())
        throw RunError(a.path +
                       ": the file changed since it was attached (decoded again it gives other frames)");
    return true;
}

void Chat::feed(const Prompt& p, size_t end) {
    if (end > fed.size()) {
        g4_status st = g4_session_append_tokens(s, p.ids.data() + fed.size(), end - fed.size(), nullptr, 0);
        if (st == G4_ERR_CANCELLED && !(interrupted && *interrupted)) {
            // A Ctrl-C that came as the last reply ended left its request for this call (now consumed): the
            // chunks before it stay fed, the rest is fed now.
            const size_t at = (size_t)g4_session_position(s);
            st              = g4_session_append_tokens(s, p.ids.data() + at, end - at, nullptr, 0);
        }
        check(st);
    }
    fed.assign(p.ids.begin(), p.ids.begin() + (long)end);
}

bool Chat::fits(const Prompt& p) {
    if (p.ids.size() + 1 < (size_t)info.max_context) return true;
    size_t soft   = 0;
    bool at_least = false; // media not encoded yet count no soft token
    for (const auto& b : p.blocks) {
        soft += b.end - b.begin - 2;
        at_least |= turns[b.turn].media[b.item].n < 0;
    }
    std::string of = soft ? " (" + std::to_string(soft) + " of them image and audio soft tokens)" : "";
    std::printf("[this turn does not fit: %s%zu prompt tokens%s, max context %d; conversation reset]\n",
                at_least ? "at least " : "", p.ids.size(), of.c_str(), info.max_context);
    std::fflush(stdout);
    reset();
    return false;
}

bool Chat::prepare(const std::string& text) {
    const size_t before = turns.size();
    turns.push_back({"user", text, std::move(pending)});
    pending.clear();
    try {
        Prompt p = render(); // the new media without their placeholders yet
        if (!fits(p)) return false;
        size_t common = 0;
        while (common < fed.size() && common < p.ids.size() && fed[common] == p.ids[common])
            ++common;
        for (const auto& b : p.blocks)
            if (b.begin < common && common < b.end) common = 0;
        if (common < fed.size()) restart(); // history changed (e.g. a reply re-tokenized): start from scratch
        // Each image or clip the session lacks is encoded just before its placeholders are fed (the
        // session queues a bounded number of soft tokens): the new ones, and after a restart the earlier
        // ones again.
        for (size_t k = 0; k < p.blocks.size(); ++k) {
            if (p.blocks[k].begin < fed.size()) continue;
            ChatAttachment& a = turns[p.blocks[k].turn].media[p.blocks[k].item];
            if (a.kind == ChatKind::Video) {
                if (!encode_video(p, k)) return false;
                continue;
            }
            const bool fresh = a.n < 0;
            encode(a);
            if (fresh && !fits(p = render())) return false;
            feed(p, p.blocks[k].end);
        }
        feed(p, p.ids.size());
        return true;
    } catch (const RunError& err) {
        std::fprintf(stderr, "g4 chat: error: %s; the message was not sent\n", err.what());
        turns.resize(std::min(turns.size(), before));
        check(g4_session_clear_media(s));
        if (g4_session_position(s) != (int32_t)fed.size()) restart();
        return false;
    }
}

std::string Chat::save(const std::string& path) const {
    nlohmann::json msgs = nlohmann::json::array();
    for (const ChatTurn& t : turns) {
        nlohmann::json m = {{"role", t.role}, {"content", t.text}};
        if (!t.media.empty()) {
            m["media"] = nlohmann::json::array();
            for (const ChatAttachment& a : t.media)
                m["media"].push_back({{"type", a.kind == ChatKind::Image   ? "image"
                                               : a.kind == ChatKind::Audio ? "audio"
                                                                           : "video"},
                                      {"path", a.path}});
        }
        msgs.push_back(std::move(m));
    }
    const std::string text =
        nlohmann::json({{"messages", msgs}}).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
        "\n";
    std::string err;
    if (!g4::write_output_file(path, text.data(), text.size(), &err)) return err;
    return "";
}

std::string Chat::load(const std::string& path) {
    std::string text;
    try {
        text = read_whole_file(path, "conversation");
    } catch (const RunError& e) {
        return e.what();
    }
    const std::string bad = path + ": not a conversation g4 chat saved (expected {\"messages\": [{\"role\": "
                                   "..., \"content\": ...}, ...]}";
    nlohmann::json j      = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("messages") || !j["messages"].is_array())
        return bad;
    std::vector<ChatTurn> loaded;
    std::vector<ChatAttachment> keep = std::move(pending);
    pending.clear();
    for (const auto& m : j["messages"]) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
            !m["content"].is_string()) {
            pending = std::move(keep);
            return bad;
        }
        ChatTurn t{m["role"].get<std::string>(), m["content"].get<std::string>(), {}};
        if (m.contains("media")) {
            for (const auto& x : m["media"]) {
                if (!x.is_object() || !x.contains("path") || !x["path"].is_string() || !x.contains("type")) {
                    pending = std::move(keep);
                    return bad;
                }
                const ChatKind kind = x["type"] == "image"   ? ChatKind::Image
                                      : x["type"] == "video" ? ChatKind::Video
                                                             : ChatKind::Audio;
                if (std::string err = attach(kind, x["path"].get<std::string>(), path); !err.empty()) {
                    pending = std::move(keep);
                    return err;
                }
            }
            t.media = std::move(pending);
            pending.clear();
        }
        loaded.push_back(std::move(t));
    }
    turns   = std::move(loaded);
    pending = std::move(keep);
    restart();
    return "";
}

} // namespace g4::cli
