// stowage._torch.AdamSlots: the offloaded optimizer's slots (adam_slots.hpp) for
// stowage.offload.Adam, with what crosses into Python here: param groups read as the update's
// options, state entries as torch's dicts, a state_dict's entries loaded into the slots. The calls that wait
// or copy release the GIL (name_of takes it back when an error names a parameter).
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/core/grad_mode.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "base/errors.hpp"
#include "python/tensors/adam_slots.hpp"
#include "python/tensors/overlapped_step.hpp"
#include "python/bindings/torch/module_parts.hpp"

namespace py = pybind11;

namespace stowage::torch_offload {

namespace {

using OptionalTensors = std::vector<std::optional<at::Tensor>>;
using Release = py::call_guard<py::gil_scoped_release>;

// None as an undefined tensor.
AdamSlots::Tensors defined(const OptionalTensors& tensors) {
  AdamSlots::Tensors out;
  out.reserve(tensors.size());
  for (const std::optional<at::Tensor>& tensor : tensors) out.push_back(tensor.value_or(at::Tensor()));
  return out;
}

// A param group's options, read as torch's Adam reads them.
GroupOptions options_of(const py::dict& group) {
  GroupOptions options;
  options.lr = py::float_(group["lr"]);
  const py::object betas = group["betas"];
  options.beta1 = py::float_(betas[py::int_(0)]);
  options.beta2 = py::float_(betas[py::int_(1)]);
  options.eps = py::float_(group["eps"]);
  options.weight_decay = py::float_(group["weight_decay"]);
  options.decoupled_weight_decay = py::bool_(group.attr("get")("decoupled_weight_decay", false));
  options.maximize = py::bool_(group["maximize"]);
  options.amsgrad = py::bool_(group["amsgrad"]);
  return options;
}

std::vector<GroupOptions> options_of(const std::vector<py::dict>& groups) {
  std::vector<GroupOptions> options;
  options.reserve(groups.size());
  for (const py::dict& group : groups) options.push_back(options_of(group));
  return options;
}

// torch's state entry of a slot: step, moments, and fp32 masters of a parameter that is not fp32.
py::dict state_entry(const AdamSlots& self, std::size_t slot) {
  const SlotStates states = self.states(slot);
  py::dict entry;
  entry["step"] = states.step;
  entry["exp_avg"] = states.exp_avg;
  entry["exp_avg_sq"] = states.exp_avg_sq;
  if (states.max_exp_avg_sq.defined()) entry["max_exp_avg_sq"] = states.max_exp_avg_sq;
  if (states.own_master) entry["master"] = states.master;
  return entry;
}

// Fills a slot's states from one parameter's checked entry (None: a fresh state); `local` gives a
// saved tensor's local part (FSDP2), `shard` is the parameter's.
void load_slot(const AdamSlots& self, std::size_t slot, const py::object& saved, const at::Tensor& shard,
                const py::function& local) {
  const SlotStates states = self.states(slot);
  const at::NoGradGuard no_grad;
  std::vector<std::pair<at::Tensor, const char*>> moments = {{states.exp_avg, "exp_avg"},
                                                               {states.exp_avg_sq, "exp_avg_sq"}};
  if (states.max_exp_avg_sq.defined()) moments.emplace_back(states.max_exp_avg_sq, "max_exp_avg_sq");
  if (saved.is_none() || !py::bool_(saved)) {
    for (auto& [moment, key] : moments) moment.zero_();
    states.step.zero_();
    if (states.master.defined()) states.master.copy_(shard.detach());
    return;
  }
  const auto copy_into = [&](const at::Tensor& destination, const py::object& value) {
    const at::Tensor source = local(value.attr("detach")()).cast<at::Tensor>();
    destination.copy_(source.reshape(destination.sizes()));
  };
  for (auto& [moment, key] : moments) copy_into(moment, saved[py::str(key)]);
  states.step.fill_(py::float_(saved.attr("get")("step", 0)).cast<double>());
  const py::object master = saved.attr("get")("master");
  if (!master.is_none() && states.own_master) {
    copy_into(states.master, master);
  } else if (states.master.defined()) {  // (staged buckets keep no copy of the parameters)
    states.master.copy_(shard.detach());
  }
}

// A checked state_dict's entries loaded, one per slot in number order (None: a fresh state), and the
// parameters' shards as they are now taken as the reference; returns each slot's state entry
// (None for a fresh one).
std::vector<py::object> load_states(AdamSlots& self, const std::vector<py::object>& saved,
                                    const AdamSlots::Tensors& shards, const py::function& local) {
  STOWAGE_CHECK(saved.size() == self.size() && shards.size() == self.size(), saved.size(), " entries and ",
                shards.size(), " shards for ", self.size(), " slots");
  std::vector<py::object> entries;
  AdamSlots::Indices slots;
  for (std::size_t slot = 0; slot < self.size(); ++slot) {
    load_slot(self, slot, saved[slot], shards[slot], local);
    const bool fresh = saved[slot].is_none() || !py::bool_(saved[slot]);
    entries.push_back(fresh ? py::none() : py::object(state_entry(self, slot)));
    slots.push_back(slot);
  }
  const py::gil_scoped_release release;
  self.parameters_are(slots, shards);
  return entries;
}

py::dict host_stats(AdamSlots& self) {
  const PinnedHostPoolStats stats = self.store().stats();
  py::dict out;
  out["allocated_bytes"] = stats.allocated_bytes;
  out["staging_bytes"] = self.staging_bytes();
  out["copied_bytes"] = self.copied_bytes();
  out["reserved_bytes"] = stats.reserved_bytes;
  out["pinned_bytes"] = stats.segments.pinned_bytes;
  out["pageable_bytes"] = stats.segments.pageable_bytes;
  out["pinning_refused"] = stats.segments.pinning_refused;
  out["placement"] = self.store().placement();
  out["update_cpus"] = self.queue().cpus();
  out["update_threads"] = self.queue().threads();
  out["update_seconds"] = self.queue().busy_seconds();
  out["content_watch_seconds"] = self.watch_seconds();
  return out;
}

// A step() call (prepare_step, commit_step) taking what step() sees of torch
// (AdamSlots::StepInputs), the GIL released while it runs.
template <typename Call>
auto step_call(Call call) {
  return [call](AdamSlots& self, const OptionalTensors& grads, const OptionalTensors& grad_shards,
                const OptionalTensors& shards, const std::vector<py::dict>& groups, double grad_scale, bool inf_checked,
                bool skip) {
    const AdamSlots::StepInputs inputs{defined(grads), defined(grad_shards), defined(shards), options_of(groups),
                                       grad_scale, inf_checked, skip};
    const py::gil_scoped_release release;
    return call(self, inputs);
  };
}

// An OverlappedStep is deleted with the GIL released: its destructor waits for the step, whose
// thread takes the GIL at each point (at_point) and to name a parameter.
struct DeleteWithoutGil {
  void operator()(OverlappedStep* step) const {
    const py::gil_scoped_release release;
    delete step;
  }
};

void bind_overlapped_step(py::module_& module) {
  py::class_<OverlappedStep, std::unique_ptr<OverlappedStep, DeleteWithoutGil>>(
      module, "OverlappedStep",
      "update='exact''s host part run behind the loop (python/tensors/overlapped_step.hpp, Note [Overlapped steps])")
      .def(py::init([](AdamSlots& slots, const std::string& device, const OptionalTensors& grads,
                       const OptionalTensors& grad_shards, const OptionalTensors& shards,
                       const std::vector<py::dict>& groups, double grad_scale, bool inf_checked, bool skip) {
             AdamSlots::StepInputs inputs{defined(grads), defined(grad_shards), defined(shards), options_of(groups),
                                          grad_scale, inf_checked, skip};
             return std::unique_ptr<OverlappedStep, DeleteWithoutGil>(
                 new OverlappedStep(slots, std::move(inputs), c10::Device(device)));
           }),
           py::arg("slots"), py::arg("device"), py::arg("grads"), py::arg("grad_shards"), py::arg("shards"),
           py::arg("groups"), py::arg("grad_scale"), py::arg("inf_checked"), py::arg("skip"), py::keep_alive<1, 2>())
      .def("wait_landed", &OverlappedStep::wait_landed, py::arg("bucket"), Release())
      .def("finish", &OverlappedStep::finish, Release())
      .def_property_readonly("ended", &OverlappedStep::ended);
}

void bind_slot_queries(py::class_<AdamSlots>& slots) {
  slots.def("__len__", &AdamSlots::size)
      .def_property_readonly("allocated_bytes", [](AdamSlots& self) { return self.store().allocated_bytes(); })
      .def_property_readonly("bucket_count", [](const AdamSlots& self) { return self.book().bucket_count(); })
      .def("updated", [](const AdamSlots& self, std::size_t bucket) { return self.book().updated(bucket); })
      .def("arrived", [](const AdamSlots& self, std::size_t slot) { return self.book().arrived(slot); })
      .def("bucket_of", [](const AdamSlots& self, std::size_t slot) { return self.book().bucket_of(slot); })
      .def_property_readonly("parameters_checked",
                             [](const AdamSlots& self) { return self.book().parameters_checked(); })
      .def("host_stats", &host_stats)
      .def("state_entry", &state_entry, py::arg("slot"))
      .def("load", &load_states, py::arg("saved"), py::arg("shards"), py::arg("local"));
}

}  // namespace

}  // namespace stowage::torch_offload

namespace stowage::python {

void bind_adam_slots(py::module_& module) {
  using torch_offload::AdamSlots;
  py::register_exception<torch_offload::HostMemoryShortage>(module, "HostMemoryError", PyExc_MemoryError);
  using torch_offload::Release;
  using torch_offload::step_call;
  py::class_<AdamSlots> slots(module, "AdamSlots",
                              "The offloaded optimizer's parameters in host memory and its step's bookkeeping "
                              "(python/tensors/adam_slots.hpp)");
  slots.def(py::init([](const std::string& device, std::string owner, const std::string& update,
                        const std::vector<int>& cpus, bool master_weights, std::int64_t bucket_numel,
                        std::optional<std::uint64_t> host_memory_limit,
                        std::function<std::string(std::size_t)> name_of, AdamSlots::Point at_point) {
              return std::make_unique<AdamSlots>(c10::Device(device), std::move(owner),
                                                 offload::parse_update_mode(update), cpus, master_weights,
                                                 bucket_numel, host_memory_limit, std::move(name_of),
                                                 std::move(at_point));
            }),
            py::arg("device"), py::arg("owner"), py::arg("update"), py::arg("cpus"), py::arg("master_weights"),
            py::arg("bucket_numel"), py::arg("host_memory_limit"), py::arg("name_of"), py::arg("at_point"))
      .def("join", &AdamSlots::join, py::arg("shards"), py::arg("groups"), py::arg("amsgrad"))
      .def("arrive", &AdamSlots::arrive, py::arg("slot"), py::arg("gradient"), py::arg("shard"), Release())
      .def("set_parameters_checked", [](AdamSlots& self) { self.book_mutable().set_parameters_checked(); })
      .def("take_written", &AdamSlots::take_written, py::arg("slots"), py::arg("shards"), Release())
      .def("parameters_are", &AdamSlots::parameters_are, py::arg("slots"), py::arg("shards"), Release())
      .def("submit",
           [](AdamSlots& self, std::size_t bucket, const py::dict& group, double scale) {
             return self.submit(bucket, torch_offload::options_of(group), scale);
           },
           py::arg("bucket"), py::arg("group"), py::arg("grad_scale"))
      .def("group_of", &AdamSlots::group_of, py::arg("bucket"))
      .def("prepare_step", step_call([](AdamSlots& self, const AdamSlots::StepInputs& inputs) {
             const AdamSlots::Prepared prepared = self.prepare_step(inputs);
             return std::make_tuple(prepared.skipped, prepared.warnings);
           }))
      .def("commit_step",
           step_call([](AdamSlots& self, const AdamSlots::StepInputs& inputs) { self.commit_step(inputs); }))
      .def("clip_by", &AdamSlots::clip_by, py::arg("coefficient"))
      .def("flush", &AdamSlots::flush, py::arg("shards"), Release())
      .def("take_state_changes", &AdamSlots::take_state_changes)
      .def("roll_back", py::overload_cast<>(&AdamSlots::roll_back), Release())
      .def("reset_arrivals", &AdamSlots::reset_arrivals);
  torch_offload::bind_slot_queries(slots);
  torch_offload::bind_overlapped_step(module);
}

}  // namespace stowage::python
