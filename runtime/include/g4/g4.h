/* g4 runtime C API: load a compiled plan (g4 compile) and run the model it holds.
 *
 * Objects
 *   g4_engine   the plan, mapped read-only, and its weights. Immutable after g4_engine_open:
 *               thread-safe, shareable by any number of sessions on any threads.
 *   g4_session  one conversation: KV cache, position, logits, sampler state, worker threads. All
 *               its memory is allocated by g4_session_create; nothing is allocated afterwards.
 *               Thread-compatible: one thread at a time may call it (g4_session_cancel excepted).
 *
 * Errors: every fallible call returns a g4_status; G4_OK is 0. On failure a one-line message is
 * available from g4_last_error_message() on the calling thread, and the session is unchanged
 * unless the function says otherwise. No C++ exception crosses this API.
 */
#ifndef G4_G4_H
#define G4_G4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define G4_API __attribute__((visibility("default")))
#else
#define G4_API
#endif

/* Version of this header's API. A new minor version only adds (functions, enum values, struct types);
 * a new major version may change existing declarations. g4_api_version() is the library's
 * (G4_API_VERSION_MAJOR << 16 | G4_API_VERSION_MINOR): a program built against this header runs with a
 * library of the same major and an equal or higher minor. */
#define G4_API_VERSION_MAJOR 1
#define G4_API_VERSION_MINOR 4
#define G4_API_VERSION ((G4_API_VERSION_MAJOR << 16) | G4_API_VERSION_MINOR)

typedef enum g4_status {
    G4_OK                   = 0,
    G4_ERR_INVALID_ARGUMENT = 1, /* NULL handle, out-of-range value, bad token id */
    G4_ERR_IO               = 2, /* file missing or unreadable */
    G4_ERR_PLAN_VERSION     = 3, /* plan written by an incompatible g4 (re-run g4 compile) */
    G4_ERR_PLAN_CORRUPT     = 4, /* truncated or damaged plan file */
    G4_ERR_OUT_OF_MEMORY    = 5,
    G4_ERR_CONTEXT_FULL     = 6, /* the tokens would exceed the plan's max context */
    G4_ERR_CANCELLED        = 7, /* g4_session_cancel was called */
    G4_ERR_UNSUPPORTED      = 8, /* the plan needs a device or feature this build lacks */
    G4_ERR_INTERNAL         = 9,
    G4_ERR_BUFFER_TOO_SMALL = 10, /* the output buffer is too small; the needed size was written */
    G4_ERR_NO_TOKENIZER     = 11, /* the plan carries no tokenizer (compile with tokenizer.json) */
    G4_ERR_BAD_STATE        = 12  /* a session state that is damaged or was saved on another plan */
} g4_status;

typedef struct g4_engine g4_engine;
typedef struct g4_session g4_session;

/* Static strings; never NULL. */
G4_API const char* g4_runtime_version(void);
/* The library's G4_API_VERSION. Thread-safe, no allocation. */
G4_API uint32_t g4_api_version(void);
G4_API const char* g4_status_string(g4_status status);
/* The last error message set on the calling thread ("" if none). Valid until the next g4 call on
 * this thread. */
G4_API const char* g4_last_error_message(void);

/* ---- engine ------------------------------------------------------------------------------- */

typedef struct g4_engine_params {
    int32_t verify_weights; /* non-zero: check the WEIGHTS checksum at open (reads every byte) */
} g4_engine_params;

G4_API g4_engine_params g4_engine_params_default(void);

/* Opens the plan at |path|. |params| may be NULL for defaults. On success |*out_engine| owns the
 * mapping and must be released with g4_engine_close after every session created from it has been
 * destroyed. */
G4_API g4_status g4_engine_open(const char* path, const g4_engine_params* params, g4_engine** out_engine);
/* Releases |engine|; NULL is a no-op. Sessions created from it must already be destroyed. */
G4_API void g4_engine_close(g4_engine* engine);

typedef struct g4_engine_info {
    int32_t vocab_size;
    int32_t max_context; /* positions a session can hold */
    int32_t max_chunk;   /* tokens processed per prefill step */
    int32_t num_layers;
    int32_t hidden_size;
    int32_t bos_token_id;
    int32_t n_eos_token_ids;
    int32_t eos_token_ids[8];
    uint64_t weights_bytes;
    uint64_t session_bytes;   /* activation arena + KV cache + scratch a session allocates */
    const char* architecture; /* owned by the engine */
    int32_t has_tokenizer;    /* non-zero if text functions (g4_tokenize, ...) are available */
    double load_ms;           /* time g4_engine_open took */
} g4_engine_info;

/* ---- text (needs a plan compiled with a tokenizer) --------------------------------------- *
 * These functions are thread-safe on a shared engine. Unlike the session compute path they use
 * temporary heap memory internally. Size-query convention: the needed element count is always
 * written to |*out_n|; if |capacity| is smaller, nothing else is written and the call returns
 * G4_ERR_BUFFER_TOO_SMALL (pass capacity 0 to query). */

/* Encodes |len| bytes of UTF-8 |text| (invalid sequences become U+FFFD, as Hugging Face does).
 * |add_special| non-zero: apply the tokenizer's template (e.g. <bos> first). */
G4_API g4_status g4_tokenize(const g4_engine* engine, const char* text, size_t len, int32_t add_special,
                             int32_t* out_ids, size_t capacity, size_t* out_n);
/* Decodes |n| ids to UTF-8 (not NUL-terminated; |*out_n| bytes). |skip_special| drops special
 * tokens such as <bos> and <turn|>. */
G4_API g4_status g4_detokenize(const g4_engine* engine, const int32_t* ids, size_t n, int32_t skip_special,
                               char* out, size_t capacity, size_t* out_n);

typedef struct g4_chat_message {
    const char* role;    /* "system", "user", "assistant" (written "model") or "model" */
    const char* content; /* UTF-8, NUL-terminated */
} g4_chat_message;

/* Renders a conversation in the model's chat format (its turn markers around each message, as
 * <bos><|turn>user\n...<turn|>\n...), with the generation prompt that opens the model's turn
 * ("<|turn>model\n") if |add_generation_prompt|. Output as for g4_detokenize. */
G4_API g4_status g4_chat_render(const g4_engine* engine, const g4_chat_message* messages, size_t n_messages,
                                int32_t add_generation_prompt, char* out, size_t capacity, size_t* out_n);

G4_API g4_status g4_engine_get_info(const g4_engine* engine, g4_engine_info* out_info);

/* A message with images and audio clips, for g4_chat_render_ids. */
typedef enum g4_media_kind { G4_MEDIA_IMAGE = 0, G4_MEDIA_AUDIO = 1 } g4_media_kind;

typedef struct g4_chat_media {
    int32_t kind;     /* g4_media_kind */
    int32_t n_tokens; /* soft tokens g4_session_add_image / g4_session_add_audio returned for it (>= 0) */
} g4_chat_media;

typedef struct g4_chat_media_message {
    const char* role;           /* as in g4_chat_message */
    const char* content;        /* UTF-8, NUL-terminated; may be "" */
    const g4_chat_media* media; /* NULL or n_media items, rendered before the content, in order, as
                                   the model's chat template renders a content list [media..., text] */
    size_t n_media;
} g4_chat_media_message;

/* Renders a conversation with images and audio into token ids: the text of g4_chat_render, where each
 * image becomes <boi>, n_tokens image placeholders, <eoi> (audio: <boa>, placeholders, <eoa>), the ids
 * g4_engine_get_media_info reports. Feed the result with g4_session_append_tokens after queuing the media
 * in the same order with g4_session_add_image / g4_session_add_audio. Size-query convention of the
 * text functions (element count of ids). A system message cannot hold media (G4_ERR_INVALID_ARGUMENT);
 * media of a kind the plan has no tower for are G4_ERR_UNSUPPORTED. Thread-safe on a shared engine;
 * uses temporary heap memory. */
G4_API g4_status g4_chat_render_ids(const g4_engine* engine, const g4_chat_media_message* messages,
                                    size_t n_messages, int32_t add_generation_prompt, int32_t* out_ids,
                                    size_t capacity, size_t* out_n);

/* ---- session ------------------------------------------------------------------------------ */

typedef struct g4_session_params {
    int32_t n_threads; /* 0: G4_THREADS env var, else all hardware threads */
} g4_session_params;

G4_API g4_session_params g4_session_params_default(void);

/* Creates a session on |engine| and allocates all of its memory. |params| may be NULL. The engine
 * must outlive the session. Release with g4_session_destroy. */
G4_API g4_status g4_session_create(g4_engine* engine, const g4_session_params* params,
                                   g4_session** out_session);
/* Releases |session|; NULL is a no-op. */
G4_API void g4_session_destroy(g4_session* session);
/* Forgets all tokens (position 0, empty KV cache). */
G4_API g4_status g4_session_reset(g4_session* session);
/* Number of tokens the session holds (the next token's position). */
G4_API int32_t g4_session_position(const g4_session* session);

/* Feeds |n| token ids (prefill, or one token of decode) and computes the logits of the last one.
 * If |out_logits| is not NULL it receives the final logits of every fed token, row-major
 * [n, vocab_size] float32; |out_logits_capacity| is its size in floats and must be >= n*vocab.
 * Errors: G4_ERR_INVALID_ARGUMENT for an id outside the vocabulary (nothing is fed),
 * G4_ERR_CONTEXT_FULL if position + n > max_context (nothing is fed), G4_ERR_CANCELLED if
 * cancelled between chunks (the tokens of completed chunks stay fed; position says how many).
 * CUDA plans, one token without |out_logits| right after a greedy g4_session_sample: the GPU starts
 * the following decode step before this returns, fed with this step's greedy token, and the next
 * call uses it if it feeds that token (G4_DECODE_AHEAD=0 turns this off). Reading logits after such a
 * step (g4_session_get_logits, a non-greedy sample) runs the step again once and ends it for the
 * session until g4_session_reset. */
G4_API g4_status g4_session_append_tokens(g4_session* session, const int32_t* ids, size_t n,
                                          float* out_logits, size_t out_logits_capacity);

/* Borrowed pointer to the logits of the last fed token, [vocab_size] floats; valid until the next
 * call that feeds tokens or resets. G4_ERR_INVALID_ARGUMENT if no token has been fed. */
G4_API g4_status g4_session_get_logits(const g4_session* session, const float** out_logits,
                                       int32_t* out_vocab);

typedef struct g4_sampling_params {
    float temperature;    /* 0: greedy (argmax) */
    int32_t top_k;        /* 0: off */
    float top_p;          /* 1: off */
    float min_p;          /* 0: off */
    float repeat_penalty; /* 1: off; applied to tokens in the last repeat_last_n */
    int32_t repeat_last_n;
    uint64_t seed;
} g4_sampling_params;

/* Greedy defaults (temperature 0). g4_sampling_params_from_plan gives the checkpoint's
 * generation_config defaults instead. */
G4_API g4_sampling_params g4_sampling_params_default(void);
G4_API g4_status g4_sampling_params_from_plan(const g4_engine* engine, g4_sampling_params* out_params);

/* G4_OK if |params| are in range (temperature >= 0 and finite, top_k >= 0, top_p in (0, 1], min_p in
 * [0, 1], repeat_penalty > 0 and finite, repeat_last_n >= -1), else G4_ERR_INVALID_ARGUMENT with the
 * first bad field in g4_last_error_message. g4_session_sample and g4_session_generate check the same
 * before any work; callers check here before feeding a prompt. */
G4_API g4_status g4_sampling_params_check(const g4_sampling_params* params);

/* Chooses the next token from the current logits with |params| (NULL: greedy) and writes it to
 * |*out_token|. Does not feed it: call g4_session_append_tokens with it to continue.
 * The sampler's random state lives in the session and is seeded by the first call after create or
 * reset. */
G4_API g4_status g4_session_sample(g4_session* session, const g4_sampling_params* params, int32_t* out_token);

/* Returns non-zero if |token| is one of the plan's end-of-generation ids. */
G4_API int32_t g4_engine_is_eos(const g4_engine* engine, int32_t token);

/* Requests cancellation of the running (or, if none runs, the next) g4_session_append_tokens,
 * which then returns G4_ERR_CANCELLED at the next op boundary; completed chunks stay fed and the
 * request is consumed. Safe to call from any thread while another thread uses the session. */
G4_API void g4_session_cancel(g4_session* session);

typedef struct g4_session_stats {
    double prefill_ms; /* time spent in g4_session_append_tokens with n > 1 */
    int64_t prefill_tokens;
    double decode_ms; /* time spent in g4_session_append_tokens with n == 1 */
    int64_t decode_tokens;
    double ttft_ms;   /* last g4_session_generate: start to first token produced */
    double sample_ms; /* time spent in g4_session_sample (on a CUDA plan: the GPU top-k and
                         the host's draw, or the logits copy and the CPU sampler) */
    int64_t sample_calls;
    double image_ms;      /* time spent in g4_session_add_image (preprocessing + vision tower) */
    int64_t image_tokens; /* soft tokens those calls produced */
    double audio_ms;      /* time spent in g4_session_add_audio (features + audio tower) */
    int64_t audio_tokens;
    int64_t decode_ahead; /* decode steps a CUDA plan ran ahead of the host (the greedy token fed
                             on the GPU, the step enqueued before the host read it) and the next
                             g4_session_append_tokens used */
    int64_t lm_screened;  /* greedy tokens whose LM head was screened (CUDA: of the steps run ahead;
                             CPU: steps of fast-precision plans): an int8 pass bounding every logit,
                             then exact bf16 logits only for the rows that can hold the greedy token
                             (the same token; the logits are computed whole if read) */
} g4_session_stats;

/* Called by g4_session_generate for each generated token, with the UTF-8 text it completes
 * (may be empty while a multi-byte character or a possible stop string is incomplete; not
 * NUL-terminated). A last call with token -1 may deliver text held back at the end. Return
 * non-zero to stop generating. Runs on the calling thread. */
typedef int32_t (*g4_token_callback)(void* user_data, int32_t token, const char* text, size_t text_len);

typedef struct g4_generate_params {
    int32_t max_tokens;      /* tokens to generate at most */
    int32_t ignore_eos;      /* non-zero: do not stop at the plan's end-of-generation ids */
    const char* const* stop; /* stop strings (NULL or n_stop entries); generation ends when the
                                text contains one; the text up to it is delivered, not the stop */
    size_t n_stop;
} g4_generate_params;

G4_API g4_generate_params g4_generate_params_default(void);

/* Generates from the current logits (feed a prompt first): sample, stop on end-of-generation ids
 * or stop strings, feed the token, report it through |callback| (may be NULL). The end-of-
 * generation token itself is not fed or reported. |*out_n_generated| (may be NULL) receives the
 * number of tokens reported. Returns G4_ERR_CONTEXT_FULL when the context fills (tokens so far
 * stay fed), G4_ERR_CANCELLED if cancelled. Text streaming needs a tokenizer; without one the
 * callback receives empty text. */
G4_API g4_status g4_session_generate(g4_session* session, const g4_sampling_params* sampling,
                                     const g4_generate_params* params, g4_token_callback callback,
                                     void* user_data, int32_t* out_n_generated);

G4_API g4_status g4_session_get_stats(const g4_session* session, g4_session_stats* out_stats);

/* ---- session state: save, load, rewind, fork ------------------------------------------------ *
 * A session's state is what decides its next logits and samples: the KV cache rows of the tokens fed,
 * the position, the token history (repetition penalty), the last logits and the sampler's random state.
 * Queued media, statistics and the cancel request are not part of it. A state is tied to its plan: it
 * records the plan's identity (a hash of the plan's section table, which holds every section's
 * checksum) and is refused by a session of any other plan. Loading a state gives a session whose next
 * logits and samples are bit-identical to those of the session that saved it (same plan, same device;
 * CUDA plans: compiled with --deterministic, else decode steps vary in their last bits run to run anyway).
 * The layout (magic "G4STATE", version, sizes, a checksum over everything) is in docs/runtime.md.
 *
 * Size of g4_session_save_state's output for the session's current position, in bytes (the KV rows of
 * position tokens: it grows with the position). Thread-compatible, no allocation. */
G4_API g4_status g4_session_state_size(const g4_session* session, size_t* out_bytes);
/* Writes the state into |out| (|capacity| bytes); |*out_n| receives the size (always; too small a
 * capacity is G4_ERR_BUFFER_TOO_SMALL and nothing is written: pass 0 to query). CUDA plans: copies the
 * KV rows from the GPU (waits for a step run ahead). Thread-compatible; no allocation. */
G4_API g4_status g4_session_save_state(g4_session* session, void* out, size_t capacity, size_t* out_n);
/* Replaces the session's state with the one in |data| (|n| bytes, as g4_session_save_state wrote them;
 * borrowed for the call). Validated before anything changes: magic, version, checksum, plan identity,
 * sizes (G4_ERR_BAD_STATE, the session unchanged, one line saying what is wrong). Queued media are
 * dropped. A CUDA copy that fails midway resets the session. Thread-compatible; no allocation. */
G4_API g4_status g4_session_load_state(g4_session* session, const void* data, size_t n);
/* The same through a file at |path| (written whole, then renamed into place; G4_ERR_IO when it cannot
 * be written or read). These two use a temporary heap buffer of the state's size. */
G4_API g4_status g4_session_save_state_file(g4_session* session, const char* path);
G4_API g4_status g4_session_load_state_file(g4_session* session, const char* path);
/* Forgets the tokens from |position| on (0 <= position <= the current position), keeping the KV cache of
 * the tokens before it, so that feeding other tokens from there costs only those. The session has no
 * logits until a token is fed. A sliding-window layer's cache is a ring: once the tokens fed after
 * |position| have overwritten rows the next tokens would read, the rewind is refused
 * (G4_ERR_INVALID_ARGUMENT, naming the earliest position still reachable; reset and feed again instead).
 * Queued media are dropped. Thread-compatible; no allocation. */
G4_API g4_status g4_session_rewind(g4_session* session, int32_t position);
/* (API 1.3) Makes the next g4_session_sample seed the session's random state from its params' seed, as the
 * first sample after g4_session_create or g4_session_reset does; the tokens, KV cache and logits are kept.
 * After g4_session_rewind to a prompt's shared prefix it makes the session sample as a fresh one fed the
 * whole prompt would. Thread-compatible; no allocation. */
G4_API g4_status g4_session_reseed(g4_session* session);
/* Copies |src|'s state into |dst|, a session of the same engine or of another engine opened on the same
 * plan (as a save and load would, without the bytes in between). |dst|'s queued media are dropped; |src|
 * is unchanged (CUDA: a step it ran ahead is waited for). Neither session may be used by another thread
 * during the call. No allocation. */
G4_API g4_status g4_session_fork(g4_session* src, g4_session* dst);

/* ---- batched decode (API 1.4) ----------------------------------------------------------------- *
 * Several conversations of one engine decoding at once (a server's streams) step together: one step of
 * the model over all their tokens reads each weight once, where separate g4_session_append_tokens calls
 * read them once per session.
 *
 * The most sessions one g4_sessions_decode call takes on |engine|'s plan: the rows of logits one step
 * produces (g4 compile --logits-rows, at most its --chunk), or 1 where the plan's backend has no batched
 * steps (CUDA plans with G4_CUDA_BATCH=0: docs/runtime.md); 0 for an invalid engine. Thread-safe. */
G4_API int32_t g4_engine_max_batch(const g4_engine* engine);
/* Feeds tokens[i] to sessions[i] for every i < n, with the effect of n calls
 * g4_session_append_tokens(sessions[i], &tokens[i], 1, NULL, 0): each session's position, history and
 * logits (g4_session_get_logits, g4_session_sample, g4_session_generate work per session as after its own
 * step; the logits agree with those of separate steps to float32 rounding: docs/runtime.md).
 * |sessions|: n distinct sessions of one engine, 1 <= n <= g4_engine_max_batch; |tokens|: n ids in
 * the vocabulary, none an image, audio or video placeholder (media prompts are fed with
 * g4_session_append_tokens). Both borrowed for the call. Validated before anything runs: NULL arrays,
 * an invalid or repeated session, sessions of different engines, n out of range or a bad id are
 * G4_ERR_INVALID_ARGUMENT, a session whose context is full G4_ERR_CONTEXT_FULL (the message names the
 * index), and then nothing is fed. A pending g4_session_cancel of any of the sessions makes the call
 * return G4_ERR_CANCELLED, nothing fed (that request is consumed). n == 1 is g4_session_append_tokens
 * of the one token; so is each session of a group its backend runs faster one by one (CUDA: groups of
 * up to 8, docs/runtime.md). None of the sessions may be used by another thread during the call
 * (g4_session_cancel excepted). Allocates nothing; each session's decode statistics count the step. */
G4_API g4_status g4_sessions_decode(g4_session* const* sessions, size_t n, const int32_t* tokens);

/* ---- progress -------------------------------------------------------------------------------- *
 * Called by g4_session_append_tokens after each step of a call that takes more than one step (more
 * tokens than max_chunk; with out_logits, than the plan's logits rows), with the tokens done and the
 * total of that call; on the calling thread. Return
 * non-zero to cancel: the call returns G4_ERR_CANCELLED with the completed steps fed, as
 * g4_session_cancel does. */
typedef int32_t (*g4_progress_callback)(void* user_data, int64_t done, int64_t total);
/* Sets (or with NULL clears) the session's progress callback; it stays set across g4_session_reset.
 * |user_data| is passed through, never dereferenced. Thread-compatible; no allocation. */
G4_API g4_status g4_session_set_progress_callback(g4_session* session, g4_progress_callback callback,
                                                  void* user_data);

/* ---- images and audio (plans compiled from a checkpoint with the vision / audio tower) ------ *
 * In a prompt, an image is <boi> followed by n image placeholders and <eoi>; an audio clip is <boa>,
 * n audio placeholders, <eoa> (ids below; n is what g4_session_add_image / _add_audio returned).
 * g4_session_add_image and g4_session_add_audio run the tower on the CPU (the calling thread plus the
 * session's worker threads), or on the plan's GPU where the plan put it (vision_device / audio_device;
 * preprocessing and log-mel features stay on the CPU), and queue the clip's n soft-token embeddings in the
 * session; g4_session_append_tokens then replaces the embedding of each placeholder token, in order, with the
 * next queued row of its kind (images and audio have separate queues). Feeding more placeholders than
 * are queued is G4_ERR_INVALID_ARGUMENT (nothing is fed). The towers use only memory allocated by
 * g4_session_create; g4_session_reset and g4_session_clear_media drop queued rows. */
typedef struct g4_media_info {
    int32_t has_vision, has_audio;
    int32_t image_token_id, boi_token_id, eoi_token_id; /* -1 when the plan has no vision tower */
    int32_t audio_token_id, boa_token_id, eoa_token_id; /* -1 when the plan has no audio tower */
    int32_t max_image_tokens;  /* soft tokens an image gives at most (g4 compile --image-tokens) */
    int64_t max_image_pixels;  /* width * height an image may have */
    int32_t audio_sample_rate; /* samples per second g4_session_add_audio expects (16000) */
    int64_t max_audio_samples; /* longest clip */
    int32_t max_queued_tokens; /* soft tokens (of each kind) a session holds queued at once */
    int32_t vision_device;     /* where the vision tower runs: -1 the CPU, N CUDA device N */
    int32_t audio_device;      /* where the audio tower runs: -1 the CPU, N CUDA device N */
    int32_t video_token_id;    /* placeholder of a video frame's soft tokens; -1: no video (no vision tower,
                                  or a checkpoint or plan without video_token_id) */
    int32_t max_video_frame_tokens; /* soft tokens a video frame gives at most (70, the video processor's) */
    /* The video limits the plan records (g4 compile --video-frames, --max-video-seconds,
     * --max-video-stream-frames, --max-video-pixels, --max-video-bytes), the defaults of a video's decoding;
     * plans compiled before they were recorded give the defaults 32, 3600, 216000, max_image_pixels and
     * 2 GiB. 0 without video. */
    int32_t video_frames;            /* frames a video gives (sampled as the processor does) */
    double max_video_seconds;        /* longest video stream */
    int64_t max_video_stream_frames; /* most frames in a video stream */
    int64_t max_video_pixels;        /* largest video frame (width * height) */
    int64_t max_video_bytes;         /* largest video file */
} g4_media_info;

G4_API g4_status g4_engine_get_media_info(const g4_engine* engine, g4_media_info* out_info);
/* |rgb|: |height| rows of |width| pixels, 3 bytes each (R, G, B), no padding; borrowed for the call.
 * Resized and patched as the model's Hugging Face image processor does, then encoded by the plan's
 * vision tower. |*out_n_tokens| (may be NULL) receives n, the placeholders to put between <boi> and
 * <eoi>. Thread-compatible, as every session call. */
G4_API g4_status g4_session_add_image(g4_session* session, const uint8_t* rgb, int32_t width, int32_t height,
                                      int32_t* out_n_tokens);
/* One frame of a video, as g4_session_add_image but at the video processor's budget (max_video_frame_tokens)
 * and queued for the video placeholders: the prompt holds, per frame, its "mm:ss " timestamp text, <boi>,
 * n x video_token_id, <eoi>, the frames separated by a space (as the model's Hugging Face processor writes).
 */
G4_API g4_status g4_session_add_video_frame(g4_session* session, const uint8_t* rgb, int32_t width,
                                            int32_t height, int32_t* out_n_tokens);
/* |samples|: mono, at audio_sample_rate, in [-1, 1]; borrowed for the call. |*out_n_tokens| as above. */
G4_API g4_status g4_session_add_audio(g4_session* session, const float* samples, int64_t n_samples,
                                      int32_t* out_n_tokens);
/* Images and audio from files or encoded bytes (API 1.2), decoded by the decoders the g4 CLI uses, then
 * fed as g4_session_add_image / g4_session_add_audio (same soft tokens, same |*out_n_tokens|):
 *   images: PNG, JPEG, BMP, GIF (first frame), binary PPM/PGM; RGB as Hugging Face's load_image gives it
 *           (EXIF orientation applied, alpha dropped). The declared size is checked against
 *           max_image_pixels before any pixel is decoded.
 *   audio files: PCM WAV at audio_sample_rate by g4's reader; any other format, rate or channel count
 *           through FFmpeg's libraries (mono, resampled to audio_sample_rate) when the library was built
 *           with them, else refused with a line saying so. Longer than max_audio_samples: refused.
 *   audio bytes: a WAV file in memory only (PCM 16/24/32-bit or float, any channels averaged to mono) at
 *           audio_sample_rate; use g4_session_add_audio_file for other formats.
 * |path| / |bytes| are borrowed for the call; nothing is kept. Errors: G4_ERR_IO for a file that cannot be
 * opened or read, G4_ERR_INVALID_ARGUMENT for undecodable, unsupported or over-limit input, and the
 * errors of g4_session_add_image / _add_audio (G4_ERR_UNSUPPORTED without the tower); the message is one
 * line naming the file (or the byte count) and the problem, and nothing is queued. Thread-compatible, as
 * every session call. */
G4_API g4_status g4_session_add_image_file(g4_session* session, const char* path, int32_t* out_n_tokens);
G4_API g4_status g4_session_add_image_encoded(g4_session* session, const void* bytes, size_t len,
                                              int32_t* out_n_tokens);
G4_API g4_status g4_session_add_audio_file(g4_session* session, const char* path, int32_t* out_n_tokens);
G4_API g4_status g4_session_add_audio_encoded(g4_session* session, const void* bytes, size_t len,
                                              int32_t* out_n_tokens);
G4_API g4_status g4_session_clear_media(g4_session* session);

#ifdef __cplusplus
}
#endif

#endif /* G4_G4_H */
