// Plan loading and validation (see plan_reader.h).
#include "runtime/plan/plan_reader.h"

#include "runtime/plan/launch_params.h"
#include "runtime/plan/op_params.h"

#include "kernels/nf4.h"
#include "runtime/src/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace g4::plan {

Plan::~Plan() {
    if (map_) ::munmap(map_, size_);
}

g4_status Plan::fail(g4_status st, const std::string& msg, std::string* err) const {
    if (err) *err = "plan " + path_ + ": " + msg;
    return st;
}

const char* section_name(uint32_t kind) {
    switch ((SectionKind)kind) {
    case SectionKind::Meta:
        return "metadata (META)";
    case SectionKind::Strings:
        return "string table (STRINGS)";
    case SectionKind::Tensors:
        return "tensor table (TENSORS)";
    case SectionKind::Ops:
        return "op table (OPS)";
    case SectionKind::Weights:
        return "weights (WEIGHTS)";
    case SectionKind::Tokenizer:
        return "tokenizer (TOKENIZER)";
    case SectionKind::Cubin:
        return "CUDA kernels (CUBIN)";
    case SectionKind::Ptx:
        return "CUDA kernels (PTX)";
    case SectionKind::CudaSchedule:
        return "CUDA schedule (CUDA_SCHEDULE)";
    case SectionKind::Programs:
        return "programs (PROGRAMS)";
    }
    return "unknown";
}

static bool dims_ok(const PlanTensor& t) {
    if (t.ndim < 1 || t.ndim > 4) return false;
    for (int i = 0; i < t.ndim; ++i)
        if (t.dims[i] <= 0 || t.dims[i] > (int64_t)1 << 40) return false;
    return true;
}

bool Plan::has_cpu_layers() const {
    for (int32_t d : info_.layer_device)
        if (d < 0) return true;
    return false;
}

int Plan::gpu_slot(int index) const {
    for (size_t g = 0; g < info_.gpus.size(); ++g)
        if (info_.gpus[g].index == index) return (int)g;
    return -1;
}

void Plan::advise_random(size_t t) const {
    const PlanTensor& w  = tensors_[t];
    const uintptr_t page = (uintptr_t)::sysconf(_SC_PAGESIZE);
    const uintptr_t a    = (uintptr_t)(weights_ + w.offset) & ~(page - 1);
    const uintptr_t b    = ((uintptr_t)(weights_ + w.offset + w.nbytes) + page - 1) & ~(page - 1);
    ::madvise((void*)a, b - a, MADV_RANDOM);
}

g4_status Plan::load(const std::string& path, bool verify_weights, std::string* err) {
    path_                       = path;
    const g4_status CORRUPT     = G4_ERR_PLAN_CORRUPT;
    const std::string recompile = "; re-run g4 compile to rebuild the plan";
    int fd                      = ::open(path.c_str(), O_RDONLY);
    if (fd < 0)
        return fail(G4_ERR_IO, "cannot open plan file (" + std::string(std::strerror(errno)) + ")", err);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return fail(G4_ERR_IO, "not a regular file", err);
    }
    size_ = (uint64_t)st.st_size;
    if (size_ < sizeof(PlanHeader)) {
        ::close(fd);
        return fail(CORRUPT,
                    "truncated plan: " + std::to_string(size_) + " bytes is smaller than the header" +
                        recompile,
                    err);
    }
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        return fail(G4_ERR_IO, "mmap failed (" + std::string(std::strerror(errno)) + ")", err);
    }
    const uint8_t* base = (const uint8_t*)map_;
    header_             = (const PlanHeader*)base;
    if (std::memcmp(header_->magic, kMagic, 8) != 0) return fail(CORRUPT, "not a g4 plan (bad magic)", err);
    if (header_->format_major != kFormatMajor)
        return fail(G4_ERR_PLAN_VERSION,
                    "plan format " + std::to_string(header_->format_major) + "." +
                        std::to_string(header_->format_minor) + " but this runtime reads " +
                        std::to_string(kFormatMajor) + ".x" + recompile,
                    err);
    PlanHeader h      = *header_;
    h.header_checksum = 0;
    if ((uint32_t)fnv1a64(&h, sizeof h) != header_->header_checksum)
        return fail(CORRUPT, "header checksum mismatch" + recompile, err);
    // Compatibility (docs/plan-format.md): older minors of this major open; a newer minor may hold what this
    // runtime cannot read.
    if (header_->format_minor > kFormatMinor)
        return fail(G4_ERR_PLAN_VERSION,
                    "plan format " + std::to_string(header_->format_major) + "." +
                        std::to_string(header_->format_minor) + " is newer than this runtime reads (" +
                        std::to_string(kFormatMajor) + ".0 to " + std::to_string(kFormatMajor) + "." +
                        std::to_string(kFormatMinor) + "); update g4, or compile the plan with this g4",
                    err);
    if (!schema_readable(header_->schema_hash, header_->format_minor))
        return fail(G4_ERR_PLAN_VERSION,
                    "plan schema differs from this runtime's (written by another g4 version)" + recompile,
                    err);
    if (header_->file_size != size_)
        return fail(CORRUPT,
                    "truncated or extended plan: header says " + std::to_string(header_->file_size) +
                        " bytes, file has " + std::to_string(size_) + recompile,
                    err);
    uint64_t tab = header_->section_table_offset, n = header_->section_count;
    if (header_->header_size != sizeof(PlanHeader) || tab < sizeof(PlanHeader) || tab % 8)
        return fail(CORRUPT,
                    "bad header (header size " + std::to_string(header_->header_size) +
                        ", section table at " + std::to_string(tab) + ")" + recompile,
                    err);
    if (n == 0 || n > 64 || tab > size_ || n * sizeof(PlanSection) > size_ - tab)
        return fail(CORRUPT,
                    "section table out of bounds (" + std::to_string(n) + " sections at " +
                        std::to_string(tab) + ")" + recompile,
                    err);
    // Format 1.1 on: the section table's checksum (FNV-1a 64) in the header's reserved0; 1.0 plans have none.
    if (header_->format_minor >= 1 && fnv1a64(base + tab, n * sizeof(PlanSection)) != header_->reserved0)
        return fail(CORRUPT, "checksum mismatch in the section table" + recompile, err);
    sections_.assign((const PlanSection*)(base + tab), (const PlanSection*)(base + tab) + n);
    const uint64_t table_end = tab + n * sizeof(PlanSection);

    const PlanSection *meta = nullptr, *strs = nullptr, *tens = nullptr, *ops = nullptr, *wts = nullptr,
                      *progs = nullptr;
    for (size_t k = 0; k < sections_.size(); ++k) {
        const PlanSection& s = sections_[k];
        const std::string what =
            std::string(section_name(s.kind)) + " section (kind " + std::to_string(s.kind) + ")";
        if (s.offset > size_ || s.size > size_ - s.offset || s.offset < table_end || s.offset % kSectionAlign)
            return fail(CORRUPT,
                        what + " out of bounds or misaligned (bytes " + std::to_string(s.offset) + "+" +
                            std::to_string(s.size) + " of " + std::to_string(size_) + ")" + recompile,
                        err);
        for (size_t o = 0; o < k; ++o) {
            const PlanSection& t = sections_[o];
            if (t.kind == s.kind) return fail(CORRUPT, "duplicate " + what + recompile, err);
            if (s.offset < t.offset + t.size && t.offset < s.offset + s.size)
                return fail(CORRUPT, what + " overlaps the " + section_name(t.kind) + " section" + recompile,
                            err);
        }
        switch ((SectionKind)s.kind) {
        case SectionKind::Meta:
            meta = &s;
            break;
        case SectionKind::Strings:
            strs = &s;
            break;
        case SectionKind::Tensors:
            tens = &s;
            break;
        case SectionKind::Ops:
            ops = &s;
            break;
        case SectionKind::Weights:
            wts = &s;
            break;
        case SectionKind::Tokenizer:
            tokenizer_ = std::string_view((const char*)base + s.offset, s.size);
            break;
        case SectionKind::Cubin:
            cubin_ = std::string_view((const char*)base + s.offset, s.size);
            break;
        case SectionKind::Ptx:
            ptx_ = std::string_view((const char*)base + s.offset, s.size);
            break;
        case SectionKind::Programs:
            progs = &s;
            break;
        case SectionKind::CudaSchedule:
            if (s.size % sizeof(CudaLaunch) || s.offset % 8)
                return fail(CORRUPT, "malformed CUDA schedule" + recompile, err);
            launches_   = (const CudaLaunch*)(base + s.offset);
            n_launches_ = s.size / sizeof(CudaLaunch);
            break;
        default:
            break; // unknown kinds from a newer minor version are skipped
        }
        bool small = (SectionKind)s.kind != SectionKind::Weights;
        if ((small || verify_weights) && fnv1a64(base + s.offset, s.size) != s.checksum)
            return fail(CORRUPT, "checksum mismatch in the " + what + ": the plan is damaged" + recompile,
                        err);
    }
    if (!meta || !strs || !tens || !ops || !wts)
        return fail(CORRUPT, "missing a required section" + recompile, err);
    if (tens->size % sizeof(PlanTensor) || ops->size % sizeof(PlanOp) || tens->offset % 8 || ops->offset % 8)
        return fail(CORRUPT, "malformed tensor or op table" + recompile, err);
    meta_         = std::string((const char*)base + meta->offset, meta->size);
    strings_      = (const char*)base + strs->offset;
    strings_size_ = strs->size;
    if (strings_size_ == 0 || strings_[strings_size_ - 1] != '\0')
        return fail(CORRUPT, "string table not terminated" + recompile, err);
    tensors_      = (const PlanTensor*)(base + tens->offset);
    n_tensors_    = tens->size / sizeof(PlanTensor);
    ops_          = (const PlanOp*)(base + ops->offset);
    n_ops_        = ops->size / sizeof(PlanOp);
    weights_      = base + wts->offset;
    weights_size_ = wts->size;

    std::string meta_err;
    if (!read_meta(meta_, header_->format_minor, &meta_struct_, &meta_err))
        return fail(CORRUPT, meta_err + recompile, err);
    if (std::string e = program_info(); !e.empty())
        return fail(CORRUPT, "bad metadata: " + e + recompile, err);
    if (header_->schema_hash != schema_hash() && device_ == "cuda")
        return fail(G4_ERR_PLAN_VERSION,
                    "CUDA plan of format " + std::to_string(header_->format_major) + "." +
                        std::to_string(header_->format_minor) +
                        ": its kernels are those of the g4 that compiled it, not this runtime's" + recompile,
                    err);
    g4_status bad = validate_programs(progs, err);
    if (bad == G4_OK) bad = validate_records(err);
    if (bad != G4_OK && err && err->find("re-run g4 compile") == std::string::npos) *err += recompile;
    return bad;
}

// ProgramInfo and the device fields from META (read by read_meta), and their consistency with WEIGHTS and
// the KV arena: "" when consistent, else what is wrong.
std::string Plan::program_info() {
    const Meta& m = meta_struct_;
    arch_         = m.architecture;
    device_       = m.device;
    if (m.cuda) {
        cuda_target_   = m.cuda->target;
        cuda_device_   = m.cuda->device_index;
        cuda_attn_hpg_ = m.cuda->attn_hpg;
    }
    ple_on_host_            = m.placement && m.placement->ple == "host";
    const MetaProgram& p    = m.program;
    info_.max_rows          = p.max_rows;
    info_.max_context       = p.max_context;
    info_.logits_rows       = p.logits_rows;
    info_.sliding_slots     = p.sliding_slots;
    info_.act_arena_bytes   = p.act_arena_bytes;
    info_.kv_arena_bytes    = p.kv_arena_bytes;
    info_.ids_tensor        = p.ids_tensor;
    info_.logits_tensor     = p.logits_tensor;
    info_.max_k             = p.max_k;
    info_.max_slots         = p.max_slots;
    info_.vocab_size        = p.vocab_size;
    info_.embed_vocab_limit = p.embed_vocab_limit;
    info_.num_layers        = m.hparams.num_hidden_layers;
    info_.hidden_size       = m.hparams.hidden_size;
    info_.kv_host_begin     = info_.kv_arena_bytes;
    info_.towers_begin = info_.towers_end = weights_size_;
    const std::string gpu                 = "cuda:" + std::to_string(cuda_device_);
    if (m.towers) {
        const MetaTowers& tw      = *m.towers;
        info_.towers_begin        = tw.weights[0];
        info_.towers_end          = tw.weights[1];
        info_.max_media_tokens    = tw.max_media_tokens;
        info_.tower_thread_floats = tw.thread_scratch_floats;
        info_.tower_session_bytes = tw.session_bytes;
        if (tw.precision != "fp32" && tw.precision != "bf16")
            return "towers precision '" + tw.precision + "'";
        info_.tower_bf16 = tw.precision == "bf16";
        if (const auto& v = tw.vision) {
            info_.vision_config       = v->config;
            info_.image_tokens        = v->image_tokens;
            info_.max_patches         = v->max_patches;
            info_.max_image_pixels    = v->max_image_pixels;
            info_.image_token_id      = v->image_token_id;
            info_.boi_token_id        = v->boi_token_id;
            info_.eoi_token_id        = v->eoi_token_id;
            info_.video_token_id      = v->video_token_id;
            info_.pixel_mean          = v->pixel_mean;
            info_.pixel_std           = v->pixel_std;
            info_.vision_program      = v->program;
            info_.patch_size          = v->patch_size;
            info_.pooling_kernel_size = v->pooling_kernel_size;
            info_.position_size       = v->position_size;
            if (!(info_.pixel_std > 0) || !std::isfinite(info_.pixel_mean) || !std::isfinite(info_.pixel_std))
                return "vision pixel_mean / pixel_std";
            if (!v->device.empty()) {
                if (device_ != "cuda" || v->device != gpu || !v->weights)
                    return "vision tower device '" + v->device + "'";
                info_.vision_gpu       = true;
                info_.vision_begin     = (*v->weights)[0];
                info_.vision_end       = (*v->weights)[1];
                info_.vision_gpu_bytes = v->gpu_bytes;
            }
        }
        if (const auto& a = tw.audio) {
            info_.audio_config      = a->config;
            info_.max_audio_samples = a->max_samples;
            info_.audio_sample_rate = a->sample_rate;
            info_.audio_token_id    = a->audio_token_id;
            info_.boa_token_id      = a->boa_token_id;
            info_.eoa_token_id      = a->eoa_token_id;
            if (!a->device.empty()) {
                if (device_ != "cuda" || a->device != gpu || !a->weights)
                    return "audio tower device '" + a->device + "'";
                info_.audio_gpu       = true;
                info_.audio_begin     = (*a->weights)[0];
                info_.audio_end       = (*a->weights)[1];
                info_.audio_gpu_bytes = a->gpu_bytes;
            }
        }
        if (info_.towers_begin > info_.towers_end || info_.towers_end != weights_size_ ||
            info_.max_media_tokens < 1 || info_.max_media_tokens > info_.max_context ||
            info_.max_patches < 0 || info_.max_audio_samples < 0 || info_.max_image_pixels < 0 ||
            (info_.vision_config.empty() && info_.audio_config.empty()) ||
            (info_.vision_gpu &&
             (info_.vision_begin < info_.towers_begin || info_.vision_begin >= info_.vision_end ||
              info_.vision_end > info_.towers_end)) ||
            (info_.audio_gpu && (info_.audio_begin < info_.towers_begin ||
                                 info_.audio_begin >= info_.audio_end || info_.audio_end > info_.towers_end)))
            return "towers";
    }
    if (p.kv_host_begin) {
        if (device_ != "cuda") return "layer_devices in a CPU plan";
        info_.layer_device  = p.layer_devices;
        info_.kv_host_begin = *p.kv_host_begin;
        for (const MetaGpuPart& g : p.gpus) {
            ProgramInfo::GpuPart part;
            part.index = g.index;
            for (const ByteRange& r : g.weights)
                part.weights.push_back({r[0], r[1]});
            part.kv_begin = g.kv[0];
            part.kv_end   = g.kv[1];
            info_.gpus.push_back(part);
        }
        bool ok = (int32_t)info_.layer_device.size() == info_.num_layers && !info_.gpus.empty() &&
                  info_.gpus[0].index == cuda_device_ && info_.kv_host_begin <= info_.kv_arena_bytes;
        for (size_t a = 0; a < info_.gpus.size(); ++a) {
            const auto& g = info_.gpus[a];
            ok            = ok && g.index >= 0 && g.index < 4096 && g.kv_begin <= g.kv_end &&
                 g.kv_end <= info_.kv_host_begin;
            for (const auto& [b, e] : g.weights)
                ok = ok && b <= e && e <= weights_size_;
            for (size_t b = 0; b < a; ++b)
                ok = ok && info_.gpus[b].index != g.index;
        }
        for (int32_t d : info_.layer_device)
            ok = ok && (d == -1 || (d >= 0 && gpu_slot(d) >= 0));
        if (!ok) return "layer_devices / gpus / kv_host_begin";
    } else if (device_ == "cuda") {
        info_.gpus.push_back({cuda_device_, {{0, info_.towers_begin}}, 0, info_.kv_arena_bytes});
    }
    const MetaGeneration& g  = m.generation;
    info_.eos_token_ids      = g.eos_token_ids;
    info_.bos_token_id       = g.bos_token_id;
    info_.pad_token_id       = g.pad_token_id;
    info_.do_sample          = g.do_sample;
    info_.temperature        = g.temperature;
    info_.top_k              = g.top_k;
    info_.top_p              = g.top_p;
    info_.min_p              = g.min_p;
    info_.repetition_penalty = g.repetition_penalty;
    return "";
}

namespace {

// The row width a row-wise op processes (its cols parameter; KvStore's width), -1 for other ops.
int32_t cols_of(const PlanOp& o) {
    switch ((OpCode)o.code) {
    case OpCode::RmsNorm:
        return params<RmsNormParams>(o).cols;
    case OpCode::Add:
        return params<AddParams>(o).cols;
    case OpCode::Scale:
        return params<ScaleParams>(o).cols;
    case OpCode::GeluMul:
        return params<GeluMulParams>(o).cols;
    case OpCode::Softcap:
        return params<SoftcapParams>(o).cols;
    case OpCode::KvStore:
        return params<KvStoreParams>(o).width;
    default:
        return -1;
    }
}
// An RmsNorm's group width (-1 for other ops).
int32_t norm_dim(const PlanOp& o) {
    return o.code == (uint16_t)OpCode::RmsNorm ? params<RmsNormParams>(o).dim : -1;
}

} // namespace

// The tensors a fused launch record names are those of the ops it covers, in the places the kernels
// read them (cuda/backend.cpp launch_fused): the ops' own checks (check_program) then bound every access.
// "" when they are, else what is wrong. The record's op range was checked before.
std::string Plan::launch_operands(const CudaLaunch& l) const {
    const auto code  = [&](int32_t i, OpCode c) { return ops_[i].code == (uint16_t)c; };
    const auto whole = [&](const PlanOp& o) {
        return !o.in_col[0] && !o.in_col[1] && !o.out_col[0] && !o.out_col[1];
    };
    const auto act_cols = [&](int32_t t, int64_t w) {
        return t >= 0 && tensors_[t].kind == (uint8_t)TensorKind::Activation && tensors_[t].ndim == 2 &&
               tensors_[t].dims[1] >= w;
    };
    const PlanOp& o0 = ops_[l.op];
    switch ((LaunchKind)l.kind) {
    case LaunchKind::Op:
        return l.count == 1 ? "" : "a single-op record covers " + std::to_string(l.count) + " ops";
    case LaunchKind::ResNorm: {
        const ResNormLaunch r = launch_params<ResNormLaunch>(l);
        const int32_t H       = r.cols;
        if (H <= 0 || H > 4096 || !code(l.op, OpCode::RmsNorm) || cols_of(o0) != H || norm_dim(o0) != H ||
            !whole(o0))
            return "the ResNorm's first op is not a full-row RmsNorm of its width " + std::to_string(H);
        if (r.zeroed >= 0 && !act_cols(r.zeroed, H))
            return "the buffer it zeroes is not an activation of at least " + std::to_string(H) + " columns";
        if (r.d < 0) { // the lone norm: xn = rms(x) * pre_w
            if (l.count != 1 || o0.in[0] != r.x || o0.in[1] != r.pre_w || o0.out[0] != r.xn || r.pre_w < 0 ||
                r.post_w >= 0 || r.scalar >= 0 || r.x_out >= 0)
                return "the lone-norm ResNorm's tensors are not its RmsNorm's";
            return "";
        }
        if (l.count < 2 || o0.in[0] != r.d || o0.out[0] != r.d || o0.in[1] != r.post_w || r.post_w < 0)
            return "the ResNorm's norm is not d -> d with post_w";
        const PlanOp& add = ops_[l.op + 1];
        if (!code(l.op + 1, OpCode::Add) || cols_of(add) != H || !whole(add) || add.out[0] != r.x_out ||
            r.x_out < 0 ||
            !((add.in[0] == r.x && add.in[1] == r.d) || (add.in[1] == r.x && add.in[0] == r.d)))
            return "the ResNorm's add is not x + d -> x_out of its width";
        int32_t j         = l.op + 2;
        const int32_t end = l.op + l.count;
        if (r.scalar >= 0) {
            if (j >= end || !code(j, OpCode::Scale) || ops_[j].in[0] != r.x_out ||
                ops_[j].out[0] != r.x_out || ops_[j].in[1] != r.scalar || cols_of(ops_[j]) != H ||
                !whole(ops_[j]))
                return "the ResNorm's scale is not x_out * scalar in place";
            ++j;
        }
        if (r.xn >= 0) {
            if (j >= end || !code(j, OpCode::RmsNorm) || ops_[j].in[0] != r.x_out || ops_[j].out[0] != r.xn ||
                ops_[j].in[1] != r.pre_w || r.pre_w < 0 || cols_of(ops_[j]) != H || norm_dim(ops_[j]) != H ||
                !whole(ops_[j]))
                return "the ResNorm's second norm is not x_out -> xn of its width with pre_w";
            ++j;
        } else if (r.pre_w >= 0) {
            return "the ResNorm has a pre-norm weight but no output for it";
        }
        return j == end ? "" : "the ResNorm covers ops it does not run";
    }
    case LaunchKind::QkvPost:
    case LaunchKind::QkvAttn: {
        const QkvLaunch q = launch_params<QkvLaunch>(l);
        const int post    = l.kind == (uint16_t)LaunchKind::QkvAttn ? q.post_ops : l.count;
        if ((post != 2 && post != 6) || l.count != post + (l.kind == (uint16_t)LaunchKind::QkvAttn ? 1 : 0))
            return "a q/k/v record covers 2 or 6 ops (and the attention)";
        const PlanOp &qn = o0, &qr = ops_[l.op + 1];
        const int32_t heads = q.heads, dim = q.dim;
        const RopeParams rope = params<RopeParams>(qr);
        if (!code(l.op, OpCode::RmsNorm) || !code(l.op + 1, OpCode::Rope) || qn.in[0] != q.q ||
            qn.out[0] != q.q || qr.in[0] != q.q || qn.in[1] != q.q_norm_w || q.q_norm_w < 0 ||
            qr.in[1] != q.inv_freq || rope.heads != heads || rope.dim != dim || norm_dim(qn) != dim ||
            (int64_t)heads * dim != cols_of(qn) || dim <= 0 || dim > 2048 || !whole(qn) || !whole(qr))
            return "the q norm and rope are not the record's q, weights, heads and dim";
        if (post == 6) {
            const PlanOp &kn = ops_[l.op + 2], &kr = ops_[l.op + 3], &vn = ops_[l.op + 4],
                         &st       = ops_[l.op + 5];
            const int32_t kvh      = q.kv_heads;
            const RopeParams krope = params<RopeParams>(kr);
            if (!code(l.op + 2, OpCode::RmsNorm) || !code(l.op + 3, OpCode::Rope) ||
                !code(l.op + 4, OpCode::RmsNorm) || !code(l.op + 5, OpCode::KvStore) || kvh <= 0 ||
                kn.in[0] != q.k || kn.out[0] != q.k || kr.in[0] != q.k || kn.in[1] != q.k_norm_w ||
                q.k_norm_w < 0 || kr.in[1] != q.inv_freq || vn.in[0] != q.v || vn.out[0] != q.v ||
                st.in[0] != q.k || st.in[1] != q.v || st.out[0] != q.k_cache || st.out[1] != q.v_cache ||
                krope.heads != kvh || krope.dim != dim || norm_dim(kn) != dim || norm_dim(vn) != dim ||
                (int64_t)kvh * dim != cols_of(kn) || cols_of(vn) != cols_of(kn) ||
                cols_of(st) != cols_of(kn) || params<KvStoreParams>(st).slots != q.slots || !whole(kn) ||
                !whole(kr) || !whole(vn) || !whole(st) || heads % kvh != 0 ||
                (q.k_norm_w >= 0 && tensors_[q.k_norm_w].dtype != tensors_[q.q_norm_w].dtype))
                return "the k/v norms, rope and store are not the record's k, v, caches, kv heads and slots";
        } else if (q.k >= 0 || q.k_norm_w >= 0 || q.v >= 0 || q.k_cache >= 0 || q.v_cache >= 0) {
            return "a q-only record names k/v tensors";
        }
        if (l.kind == (uint16_t)LaunchKind::QkvAttn) {
            const PlanOp& at         = ops_[l.op + post];
            const AttentionParams ap = params<AttentionParams>(at);
            if (at.in[0] != q.q || ap.heads != heads || ap.dim != dim || at.in_col[0] || at.out_col[0] ||
                (post == 6 && (at.in[1] != q.k_cache || at.in[2] != q.v_cache || ap.kv_heads != q.kv_heads ||
                               ap.slots != q.slots)))
                return "the attention is not over the record's q and caches";
        }
        return "";
    }
    case LaunchKind::Gemv: {
        const GemvLaunch gl = launch_params<GemvLaunch>(l);
        const int nmat = gl.nmat, epi = gl.epilogue;
        const PlanTensor& w0 = tensors_[o0.in[1]];
        for (int m = 0; m < nmat; ++m) {
            const PlanOp& mm    = ops_[gl.mat(m)];
            const PlanTensor& w = tensors_[mm.in[1]];
            if (gl.mat(m) != l.op + m || mm.in[0] != o0.in[0] || mm.in_col[0] != o0.in_col[0] ||
                w.dtype != w0.dtype || w.dims[1] != w0.dims[1])
                return "the GEMV's matmuls are not consecutive matmuls of one input, K and dtype";
        }
        const int32_t y0 = o0.out[0];
        if (epi == 0) {
            if (l.count != nmat || gl.aux >= 0 || gl.out >= 0) return "a plain GEMV covers its matmuls only";
        } else if (epi == 1) {
            const PlanOp& g = ops_[l.op + 2];
            if (nmat != 2 || l.count != 3 || !code(l.op + 2, OpCode::GeluMul) || g.in[0] != y0 ||
                g.in[1] != ops_[l.op + 1].out[0] || g.out[0] != gl.out || cols_of(g) != w0.dims[0] ||
                tensors_[ops_[l.op + 1].in[1]].dims[0] != w0.dims[0] || !whole(g) || gl.aux >= 0)
                return "the GEMV pair's GeluMul is not gelu(gate) * up -> its output";
        } else if (epi == 2) {
            const PlanOp& g = ops_[l.op + 1];
            if (nmat != 1 || l.count != 2 || !code(l.op + 1, OpCode::GeluMul) || g.in[0] != y0 ||
                g.in[1] != gl.aux || g.in_col[1] != gl.aux_col || g.out[0] != gl.out ||
                cols_of(g) != w0.dims[0] || g.in_col[0] || g.out_col[0])
                return "the GEMV's GeluMul is not gelu(y) * aux -> its output";
        } else {
            const PlanOp& c = ops_[l.op + 1];
            if (nmat != 1 || l.count != 2 || !code(l.op + 1, OpCode::Softcap) || c.in[0] != y0 ||
                c.out[0] != y0 || !whole(c) || cols_of(c) != w0.dims[0] || gl.aux >= 0 || gl.out >= 0 ||
                !(gl.cap > 0))
                return "the GEMV's softcap is not in place over its output";
        }
        return "";
    }
    case LaunchKind::Mlp: {
        const PlanOp &g = o0, &u = ops_[l.op + 1], &gm = ops_[l.op + 2], &dn = ops_[l.op + 3];
        const PlanTensor &wg = tensors_[g.in[1]], &wu = tensors_[u.in[1]], &wd = tensors_[dn.in[1]];
        if (u.in[0] != g.in[0] || u.in_col[0] != g.in_col[0] || gm.in[0] != g.out[0] ||
            gm.in[1] != u.out[0] || dn.in[0] != gm.out[0] || !whole(gm) || dn.in_col[0] ||
            wg.dims[0] != wu.dims[0] || wg.dims[1] != wu.dims[1] || wg.dtype != wu.dtype ||
            wd.dims[1] != wg.dims[0] || wd.dims[0] != wg.dims[1] || cols_of(gm) != wg.dims[0] ||
            wd.dims[1] % 32 != 0)
            return "the MLP's gate, up, GeluMul and down do not chain (x -> [I, H] gate and up -> [H, I] "
                   "down)";
        return "";
    }
    case LaunchKind::GroupNormAdd: {
        const PlanOp &s1 = o0, &n = ops_[l.op + 1], &a = ops_[l.op + 2], &s2 = ops_[l.op + 3];
        const GroupNormAddLaunch gn = launch_params<GroupNormAddLaunch>(l);
        const int32_t N = gn.cols, P = gn.group;
        if (s1.in[0] != gn.ctx || s1.out[0] != gn.ctx || s1.in[1] >= 0 || cols_of(s1) != N || !whole(s1) ||
            n.in[0] != gn.ctx || n.out[0] != gn.ctx || n.in[1] != gn.w || cols_of(n) != N ||
            norm_dim(n) != P || !whole(n) || cols_of(a) != N || !whole(a) || a.out[0] != gn.out ||
            !((a.in[0] == gn.ctx && a.in[1] == gn.tok) || (a.in[1] == gn.ctx && a.in[0] == gn.tok)) ||
            s2.in[0] != gn.out || s2.out[0] != gn.out || s2.in[1] >= 0 || cols_of(s2) != N || !whole(s2))
            return "the per-layer-input ops are not the record's ctx, norm weight, tok and output";
        return "";
    }
    case LaunchKind::AttnO:
    case LaunchKind::GatedProj:
        return ""; // checked with their kinds above
    }
    return "unknown launch kind";
}

// Launch record i against its ops and the records around it (its op range starts at `next`): "" when it is
// consistent, else the message ("CUDA schedule record 12: ...").
std::string Plan::check_launch(size_t i, size_t next) const {
    const CudaLaunch& l = launches_[i];
    const auto cols     = [&](int32_t t) {
        return tensors_[t].ndim > 1 ? tensors_[t].dims[1] : tensors_[t].dims[0];
    }; // a row's width
    std::string what = "CUDA schedule record " + std::to_string(i);
    const auto RN    = [](const CudaLaunch& x) { return launch_params<ResNormLaunch>(x); };
    if (l.kind > (uint16_t)LaunchKind::GroupNormAdd || l.count < 1 || l.op != (int32_t)next ||
        next + l.count > n_ops())
        return what + ": bad kind or op range";
    const int32_t post_ops = launch_params<QkvLaunch>(l).post_ops;
    if (l.kind == (uint16_t)LaunchKind::QkvAttn &&
        ((post_ops != 2 && post_ops != 6) || l.count != post_ops + 1 ||
         ops_[l.op + l.count - 1].code != (uint16_t)OpCode::Attention))
        return what + ": q/k/v + attention record does not end in an attention op";
    for (int32_t t : l.t)
        if (t < -1 || t >= (int32_t)n_tensors_) return what + ": tensor index out of range";
    const GemvLaunch gl = launch_params<GemvLaunch>(l);
    if (l.kind == (uint16_t)LaunchKind::Gemv) {
        if (gl.nmat < 1 || gl.nmat > 3 || gl.epilogue < 0 || gl.epilogue > 3 ||
            (gl.lanes != 8 && gl.lanes != 16 && gl.lanes != 32 && gl.lanes != 64 && gl.lanes != 128))
            return what + ": bad GEMV parameters";
        for (int m = 0; m < gl.nmat; ++m)
            if (gl.mat(m) < l.op || gl.mat(m) >= l.op + l.count ||
                ops_[gl.mat(m)].code != (uint16_t)OpCode::Matmul)
                return what + ": GEMV operand is not a matmul it covers";
    }
    if (l.kind == (uint16_t)LaunchKind::Mlp) {
        const MlpLaunch ml = launch_params<MlpLaunch>(l);
        const bool ops_ok  = l.count == 4 && (ml.threads == 128 || ml.threads == 256) && ml.gate == l.op &&
                            ml.up == l.op + 1 && ml.down == l.op + 3 &&
                            ops_[l.op].code == (uint16_t)OpCode::Matmul &&
                            ops_[l.op + 1].code == (uint16_t)OpCode::Matmul &&
                            ops_[l.op + 2].code == (uint16_t)OpCode::GeluMul &&
                            ops_[l.op + 3].code == (uint16_t)OpCode::Matmul;
        if (!ops_ok || i == 0 || launches_[i - 1].kind != (uint16_t)LaunchKind::ResNorm ||
            RN(launches_[i - 1]).zeroed != ops_[l.op + 3].out[0])
            return what + ": bad MLP record (gate, up, GeluMul, down after a ResNorm that zeroes its output)";
        const PlanTensor& w = tensors_[ops_[l.op + 3].in[1]];
        if (w.dtype != (uint8_t)DType::NF4 || !(w.quant_flags & kQuantTiled32) || w.dims[1] % 64 != 0 ||
            w.dims[0] % 4 != 0)
            return what + ": the MLP's down weight is not a tiled NF4 matrix";
        if (ml.replicas < 1 || ml.replicas > kMlpReplicasMax)
            return what + ": MLP output replicas " + std::to_string(ml.replicas) + " (1 to " +
                   std::to_string(kMlpReplicasMax) + ")";
        if (ml.replicas > 1 &&
            (i + 1 >= n_launches_ || launches_[i + 1].kind != (uint16_t)LaunchKind::ResNorm ||
             RN(launches_[i + 1]).d != ops_[l.op + 3].out[0]))
            return what + ": an MLP with output replicas is not followed by the ResNorm that sums them";
        const PlanTensor &wg = tensors_[ops_[l.op].in[1]], &wu = tensors_[ops_[l.op + 1].in[1]];
        if (ml.f16 != 0 && ml.f16 != 1)
            return what + ": MLP arithmetic " + std::to_string(ml.f16) + " (0 f32, 1 packed f16)";
        const bool dq = ((w.quant_flags | wg.quant_flags | wu.quant_flags) & kQuantDoubleQuant) != 0;
        if (ml.f16 == 1 && (dq || wg.dtype != (uint8_t)DType::NF4 || wu.dtype != (uint8_t)DType::NF4 ||
                            !mlp_f16_width_ok(wg.dims[1])))
            return what +
                   ": a packed-f16 MLP needs NF4 gate and up weights with f32 block scales and "
                   "a width that is a multiple of 32 up to " +
                   std::to_string(kMlpF16MaxH);
        const ResNormLaunch rn = RN(launches_[i - 1]);
        if (rn.folded == 2) {    // the ResNorm before, run by this launch's _r kernel
            bool zeroed = false; // by an earlier ResNorm (its zero2)
            for (size_t k = i - 1; rn.zeroed >= 0 && k-- > 0 && !zeroed;)
                zeroed = launches_[k].kind == (uint16_t)LaunchKind::ResNorm &&
                         RN(launches_[k]).zero2 == rn.zeroed + 1;
            const bool ok = ml.f16 == 1 && ops_[l.op].in[0] == rn.xn && rn.x >= 0 && rn.d >= 0 &&
                            rn.post_w >= 0 && rn.x_out >= 0 && rn.pre_w >= 0 && rn.xn >= 0 && rn.scalar < 0 &&
                            rn.scale == 1.0f && rn.zero2 == 0 && mlp_res_fits(rn.cols, ml.threads) &&
                            rn.cols == w.dims[0] && cols(rn.x) >= rn.cols && cols(rn.d) >= rn.cols &&
                            cols(rn.x_out) >= rn.cols && zeroed;
            if (!ok)
                return "CUDA schedule record " + std::to_string(i - 1) +
                       ": bad folded ResNorm (folded 2 needs a packed-f16 MLP after it reading its "
                       "output, no scale, a width the "
                       "MLP kernel takes, and an earlier ResNorm zeroing the MLP's output)";
        }
    }
    const ResNormLaunch r = RN(l);
    if (l.kind == (uint16_t)LaunchKind::ResNorm && r.folded == 2 &&
        (i + 1 >= n_launches_ || launches_[i + 1].kind != (uint16_t)LaunchKind::Mlp))
        return what + ": bad folded ResNorm (folded 2 needs the MLP launch that runs it after it)";
    if (l.kind == (uint16_t)LaunchKind::ResNorm && r.zero2 != 0) {
        const int32_t z       = r.zero2 - 1;
        const bool after_reps = i > 0 && launches_[i - 1].kind == (uint16_t)LaunchKind::Mlp &&
                                launch_params<MlpLaunch>(launches_[i - 1]).replicas > 1;
        if (z < 0 || z >= (int32_t)n_tensors_ || tensors_[z].kind != (uint8_t)TensorKind::Activation ||
            cols(z) < r.cols || r.folded != 0 || after_reps)
            return what + ": bad second zeroed buffer (zero2 " + std::to_string(r.zero2) +
                   ": an activation tensor + 1 at least the row wide, on a ResNorm that is "
                   "launched and sums no replicas)";
    }
    if (l.kind == (uint16_t)LaunchKind::ResNorm && r.folded != 0 && r.folded != 2) {
        // folded 1: run by the GatedProj launch after it (g4_resnorm_gated_proj); the MLP before it zeroes
        // that launch's output.
        const CudaLaunch* mlp = i > 0 ? &launches_[i - 1] : nullptr;
        const CudaLaunch* ple = i + 1 < n_launches_ ? &launches_[i + 1] : nullptr;
        const bool ok         = r.folded == 1 && mlp && mlp->kind == (uint16_t)LaunchKind::Mlp &&
                        launch_params<MlpLaunch>(*mlp).y == r.d &&
                        launch_params<MlpLaunch>(*mlp).threads == 256 &&
                        launch_params<MlpLaunch>(*mlp).replicas == 1 && ple &&
                        ple->kind == (uint16_t)LaunchKind::GatedProj && ple->op == l.op + l.count &&
                        l.op + l.count < (int32_t)n_ops() && ops_[l.op + l.count].in[0] == r.x_out &&
                        r.x >= 0 && r.d >= 0 && r.post_w >= 0 && r.x_out >= 0 && r.scalar < 0 &&
                        r.pre_w < 0 && r.xn < 0 && r.scale == 1.0f && r.cols > 0 && r.cols % 4 == 0;
        if (!ok)
            return what + ": bad folded ResNorm (folded " + std::to_string(r.folded) +
                   "; 1 needs an MLP of 256 threads and one output before it, a PLE after it "
                   "reading its output, and no scale or second norm)";
    }
    if (l.kind == (uint16_t)LaunchKind::GatedProj) {
        const bool ok = l.count == 3 && ops_[l.op].code == (uint16_t)OpCode::Matmul &&
                        ops_[l.op + 1].code == (uint16_t)OpCode::GeluMul &&
                        ops_[l.op + 2].code == (uint16_t)OpCode::Matmul && i > 0 &&
                        launches_[i - 1].kind == (uint16_t)LaunchKind::ResNorm &&
                        RN(launches_[i - 1]).zeroed == ops_[l.op + 2].out[0];
        if (!ok)
            return what + ": bad per-layer-input record (gate, GeluMul, projection after a ResNorm "
                          "that zeroes its output)";
        const PlanTensor &g = tensors_[ops_[l.op].in[1]], &w = tensors_[ops_[l.op + 2].in[1]];
        if (g.dtype != (uint8_t)DType::BF16 || w.dtype != (uint8_t)DType::BF16 || g.dims[0] != w.dims[1] ||
            g.dims[1] != w.dims[0] || w.dims[0] % 8 != 0 || w.dims[0] > 4096 || w.dims[1] % 8 != 0)
            return what + ": the per-layer-input record's weights are not bf16 [P, H] and [H, P] "
                          "(H, P multiples of 8, H <= 4096)";
        const ResNormLaunch rn = RN(launches_[i - 1]);
        if (rn.folded == 1 && (rn.cols != w.dims[0] || cols(rn.x) < rn.cols || cols(rn.d) < rn.cols ||
                               cols(rn.x_out) < rn.cols))
            return what + ": the ResNorm folded into this per-layer-input record has another width";
    }
    if (l.kind == (uint16_t)LaunchKind::GroupNormAdd) {
        const GroupNormAddLaunch gn = launch_params<GroupNormAddLaunch>(l);
        const bool ok =
            l.count == 4 && ops_[l.op].code == (uint16_t)OpCode::Scale &&
            ops_[l.op + 1].code == (uint16_t)OpCode::RmsNorm &&
            ops_[l.op + 2].code == (uint16_t)OpCode::Add && ops_[l.op + 3].code == (uint16_t)OpCode::Scale &&
            gn.group > 0 && gn.group <= 1024 && gn.cols > 0 && gn.cols % gn.group == 0 && gn.ctx >= 0 &&
            gn.w >= 0 && gn.tok >= 0 && gn.out >= 0 &&
            tensors_[gn.w].dims[0] * (tensors_[gn.w].ndim > 1 ? tensors_[gn.w].dims[1] : 1) >= gn.group;
        if (!ok || cols(gn.ctx) < gn.cols || cols(gn.tok) < gn.cols || cols(gn.out) < gn.cols)
            return what + ": bad per-layer-input combination record (scale, grouped norm, add, "
                          "scale over N = groups x P <= 1024)";
    }
    if (l.kind == (uint16_t)LaunchKind::AttnO) {
        const AttnOLaunch ao = launch_params<AttnOLaunch>(l);
        const PlanOp& o      = ops_[l.op];
        bool ok = l.count == 1 && o.code == (uint16_t)OpCode::Matmul && i > 0 && ao.attention == l.op - 1 &&
                  ops_[ao.attention].code == (uint16_t)OpCode::Attention &&
                  o.in[0] == ops_[ao.attention].out[0] && o.in[1] >= 0;
        bool zeroed = false; // by a ResNorm launch before the attention's
        for (size_t k = i; ok && k-- > 0 && !zeroed;)
            zeroed =
                launches_[k].kind == (uint16_t)LaunchKind::ResNorm && RN(launches_[k]).zeroed == o.out[0];
        if (!ok || !zeroed)
            return what + ": bad attention-o record (the o matmul after an attention op, its output "
                          "zeroed by a ResNorm before)";
        const PlanOp& at    = ops_[ao.attention];
        const auto ap       = params<AttentionParams>(at);
        const PlanTensor& w = tensors_[o.in[1]];
        if (w.dtype != (uint8_t)DType::NF4 || !(w.quant_flags & kQuantTiled32) ||
            w.dims[1] != (int64_t)ap.heads * ap.dim || w.dims[1] % 64 != 0 || w.dims[0] % 4 != 0 ||
            w.dims[0] > 4096 || ap.dim % 32 != 0 || ap.decode_splits < 1 || ap.decode_splits > 1024)
            return what +
                   ": the attention-o record's weight is not a tiled NF4 [<= 4096, heads x dim] matrix";
    }
    if (const std::string bad = launch_operands(l); !bad.empty()) return what + ": " + bad;
    return "";
}

g4_status Plan::validate_records(std::string* err) {
    const g4_status CORRUPT     = G4_ERR_PLAN_CORRUPT;
    const ProgramInfo& in       = info_;
    const std::string recompile = "; re-run g4 compile to rebuild the plan";
    // Sizes a session allocates from: bounded here (the arenas below, by the tensors they hold).
    if (in.max_rows < 1 || in.max_rows > 8192 || in.max_context < 1 || in.max_context > (1 << 24) ||
        in.logits_rows < 1 || in.logits_rows > in.max_rows || in.vocab_size < 1 ||
        in.vocab_size > (1 << 24) || in.embed_vocab_limit < 1 || in.embed_vocab_limit > in.vocab_size ||
        in.max_k < 1 || in.max_k > (1 << 20) || in.max_slots < 1 || in.max_slots > in.max_context ||
        in.num_layers < 1 || in.num_layers > 4096 || in.hidden_size < 1 || in.eos_token_ids.size() > 64 ||
        in.tower_thread_floats > (1ull << 32) || in.tower_session_bytes > (1ull << 40) ||
        in.vision_gpu_bytes > (1ull << 40) || in.audio_gpu_bytes > (1ull << 40))
        return fail(CORRUPT, "inconsistent program sizes in metadata" + recompile, err);
    auto token_ok  = [&](int32_t id) { return id >= 0 && id < in.vocab_size; };
    bool tokens_ok = token_ok(in.bos_token_id) && token_ok(in.pad_token_id);
    for (int32_t id : in.eos_token_ids)
        tokens_ok = tokens_ok && token_ok(id);
    // (The media placeholders may lie beyond the text vocabulary: the session looks them up as pad_token_id.)
    if (!in.vision_config.empty())
        tokens_ok = tokens_ok && in.image_token_id >= 0 && in.boi_token_id >= 0 && in.eoi_token_id >= 0;
    if (!in.audio_config.empty())
        tokens_ok = tokens_ok && in.audio_token_id >= 0 && in.boa_token_id >= 0 && in.eoa_token_id >= 0;
    if (!tokens_ok)
        return fail(CORRUPT,
                    "bad metadata: a special token id outside the vocabulary of " +
                        std::to_string(in.vocab_size) + recompile,
                    err);
    // The generation defaults are what g4_sampling_params_from_plan hands out: the sampler's ranges.
    g4_sampling_params gen = g4_sampling_params_default();
    gen.temperature = in.temperature, gen.top_k = in.top_k, gen.top_p = in.top_p, gen.min_p = in.min_p;
    gen.repeat_penalty = in.repetition_penalty;
    if (const std::string bad = rt::check_sampling(gen); !bad.empty())
        return fail(CORRUPT, "bad metadata: generation defaults: " + bad + recompile, err);
    for (size_t i = 0; i < n_tensors_; ++i) {
        const PlanTensor& t = tensors_[i];
        std::string what    = "tensor " + std::to_string(i);
        if (t.name >= strings_size_) return fail(CORRUPT, what + ": name out of bounds", err);
        what = "tensor '" + std::string(str(t.name)) + "'";
        if (!dims_ok(t) || t.dtype > (uint8_t)DType::NF4 || t.kind > (uint8_t)TensorKind::Input)
            return fail(CORRUPT, what + ": bad dtype, kind or shape", err);
        int64_t n = 1;
        for (int d = 0; d < t.ndim; ++d)
            n *= t.dims[d];
        uint64_t expect = t.dtype == (uint8_t)DType::NF4
                              ? nf4::layout(n, t.quant_flags & kQuantDoubleQuant).total
                              : dtype_bytes((DType)t.dtype, n);
        if (t.nbytes != expect) return fail(CORRUPT, what + ": byte size disagrees with shape", err);
        if (t.dtype == (uint8_t)DType::NF4 && t.kind != (uint8_t)TensorKind::Weight)
            return fail(CORRUPT, what + ": NF4 must be a weight", err);
        uint64_t limit = 0;
        switch ((TensorKind)t.kind) {
        case TensorKind::Weight:
            limit = weights_size_;
            break;
        case TensorKind::KvCache:
            limit = in.kv_arena_bytes;
            break;
        default: // in the arena of the program that owns it
            limit = programs_[tensor_program(i)].arena_bytes;
            break;
        }
        if (t.offset > limit || t.nbytes > limit - t.offset)
            return fail(CORRUPT, what + ": data out of bounds", err);
        if (t.offset % kTensorAlign) return fail(CORRUPT, what + ": misaligned", err);
        if ((TensorKind)t.kind == TensorKind::Activation && (t.ndim != 2 || t.dtype != (uint8_t)DType::F32))
            return fail(CORRUPT, what + ": activations must be 2-D f32", err);
        if ((TensorKind)t.kind == TensorKind::KvCache &&
            (t.ndim != 2 || (t.dtype != (uint8_t)DType::F32 && t.dtype != (uint8_t)DType::BF16)))
            return fail(CORRUPT, what + ": KV caches must be 2-D f32 or bf16", err);
    }
    // The arenas a session allocates are no larger than their tensors laid end to end (each rounded up to
    // kTensorAlign), the most any packing of them takes; max_k (per-thread scratch) no larger than a weight's
    // K.
    uint64_t act_sum = 0, kv_sum = 0;
    int64_t widest_k = 1;
    for (size_t i = 0; i < n_tensors_; ++i) {
        const PlanTensor& t = tensors_[i];
        const uint64_t size = (t.nbytes + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
        if ((t.kind == (uint8_t)TensorKind::Activation || t.kind == (uint8_t)TensorKind::Input) &&
            i < programs_[0].tensor_end)
            act_sum += size;
        if (t.kind == (uint8_t)TensorKind::KvCache) kv_sum += size;
        if (t.kind == (uint8_t)TensorKind::Weight && t.ndim == 2) widest_k = std::max(widest_k, t.dims[1]);
    }
    if (in.act_arena_bytes > act_sum || in.kv_arena_bytes > kv_sum || in.max_k > widest_k)
        return fail(CORRUPT,
                    "bad metadata: activation arena " + std::to_string(in.act_arena_bytes) +
                        " bytes (its tensors take " + std::to_string(act_sum) + "), KV arena " +
                        std::to_string(in.kv_arena_bytes) + " (" + std::to_string(kv_sum) + "), max_k " +
                        std::to_string(in.max_k) + " (widest weight " + std::to_string(widest_k) + ")" +
                        recompile,
                    err);
    auto is = [&](int32_t idx, TensorKind k) {
        return idx >= 0 && (size_t)idx < n_tensors_ && tensors_[idx].kind == (uint8_t)k;
    };
    if (!is(in.ids_tensor, TensorKind::Input) || tensors_[in.ids_tensor].dims[0] < in.max_rows ||
        tensors_[in.ids_tensor].dtype != (uint8_t)DType::I32)
        return fail(CORRUPT, "bad ids tensor", err);
    if (!is(in.logits_tensor, TensorKind::Activation) ||
        tensors_[in.logits_tensor].dims[0] < in.logits_rows ||
        tensors_[in.logits_tensor].dims[1] != in.vocab_size)
        return fail(CORRUPT, "bad logits tensor", err);
    for (size_t i = 0; i < n_ops_; ++i) {
        const PlanOp& op = ops_[i];
        std::string what = "op " + std::to_string(i);
        if (op.name >= strings_size_) return fail(CORRUPT, what + ": name out of bounds", err);
        if (std::string_view(op_name((OpCode)op.code)) == "unknown")
            return fail(CORRUPT, what + ": unknown op code", err);
        // (The other programs' ops: row modes and tensors checked by check_program against their program.)
        const bool text = i < n_ops();
        if (text && (op.row_mode < 0 || op.row_mode > 2)) return fail(CORRUPT, what + ": bad row mode", err);
        if (text && op.layer != kNoLayer && op.layer >= in.num_layers)
            return fail(CORRUPT,
                        what + ": layer " + std::to_string(op.layer) + " of a model of " +
                            std::to_string(in.num_layers) + recompile,
                        err);
        for (int32_t t : op.in)
            if (t < -1 || t >= (int32_t)n_tensors_)
                return fail(CORRUPT, what + ": input tensor index out of range", err);
        for (int32_t t : op.out)
            if (t < -1 || t >= (int32_t)n_tensors_)
                return fail(CORRUPT, what + ": output tensor index out of range", err);
    }
    // Every op against the tensors it names (its indices are in range: checked above).
    if (const std::string bad = check_program(*this); !bad.empty()) return fail(CORRUPT, bad, err);
    // The CUDA schedule covers ops 0..n-1 in order, each exactly once; its operands are in range.
    size_t next = 0;
    for (size_t i = 0; i < n_launches_; ++i) {
        if (const std::string bad = check_launch(i, next); !bad.empty()) return fail(CORRUPT, bad, err);
        next += launches_[i].count;
    }
    if (n_launches_ && next != n_ops())
        return fail(CORRUPT, "CUDA schedule does not cover every op of the text program", err);
    return G4_OK;
}

} // namespace g4::plan
