# Generates a C++ file holding kernels/cuda/kernels.cu as a string (g4::cuda::kKernelSource).
file(READ "${SRC}" G4_CUDA_SRC)
file(WRITE "${OUT}" "// Generated from kernels/cuda/kernels.cu by kernels/cuda/embed_source.cmake. Do not edit.\nnamespace g4::cuda {\nextern const char* const kKernelSource;\nconst char* const kKernelSource = R\"G4CU(${G4_CUDA_SRC})G4CU\";\n}\n")
