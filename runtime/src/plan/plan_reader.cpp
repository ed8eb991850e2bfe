// Plan loading and validation (see plan_reader.h).
#include "runtime/src/plan/plan_reader.h"

#include "kernels/nf4.h"
#include "runtime/src/json_fields.h"
#include "runtime/src/json_limits.h"

#include <cstring>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace g4::plan {

Plan::~Plan() {
    if (map_) ::munmap(map_, size_);
}

g4_status Plan::fail(g4_status st, const std::string& msg, std::string* err) const {
    if (err) *err = path_ + ": " + msg;
    return st;
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
    const PlanTensor& w = tensors_[t];
    const uintptr_t page = (uintptr_t)::sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)(weights_ + w.offset) & ~(page - 1);
    const uintptr_t b = ((uintptr_t)(weights_ + w.offset + w.nbytes) + page - 1) & ~(page - 1);
    ::madvise((void*)a, b - a, MADV_RANDOM);
}

g4_status Plan::load(const std::string& path, bool verify_weights, std::string* err) {
    path_ = path;
    const g4_status CORRUPT = G4_ERR_PLAN_CORRUPT;
    const std::string recompile = "; re-run g4 compile to rebuild the plan";
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return fail(G4_ERR_IO, "cannot open plan file (" + std::string(std::strerror(errno)) + ")", err);
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return fail(G4_ERR_IO, "not a regular file", err);
    }
    size_ = (uint64_t)st.st_size;
    if (size_ < sizeof(PlanHeader)) {
        ::close(fd);
        return fail(CORRUPT, "truncated plan: " + std::to_string(size_) + " bytes is smaller than the header" + recompile, err);
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
        return fail(G4_ERR_PLAN_VERSION, "plan format " + std::to_string(header_->format_major) + "." +
                    std::to_string(header_->format_minor) + " but this runtime reads " + std::to_string(kFormatMajor) +
                    ".x" + recompile, err);
    PlanHeader h = *header_;
    h.header_checksum = 0;
    if ((uint32_t)fnv1a64(&h, sizeof h) != header_->header_checksum) return fail(CORRUPT, "header checksum mismatch" + recompile, err);
    if (header_->schema_hash != schema_hash())
        return fail(G4_ERR_PLAN_VERSION, "plan schema differs from this runtime's (written by another g4 version)" + recompile, err);
    if (header_->file_size != size_)
        return fail(CORRUPT, "truncated or extended plan: header says " + std::to_string(header_->file_size) +
                    " bytes, file has " + std::to_string(size_) + recompile, err);
    uint64_t tab = header_->section_table_offset, n = header_->section_count;
    if (n == 0 || n > 64 || tab + n * sizeof(PlanSection) > size_) return fail(CORRUPT, "section table out of bounds" + recompile, err);
    sections_.assign((const PlanSection*)(base + tab), (const PlanSection*)(base + tab) + n);

    const PlanSection *meta = nullptr, *strs = nullptr, *tens = nullptr, *ops = nullptr, *wts = nullptr;
    for (const PlanSection& s : sections_) {
        if (s.offset > size_ || s.size > size_ - s.offset) return fail(CORRUPT, "section " + std::to_string(s.kind) + " out of bounds" + recompile, err);
        switch ((SectionKind)s.kind) {
        case SectionKind::Meta: meta = &s; break;
        case SectionKind::Strings: strs = &s; break;
        case SectionKind::Tensors: tens = &s; break;
        case SectionKind::Ops: ops = &s; break;
        case SectionKind::Weights: wts = &s; break;
        case SectionKind::Tokenizer: tokenizer_ = std::string_view((const char*)base + s.offset, s.size); break;
        case SectionKind::Cubin: cubin_ = std::string_view((const char*)base + s.offset, s.size); break;
        case SectionKind::Ptx: ptx_ = std::string_view((const char*)base + s.offset, s.size); break;
        case SectionKind::CudaSchedule:
            if (s.size % sizeof(CudaLaunch) || s.offset % 8) return fail(CORRUPT, "malformed CUDA schedule" + recompile, err);
            launches_   = (const CudaLaunch*)(base + s.offset);
            n_launches_ = s.size / sizeof(CudaLaunch);
            break;
        default: break;   // unknown kinds from a newer minor version are skipped
        }
        bool small = (SectionKind)s.kind != SectionKind::Weights;
        if ((small || verify_weights) && fnv1a64(base + s.offset, s.size) != s.checksum)
            return fail(CORRUPT, std::string("checksum mismatch in the ") + (small ? "metadata" : "weights") + " section (kind " +
                        std::to_string(s.kind) + ")" + recompile, err);
    }
    if (!meta || !strs || !tens || !ops || !wts) return fail(CORRUPT, "missing a required section" + recompile, err);
    if (tens->size % sizeof(PlanTensor) || ops->size % sizeof(PlanOp) || tens->offset % 8 || ops->offset % 8)
        return fail(CORRUPT, "malformed tensor or op table" + recompile, err);
    meta_         = std::string((const char*)base + meta->offset, meta->size);
    strings_      = (const char*)base + strs->offset;
    strings_size_ = strs->size;
    if (strings_size_ == 0 || strings_[strings_size_ - 1] != '\0') return fail(CORRUPT, "string table not terminated" + recompile, err);
    tensors_      = (const PlanTensor*)(base + tens->offset);
    n_tensors_    = tens->size / sizeof(PlanTensor);
    ops_          = (const PlanOp*)(base + ops->offset);
    n_ops_        = ops->size / sizeof(PlanOp);
    weights_      = base + wts->offset;
    weights_size_ = wts->size;

    try {
        if (std::string e = json_depth_error(meta_); !e.empty())
            return fail(CORRUPT, "META: " + e + recompile, err);
        auto j              = nlohmann::json::parse(meta_);
        arch_               = jsonf::get<std::string>(j, "architecture");
        device_             = jsonf::value<std::string>(j, "device", "cpu");
        if (j.contains("cuda")) {
            cuda_target_   = jsonf::get<std::string>(j["cuda"], "target");
            cuda_device_   = jsonf::value<int>(j["cuda"], "device_index", 0);
            cuda_attn_hpg_ = jsonf::value<int>(j["cuda"], "attn_hpg", 0);
        }
        if (j.contains("placement"))
            ple_on_host_ = jsonf::value<std::string>(j["placement"], "ple", "device") == "host";
        const auto& p       = j.at("program");
        info_.max_rows          = jsonf::get<int32_t>(p, "max_rows");
        info_.max_context       = jsonf::get<int32_t>(p, "max_context");
        info_.logits_rows       = jsonf::get<int32_t>(p, "logits_rows");
        info_.sliding_slots     = jsonf::get<int32_t>(p, "sliding_slots");
        info_.act_arena_bytes   = jsonf::get<uint64_t>(p, "act_arena_bytes");
        info_.kv_arena_bytes    = jsonf::get<uint64_t>(p, "kv_arena_bytes");
        info_.ids_tensor        = jsonf::get<int32_t>(p, "ids_tensor");
        info_.logits_tensor     = jsonf::get<int32_t>(p, "logits_tensor");
        info_.max_k             = jsonf::get<int64_t>(p, "max_k");
        info_.max_slots         = jsonf::get<int64_t>(p, "max_slots");
        info_.vocab_size        = jsonf::get<int32_t>(p, "vocab_size");
        info_.embed_vocab_limit = jsonf::get<int32_t>(p, "embed_vocab_limit");
        const auto& hp      = j.at("hparams");
        info_.num_layers        = jsonf::get<int32_t>(hp, "num_hidden_layers");
        info_.hidden_size       = jsonf::get<int32_t>(hp, "hidden_size");
        info_.kv_host_begin = info_.kv_arena_bytes;
        info_.towers_begin = info_.towers_end = weights_size_;
        if (j.contains("towers")) {
            const auto& tw = j.at("towers");
            info_.towers_begin        = jsonf::get<uint64_t>(tw.at("weights"), 0, "weights");
            info_.towers_end          = jsonf::get<uint64_t>(tw.at("weights"), 1, "weights");
            info_.max_media_tokens    = jsonf::get<int32_t>(tw, "max_media_tokens");
            info_.tower_thread_floats = jsonf::get<uint64_t>(tw, "thread_scratch_floats");
            info_.tower_session_bytes = jsonf::value<uint64_t>(tw, "session_bytes", 0);
            const std::string prec =
                jsonf::value<std::string>(tw, "precision", "fp32"); // absent in older plans
            if (prec != "fp32" && prec != "bf16")
                return fail(CORRUPT, "bad metadata: towers precision '" + prec + "'" + recompile, err);
            info_.tower_bf16 = prec == "bf16";
            if (tw.contains("vision")) {
                const auto& v         = tw.at("vision");
                info_.vision_config   = v.at("config").dump();
                info_.image_tokens     = jsonf::get<int32_t>(v, "image_tokens");
                info_.max_patches      = jsonf::get<int32_t>(v, "max_patches");
                info_.max_image_pixels = jsonf::get<int64_t>(v, "max_image_pixels");
                info_.image_token_id   = jsonf::get<int32_t>(v, "image_token_id");
                info_.boi_token_id     = jsonf::get<int32_t>(v, "boi_token_id");
                info_.eoi_token_id     = jsonf::get<int32_t>(v, "eoi_token_id");
                const std::string dev =
                    jsonf::value<std::string>(v, "device", "cpu"); // absent in older plans
                if (dev != "cpu") {
                    if (device_ != "cuda" || dev != "cuda:" + std::to_string(cuda_device_))
                        return fail(CORRUPT, "bad metadata: vision tower device '" + dev + "'" + recompile, err);
                    info_.vision_gpu       = true;
                    info_.vision_begin     = jsonf::get<uint64_t>(v.at("weights"), 0, "weights");
                    info_.vision_end       = jsonf::get<uint64_t>(v.at("weights"), 1, "weights");
                    info_.vision_gpu_bytes = jsonf::get<uint64_t>(v, "gpu_bytes");
                }
            }
            if (tw.contains("audio")) {
                const auto& a           = tw.at("audio");
                info_.audio_config      = a.at("config").dump();
                info_.max_audio_samples = jsonf::get<int64_t>(a, "max_samples");
                info_.audio_sample_rate = jsonf::get<int32_t>(a, "sample_rate");
                info_.audio_token_id    = jsonf::get<int32_t>(a, "audio_token_id");
                info_.boa_token_id      = jsonf::get<int32_t>(a, "boa_token_id");
                info_.eoa_token_id      = jsonf::get<int32_t>(a, "eoa_token_id");
                const std::string dev =
                    jsonf::value<std::string>(a, "device", "cpu"); // absent in older plans
                if (dev != "cpu") {
                    if (device_ != "cuda" || dev != "cuda:" + std::to_string(cuda_device_))
                        return fail(CORRUPT, "bad metadata: audio tower device '" + dev + "'" + recompile,
                                    err);
                    info_.audio_gpu       = true;
                    info_.audio_begin     = jsonf::get<uint64_t>(a.at("weights"), 0, "weights");
                    info_.audio_end       = jsonf::get<uint64_t>(a.at("weights"), 1, "weights");
                    info_.audio_gpu_bytes = jsonf::get<uint64_t>(a, "gpu_bytes");
                }
            }
            if (info_.towers_begin > info_.towers_end || info_.towers_end != weights_size_ ||
                info_.max_media_tokens < 1 || info_.max_media_tokens > info_.max_context ||
                info_.max_patches < 0 || info_.max_audio_samples < 0 || info_.max_image_pixels < 0 ||
                (info_.vision_config.empty() && info_.audio_config.empty()) ||
                (info_.vision_gpu &&
                 (info_.vision_begin < info_.towers_begin || info_.vision_begin >= info_.vision_end ||
                  info_.vision_end > info_.towers_end)) ||
                (info_.audio_gpu &&
                 (info_.audio_begin < info_.towers_begin || info_.audio_begin >= info_.audio_end ||
                  info_.audio_end > info_.towers_end)))
                return fail(CORRUPT, "bad metadata: towers" + recompile, err);
        }
        if (p.contains("layer_devices")) {
            if (device_ != "cuda") return fail(CORRUPT, "bad metadata: layer_devices in a CPU plan" + recompile, err);
            info_.layer_device  = jsonf::get<std::vector<int32_t>>(p, "layer_devices");
            info_.kv_host_begin = jsonf::get<uint64_t>(p, "kv_host_begin");
            for (const auto& g : p.at("gpus")) {
                ProgramInfo::GpuPart part;
                part.index = jsonf::get<int32_t>(g, "index");
                for (const auto& r : g.at("weights"))
                    part.weights.push_back(
                        {jsonf::get<uint64_t>(r, 0, "weights"), jsonf::get<uint64_t>(r, 1, "weights")});
                part.kv_begin = jsonf::get<uint64_t>(g.at("kv"), 0, "kv");
                part.kv_end   = jsonf::get<uint64_t>(g.at("kv"), 1, "kv");
                info_.gpus.push_back(part);
            }
            bool ok = (int32_t)info_.layer_device.size() == info_.num_layers && !info_.gpus.empty() &&
                      info_.gpus[0].index == cuda_device_ && info_.kv_host_begin <= info_.kv_arena_bytes;
            for (size_t a = 0; a < info_.gpus.size(); ++a) {
                const auto& g = info_.gpus[a];
                ok            = ok && g.index >= 0 && g.index < 4096 && g.kv_begin <= g.kv_end && g.kv_end <= info_.kv_host_begin;
                for (const auto& [b, e] : g.weights) ok = ok && b <= e && e <= weights_size_;
                for (size_t b = 0; b < a; ++b) ok = ok && info_.gpus[b].index != g.index;
            }
            for (int32_t d : info_.layer_device) ok = ok && (d == -1 || (d >= 0 && gpu_slot(d) >= 0));
            if (!ok) return fail(CORRUPT, "bad metadata: layer_devices / gpus / kv_host_begin" + recompile, err);
        } else if (device_ == "cuda") {
            info_.gpus.push_back({cuda_device_, {{0, info_.towers_begin}}, 0, info_.kv_arena_bytes});
        }
        const auto& g       = j.at("generation");
        info_.eos_token_ids      = jsonf::get<std::vector<int32_t>>(g, "eos_token_ids");
        info_.bos_token_id       = jsonf::get<int32_t>(g, "bos_token_id");
        info_.pad_token_id       = jsonf::value<int32_t>(g, "pad_token_id", 0);
        info_.do_sample          = jsonf::value<bool>(g, "do_sample", false);
        info_.temperature        = jsonf::value<float>(g, "temperature", 1.0f);
        info_.top_k              = jsonf::value<int32_t>(g, "top_k", 0);
        info_.top_p              = jsonf::value<float>(g, "top_p", 1.0f);
        info_.min_p              = jsonf::value<float>(g, "min_p", 0.0f);
        info_.repetition_penalty = jsonf::value<float>(g, "repetition_penalty", 1.0f);
    } catch (const std::exception& e) {
        return fail(CORRUPT, std::string("bad metadata: ") + e.what() + recompile, err);
    }
    return validate_records(err);
}

g4_status Plan::validate_records(std::string* err) {
    const g4_status CORRUPT = G4_ERR_PLAN_CORRUPT;
    const ProgramInfo& in   = info_;
    if (in.max_rows < 1 || in.max_context < 1 || in.logits_rows < 1 || in.logits_rows > in.max_rows || in.vocab_size < 1 ||
        in.embed_vocab_limit < 1 || in.embed_vocab_limit > in.vocab_size || in.max_k < 1 || in.max_slots < 1)
        return fail(CORRUPT, "inconsistent program sizes in metadata", err);
    for (size_t i = 0; i < n_tensors_; ++i) {
        const PlanTensor& t = tensors_[i];
        std::string what    = "tensor " + std::to_string(i);
        if (t.name >= strings_size_) return fail(CORRUPT, what + ": name out of bounds", err);
        what = "tensor '" + std::string(str(t.name)) + "'";
        if (!dims_ok(t) || t.dtype > (uint8_t)DType::NF4 || t.kind > (uint8_t)TensorKind::Input)
            return fail(CORRUPT, what + ": bad dtype, kind or shape", err);
        int64_t n = 1;
        for (int d = 0; d < t.ndim; ++d) n *= t.dims[d];
        uint64_t expect = t.dtype == (uint8_t)DType::NF4 ? nf4::layout(n, t.quant_flags & kQuantDoubleQuant).total
                                                         : dtype_bytes((DType)t.dtype, n);
        if (t.nbytes != expect) return fail(CORRUPT, what + ": byte size disagrees with shape", err);
        if (t.dtype == (uint8_t)DType::NF4 && t.kind != (uint8_t)TensorKind::Weight) return fail(CORRUPT, what + ": NF4 must be a weight", err);
        uint64_t limit = 0;
        switch ((TensorKind)t.kind) {
        case TensorKind::Weight: limit = weights_size_; break;
        case TensorKind::KvCache: limit = in.kv_arena_bytes; break;
        default: limit = in.act_arena_bytes; break;
        }
        if (t.offset > limit || t.nbytes > limit - t.offset) return fail(CORRUPT, what + ": data out of bounds", err);
        if (t.offset % kTensorAlign) return fail(CORRUPT, what + ": misaligned", err);
        if ((TensorKind)t.kind == TensorKind::Activation && (t.ndim != 2 || t.dtype != (uint8_t)DType::F32))
            return fail(CORRUPT, what + ": activations must be 2-D f32", err);
        if ((TensorKind)t.kind == TensorKind::KvCache && (t.ndim != 2 || (t.dtype != (uint8_t)DType::F32 && t.dtype != (uint8_t)DType::BF16)))
            return fail(CORRUPT, what + ": KV caches must be 2-D f32 or bf16", err);
    }
    auto is = [&](int32_t idx, TensorKind k) { return idx >= 0 && (size_t)idx < n_tensors_ && tensors_[idx].kind == (uint8_t)k; };
    if (!is(in.ids_tensor, TensorKind::Input) || tensors_[in.ids_tensor].dims[0] < in.max_rows ||
        tensors_[in.ids_tensor].dtype != (uint8_t)DType::I32)
        return fail(CORRUPT, "bad ids tensor", err);
    if (!is(in.logits_tensor, TensorKind::Activation) || tensors_[in.logits_tensor].dims[0] < in.logits_rows ||
        tensors_[in.logits_tensor].dims[1] != in.vocab_size)
        return fail(CORRUPT, "bad logits tensor", err);
    for (size_t i = 0; i < n_ops_; ++i) {
        const PlanOp& op = ops_[i];
        std::string what = "op " + std::to_string(i);
        if (op.name >= strings_size_) return fail(CORRUPT, what + ": name out of bounds", err);
        if (op.code < (uint16_t)OpCode::Embed || op.code > (uint16_t)OpCode::Copy) return fail(CORRUPT, what + ": unknown op code", err);
        if (op.row_mode < 0 || op.row_mode > 2) return fail(CORRUPT, what + ": bad row mode", err);
        for (int32_t t : op.in)
            if (t < -1 || t >= (int32_t)n_tensors_) return fail(CORRUPT, what + ": input tensor index out of range", err);
        for (int32_t t : op.out)
            if (t < -1 || t >= (int32_t)n_tensors_) return fail(CORRUPT, what + ": output tensor index out of range", err);
    }
    // The CUDA schedule covers ops 0..n-1 in order, each exactly once; its operands are in range.
    size_t next = 0;
    const auto cols = [&](int32_t t) { return tensors_[t].ndim > 1 ? tensors_[t].dims[1] : tensors_[t].dims[0]; };   // a row's width
    for (size_t i = 0; i < n_launches_; ++i) {
        const CudaLaunch& l = launches_[i];
        std::string what    = "CUDA schedule record " + std::to_string(i);
        if (l.kind > (uint16_t)LaunchKind::PleIn || l.count < 1 || l.op != (int32_t)next || next + l.count > n_ops_)
            return fail(CORRUPT, what + ": bad kind or op range", err);
        if (l.kind == (uint16_t)LaunchKind::QkvAttn &&
            ((l.ip[4] != 2 && l.ip[4] != 6) || l.count != l.ip[4] + 1 || ops_[l.op + l.count - 1].code != (uint16_t)OpCode::Attention))
            return fail(CORRUPT, what + ": q/k/v + attention record does not end in an attention op", err);
        for (int32_t t : l.t)
            if (t < -1 || t >= (int32_t)n_tensors_) return fail(CORRUPT, what + ": tensor index out of range", err);
        if (l.kind == (uint16_t)LaunchKind::Gemv) {
            if (l.ip[3] < 1 || l.ip[3] > 3 || l.ip[4] < 0 || l.ip[4] > 3 || (l.ip[5] != 8 && l.ip[5] != 16 && l.ip[5] != 32 && l.ip[5] != 64 && l.ip[5] != 128))
                return fail(CORRUPT, what + ": bad GEMV parameters", err);
            for (int m = 0; m < l.ip[3]; ++m)
                if (l.ip[m] < l.op || l.ip[m] >= l.op + l.count || ops_[l.ip[m]].code != (uint16_t)OpCode::Matmul)
                    return fail(CORRUPT, what + ": GEMV operand is not a matmul it covers", err);
        }
        if (l.kind == (uint16_t)LaunchKind::Mlp) {
            const bool ops_ok = l.count == 4 && (l.ip[5] == 128 || l.ip[5] == 256) && l.ip[0] == l.op && l.ip[1] == l.op + 1 && l.ip[3] == l.op + 3 &&
                                ops_[l.op].code == (uint16_t)OpCode::Matmul && ops_[l.op + 1].code == (uint16_t)OpCode::Matmul &&
                                ops_[l.op + 2].code == (uint16_t)OpCode::GeluMul && ops_[l.op + 3].code == (uint16_t)OpCode::Matmul;
            if (!ops_ok || i == 0 || launches_[i - 1].kind != (uint16_t)LaunchKind::ResNorm || launches_[i - 1].t[7] != ops_[l.op + 3].out[0])
                return fail(CORRUPT, what + ": bad MLP record (gate, up, GeluMul, down after a ResNorm that zeroes its output)", err);
            const PlanTensor& w = tensors_[ops_[l.op + 3].in[1]];
            if (w.dtype != (uint8_t)DType::NF4 || !(w.quant_flags & kQuantTiled32) || w.dims[1] % 64 != 0 || w.dims[0] % 4 != 0)
                return fail(CORRUPT, what + ": the MLP's down weight is not a tiled NF4 matrix", err);
            if (l.ip[6] < 1 || l.ip[6] > kMlpReplicasMax)
                return fail(CORRUPT, what + ": MLP output replicas " + std::to_string(l.ip[6]) + " (1 to " + std::to_string(kMlpReplicasMax) + ")", err);
            if (l.ip[6] > 1 && (i + 1 >= n_launches_ || launches_[i + 1].kind != (uint16_t)LaunchKind::ResNorm ||
                                launches_[i + 1].t[1] != ops_[l.op + 3].out[0]))
                return fail(CORRUPT, what + ": an MLP with output replicas is not followed by the ResNorm that sums them", err);
            const PlanTensor &wg = tensors_[ops_[l.op].in[1]], &wu = tensors_[ops_[l.op + 1].in[1]];
            if (l.ip[7] != 0 && l.ip[7] != 1)
                return fail(CORRUPT, what + ": MLP arithmetic " + std::to_string(l.ip[7]) + " (0 f32, 1 packed f16)", err);
            const bool dq = ((w.quant_flags | wg.quant_flags | wu.quant_flags) & kQuantDoubleQuant) != 0;
            if (l.ip[7] == 1 && (dq || wg.dtype != (uint8_t)DType::NF4 || wu.dtype != (uint8_t)DType::NF4 || !mlp_f16_width_ok(wg.dims[1])))
                return fail(CORRUPT, what + ": a packed-f16 MLP needs NF4 gate and up weights with f32 block scales and a width that is a multiple of 32 up to " +
                                         std::to_string(kMlpF16MaxH), err);
            if (launches_[i - 1].ip[1] == 2) {   // the ResNorm before, run by this launch's _r kernel
                const CudaLaunch& rn = launches_[i - 1];
                bool zeroed          = false;   // by an earlier ResNorm (ip2)
                for (size_t k = i - 1; rn.t[7] >= 0 && k-- > 0 && !zeroed;)
                    zeroed = launches_[k].kind == (uint16_t)LaunchKind::ResNorm && launches_[k].ip[2] == rn.t[7] + 1;
                const bool ok = l.ip[7] == 1 && ops_[l.op].in[0] == rn.t[6] && rn.t[0] >= 0 && rn.t[1] >= 0 && rn.t[2] >= 0 && rn.t[4] >= 0 &&
                                rn.t[5] >= 0 && rn.t[6] >= 0 && rn.t[3] < 0 && rn.fp[1] == 1.0f && rn.ip[2] == 0 && mlp_res_fits(rn.ip[0], l.ip[5]) &&
                                rn.ip[0] == w.dims[0] && cols(rn.t[0]) >= rn.ip[0] && cols(rn.t[1]) >= rn.ip[0] && cols(rn.t[4]) >= rn.ip[0] && zeroed;
                if (!ok)
                    return fail(CORRUPT, "CUDA schedule record " + std::to_string(i - 1) +
                                             ": bad folded ResNorm (ip1 2 needs a packed-f16 MLP after it reading its output, no scale, a width the "
                                             "MLP kernel takes, and an earlier ResNorm zeroing the MLP's output)", err);
            }
        }
        if (l.kind == (uint16_t)LaunchKind::ResNorm && l.ip[1] == 2 && (i + 1 >= n_launches_ || launches_[i + 1].kind != (uint16_t)LaunchKind::Mlp))
            return fail(CORRUPT, what + ": bad folded ResNorm (ip1 2 needs the MLP launch that runs it after it)", err);
        if (l.kind == (uint16_t)LaunchKind::ResNorm && l.ip[2] != 0) {
            const int32_t z = l.ip[2] - 1;
            const bool after_reps = i > 0 && launches_[i - 1].kind == (uint16_t)LaunchKind::Mlp && launches_[i - 1].ip[6] > 1;
            if (z < 0 || z >= (int32_t)n_tensors_ || tensors_[z].kind != (uint8_t)TensorKind::Activation || cols(z) < l.ip[0] || l.ip[1] != 0 || after_reps)
                return fail(CORRUPT, what + ": bad second zeroed buffer (ip2 " + std::to_string(l.ip[2]) +
                                         ": an activation tensor + 1 at least the row wide, on a ResNorm that is launched and sums no replicas)", err);
        }
        if (l.kind == (uint16_t)LaunchKind::ResNorm && l.ip[1] != 0 && l.ip[1] != 2) {
            // ip1 = 1: run by the Ple launch after it (g4_ple_res); the MLP before it zeroes that launch's output.
            const CudaLaunch* mlp = i > 0 ? &launches_[i - 1] : nullptr;
            const CudaLaunch* ple = i + 1 < n_launches_ ? &launches_[i + 1] : nullptr;
            const bool ok = l.ip[1] == 1 && mlp && mlp->kind == (uint16_t)LaunchKind::Mlp && mlp->t[0] == l.t[1] && mlp->ip[5] == 256 && mlp->ip[6] == 1 && ple &&
                            ple->kind == (uint16_t)LaunchKind::Ple && ple->op == l.op + l.count && l.op + l.count < (int32_t)n_ops_ &&
                            ops_[l.op + l.count].in[0] == l.t[4] && l.t[0] >= 0 && l.t[1] >= 0 && l.t[2] >= 0 && l.t[4] >= 0 &&
                            l.t[3] < 0 && l.t[5] < 0 && l.t[6] < 0 && l.fp[1] == 1.0f && l.ip[0] > 0 && l.ip[0] % 4 == 0;
            if (!ok)
                return fail(CORRUPT, what + ": bad folded ResNorm (ip1 " + std::to_string(l.ip[1]) +
                                         "; 1 needs an MLP of 256 threads and one output before it, a PLE after it reading its output, and no scale or second norm)", err);
        }
        if (l.kind == (uint16_t)LaunchKind::Ple) {
            const bool ok = l.count == 3 && ops_[l.op].code == (uint16_t)OpCode::Matmul && ops_[l.op + 1].code == (uint16_t)OpCode::GeluMul &&
                            ops_[l.op + 2].code == (uint16_t)OpCode::Matmul && i > 0 && launches_[i - 1].kind == (uint16_t)LaunchKind::ResNorm &&
                            launches_[i - 1].t[7] == ops_[l.op + 2].out[0];
            if (!ok) return fail(CORRUPT, what + ": bad per-layer-input record (gate, GeluMul, projection after a ResNorm that zeroes its output)", err);
            const PlanTensor &g = tensors_[ops_[l.op].in[1]], &w = tensors_[ops_[l.op + 2].in[1]];
            if (g.dtype != (uint8_t)DType::BF16 || w.dtype != (uint8_t)DType::BF16 || g.dims[0] != w.dims[1] || g.dims[1] != w.dims[0] ||
                w.dims[0] % 8 != 0 || w.dims[0] > 4096 || w.dims[1] % 8 != 0)
                return fail(CORRUPT, what + ": the per-layer-input record's weights are not bf16 [P, H] and [H, P] (H, P multiples of 8, H <= 4096)", err);
            const CudaLaunch& rn = launches_[i - 1];
            if (rn.ip[1] == 1 && (rn.ip[0] != w.dims[0] || cols(rn.t[0]) < rn.ip[0] || cols(rn.t[1]) < rn.ip[0] || cols(rn.t[4]) < rn.ip[0]))
                return fail(CORRUPT, what + ": the ResNorm folded into this per-layer-input record has another width", err);
        }
        if (l.kind == (uint16_t)LaunchKind::PleIn) {
            const bool ok = l.count == 4 && ops_[l.op].code == (uint16_t)OpCode::Scale && ops_[l.op + 1].code == (uint16_t)OpCode::RmsNorm &&
                            ops_[l.op + 2].code == (uint16_t)OpCode::Add && ops_[l.op + 3].code == (uint16_t)OpCode::Scale &&
                            l.ip[1] > 0 && l.ip[1] <= 1024 && l.ip[0] > 0 && l.ip[0] % l.ip[1] == 0 && l.t[0] >= 0 && l.t[1] >= 0 &&
                            l.t[2] >= 0 && l.t[3] >= 0 && tensors_[l.t[1]].dims[0] * (tensors_[l.t[1]].ndim > 1 ? tensors_[l.t[1]].dims[1] : 1) >= l.ip[1];
            if (!ok || cols(l.t[0]) < l.ip[0] || cols(l.t[2]) < l.ip[0] || cols(l.t[3]) < l.ip[0])
                return fail(CORRUPT, what + ": bad per-layer-input combination record (scale, grouped norm, add, scale over N = groups x P <= 1024)", err);
        }
        if (l.kind == (uint16_t)LaunchKind::AttnO) {
            const PlanOp& o = ops_[l.op];
            bool ok         = l.count == 1 && o.code == (uint16_t)OpCode::Matmul && i > 0 && l.ip[1] == l.op - 1 &&
                      ops_[l.ip[1]].code == (uint16_t)OpCode::Attention && o.in[0] == ops_[l.ip[1]].out[0] && o.in[1] >= 0;
            bool zeroed = false;   // by a ResNorm launch before the attention's
            for (size_t k = i; ok && k-- > 0 && !zeroed;)
                zeroed = launches_[k].kind == (uint16_t)LaunchKind::ResNorm && launches_[k].t[7] == o.out[0];
            if (!ok || !zeroed)
                return fail(CORRUPT, what + ": bad attention-o record (the o matmul after an attention op, its output zeroed by a ResNorm before)", err);
            const PlanOp& at    = ops_[l.ip[1]];
            const PlanTensor& w = tensors_[o.in[1]];
            if (w.dtype != (uint8_t)DType::NF4 || !(w.quant_flags & kQuantTiled32) || w.dims[1] != (int64_t)at.ip[0] * at.ip[2] ||
                w.dims[1] % 64 != 0 || w.dims[0] % 4 != 0 || w.dims[0] > 4096 || at.ip[2] % 32 != 0 || at.ip[6] < 1 || at.ip[6] > 1024)
                return fail(CORRUPT, what + ": the attention-o record's weight is not a tiled NF4 [<= 4096, heads x dim] matrix", err);
        }
        next += l.count;
    }
    if (n_launches_ && next != n_ops_) return fail(CORRUPT, "CUDA schedule does not cover every op", err);
    return G4_OK;
}

} // namespace g4::plan
