// The restricted pickle machine (restricted_pickle.cc) and its registration in
// pyckpt._core as `restricted_unpickle`.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "pyckpt/status.h"

namespace pyckpt {
namespace binding {

// What one run reads and may call (borrowed references, alive for the run).
struct UnpickleArgs {
  const char* data = nullptr;
  size_t size = 0;
  PyObject* allowed = nullptr;      // dict: (module, name) -> Global stand-in
  PyObject* persistent = nullptr;   // callable(pid), or None: refused
  PyObject* global_type = nullptr;  // unpickler.Global
  PyObject* obj_type = nullptr;     // unpickler.Obj: Obj(qualname, args); .state
  PyObject* short_fn = nullptr;     // unpickler._short: a value in a message
  PyObject* int_tuple = nullptr;    // unpickler.int_tuple: a call run natively
  PyObject* state_name = nullptr;   // "state"
  std::string where;                // the messages' prefix
  uint64_t work_per_byte = 0, work_base = 0, max_long_bytes = 0;
};

// Runs the machine over args.data to its STOP: *value (a new reference) and *after
// (the position past STOP). A refusal is a Corruption status; *python_error: a
// Python exception that is no refusal is set instead (re-raise it). GIL held.
Status RestrictedUnpickle(const UnpickleArgs& args, PyObject** value, size_t* after,
                          bool* python_error);

// Adds `restricted_unpickle` to the module.
void RegisterRestrictedPickle(pybind11::module_& m);

}  // namespace binding
}  // namespace pyckpt
