// Compiler-side error type. The compiler (offline) reports failures by throwing g4::CompileError with a
// one-line message that names the file or tensor and says how to fix it; the CLI prints it and exits 1.
// The runtime never uses exceptions (see runtime/include/g4/g4.h).
#pragma once
#include <stdexcept>
#include <string>

namespace g4 {

struct CompileError : std::runtime_error {
    explicit CompileError(const std::string& msg) : std::runtime_error(msg) {}
};

} // namespace g4
