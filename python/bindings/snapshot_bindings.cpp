// stowage._core's snapshot reader (snapshot/): a snapshot's pickle bytes (or a large file's window)
// read as Python's plain data, or with its traces as columns; conversions only. stowage.snapshot_reader wraps them.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "python/bindings/bindings.hpp"
#include "python/bindings/python_objects.hpp"
#include "snapshot/file_window.hpp"
#include "snapshot/limits.hpp"
#include "snapshot/memory_budget.hpp"
#include "snapshot/reader.hpp"
#include "snapshot/refusal.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace stowage::python {

namespace {

using snapshot::Handle;

snapshot::ReadOptions options_of(snapshot::MemoryBound memory, std::uint64_t memory_start,
                                 std::uint64_t report_every, std::uint64_t release_every,
                                 const py::object& progress) {
  snapshot::ReadOptions options;
  options.memory = std::move(memory);
  options.memory_start = memory_start;
  options.report_every = report_every;
  options.release_every = release_every;
  const bool heard = !progress.is_none();
  options.progress = [progress, heard](std::uint64_t done, std::uint64_t total) {
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C ends a long reading
    if (heard) progress("loading", done, total);
  };
  return options;
}

// A column handed to numpy without a copy: numpy frees the block.
template <typename T>
py::array column(snapshot::PodColumn<T>& values) {
  const std::size_t count = values.size();
  T* block = values.release();
  if (block == nullptr) return py::array_t<T>(0);
  py::capsule owner(block, [](void* freed) { std::free(freed); });
  return py::array_t<T>({static_cast<py::ssize_t>(count)}, block, owner);
}

// The snapshot of a reading for columns, its device_traces the traces as TraceColumns (made by
// make_trace from the columns, the stacks Stack objects made by make_stack).
py::object columns_result(snapshot::Reading& reading, const py::object& make_trace, const py::object& make_stack) {
  py::object root = py::reinterpret_borrow<py::object>(object(reading.root()));
  if (reading.device_traces() == nullptr) return root;
  py::list stacks;
  const auto& stored = reading.stacks().stacks();
  for (std::size_t s = 0; s < stored.size(); ++s) {
    py::list frames(stored[s].size());
    for (std::size_t j = 0; j < stored[s].size(); ++j) {
      frames[j] = py::reinterpret_borrow<py::object>(object(stored[s][j]));
    }
    stacks.append(make_stack(frames, s));
  }
  py::list traces;
  for (snapshot::TraceColumnsBuilder* trace : reading.traces()) {
    py::dict device_free;
    for (const auto& [index, value] : trace->device_free) device_free[py::int_(index)] = py::int_(value);
    // torch writes an empty user_metadata on every event: those are a mask (a byte an event), not
    // a dict entry each (some sixty bytes).
    py::dict metadata;
    py::object empty = py::none();
    bool* empty_at = nullptr;
    for (const auto& [index, value] : trace->metadata) {
      py::object held = py::reinterpret_borrow<py::object>(object(value));
      if (PyUnicode_Check(held.ptr()) && PyUnicode_GET_LENGTH(held.ptr()) == 0) {
        if (empty_at == nullptr) {
          py::array_t<bool> mask(static_cast<py::ssize_t>(trace->action.size()));
          empty_at = mask.mutable_data();
          std::fill(empty_at, empty_at + trace->action.size(), false);
          empty = mask;
        }
        empty_at[index] = true;
      } else {
        metadata[py::int_(index)] = held;
      }
    }
    traces.append(make_trace(column(trace->action), column(trace->flags), column(trace->addr), column(trace->size),
                             column(trace->stream), column(trace->time), column(trace->stack), stacks,
                             device_free, metadata, empty));
  }
  py::dict copied = py::reinterpret_steal<py::dict>(PyDict_Copy(root.ptr()));
  if (!copied) throw py::error_already_set();
  copied["device_traces"] = traces;
  return copied;
}

// `data`: the pickle's bytes (a buffer), or a large file's window (FileWindow), read as the machine goes.
py::object read(const py::object& data, bool columns, std::uint64_t memory_per_byte, std::uint64_t memory_ceiling,
                const std::string& memory_remedy, std::uint64_t memory_start, std::uint64_t report_every,
                std::uint64_t release_every, const py::object& progress, const py::object& make_trace,
                const py::object& make_stack) {
  std::optional<py::buffer_info> held;  // for the reading: the buffer stays where it is
  std::optional<snapshot::MemoryBytes> bytes;
  if (!py::isinstance<snapshot::FileWindow>(data)) {
    held = py::reinterpret_borrow<py::buffer>(data).request();
    bytes.emplace(static_cast<const std::uint8_t*>(held->ptr), static_cast<std::size_t>(held->size * held->itemsize));
  }
  snapshot::ByteSource& source = bytes ? static_cast<snapshot::ByteSource&>(*bytes) : data.cast<snapshot::FileWindow&>();
  PythonObjects objects;
  snapshot::Reading reading(objects);
  const snapshot::ReadOptions options = options_of({memory_per_byte, memory_ceiling, memory_remedy}, memory_start,
                                                   report_every, release_every, progress);
  if (!columns) return py::reinterpret_steal<py::object>(object(reading.plain(source, options)));
  reading.columns(source, options);
  return columns_result(reading, make_trace, make_stack);
}

py::object columns_of(const py::object& snapshot, const py::object& make_trace, const py::object& make_stack) {
  PythonObjects objects;
  snapshot::Reading reading(objects);
  reading.columns_of(snapshot.ptr());
  return columns_result(reading, make_trace, make_stack);
}

}  // namespace

void bind_snapshot(py::module_& module) {
  static py::exception<snapshot::Refused> refused(module, "SnapshotRefused", PyExc_ValueError);
  static py::exception<snapshot::ReadWhole> read_whole(module, "SnapshotReadWhole", PyExc_Exception);
  py::register_exception_translator([](std::exception_ptr raised) {
    try {
      if (raised) std::rethrow_exception(raised);
    } catch (const snapshot::Refused& error) {
      PyErr_SetString(refused.ptr(), error.message().c_str());
    } catch (const snapshot::ReadWhole& error) {
      PyErr_SetString(read_whole.ptr(), error.what());
    }
  });
  using namespace snapshot;
  module.attr("snapshot_limits") = py::dict(
      "max_depth"_a = kMaxDepth, "max_number"_a = kMaxNumber, "nodes_per_byte"_a = kNodesPerByte,
      "min_node_budget"_a = kMinNodeBudget, "memory_floor"_a = kMemoryFloor,
      "columns_memory_per_byte"_a = kColumnsMemoryPerByte, "plain_memory_per_byte"_a = kPlainMemoryPerByte,
      "memory_ceiling"_a = kMemoryCeiling, "ceiling_variable"_a = kCeilingVariable, "report_every"_a = kReportEvery,
      "release_every"_a = kReleaseEvery,
      "max_size"_a = kMaxSize, "max_devices"_a = kMaxDevices);
  py::class_<snapshot::FileWindow>(module, "FileWindow", "A large snapshot file read as the reader goes "
                                   "(snapshot/file_window.hpp).")
      .def("__len__", &snapshot::FileWindow::size)
      .def("rewind", &snapshot::FileWindow::rewind, "To be read again from the start.")
      .def("close", &snapshot::FileWindow::close, "Gives back the mapping and the file now.");
  module.def("open_file_window", &snapshot::FileWindow::open, py::arg("path"), py::arg("fill_ahead"),
             "The FileWindow over `path`, None where there is no room for its mapping; SnapshotRefused where "
             "the file cannot be read.");
  module.def("read_snapshot", &read, py::arg("data"), py::arg("columns"), py::arg("memory_per_byte"),
             py::arg("memory_ceiling"), py::arg("memory_remedy"), py::arg("memory_start"), py::arg("report_every"),
             py::arg("release_every"), py::arg("progress"), py::arg("make_trace"), py::arg("make_stack"),
             "Reads a snapshot's pickle (a buffer, or a FileWindow read as it goes) as plain data, or "
             "with its traces as make_trace(...) of columns, its memory "
             "growth from memory_start (resident bytes; 0: now) within the budget (96 MiB and "
             "memory_per_byte a byte, at most memory_ceiling; memory_remedy ends its refusal); raises "
             "SnapshotRefused naming the reason, or SnapshotReadWhole (columns only) for a pickle "
             "to read again as plain data.");
  module.def(
      "columns_remedy",
      [](std::uint64_t pickle_size, const py::object& command) {
        // the command line as typed, a file name's undecodable bytes (surrogates) and all
        const std::string typed = command.is_none() ? "" : py::bytes(command.attr("encode")("utf-8", "surrogatepass"));
        return py::bytes(snapshot::columns_remedy(pickle_size, typed)).attr("decode")("utf-8", "surrogatepass");
      },
      py::arg("pickle_size"), py::arg("command"),
      "What a refusal of a reading into columns says to do, for a pickle of `pickle_size` bytes read by `command` "
      "(the command line; None: a program's call) (snapshot/memory_budget.hpp).");
  module.def(
      "resident_bytes", [] { return snapshot::resident_bytes().value_or(0); },
      "The process's resident memory in bytes (0 where it cannot be read).");
  module.def("snapshot_columns", &columns_of, py::arg("snapshot"), py::arg("make_trace"), py::arg("make_stack"),
             "A snapshot read as plain data with its traces as make_trace(...) of columns.");
  bind_trace_analysis(module);  // the analyses over the columns a reading makes
}

}  // namespace stowage::python
