// cuBLAS, loaded at run time with dlopen (libcublas.so.13 / .12): the prefill GEMM tier of CUDA plans
// (MatmulVariant::Cublas). Optional: where it cannot be loaded the backend uses its own tensor-core
// kernel. Only the entry points g4 uses are declared; enum values are cuBLAS's ABI.
#pragma once
#include "runtime/src/cuda/driver.h"

#include <string>

namespace g4::cublas {

typedef struct cublasContext* Handle;
constexpr int kOpN = 0, kOpT = 1;     // cublasOperation_t
constexpr int kR32F = 0, kR16BF = 14; // cudaDataType
constexpr int kCompute32F  = 68;      // cublasComputeType_t
constexpr int kGemmDefault = -1;      // CUBLAS_GEMM_DEFAULT

struct Lib {
    int (*create)(Handle*);
    int (*destroy)(Handle);
    int (*set_stream)(Handle, cu::CUstream);
    int (*set_workspace)(Handle, void*, size_t);
    int (*gemm_ex)(Handle, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
                   const void*, void*, int, int, int, int);
    std::string path; // the library that was loaded
};

// The loaded library or nullptr (*why says what was tried). G4_CUBLAS=PATH picks a file;
// G4_CUBLAS=off disables the tier. Thread-safe; loads once.
const Lib* lib(std::string* why);

} // namespace g4::cublas
