// Images and audio of a session (see media.h).
#include "runtime/src/frontend/media.h"

#include "runtime/src/encoder_inputs.h"
#include "runtime/src/engine.h"
#include "runtime/src/env.h"
#include "runtime/src/frontend/image.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace g4::rt {

namespace {

constexpr size_t kAlign = 64;
size_t up(size_t n) {
    return (n + kAlign - 1) / kAlign * kAlign;
}

// Makes room for n more rows at the tail of q (moving the queued rows to the front when needed).
bool queue_reserve(MediaQueue& q, int32_t n, int32_t H) {
    if (q.tail + n <= q.cap) return true;
    if (q.queued() + n > q.cap) return false;
    std::memmove(q.rows, q.rows + (size_t)q.head * H, sizeof(float) * (size_t)q.queued() * H);
    q.tail -= q.head;
    q.head = 0;
    return true;
}

} // namespace

MediaState::~MediaState() {
    std::free(block);
}

size_t MediaBlock::total() const {
    size_t t = 0;
    for (size_t b : bytes)
        t += b;
    return t;
}

MediaBlock media_block(const MediaSizing& z) {
    MediaBlock b;
    b.stride                           = std::max<size_t>(z.thread_floats, 64);
    const size_t queue                 = (size_t)z.queue_rows * z.hidden * 4;
    b.bytes[MediaBlock::VisionScratch] = up(z.vision_scratch);
    b.bytes[MediaBlock::ResizeScratch] = up(z.resize_scratch);
    b.bytes[MediaBlock::Patches]       = up((size_t)z.patch_floats * 4);
    b.bytes[MediaBlock::Positions]     = up((size_t)z.max_patches * 8);
    b.bytes[MediaBlock::ImageQueue]    = up(z.vision ? queue : 0);
    b.bytes[MediaBlock::AudioQueue]    = up(z.audio ? queue : 0);
    b.bytes[MediaBlock::VideoQueue]    = up(z.vision ? queue : 0);
    b.bytes[MediaBlock::Soft]          = up((size_t)z.max_soft * z.hidden * 4);
    b.bytes[MediaBlock::ThreadScratch] = up(b.stride * z.threads * 4);
    b.bytes[MediaBlock::StepRows]      = up((size_t)z.max_rows * 4);
    b.bytes[MediaBlock::StepSources]   = up((size_t)z.max_rows * sizeof(float*));
    return b;
}

// The queue whose rows placeholder `id` takes, or null when `id` is not a placeholder of a tower the plan
// has.
static MediaQueue* queue_of(const g4_session* s, int32_t id) {
    MediaState* m  = s->media.get();
    const auto& in = s->engine->plan.info();
    if (m->vision && id == in.image_token_id) return &m->image_q;
    if (m->audio && id == in.audio_token_id) return &m->audio_q;
    if (m->vision && in.video_token_id >= 0 && id == in.video_token_id) return &m->video_q;
    return nullptr;
}

bool media_is_placeholder(const g4_session* s, int32_t id) {
    return s->media && queue_of(s, id);
}

// The plan's audio program (on the device the plan places it on) and the log-mel front end (META
// towers.audio) that fills its input on the CPU.
static g4_status audio_program_create(g4_session* s, MediaState* m, MediaSizing* z, std::string* err) {
    const plan::Plan& p = s->engine->plan;
    const auto& a       = p.meta().towers->audio;
    if (!a || a->program.empty()) {
        *err =
            "the plan's audio tower is not an encoder program; this runtime runs only those (recompile the "
            "plan)";
        return G4_ERR_PLAN_VERSION;
    }
    if (g4_status st = encoder_bind(s, a->program.c_str(), &m->audio_run, err); st != G4_OK) return st;
    if (m->audio_run.program <= 0) {
        *err = "the plan has no program '" + a->program + "' (META towers.audio.program; recompile the plan)";
        return G4_ERR_PLAN_CORRUPT;
    }
    const media::LogMelParams lp{a->sample_rate, a->frame_length, a->hop_length, a->fft_length,
                                 a->mel_bins,    a->min_hz,       a->max_hz,     a->mel_floor};
    std::string e              = m->mel.init(lp);
    const plan::PlanProgram& g = p.program(m->audio_run.program);
    const plan::PlanTensor* x  = g.inputs[0] >= 0 ? &p.tensor(g.inputs[0]) : nullptr;
    if (e.empty() &&
        (!x || x->dtype != (uint8_t)DType::F32 || x->ndim != 2 || x->dims[1] != a->mel_bins ||
         x->dims[0] < g.max_rows[0] || g.outputs[0] < 0 ||
         p.tensor(g.outputs[0]).dims[1] != s->engine->plan.info().hidden_size || g.max_rows[0] < 1))
        e = "the audio program's input is not f32 [frames, mel_bins] or its output not [tokens, hidden]";
    if (!e.empty()) {
        *err = "the plan's audio tower: " + e + " (recompile the plan)";
        return G4_ERR_PLAN_CORRUPT;
    }
    z->max_soft = std::max(z->max_soft, g.max_rows[2]);
    return G4_OK;
}

g4_status media_create(g4_session* s, std::string* err) {
    const plan::Plan& p = s->engine->plan;
    const auto& in      = p.info();
    if (in.vision_config.empty() && in.audio_config.empty()) return G4_OK;
    auto m = std::make_unique<MediaState>();
    m->H   = in.hidden_size;
    MediaSizing z;
    if (!in.vision_config.empty()) {
        if (in.vision_program.empty() || in.patch_size < 1 || in.pooling_kernel_size < 1) {
            *err = "the plan's vision tower has no encoder program (recompile the plan)";
            return G4_ERR_PLAN_CORRUPT;
        }
        if (g4_status st = encoder_bind(s, in.vision_program.c_str(), &m->vision_run, err); st != G4_OK)
            return st;
        if (m->vision_run.program <= 0) {
            *err = "the plan names the vision program '" + in.vision_program +
                   "' but has none (recompile the plan)";
            return G4_ERR_PLAN_CORRUPT;
        }
        m->vision        = true;
        z.vision         = true;
        z.vision_scratch = (size_t)in.max_patches * 8; // the patch grid's cells (check_patch_grid's seen)
        z.resize_scratch = towers::preprocess_reserve_bytes(in.max_image_pixels, in.image_tokens,
                                                            in.patch_size, in.pooling_kernel_size);
        z.patch_floats   = (int64_t)in.max_patches * 3 * in.patch_size * in.patch_size;
        z.max_patches    = in.max_patches;
        z.max_soft       = std::max(z.max_soft, in.image_tokens);
    }
    if (!in.audio_config.empty()) {
        m->audio = z.audio = true;
        if (g4_status st = audio_program_create(s, m.get(), &z, err); st != G4_OK) return st;
    }
    m->max_soft  = z.max_soft;
    m->pre_bytes = z.resize_scratch;
    // Threads: a CPU session's pool; a CUDA session (one-thread pool) gets its own for the towers.
    cpu::ThreadPool* pool = s->pool.get();
    if (!pool || pool->size() < 2) {
        m->own_pool = std::make_unique<cpu::ThreadPool>(cpu::default_thread_count());
        pool        = m->own_pool.get();
    }
    z.queue_rows = in.max_media_tokens;
    z.hidden     = in.hidden_size;
    z.max_rows   = in.max_rows;
    z.thread_floats =
        std::max<uint64_t>({in.tower_thread_floats, encoder_thread_floats(s, in.vision_program.c_str()),
                            m->audio_run.program > 0 ? encoder_thread_floats(s, "audio") : 0,
                            m->audio_run.program > 0 ? m->mel.thread_floats() : 0});
    z.threads          = pool->size();
    const MediaBlock b = media_block(z);
    const size_t total = b.total();
    m->block           = std::aligned_alloc(kAlign, std::max<size_t>(total, kAlign));
    if (!m->block) {
        *err = "cannot allocate " + std::to_string(total) + " bytes for the towers' buffers";
        return G4_ERR_OUT_OF_MEMORY;
    }
    std::memset(m->block, 0, total);
    m->block_bytes = total;
    uint8_t* parts[MediaBlock::kParts];
    uint8_t* at = (uint8_t*)m->block;
    for (int i = 0; i < MediaBlock::kParts; ++i)
        parts[i] = at, at += b.bytes[i];
    const int32_t Q   = in.max_media_tokens;
    m->vision_scratch = parts[MediaBlock::VisionScratch];
    m->pre_scratch    = parts[MediaBlock::ResizeScratch];
    m->patches        = (float*)parts[MediaBlock::Patches];
    m->pos            = (int32_t*)parts[MediaBlock::Positions];
    m->image_q        = {(float*)parts[MediaBlock::ImageQueue], z.vision ? Q : 0};
    m->audio_q        = {(float*)parts[MediaBlock::AudioQueue], z.audio ? Q : 0};
    m->video_q        = {(float*)parts[MediaBlock::VideoQueue], z.vision ? Q : 0};
    m->soft           = (float*)parts[MediaBlock::Soft];
    m->ctx            = {pool, (float*)parts[MediaBlock::ThreadScratch], b.stride};
    m->step_row       = (int32_t*)parts[MediaBlock::StepRows];
    m->step_src       = (const float**)parts[MediaBlock::StepSources];
    s->media          = std::move(m);
    return G4_OK;
}

static g4_status enqueue(g4_session* s, MediaQueue& q, int32_t n, const char* what, std::string* err) {
    MediaState* m = s->media.get();
    if (const char* dump =
            rt::env::dump_media()) { // debugging, bench/e2e/tower_bench.py: the rows, f32 [n, H]
        if (FILE* f = std::fopen(dump, "ab")) {
            std::fwrite(m->soft, sizeof(float), (size_t)n * m->H, f);
            std::fclose(f);
        }
    }
    if (!queue_reserve(q, n, m->H)) {
        *err = std::string("the ") + what + " gives " + std::to_string(n) + " soft tokens but " +
               std::to_string(q.queued()) + " of the session's " + std::to_string(q.cap) +
               " are queued already (feed the prompt that uses them first, or recompile with a larger "
               "--max-media-tokens)";
        return G4_ERR_CONTEXT_FULL;
    }
    std::memcpy(q.rows + (size_t)q.tail * m->H, m->soft, sizeof(float) * (size_t)n * m->H);
    q.tail += n;
    return G4_OK;
}

g4_status media_vision_patches(g4_session* s, const float* patches, const int32_t* pos, int n_patches,
                               int32_t* n_soft, std::string* err) {
    MediaState* m = s->media.get();
    if (!m || m->vision_run.program <= 0) {
        *err = "the session runs no vision program";
        return G4_ERR_UNSUPPORTED;
    }
    const auto& in = s->engine->plan.info();
    int32_t* seen  = (int32_t*)m->vision_scratch; // [max_patches]
    const int k    = in.pooling_kernel_size;
    PatchGrid g;
    if (std::string e = check_patch_grid(pos, n_patches, in.max_patches, k, in.position_size, seen, &g);
        !e.empty()) {
        *err = "vision program: " + e;
        return G4_ERR_INVALID_ARGUMENT;
    }
    const int cells   = (g.gw / k) * (g.gh / k);
    const int64_t pin = 3LL * in.patch_size * in.patch_size;
    float* px         = (float*)encoder_input(s, m->vision_run, 0);
    const float mean = in.pixel_mean, inv_std = 1.0f / in.pixel_std;
    for (int64_t e = 0; e < (int64_t)g.n * pin; ++e)
        px[e] = (patches[e] - mean) * inv_std;
    std::memcpy(encoder_input(s, m->vision_run, 1), pos, sizeof(int32_t) * 2 * g.n);
    patch_pool_index(g, k, seen, (int32_t*)encoder_input(s, m->vision_run, 2));
    const int32_t counts[plan::kMaxRowCounts] = {g.n, cells, 0, 0};
    const int32_t in_rows[4] = {g.n, g.n, cells, 0}, out_rows[2] = {cells, 0};
    if (g4_status st = encoder_run(s, m->vision_run, m->ctx, counts, in_rows, out_rows, err); st != G4_OK)
        return st;
    std::memcpy(m->soft, encoder_output(s, m->vision_run, 0), sizeof(float) * (size_t)cells * m->H);
    *n_soft = cells;
    return G4_OK;
}

// One image (or video frame) at `budget` soft tokens at most through the vision tower into m->*queue.
static g4_status add_vision(g4_session* s, const uint8_t* rgb, int32_t width, int32_t height, int32_t budget,
                            MediaQueue MediaState::*queue, const char* what, int32_t* n_tokens,
                            std::string* err) {
    MediaState* m = s->media.get();
    if (!m || !m->vision) {
        *err = "the plan has no vision tower (compile it from a checkpoint with vision_config, "
               "without --no-vision)";
        return G4_ERR_UNSUPPORTED;
    }
    const auto& in = s->engine->plan.info();
    if (!rgb || width < 1 || height < 1) {
        *err = "the image is empty (" + std::to_string(width) + "x" + std::to_string(height) + ")";
        return G4_ERR_INVALID_ARGUMENT;
    }
    if ((int64_t)width * height > in.max_image_pixels) {
        *err = "the image has " + std::to_string(width) + "x" + std::to_string(height) +
               " pixels but the plan takes at most " + std::to_string(in.max_image_pixels) +
               " (downscale it, or recompile with a larger --max-image-pixels)";
        return G4_ERR_INVALID_ARGUMENT;
    }
    towers::ImageLayout lay{};
    const size_t need =
        towers::preprocess_scratch_bytes_for(height, width, budget, in.patch_size, in.pooling_kernel_size);
    if (need > m->pre_bytes) {
        *err = "the image is " + std::to_string(width) + "x" + std::to_string(height) +
               ": its aspect ratio needs " + std::to_string(need) +
               " bytes of resize scratch but the session reserves " + std::to_string(m->pre_bytes) +
               " (crop or pad it to a less extreme shape)";
        return G4_ERR_INVALID_ARGUMENT;
    }
    std::string e =
        towers::preprocess_image(rgb, height, width, budget, in.patch_size, in.pooling_kernel_size,
                                 m->pre_scratch, m->pre_bytes, m->patches, m->pos, &lay, &m->ctx);
    if (!e.empty()) {
        *err = "image preprocessing: " + e;
        return G4_ERR_INVALID_ARGUMENT;
    }
    int n = 0;
    if (g4_status st = media_vision_patches(s, m->patches, m->pos, lay.n_patches, &n, err); st != G4_OK)
        return st;
    g4_status st = enqueue(s, m->*queue, n, what, err);
    if (st == G4_OK && n_tokens) *n_tokens = n;
    return st;
}

g4_status media_add_image(g4_session* s, const uint8_t* rgb, int32_t width, int32_t height, int32_t* n_tokens,
                          std::string* err) {
    return add_vision(s, rgb, width, height, s->engine->plan.info().image_tokens, &MediaState::image_q,
                      "image", n_tokens, err);
}

g4_status media_add_video_frame(g4_session* s, const uint8_t* rgb, int32_t width, int32_t height,
                                int32_t* n_tokens, std::string* err) {
    MediaState* m = s->media.get();
    if (m && m->vision && s->engine->plan.info().video_token_id < 0) {
        *err = "the plan has no video placeholder id (its config.json has no video_token_id, or the plan was "
               "compiled before video: recompile it)";
        return G4_ERR_UNSUPPORTED;
    }
    return add_vision(s, rgb, width, height, std::min(kVideoFrameTokens, s->engine->plan.info().image_tokens),
                      &MediaState::video_q, "video frame", n_tokens, err);
}

// The audio program over one clip (checked by the caller for length): its soft tokens into s->media->soft.
static g4_status audio_program_run(g4_session* s, const float* samples, int64_t n_samples, int* n_soft,
                                   std::string* err) {
    MediaState* m                 = s->media.get();
    const plan::PlanProgram& g    = s->engine->plan.program(m->audio_run.program);
    const media::LogMelParams& lp = m->mel.params();
    const int64_t frames          = std::min<int64_t>(m->mel.valid_frames(n_samples), g.max_rows[0]);
    if (frames < 1) {
        *err = "audio tower: the clip's " + std::to_string(n_samples) +
               " samples are shorter than one analysis frame (" +
               std::to_string(lp.frame_length + 1 - lp.frame_length / 2) + " samples at " +
               std::to_string(lp.sample_rate) + " Hz): it gives no audio tokens";
        return G4_ERR_INVALID_ARGUMENT;
    }
    for (int64_t i = 0; i < n_samples; ++i)
        if (!std::isfinite(samples[i])) {
            *err = "audio tower: sample " + std::to_string(i) + " of the clip is not a finite number";
            return G4_ERR_INVALID_ARGUMENT;
        }
    // Samples past the last frame the program takes are not read (the frames' windows end before them).
    const int64_t first = lp.frame_length + 1 - lp.frame_length / 2;
    const int64_t used  = std::min(n_samples, first + (frames - 1) * lp.hop_length + lp.hop_length - 1);
    m->mel.compute(m->ctx, samples, used, (float*)encoder_input(s, m->audio_run, 0));
    const int32_t f0 = (int32_t)frames, f1 = (f0 + 1) / 2, f2 = (f1 + 1) / 2;
    const int32_t counts[plan::kMaxRowCounts] = {f0, f1, f2, g.max_rows[3]};
    const int32_t in_rows[4] = {f0, 0, 0, 0}, out_rows[2] = {f2, 0};
    if (g4_status st = encoder_run(s, m->audio_run, m->ctx, counts, in_rows, out_rows, err); st != G4_OK)
        return st;
    std::memcpy(m->soft, encoder_output(s, m->audio_run, 0), sizeof(float) * (size_t)f2 * m->H);
    *n_soft = f2;
    return G4_OK;
}

g4_status media_add_audio(g4_session* s, const float* samples, int64_t n_samples, int32_t* n_tokens,
                          std::string* err) {
    MediaState* m = s->media.get();
    if (!m || !m->audio) {
        *err = "the plan has no audio tower (compile it from a checkpoint with audio_config, without "
               "--no-audio)";
        return G4_ERR_UNSUPPORTED;
    }
    const auto& in = s->engine->plan.info();
    if (!samples || n_samples < 1) {
        *err = "the audio clip is empty";
        return G4_ERR_INVALID_ARGUMENT;
    }
    if (n_samples > in.max_audio_samples) {
        *err = "the audio clip has " + std::to_string(n_samples) + " samples (" +
               std::to_string((double)n_samples / in.audio_sample_rate) + " s) but the plan takes at most " +
               std::to_string(in.max_audio_samples) +
               " (split it, or recompile with a larger --max-audio-seconds)";
        return G4_ERR_INVALID_ARGUMENT;
    }
    int n = 0;
    if (g4_status st = audio_program_run(s, samples, n_samples, &n, err); st != G4_OK) return st;
    g4_status st = enqueue(s, m->audio_q, n, "audio clip", err);
    if (st == G4_OK && n_tokens) *n_tokens = n;
    return st;
}

g4_status media_check_tokens(const g4_session* s, const int32_t* ids, size_t n, std::string* err) {
    const MediaState* m = s->media.get();
    if (!m) return G4_OK;
    const auto& in = s->engine->plan.info();
    int64_t img = 0, aud = 0, vid = 0;
    for (size_t i = 0; i < n; ++i)
        if (const MediaQueue* q = queue_of(s, ids[i]))
            (q == &m->image_q ? img : q == &m->audio_q ? aud : vid)++;
    if (img > m->image_q.queued()) {
        *err = "the tokens hold " + std::to_string(img) + " image placeholders (id " +
               std::to_string(in.image_token_id) + ") but " + std::to_string(m->image_q.queued()) +
               " image soft tokens are queued; add the images first (g4_session_add_image) "
               "and put <boi>, one placeholder per soft token, <eoi> where each goes";
        return G4_ERR_INVALID_ARGUMENT;
    }
    if (aud > m->audio_q.queued()) {
        *err = "the tokens hold " + std::to_string(aud) + " audio placeholders (id " +
               std::to_string(in.audio_token_id) + ") but " + std::to_string(m->audio_q.queued()) +
               " audio soft tokens are queued; add the clips first (g4_session_add_audio)";
        return G4_ERR_INVALID_ARGUMENT;
    }
    if (vid > m->video_q.queued()) {
        *err = "the tokens hold " + std::to_string(vid) + " video placeholders (id " +
               std::to_string(in.video_token_id) + ") but " + std::to_string(m->video_q.queued()) +
               " video soft tokens are queued; add the frames first (g4_session_add_video_frame)";
        return G4_ERR_INVALID_ARGUMENT;
    }
    return G4_OK;
}

void media_prepare_step(g4_session* s, const int32_t* ids, int32_t rows) {
    MediaState* m = s->media.get();
    if (!m) return;
    m->step_n = 0;
    for (int32_t r = 0; r < rows; ++r) {
        MediaQueue* q = queue_of(s, ids[r]);
        if (!q) continue;
        s->ids[r] = s->engine->plan.info()
                        .pad_token_id; // as Hugging Face: the pad row for the lookups (PLE included)
        m->step_row[m->step_n]   = r;
        m->step_src[m->step_n++] = q->rows + (size_t)(q->head + q->taken++) * m->H;
    }
}

void media_end_step(g4_session* s, bool fed) {
    MediaState* m = s->media.get();
    if (!m) return;
    for (MediaQueue* q : {&m->image_q, &m->audio_q, &m->video_q}) {
        if (fed) q->head += q->taken;
        q->taken = 0;
        if (q->head == q->tail) q->head = q->tail = 0;
    }
    m->step_n = 0;
}

void media_clear(g4_session* s) {
    MediaState* m = s->media.get();
    if (!m) return;
    for (MediaQueue* q : {&m->image_q, &m->audio_q, &m->video_q})
        q->head = q->tail = q->taken = 0;
    m->step_n = 0;
}

} // namespace g4::rt
