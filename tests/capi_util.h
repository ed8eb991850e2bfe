// Owning handles of the C API's engine and session for the tests: closed / destroyed when they go out of
// scope, so that a failed assertion leaks nothing.
#pragma once
#include "g4/g4.h"

namespace g4test {

struct Engine {
    g4_engine* e          = nullptr;
    Engine()              = default;
    Engine(const Engine&) = delete;
    ~Engine() { g4_engine_close(e); }
};

struct Session {
    g4_session* s           = nullptr;
    Session()               = default;
    Session(const Session&) = delete;
    ~Session() { g4_session_destroy(s); }
};

} // namespace g4test
