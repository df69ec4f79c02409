// stowage._torch's offload part: the saved-tensor offloader of stowage.offload.activations() and
// the offload engines' statistics and step boundaries. Tensors cross as torch.Tensor (torch's
// own pybind11 casters: this module is compiled against torch's pybind11).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "base/errors.hpp"
#include "offload/offload_report.hpp"
#include "python/tensors/check_mode.hpp"
#include "python/tensors/cpu_allocator.hpp"
#include "python/bindings/torch/module_parts.hpp"
#include "python/tensors/offload_engines.hpp"
#include "python/tensors/tensor_offloader.hpp"
#include "python/tensors/weak_storage.hpp"

namespace py = pybind11;

namespace stowage::torch_offload {

namespace {

// The prefetch settings every engine follows (Note [Prefetch window]); set by each region.
struct PrefetchSettings {
  std::optional<std::size_t> buffers;  // nullopt: adaptive
  std::size_t max_bytes = std::size_t{1} << 30;
  bool operator==(const PrefetchSettings&) const = default;
};

PrefetchSettings& prefetch_settings() {
  static PrefetchSettings settings;
  return settings;
}

void apply(const PrefetchSettings& settings, OffloadEngine& engine) {
  OffloadEngineOptions options;
  options.prefetch_depth = settings.buffers;
  options.max_prefetch_bytes = settings.max_bytes;
  engine.offloader().set_prefetch_policy(make_prefetch_policy(options));
}

// The report's fields that a region's user reads and sets, as Python names them.
constexpr std::pair<const char*, std::int64_t offload::OffloadReport::*> kReportFields[] = {
    {"saved_bytes", &offload::OffloadReport::saved_bytes},
    {"offloaded_bytes", &offload::OffloadReport::offloaded_bytes},
    {"parameter_bytes", &offload::OffloadReport::parameter_bytes},
    {"small_bytes", &offload::OffloadReport::small_bytes},
    {"elsewhere_bytes", &offload::OffloadReport::elsewhere_bytes},
    {"host_full_bytes", &offload::OffloadReport::host_full_bytes},
    {"num_saved", &offload::OffloadReport::num_saved},
    {"num_shared", &offload::OffloadReport::num_shared},
    {"forward_bytes", &offload::OffloadReport::forward_bytes},
    {"unseen_bytes", &offload::OffloadReport::unseen_bytes},
    {"held_elsewhere_bytes", &offload::OffloadReport::held_elsewhere_bytes},
};

// The region's counts and the forward's figures (OffloadReport::account_forward) into `report`.
void fill_report(const TensorOffloader& offloader, offload::OffloadReport& report, std::int64_t allocated_before,
                 std::int64_t allocated_after) {
  const PackCounts& counts = offloader.counts();
  report.saved_bytes = counts.seen;
  report.offloaded_bytes = counts.offloaded;
  report.parameter_bytes = counts.parameters;
  report.small_bytes = counts.small;
  report.elsewhere_bytes = counts.elsewhere;
  report.host_full_bytes = counts.host_full;
  report.num_saved = counts.num_saved;
  report.num_shared = counts.num_shared;
  report.held_elsewhere_bytes = counts.held_elsewhere;
  report.account_forward(allocated_before, allocated_after, offloader.live_offloaded_bytes());
}

void bind_report(py::module_& module) {
  using offload::OffloadReport;
  py::class_<OffloadReport> report(module, "OffloadReport",
                                   "What one offload region did, in bytes (offload/offload_report.hpp)");
  report.def(py::init<>())
      .def("__str__", &OffloadReport::text)
      .def("__eq__", [](const OffloadReport& self, const OffloadReport& other) { return self == other; })
      .def("__repr__", [](const OffloadReport& self) {
        std::string out = "OffloadReport(";
        for (const auto& [name, field] : kReportFields) {
          out += std::string(out.back() == '(' ? "" : ", ") + name + "=" + std::to_string(self.*field);
        }
        return out + ")";
      });
  for (const auto& [name, field] : kReportFields) report.def_readwrite(name, field);
}

// A c10 error as torch's own ops raise it: RuntimeError with torch's message, without the C++
// backtrace; out of memory as torch.OutOfMemoryError (its C symbol is not exported).
[[noreturn]] void raise_as_torch(const c10::Error& error, bool out_of_memory) {
  const py::object kind = out_of_memory ? py::module_::import("torch").attr("OutOfMemoryError")
                                        : py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  PyErr_SetString(kind.ptr(), error.what_without_backtrace());
  throw py::error_already_set();
}

at::Tensor unpack_object(const py::object& packed) {
  if (THPVariable_Check(packed.ptr())) return py::cast<at::Tensor>(packed);
  try {
    if (py::isinstance<KeptTensor>(packed)) return py::cast<const KeptTensor&>(packed).unpack();
    const PackedTensor& tensor = py::cast<const PackedTensor&>(packed);
    const py::gil_scoped_release release;  // reload may wait for its copy
    return TensorOffloader::unpack(tensor);
  } catch (const c10::OutOfMemoryError& error) {  // (before c10::Error, which it derives from)
    raise_as_torch(error, true);
  } catch (const c10::Error& error) {
    raise_as_torch(error, false);
  }
}

void bind_offloader(py::module_& module) {
  py::class_<PackedTensor>(module, "PackedTensor")
      .def("__repr__", [](const PackedTensor& packed) {
        const std::shared_ptr<OffloadRef> ref = packed.saved->ref();
        return ref != nullptr ? "<stowage offloaded tensor: buffer " + std::to_string(ref->id()) + ">"
                              : std::string("<stowage offloaded tensor: kept on its device since its region ended>");
      });
  py::class_<SavedVersion>(module, "SavedVersion")
      .def(py::init<const at::Tensor&>(), py::arg("tensor"),
           "The tensor's version now, holding its version counter and not its storage")
      .def("intact", &SavedVersion::intact, "Whether the tensor is still at that version")
      .def("check", [](const SavedVersion& self) {
        try {
          self.check();
        } catch (const c10::Error& error) {
          raise_as_torch(error, false);
        }
      }, "Raises torch's 'modified by an inplace operation' RuntimeError when it is not");
  py::class_<WeakStorage>(module, "WeakStorage")
      .def(py::init<const at::Tensor&>(), py::arg("tensor"),
           "The tensor's storage, referred to without keeping it alive")
      .def("alive", &WeakStorage::alive)
      .def("is_storage_of", &WeakStorage::is_storage_of, py::arg("tensor"),
           "Whether the tensor is over this storage (resized or not), not another one")
      .def("bytes", &WeakStorage::bytes, "The whole storage as bytes (holding it), or None once it was freed");
  py::class_<KeptTensor>(module, "KeptTensor")
      .def_property_readonly("tensor", [](const KeptTensor& self) { return self.tensor; },
                             "The saved tensor, detached (no version check)")
      .def("intact", [](const KeptTensor& self) { return self.version.intact(); },
           "Whether the tensor it was made from is at the version it had then (not changed in place)")
      .def("__repr__", [](const KeptTensor&) { return std::string("<stowage saved tensor, kept on its device>"); });
  py::class_<TensorOffloader>(module, "TensorOffloader")
      .def(py::init<std::size_t>(), py::arg("min_bytes"))
      .def("pack",
           [](TensorOffloader& self, const at::Tensor& tensor, const std::string& where) -> py::object {
             auto packed = self.pack(tensor, where);
             if (auto* kept = std::get_if<KeptTensor>(&packed)) return py::cast(std::move(*kept));
             return py::cast(std::get<PackedTensor>(std::move(packed)));
           },
           py::arg("tensor"), py::arg("where") = "")
      .def_static("keep", &KeptTensor::of, py::arg("tensor"),
                  "A saved tensor kept on its device, detached, with its version checked at unpack")
      .def_static("unpack", &unpack_object)
      .def("add_parameters",
           [](TensorOffloader& self, const std::vector<at::Tensor>& tensors) {
             for (const at::Tensor& tensor : tensors) self.add_parameter(tensor);
           })
      .def("region_ended", &TensorOffloader::region_ended,
           "The region ended: the offloaded storages someone else still holds stay on the device, read in place "
           "by backward (Note [Saved tensors written through an alias])")
      .def("forward_ended", &TensorOffloader::forward_ended,
           "The model's forward returned: check mode watches the offloaded storages someone else still holds")
      .def("fill_report", &fill_report, py::arg("report"), py::arg("allocated_before"), py::arg("allocated_after"),
           "The region's counts and the forward's figures into `report`");
}

void bind_engines(py::module_& module) {
  module.def(
      "offload_configure",
      [](std::optional<std::size_t> buffers, std::size_t max_bytes) {
        const PrefetchSettings settings{buffers, max_bytes};
        if (settings == prefetch_settings()) return;
        prefetch_settings() = settings;
        for_each_engine([&](int, OffloadEngine& engine) { apply(settings, engine); });
      },
      py::arg("prefetch_depth"), py::arg("max_prefetch_bytes"));
  module.def(
      "offload_engine",
      [](const std::string& device) {
        OffloadEngine* engine = engine_for(c10::Device(device));
        if (engine != nullptr) apply(prefetch_settings(), *engine);
        return engine != nullptr;
      },
      py::arg("device"));
  module.def(
      "offload_stats",
      [](int device) {
        py::dict out;
        for_each_engine([&](int index, OffloadEngine& engine) {
          if (index != device) return;
          for (const auto& [key, value] : offload_stats_entries(engine.stats())) {
            out[py::str(key)] = value;
          }
        });
        return out;
      },
      py::arg("device"));
  module.def("offload_end_step", [] {
    const py::gil_scoped_release release;
    for_each_engine([](int, OffloadEngine& engine) { engine.end_step(); });
    note_step_ended();
  });
  module.def("set_check_mode", &set_check_mode, py::arg("on"));
  module.def(
      "cpu_corrupt_copy",
      [](std::uint64_t nth) {
        HostBackend* backend = torch_cpu::backend();
        STOWAGE_CHECK(backend != nullptr, "CPU mode is not on: stowage.enable(device='cpu', capacity=...)");
        backend->faults().corrupt_nth(BackendCall::kCopy, nth);
      },
      py::arg("nth"),
      "Tests of check mode: the nth copy from now on CPU mode's simulated device flips one byte it writes");
}

}  // namespace

}  // namespace stowage::torch_offload

namespace stowage::python {

void bind_offload(py::module_& module) {
  torch_offload::bind_report(module);
  torch_offload::bind_offloader(module);
  torch_offload::bind_engines(module);
}

}  // namespace stowage::python
