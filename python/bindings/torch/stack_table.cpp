#include "python/tensors/stack_table.hpp"

#include <Python.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <frameobject.h>

#include <cstdlib>
#include <memory>

namespace stowage::torch_cpu {

namespace {

constexpr int kMaxPythonFrames = 64;
constexpr int kMaxCppFrames = 48;

bool python_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

std::string utf8(PyObject* text) {
  const char* chars = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
  if (chars == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return chars;
}

std::vector<Frame> python_frames() {
  std::vector<Frame> frames;
  if (!python_usable() || PyGILState_GetThisThreadState() == nullptr) return frames;
  const PyGILState_STATE gil = PyGILState_Ensure();
  // A tensor may be freed while an exception is being raised: keep it, and clear only what the
  // walk below raises.
  PyObject* error_type = nullptr;
  PyObject* error_value = nullptr;
  PyObject* error_traceback = nullptr;
  PyErr_Fetch(&error_type, &error_value, &error_traceback);
  PyFrameObject* frame = PyThreadState_GetFrame(PyThreadState_Get());  // new reference
  while (frame != nullptr && frames.size() < kMaxPythonFrames) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    PyObject* filename = PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), "co_filename");
    PyObject* name = PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), "co_name");
    frames.push_back({utf8(filename), PyFrame_GetLineNumber(frame), utf8(name)});
    Py_XDECREF(filename);
    Py_XDECREF(name);
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  PyErr_Clear();
  PyErr_Restore(error_type, error_value, error_traceback);
  PyGILState_Release(gil);
  return frames;
}

Frame symbolise(void* address) {
  Dl_info info{};
  if (::dladdr(address, &info) == 0 || info.dli_sname == nullptr) {
    return {info.dli_fname != nullptr ? info.dli_fname : "??", 0, "??"};
  }
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> demangled(
      abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status), &std::free);
  return {info.dli_fname != nullptr ? info.dli_fname : "??", 0,
          status == 0 && demangled ? demangled.get() : info.dli_sname};
}

}  // namespace

void StackTable::prepare_fork() { mutex_.lock(); }
void StackTable::after_fork() { mutex_.unlock(); }

void StackTable::configure(bool python, bool cpp) {
  std::lock_guard lock(mutex_);
  python_ = python;
  cpp_ = cpp;
}

std::uint64_t StackTable::capture() noexcept {
  try {
    bool python = false;
    bool cpp = false;
    {
      std::lock_guard lock(mutex_);
      python = python_;
      cpp = cpp_;
    }
    Stack stack;
    if (python) stack.python = python_frames();
    if (cpp) {
      void* addresses[kMaxCppFrames];
      const int depth = ::backtrace(addresses, kMaxCppFrames);
      stack.cpp.assign(addresses, addresses + depth);
    }
    if (stack.python.empty() && stack.cpp.empty()) return 0;
    std::string key;
    for (const Frame& frame : stack.python) {
      key += frame.filename;
      key += ':';
      key += std::to_string(frame.line);
      key += '\n';
    }
    key.append(reinterpret_cast<const char*>(stack.cpp.data()), stack.cpp.size() * sizeof(void*));
    std::lock_guard lock(mutex_);
    const auto [it, added] = handles_.emplace(std::move(key), stacks_.size() + 1);
    if (added) stacks_.push_back(std::move(stack));
    return it->second;
  } catch (...) {
    return 0;  // a stack is a nicety; allocation must go on
  }
}

std::vector<Frame> StackTable::frames(std::uint64_t handle) const {
  Stack stack;
  {
    std::lock_guard lock(mutex_);
    if (handle == 0 || handle > stacks_.size()) return {};
    stack = stacks_[handle - 1];
  }
  std::vector<Frame> out = std::move(stack.python);
  for (void* address : stack.cpp) out.push_back(symbolise(address));
  return out;
}

}  // namespace stowage::torch_cpu
