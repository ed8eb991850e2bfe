// The runtime's environment variables, each read here and nowhere else in the runtime (the table of every
// G4_* variable, with values and defaults, is docs/environment.md). Each call reads the variable anew and
// allocates nothing.
#pragma once

namespace g4::rt::env {

// G4_CUBLAS: a libcublas file to load first, or "off" (no cuBLAS tier); nullptr when unset or empty.
const char* cublas();
// G4_CUDA_PROFILE=1: sessions time every CUDA launch and print the totals when destroyed.
bool cuda_profile();
// G4_CPU_PROFILE=1: each encoder-program run on the CPU prints its time per op kind, and CPU sessions their
// text program's (cpu_profile.h).
bool cpu_profile();
// G4_PDL=0: decode graphs without programmatic dependent launch.
bool pdl_off();
// G4_DECODE_AHEAD=0: sessions do not run greedy decode steps ahead.
bool decode_ahead_off();
// G4_LM_SCREEN=0: engines build no screening copy of the LM head.
bool lm_screen_off();
// G4_GPU_SAMPLING=0: CUDA sessions always sample on the CPU.
bool gpu_sampling_off();
// G4_CUDA_BATCH: how CUDA engines run g4_sessions_decode. "1": every group of 2..16 sessions as one batched
// step (All); "0": each session its own decode step (Off); unset or anything else: groups of 9..16 batched,
// smaller ones a session at a time (Auto).
enum class CudaBatch { Off, Auto, All };
CudaBatch cuda_batch();
// G4_TRACE_OUT: where a plan compiled with --kernel-trace writes its records; nullptr when unset or empty.
const char* trace_out();
// G4_DUMP_MEDIA: a file each image's and clip's soft tokens are appended to; nullptr when unset or empty.
const char* dump_media();

} // namespace g4::rt::env
