// A session's images and audio: the plan's encoder programs bound on their devices, their host buffers (all
// allocated by media_create at session creation), and the queues of soft-token embeddings that placeholder
// tokens of the prompt consume in order (g4_session_add_image / g4_session_add_audio, then append_tokens).
#pragma once
#include "g4/g4.h"
#include "kernels/cpu/cpu.h"
#include "runtime/src/encoder_program.h"
#include "runtime/src/log_mel.h"

#include <memory>
#include <string>

struct g4_session;

namespace g4::rt {

// Soft tokens of a video frame at most: the reference video processor's max_soft_tokens default.
constexpr int32_t kVideoFrameTokens = 70;

// Soft-token rows waiting for their placeholders: rows [head, tail) of rows [cap, H] are queued; the step
// being run takes the first `taken` of them.
struct MediaQueue {
    float* rows = nullptr;
    int32_t cap = 0, head = 0, tail = 0, taken = 0;
    int32_t queued() const { return tail - head; }
};

struct MediaState {
    int32_t H   = 0;
    bool vision = false;   // the plan has a vision tower (its encoder program)
    bool audio  = false;   // the plan has an audio tower (its encoder program)
    EncoderRun vision_run; // the plan's vision program, on the CPU or the plan's GPU
    EncoderRun audio_run;  // the plan's audio program, likewise
    media::LogMel mel;     // the audio program's input features on the CPU (META towers.audio)
    std::unique_ptr<cpu::ThreadPool> own_pool; // CUDA sessions (whose pool is one thread)
    cpu::Context ctx;                          // the towers' pool and per-thread scratch
    void* block          = nullptr;            // one allocation behind every buffer below (media_block)
    size_t block_bytes   = 0;
    void* vision_scratch = nullptr;
    void* pre_scratch    = nullptr;
    size_t pre_bytes     = 0;
    float* patches       = nullptr; // [max_patches, 3 * patch^2]
    int32_t* pos         = nullptr; // [max_patches, 2]
    MediaQueue image_q, audio_q, video_q;
    float* soft      = nullptr; // [max_soft, H] one tower call's output before queueing
    int32_t max_soft = 0;
    // The step being run: rows of the ids whose embedding is replaced, and the queued rows replacing them.
    int32_t step_n         = 0;
    int32_t* step_row      = nullptr; // [max_rows]
    const float** step_src = nullptr; // [max_rows]
    ~MediaState();
};

// What the towers' buffers of a session are sized from (plan figures; threads: the towers' pool).
struct MediaSizing {
    size_t vision_scratch = 0, resize_scratch = 0;
    int64_t patch_floats = 0; // [max_patches, 3 * patch^2]
    int32_t max_patches  = 0;
    bool vision = false, audio = false;
    int32_t queue_rows = 0, hidden = 0, max_soft = 0, max_rows = 0;
    size_t thread_floats = 0; // the towers' per-thread scratch (thread_scratch_floats)
    int threads          = 0;
};
// The one block media_create allocates: its parts in order, each rounded up to 64 bytes. The compiler's
// memory plan (compiler/compile.cpp) sizes the towers' session buffers with the same function.
struct MediaBlock {
    enum Part {
        VisionScratch,
        ResizeScratch,
        Patches,
        Positions,
        ImageQueue,
        AudioQueue,
        VideoQueue,
        Soft,
        ThreadScratch,
        StepRows,
        StepSources,
        kParts
    };
    size_t bytes[kParts] = {};
    size_t stride        = 0; // floats of per-thread scratch
    size_t total() const;
};
MediaBlock media_block(const MediaSizing& z);

// Binds the plan's towers (if any) and allocates their buffers; s->media stays null for plans without towers.
g4_status media_create(g4_session* s, std::string* err);
// Runs the vision tower over rgb [height, width, 3] and queues its soft tokens (*n_tokens of them).
g4_status media_add_image(g4_session* s, const uint8_t* rgb, int32_t width, int32_t height, int32_t* n_tokens,
                          std::string* err);
// The plan's vision program (on its device) over n_patches rows of patches [n, 3 * patch^2] (pixel values
// in [0, 1], HF padding rows trailing) at positions pos [n, 2]: the grid checked, the inputs written (pixels
// normalised as the plan says, positions, each pooling cell's patches), the program run over the patches and
// their cells; the *n_soft soft tokens left in s->media->soft (not queued).
g4_status media_vision_patches(g4_session* s, const float* patches, const int32_t* pos, int n_patches,
                               int32_t* n_soft, std::string* err);
// Runs the vision tower over one video frame with the video processor's budget (kVideoFrameTokens) and
// queues its soft tokens for the video placeholders.
g4_status media_add_video_frame(g4_session* s, const uint8_t* rgb, int32_t width, int32_t height,
                                int32_t* n_tokens, std::string* err);
// Runs the audio tower over mono samples at the plan's sample rate and queues its soft tokens: on the CPU the
// log-mel features of the clip's valid frames (at most the program's frame bound: longer clips are cut there)
// into the audio program's input, then the program on its device over the frames, the frames after each
// stride-2 conv and the fixed relative positions.
g4_status media_add_audio(g4_session* s, const float* samples, int64_t n, int32_t* n_tokens,
                          std::string* err);
// Checks that ids[0..n) hold no more placeholders than are queued (placeholder ids may lie past the
// embedding's vocabulary: they are never looked up).
g4_status media_check_tokens(const g4_session* s, const int32_t* ids, size_t n, std::string* err);
// For one step of `rows` ids already in s->ids: replaces placeholders by the pad id and records which
// queued rows replace their embeddings. media_end_step after the step: `fed` consumes those rows,
// otherwise (an error, a cancel) they stay queued.
void media_prepare_step(g4_session* s, const int32_t* ids, int32_t rows);
void media_end_step(g4_session* s, bool fed);
void media_clear(g4_session* s);
// True if `id` is a placeholder of a tower the plan has.
bool media_is_placeholder(const g4_session* s, int32_t id);

} // namespace g4::rt
