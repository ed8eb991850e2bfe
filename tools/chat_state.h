// g4 chat's conversation state (tools/cmd_chat.cpp): the turns, their images and clips, and the tokens the
// session holds; saved to and loaded from a JSON file of messages.
#pragma once
#include "runtime/src/chat_template.h"
#include "runtime/src/media/audio_io.h"
#include "runtime/src/media/image_io.h"
#include "runtime/src/media/video_decode.h"
#include "tools/cli_common.h"

#include <string>
#include <vector>

namespace g4::cli {

// What a chat attachment is. The chat template knows images and clips; a video takes an image's place there
// (Gemma 4's writes both as "\n\n<marker>\n\n") and its marker becomes the video's per-frame blocks.
enum class ChatKind { Image, Audio, Video };

// An image, clip or video attached to a chat message: decoded when attached, encoded by its tower when the
// message is sent, and again only if the session has to be fed from the start (the history it holds
// changed). A video's frames are not kept: they are decoded again, one at a time, when it is encoded.
struct ChatAttachment {
    ChatKind kind = ChatKind::Image;
    std::string path;
    g4::media::ImageRGB8 image;
    g4::media::AudioPcm audio;
    g4::media::VideoFrames video; // the sampled frames' indices and timestamps (no pixels)
    int32_t n = -1;               // soft tokens (of a video: of each frame), once encoded
};

struct ChatTurn {
    std::string role, text;
    std::vector<ChatAttachment>
        media; // before the text, as content [{"type": "image"}, ..., {"type": "text"}]
};

// A multi-turn conversation on one session: re-rendered each turn (the chat template, then each media
// marker replaced by <boi>/<boa>, n placeholders, <eoi>/<eoa>) and only the tokens the session does not
// already hold are fed, so an earlier image stays in the KV cache and its tower does not run again.
struct Chat {
    g4_engine* e  = nullptr;
    g4_session* s = nullptr;
    g4_engine_info info{};
    g4_media_info mi{};
    g4::media::VideoLimits video_limits;           // of each /video (--video-frames, ...)
    std::vector<ChatTurn> turns;                   // (the system turn first, if any)
    std::vector<ChatAttachment> pending;           // for the next user message
    std::vector<int32_t> fed;                      // tokens the session holds
    const std::atomic<int>* interrupted = nullptr; // non-zero after Ctrl-C (tools/cmd_chat.cpp)

    struct Prompt {
        std::vector<int32_t> ids;
        struct Block {
            size_t begin, end, turn, item;
            std::vector<size_t> frame_ends; // a video's: where each frame's <eoi> ends
        };                                  // ids [begin, end) hold turns[turn].media[item]
        std::vector<Block> blocks;
    };

    // Decodes a file for the next message; "" or why it cannot be attached (`what`: "/image", "--audio",
    // ...).
    std::string attach(ChatKind kind, const std::string& path, const std::string& what);

    void restart();

    // Starts over: only the system turn stays; pending attachments are dropped.
    void reset();

    Prompt render() const;

    // Runs a's tower; its soft tokens wait in the session's queue for the placeholders.
    void encode(ChatAttachment& a);
    // Encodes the video of p.blocks[k] frame by frame, feeding each frame's block as soon as its soft tokens
    // are queued (a video may hold more than the session queues). False when the prompt does not fit.
    bool encode_video(Prompt& p, size_t k);

    // Feeds p.ids [fed.size(), end); fed is a prefix of p.ids.
    void feed(const Prompt& p, size_t end);

    // False (conversation reset, as a turn that does not fit always did) when p leaves no room for a reply.
    bool fits(const Prompt& p);

    // Adds a user turn with the pending attachments and feeds what the session lacks. False when it was
    // not sent (reported); the conversation is then as before.
    bool prepare(const std::string& text);

    // Writes the conversation as {"messages": [{"role", "content", "media": [{"type", "path"}]}]} (an
    // atomic replace of `path`). "" or why not.
    std::string save(const std::string& path) const;
    // Replaces the conversation with the one in `path` (images and clips decoded again from their paths);
    // the session is fed again with the next message. "" or why not (the conversation is then unchanged).
    std::string load(const std::string& path);
};

} // namespace g4::cli
