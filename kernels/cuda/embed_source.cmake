# Generates a C++ file holding the CUDA kernel sources (SRCS: paths separated by "|", concatenated in that
# order) as one string (g4::cuda::kKernelSource), compiled by NVRTC when a plan is compiled.
string(REPLACE "|" ";" G4_SRCS "${SRCS}")
set(G4_CUDA_SRC "")
foreach(f IN LISTS G4_SRCS)
    file(READ "${f}" G4_PART)
    get_filename_component(G4_NAME "${f}" NAME)
    string(APPEND G4_CUDA_SRC "// ---- ${G4_NAME}\n${G4_PART}\n")
endforeach()
file(WRITE "${OUT}" "// Generated from kernels/cuda/*.cu by kernels/cuda/embed_source.cmake. Do not edit.\nnamespace g4::cuda {\nextern const char* const kKernelSource;\nconst char* const kKernelSource = R\"G4CU(${G4_CUDA_SRC})G4CU\";\n}\n")
