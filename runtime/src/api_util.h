// Helpers shared by the C API's source files (c_api.cpp, session_state.cpp): the thread's last error and
// the live-handle checks.
#pragma once
#include "g4/g4.h"

#include <string>

namespace g4::rt {

// Sets the calling thread's g4_last_error_message and returns st.
g4_status api_error(g4_status st, const std::string& msg);
// True for a live (created, not yet released) handle.
bool api_engine_ok(const g4_engine* e);
bool api_session_ok(const g4_session* s);

} // namespace g4::rt
