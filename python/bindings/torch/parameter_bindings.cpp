// stowage._torch's side of stowage.offload.parameters: the schedule of which parameter copies are
// on the device (offload/parameter_schedule.hpp, numbers only) and the copies between the host
// parameters and their device copies (python/tensors/parameter_transfers.hpp). A schedule's moves
// come back as (fill, free): lists of parameter indices, applied by the caller in that order.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <tuple>
#include <vector>

#include "offload/parameter_schedule.hpp"
#include "python/bindings/torch/module_parts.hpp"
#include "python/tensors/parameter_transfers.hpp"

namespace py = pybind11;

namespace stowage::python {

namespace {

using offload::ParameterMoves;
using offload::ParameterSchedule;
using offload::SchedulePass;
using Moves = std::tuple<std::vector<std::size_t>, std::vector<std::size_t>>;

Moves as_tuple(ParameterMoves moves) { return {std::move(moves.fill), std::move(moves.free)}; }

void bind_schedule(py::module_& module) {
  py::class_<ParameterSchedule>(module, "ParameterSchedule",
                                "Which offloaded parameters have a device copy: units held, prefetched and released "
                                "(Note [Parameters off the device])")
      .def(py::init<std::vector<std::size_t>, std::vector<std::vector<std::size_t>>, std::size_t>(),
           py::arg("parameter_bytes"), py::arg("unit_parameters"), py::arg("prefetch"))
      .def(
          "hold",
          [](ParameterSchedule& self, std::size_t unit, bool backward) {
            return as_tuple(self.hold(unit, backward ? SchedulePass::kBackward : SchedulePass::kForward));
          },
          py::arg("unit"), py::arg("backward"), "One more hold on `unit`, its pass's next units prefetched: (fill, free)")
      .def(
          "release", [](ParameterSchedule& self, std::size_t unit) { return as_tuple(self.release(unit)); },
          py::arg("unit"), "One hold on `unit` dropped: (fill, free)")
      .def(
          "release_all", [](ParameterSchedule& self) { return as_tuple(self.release_all()); },
          "Every hold and prefetch dropped: (fill, free)")
      .def("holds", &ParameterSchedule::holds, py::arg("unit"))
      .def("prefetched", &ParameterSchedule::prefetched, py::arg("unit"))
      .def("resident", &ParameterSchedule::resident, py::arg("parameter"))
      .def("unit_bytes", &ParameterSchedule::unit_bytes, py::arg("unit"))
      .def_property_readonly("resident_bytes", &ParameterSchedule::resident_bytes)
      .def_property_readonly("peak_resident_bytes", &ParameterSchedule::peak_resident_bytes)
      .def_property_readonly("order", &ParameterSchedule::order)
      .def_property_readonly("prefetch", &ParameterSchedule::prefetch)
      .def("check_invariants", &ParameterSchedule::check_invariants);
}

void bind_transfers(py::module_& module) {
  using torch_offload::ParameterTransfers;
  py::class_<ParameterTransfers>(module, "ParameterTransfers",
                                 "Copies between host parameters and their device copies on the offload engine")
      .def(py::init([](const std::string& device, std::size_t gradient_bound_bytes) {
             return std::make_unique<ParameterTransfers>(c10::Device(device), gradient_bound_bytes);
           }),
           py::arg("device"), py::arg("gradient_bound_bytes"))
      .def("fill", &ParameterTransfers::fill, py::arg("copies"), py::arg("hosts"),
           "Starts filling the device copies from the host parameters (versions kept)")
      .def("filled", &ParameterTransfers::filled, "Makes the compute wait for the fills issued so far")
      .def("send_gradient", &ParameterTransfers::send_gradient, py::arg("destination"), py::arg("gradient"),
           "Starts copying a device copy's gradient into a 1-D host buffer after the compute that made it; "
           "returns its ticket (Note [Gradients in flight])")
      .def("landed", &ParameterTransfers::landed, "The oldest gradients landed, taken off the queue without waiting")
      .def("land_over_bound", &ParameterTransfers::land_over_bound, py::call_guard<py::gil_scoped_release>(),
           "Waits for the oldest gradients until those in flight are within the bound; how many landed")
      .def("land_all", &ParameterTransfers::land_all, py::call_guard<py::gil_scoped_release>(),
           "Waits for every gradient in flight; how many landed")
      .def_property_readonly("gradients_in_flight", &ParameterTransfers::gradients_in_flight)
      .def_property_readonly("gradient_bytes_in_flight",
                             [](const ParameterTransfers& self) { return self.gradient_queue().bytes_in_flight(); })
      .def_property_readonly(
          "peak_gradient_bytes_in_flight",
          [](const ParameterTransfers& self) { return self.gradient_queue().peak_bytes_in_flight(); })
      .def_property_readonly("gradient_bound_bytes",
                             [](const ParameterTransfers& self) { return self.gradient_queue().bound_bytes(); })
      .def_property_readonly("host_waits", &ParameterTransfers::host_waits,
                             "Times the host waited for a gradient's copy that had not landed")
      .def("synchronize", &ParameterTransfers::synchronize, py::call_guard<py::gil_scoped_release>(),
           "Waits for every copy issued so far");
}

}  // namespace

void bind_parameters(py::module_& module) {
  bind_schedule(module);
  bind_transfers(module);
}

}  // namespace stowage::python
