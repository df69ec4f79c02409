// stowage._torch's optimizer part: the offloaded optimizer's layout (offload/adam_buckets.hpp),
// its buckets in host memory (host_bucket.hpp), the queue their updates run on
// (offload/update_queue.hpp), its copies on the offload engine (optimizer_transfers.hpp), and the
// host AdamW update over torch tensors (the GIL released while it runs).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <utility>
#include <vector>
#include <string>
#include <tuple>

#include "allocator/base/errors.hpp"
#include "offload/adamw_kernel.hpp"
#include "python/bindings/torch/content_checksum.hpp"
#include "python/bindings/torch/content_watch.hpp"
#include "offload/adam_buckets.hpp"
#include "offload/update_queue.hpp"
#include "python/bindings/torch/host_bucket.hpp"
#include "python/bindings/torch/host_state_store.hpp"
#include "python/bindings/torch/optimizer_transfers.hpp"
#include "python/bindings/torch/module_parts.hpp"

namespace py = pybind11;

namespace stowage::torch_offload {

namespace {

using offload::ElementType;

ElementType element_type(const at::Tensor& tensor, const char* what) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return ElementType::kFloat32;
    case at::kBFloat16: return ElementType::kBFloat16;
    case at::kHalf: return ElementType::kFloat16;
    default:
      STOWAGE_CHECK(false, "the AdamW update takes float32, bfloat16 or float16 ", what, ", not ",
                    c10::toString(tensor.scalar_type()));
      return ElementType::kFloat32;  // not reached
  }
}


void check_host(const at::Tensor& tensor, const char* what, std::int64_t numel) {
  STOWAGE_CHECK(tensor.device().is_cpu(), "the AdamW update's ", what, " must be a CPU tensor, not on ",
                tensor.device().str());
  STOWAGE_CHECK(tensor.is_contiguous(), "the AdamW update's ", what, " must be contiguous");
  STOWAGE_CHECK(tensor.numel() == numel, "the AdamW update's ", what, " has ", tensor.numel(),
                " elements where the master weights have ", numel);
}

float* fp32_data(const at::Tensor& tensor, const char* what, std::int64_t numel) {
  check_host(tensor, what, numel);
  STOWAGE_CHECK(tensor.scalar_type() == at::kFloat, "the AdamW update's ", what, " must be float32, not ",
                c10::toString(tensor.scalar_type()));
  return tensor.data_ptr<float>();
}

struct UpdateArguments {
  at::Tensor master, exp_avg, exp_avg_sq, grad;
  std::optional<at::Tensor> out;
  std::optional<at::Tensor> max_exp_avg_sq;
};

offload::AdamWBuffers buffers_of(const UpdateArguments& a) {
  const std::int64_t numel = a.master.numel();
  offload::AdamWBuffers buffers;
  buffers.master = fp32_data(a.master, "master weights", numel);
  buffers.exp_avg = fp32_data(a.exp_avg, "exp_avg", numel);
  buffers.exp_avg_sq = fp32_data(a.exp_avg_sq, "exp_avg_sq", numel);
  check_host(a.grad, "gradient", numel);
  buffers.grad = a.grad.const_data_ptr();
  buffers.grad_type = element_type(a.grad, "gradients");
  if (a.out) {
    check_host(*a.out, "output", numel);
    buffers.out = a.out->mutable_data_ptr();
    buffers.out_type = element_type(*a.out, "outputs");
  }
  if (a.max_exp_avg_sq) buffers.max_exp_avg_sq = fp32_data(*a.max_exp_avg_sq, "max_exp_avg_sq", numel);
  buffers.count = static_cast<std::size_t>(numel);
  return buffers;
}

void bind_update(py::module_& module) {
  module.def(
      "adamw_update",
      [](const at::Tensor& master, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& grad,
         const std::optional<at::Tensor>& out, std::int64_t step, double lr, double beta1, double beta2, double eps,
         double weight_decay, double grad_scale, int threads, bool decoupled_weight_decay, bool maximize,
         const std::optional<at::Tensor>& max_exp_avg_sq, bool cpu_sqrt) {
        const offload::AdamWBuffers buffers =
            buffers_of({master, exp_avg, exp_avg_sq, grad, out, max_exp_avg_sq});
        offload::AdamWHyperparameters hyper{lr, beta1, beta2, eps, weight_decay, grad_scale};
        hyper.decoupled_weight_decay = decoupled_weight_decay;
        hyper.maximize = maximize;
        // torch's AdamW on a CPU takes its CPU's square root; on a GPU, the correctly rounded one
        hyper.vector_sqrt = cpu_sqrt ? torch_vector_sqrt() : nullptr;
        const py::gil_scoped_release release;
        offload::adamw_step(hyper, step, buffers, threads);
      },
      py::arg("master"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("grad"), py::arg("out"),
      py::arg("step"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
      py::arg("weight_decay"), py::arg("grad_scale") = 1.0, py::arg("threads") = 1,
      py::arg("decoupled_weight_decay") = true, py::arg("maximize") = false,
      py::arg("max_exp_avg_sq") = py::none(), py::arg("cpu_sqrt") = true,
      "One Adam step (torch.optim.Adam's update; AdamW's with decoupled_weight_decay) over fp32 "
      "master weights and moments (updated in place) from `grad`, the updated weights written to "
      "`out` (or None) in its precision, split over `threads` threads; `max_exp_avg_sq` for "
      "amsgrad. `cpu_sqrt`: the square root torch's CPU AdamW takes (for parameters on a CPU), "
      "else the correctly rounded one (torch's CUDA AdamW's). Releases the GIL.");
}

void* narrow_data(const at::Tensor& tensor, const char* what, std::int64_t numel, at::ScalarType type) {
  check_host(tensor, what, numel);
  STOWAGE_CHECK(tensor.scalar_type() == type, "the Adam update's ", what, " must be ",
                c10::toString(type), " like the parameter, not ", c10::toString(tensor.scalar_type()));
  return tensor.data_ptr();
}

void bind_narrow_update(py::module_& module) {
  module.def(
      "adam_update_narrow",
      [](const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& grad,
         std::int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay,
         double grad_scale, int threads, bool decoupled_weight_decay, bool maximize,
         const std::optional<at::Tensor>& max_exp_avg_sq) {
        const std::int64_t numel = param.numel();
        const at::ScalarType type = param.scalar_type();
        STOWAGE_CHECK(type == at::kBFloat16 || type == at::kHalf,
                      "parameters kept in their own precision are bfloat16 or float16, not ", c10::toString(type));
        offload::NarrowAdamBuffers buffers;
        buffers.param = narrow_data(param, "parameter", numel, type);
        buffers.exp_avg = narrow_data(exp_avg, "exp_avg", numel, type);
        buffers.exp_avg_sq = narrow_data(exp_avg_sq, "exp_avg_sq", numel, type);
        buffers.grad = narrow_data(grad, "gradient", numel, type);
        if (max_exp_avg_sq) buffers.max_exp_avg_sq = narrow_data(*max_exp_avg_sq, "max_exp_avg_sq", numel, type);
        buffers.type = type == at::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat16;
        buffers.count = static_cast<std::size_t>(numel);
        offload::AdamWHyperparameters hyper{lr, beta1, beta2, eps, weight_decay, grad_scale};
        hyper.decoupled_weight_decay = decoupled_weight_decay;
        hyper.maximize = maximize;
        const py::gil_scoped_release release;
        offload::adam_step_narrow(hyper, step, buffers, threads);
      },
      py::arg("param"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("grad"), py::arg("step"), py::arg("lr"),
      py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("grad_scale") = 1.0,
      py::arg("threads") = 1, py::arg("decoupled_weight_decay") = true, py::arg("maximize") = false,
      py::arg("max_exp_avg_sq") = py::none(),
      "One Adam step for bfloat16 or float16 parameters whose states stay in that precision (torch's Adam on "
      "such parameters): updated in place in fp32 arithmetic, each state rounded as it is stored. Releases the GIL.");
}

void bind_store(py::module_& module) {
  py::class_<HostStateStore>(module, "HostStateStore")
      .def(py::init([](const std::string& device, std::size_t limit_bytes) {
             return HostStateStore(c10::Device(device), limit_bytes);
           }),
           py::arg("device"), py::arg("limit_bytes") = 0)
      .def("empty", &HostStateStore::empty, py::arg("numel"), py::arg("dtype"))
      .def("placement", &HostStateStore::placement)
      .def("stats", [](const HostStateStore& self) {
        const PinnedHostPoolStats stats = self.stats();
        py::dict out;
        out["allocated_bytes"] = stats.allocated_bytes;
        out["reserved_bytes"] = stats.reserved_bytes;
        out["pinned_bytes"] = stats.segments.pinned_bytes;
        out["pageable_bytes"] = stats.segments.pageable_bytes;
        out["pinning_refused"] = stats.segments.pinning_refused;
        return out;
      });
}


void bind_layout(py::module_& module) {
  py::class_<offload::BucketPlan>(module, "BucketPlan",
                                  "A bucket (Note [Optimizer buckets]): its parameters, as indices into the "
                                  "planner's input in bucket order, each one's offset, and its element count")
      .def_readonly("members", &offload::BucketPlan::members)
      .def_readonly("offsets", &offload::BucketPlan::offsets)
      .def_readonly("numel", &offload::BucketPlan::numel);
  module.def(
      "plan_buckets",
      [](const std::vector<std::tuple<std::size_t, at::ScalarType, std::int64_t, std::int64_t>>& params,
         std::int64_t bucket_numel) {
        std::vector<offload::PlannedParameter> planned;
        for (const auto& [group, dtype, numel, device] : params) {
          planned.push_back({group, element_type_of(dtype), numel, device});
        }
        return offload::plan_buckets(planned, bucket_numel);
      },
      py::arg("params"), py::arg("bucket_numel"),
      "The buckets (Note [Optimizer buckets]) for (group, dtype, numel, device) of each parameter in the "
      "optimizer's order");
  module.def(
      "kept_on_device",
      [](const std::vector<std::int64_t>& numels, double fraction) { return offload::kept_on_device(numels, fraction); },
      py::arg("numels"), py::arg("fraction"),
      "How many of the first parameters keep their states on the device for `fraction` of them by count");
  module.def(
      "bytes_per_parameter",
      [](at::ScalarType dtype, int grad_buffers, bool amsgrad, bool master_weights) {
        return offload::bytes_per_parameter(element_type_of(dtype), grad_buffers, amsgrad, master_weights);
      },
      py::arg("dtype"), py::arg("grad_buffers"), py::arg("amsgrad") = false, py::arg("master_weights") = false,
      "Host bytes one offloaded parameter takes");
}

void bind_content_watch(py::module_& module) {
  py::class_<ContentWatch>(module, "ContentWatch",
                           "Checksums of watched tensors, one row per index, on one device "
                           "(python/bindings/torch/content_watch.hpp)")
      .def(py::init([](const std::string& device) { return std::make_unique<ContentWatch>(c10::Device(device)); }),
           py::arg("device"))
      .def("extend", &ContentWatch::extend, py::arg("count"))
      .def("remember", &ContentWatch::remember, py::arg("indices"), py::arg("tensors"))
      .def("changed", &ContentWatch::changed, py::arg("indices"), py::arg("tensors"))
      .def_property_readonly("seconds", &ContentWatch::seconds);
}

void wait_for(const offload::UpdateTicket& ticket, const std::string& what, std::size_t bytes) {
  const py::gil_scoped_release release;
  wait_until([&] { return ticket.done(); }, {what, bytes});
}

void bind_engine_parts(py::module_& module) {
  py::class_<offload::UpdateTicket, std::shared_ptr<offload::UpdateTicket>>(module, "UpdateTicket")
      .def("done", &offload::UpdateTicket::done)
      .def("wait",
           [](offload::UpdateTicket& self, const std::string& what, std::size_t bytes) {
             wait_for(self, what, bytes);
             self.take();
           },
           py::arg("what"), py::arg("bytes") = 0,
           "Waits for the update (Note [Bounded waits]) and raises what it raised");
  module.def("cpus_near", &offload::cpus_near, py::arg("pci_bus_id"),
             "The CPUs this process may use nearest the GPU with that bus id (all the allowed ones for '')");
  py::class_<offload::UpdateQueue, std::shared_ptr<offload::UpdateQueue>>(module, "UpdateQueue")
      .def(py::init([](const std::vector<int>& cpus) { return std::make_shared<offload::UpdateQueue>(cpus); }),
           py::arg("cpus"))
      .def_property_readonly("cpus", &offload::UpdateQueue::cpus)
      .def_property_readonly("threads", &offload::UpdateQueue::threads)
      .def_property_readonly("busy_seconds", &offload::UpdateQueue::busy_seconds);
  py::class_<CopyMark>(module, "CopyMark").def("done", &CopyMark::done);
  py::class_<OptimizerTransfers>(module, "OptimizerTransfers")
      .def(py::init([](const std::string& device) { return std::make_unique<OptimizerTransfers>(c10::Device(device)); }),
           py::arg("device"))
      .def("copy_out", &OptimizerTransfers::copy_out, py::arg("destination"), py::arg("gradient"),
           py::call_guard<py::gil_scoped_release>())
      .def("copies_out_issued", &OptimizerTransfers::copies_out_issued)
      .def("write_back", &OptimizerTransfers::write_back, py::arg("params"), py::arg("sources"),
           py::call_guard<py::gil_scoped_release>())
      .def("written_back", &OptimizerTransfers::written_back, py::call_guard<py::gil_scoped_release>())
      .def("synchronize", &OptimizerTransfers::synchronize, py::arg("bytes") = 0,
           py::call_guard<py::gil_scoped_release>());
  py::class_<HostBucket>(module, "HostBucket")
      .def(py::init([](HostStateStore& store, at::ScalarType dtype, const std::vector<std::int64_t>& numels,
                       bool master_weights, bool amsgrad, int grad_buffers) {
             return std::make_unique<HostBucket>(store, dtype, numels, master_weights, amsgrad, grad_buffers);
           }),
           py::arg("store"), py::arg("dtype"), py::arg("numels"), py::arg("master_weights"), py::arg("amsgrad"),
           py::arg("grad_buffers"))
      .def_property_readonly("narrow", &HostBucket::narrow)
      .def_property_readonly("numel", &HostBucket::numel)
      .def_property_readonly("bytes", &HostBucket::bytes)
      .def_property_readonly("offsets", &HostBucket::offsets)
      .def_property_readonly("master", &HostBucket::master)
      .def_property_readonly("exp_avg", &HostBucket::exp_avg)
      .def_property_readonly("exp_avg_sq", &HostBucket::exp_avg_sq)
      .def_property_readonly("max_exp_avg_sq", [](const HostBucket& self) -> std::optional<at::Tensor> {
        return self.max_exp_avg_sq().defined() ? std::optional<at::Tensor>(self.max_exp_avg_sq()) : std::nullopt;
      })
      .def_property_readonly("out", [](const HostBucket& self) -> std::optional<at::Tensor> {
        return self.out().defined() ? std::optional<at::Tensor>(self.out()) : std::nullopt;
      })
      .def_property_readonly("grads", &HostBucket::grads)
      .def_property_readonly("steps", &HostBucket::steps)
      .def(
          "submit",
          [](HostBucket& self, offload::UpdateQueue& queue, const std::vector<bool>& has_gradient, double lr,
             double beta1, double beta2, double eps, double weight_decay, double grad_scale,
             bool decoupled_weight_decay, bool maximize, int grad_buffer, bool provisional, bool cpu_sqrt,
             std::optional<CopyMark> copied, std::optional<CopyMark> returned) {
            BucketUpdate update;
            update.hyper = offload::AdamWHyperparameters{lr, beta1, beta2, eps, weight_decay, grad_scale};
            update.hyper.decoupled_weight_decay = decoupled_weight_decay;
            update.hyper.maximize = maximize;
            update.grad_buffer = grad_buffer;
            update.provisional = provisional;
            update.cpu_sqrt = cpu_sqrt;
            return self.submit(queue, update, has_gradient, std::move(copied), std::move(returned));
          },
          py::arg("queue"), py::arg("has_gradient"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
          py::arg("eps"), py::arg("weight_decay"), py::arg("grad_scale"), py::arg("decoupled_weight_decay"),
          py::arg("maximize"), py::arg("grad_buffer"), py::arg("provisional"), py::arg("cpu_sqrt"),
          py::arg("copied") = py::none(), py::arg("returned") = py::none(),
          "Increments the step counts of the parameters with a gradient and queues their update; None when "
          "none has one")
      .def("restore", &HostBucket::restore)
      .def("forget", &HostBucket::forget);
}

}  // namespace

}  // namespace stowage::torch_offload

namespace stowage::python {

void bind_optimizer(py::module_& module) {
  module.def("adamw_takes_torch_sqrt", [] { return torch_offload::torch_vector_sqrt() != nullptr; },
             "Whether the host update takes torch's own (MKL's) square root");
  module.def("content_checksums", &torch_offload::content_checksums, py::arg("tensors"),
             "[len(tensors), 3] int64 checksums of the tensors' bytes, on their device "
             "(python/bindings/torch/content_checksum.hpp): equal bytes give equal rows.");
  torch_offload::bind_update(module);
  torch_offload::bind_narrow_update(module);
  torch_offload::bind_store(module);
  torch_offload::bind_layout(module);
  torch_offload::bind_content_watch(module);
  torch_offload::bind_engine_parts(module);
}

}  // namespace stowage::python
