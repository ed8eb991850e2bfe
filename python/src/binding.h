// Shared pieces of the g4._g4 extension (nanobind): the error type every binding raises, and the engine
// and session handles. The Python side (python/g4/*.py) maps errors to exception classes and builds the
// documented API on top of these thin wrappers.
#pragma once
#include "g4/g4.h"

#include <nanobind/nanobind.h>
#include <stdexcept>
#include <string>

namespace g4py {

namespace nb = nanobind;

// A failed g4 call: its status (or kCompileFailed) and g4's one-line message. Translated into the
// exception class python/g4/_errors.py registers for the status.
struct Failure : std::runtime_error {
    int status;
    Failure(int st, const std::string& msg) : std::runtime_error(msg), status(st) {}
};
constexpr int kCompileFailed = -1;

// Throws Failure with g4_last_error_message() when st is not G4_OK (call with the GIL held or released:
// the message is thread-local to the calling thread).
inline void check(g4_status st) {
    if (st != G4_OK) throw Failure((int)st, g4_last_error_message());
}

struct Engine {
    g4_engine* e = nullptr;
    std::string path;
    Engine()                         = default;
    Engine(const Engine&)            = delete;
    Engine& operator=(const Engine&) = delete;
    ~Engine() { g4_engine_close(e); }
};

void bind_compile(nb::module_& m);
void bind_session(nb::module_& m);

} // namespace g4py
