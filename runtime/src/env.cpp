// The runtime's environment variables (see env.h and docs/environment.md).
#include "runtime/src/env.h"

#include <cstdlib>

namespace g4::rt::env {

namespace {
const char* value(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? v : nullptr;
}
bool is(const char* name, char c) {
    const char* v = value(name);
    return v && *v == c;
}
} // namespace

const char* cublas() {
    return value("G4_CUBLAS");
}
bool cuda_profile() {
    return is("G4_CUDA_PROFILE", '1');
}
bool cpu_profile() {
    return is("G4_CPU_PROFILE", '1');
}
bool pdl_off() {
    return is("G4_PDL", '0');
}
bool decode_ahead_off() {
    return is("G4_DECODE_AHEAD", '0');
}
bool lm_screen_off() {
    return is("G4_LM_SCREEN", '0');
}
bool gpu_sampling_off() {
    return is("G4_GPU_SAMPLING", '0');
}
CudaBatch cuda_batch() {
    return is("G4_CUDA_BATCH", '1')   ? CudaBatch::All
           : is("G4_CUDA_BATCH", '0') ? CudaBatch::Off
                                      : CudaBatch::Auto;
}
const char* trace_out() {
    return value("G4_TRACE_OUT");
}
const char* dump_media() {
    return value("G4_DUMP_MEDIA");
}

} // namespace g4::rt::env
