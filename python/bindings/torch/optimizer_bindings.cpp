// stowage._torch's optimizer part: the offloaded optimizer's layout figures
// (offload/adam_buckets.hpp), its host memory, the CPUs its updates run on
// (offload/update_queue.hpp), and the host AdamW update over torch tensors (the GIL released while
// it runs). The optimizer's slots, buckets and copies are adam_slots_bindings.cpp's.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <utility>
#include <vector>
#include <string>

#include "base/errors.hpp"
#include "base/interrupt_watch.hpp"
#include "offload/adam_buckets.hpp"
#include "offload/adamw_kernel.hpp"
#include "offload/update_queue.hpp"
#include "python/tensors/content_checksum.hpp"
#include "python/tensors/host_bucket.hpp"
#include "python/tensors/host_state_store.hpp"
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
      .def(py::init([](const std::string& device) { return HostStateStore(c10::Device(device)); }),
           py::arg("device"))
      .def("empty", &HostStateStore::empty, py::arg("numel"), py::arg("dtype"));
}


void bind_layout(py::module_& module) {
  module.def(
      "kept_on_device",
      [](const std::vector<std::int64_t>& numels, double fraction) { return offload::kept_on_device(numels, fraction); },
      py::arg("numels"), py::arg("fraction"),
      "How many of the first parameters keep their states on the device for `fraction` of them by count");
  module.def(
      "bytes_per_parameter",
      [](at::ScalarType dtype, int grad_buffers, bool amsgrad, bool master_weights, int state_sets) {
        return offload::bytes_per_parameter(element_type_of(dtype), grad_buffers, amsgrad, master_weights,
                                            state_sets);
      },
      py::arg("dtype"), py::arg("grad_buffers"), py::arg("amsgrad") = false, py::arg("master_weights") = false,
      py::arg("state_sets") = 1,
      "Host bytes one offloaded parameter takes where its buffers persist (update='in_backward': state_sets=2, "
      "'delayed')");
  module.attr("STAGING_SLOTS") = offload::kStagingSlots;
  module.def(
      "staged_bytes_per_parameter",
      [](at::ScalarType dtype, bool amsgrad, bool master_weights) {
        return offload::staged_bytes_per_parameter(element_type_of(dtype), amsgrad, master_weights);
      },
      py::arg("dtype"), py::arg("amsgrad") = false, py::arg("master_weights") = false,
      "Host bytes one offloaded parameter takes with update='exact': its states (Note [Staged buckets])");
  module.def(
      "staging_ring_bytes",
      [](at::ScalarType dtype, std::int64_t bucket_numel, std::size_t buckets) {
        return offload::staging_ring_bytes(element_type_of(dtype), bucket_numel, buckets);
      },
      py::arg("dtype"), py::arg("bucket_numel"), py::arg("buckets"),
      "Host bytes of update='exact''s staging ring for `buckets` buckets of at most bucket_numel elements");
}

// InterruptHold as a Python context manager, entered and left on one thread (the hold is that
// thread's).
struct HeldInterrupts {
  std::optional<InterruptHold> hold;
};

void bind_engine_parts(py::module_& module) {
  module.def("cpus_near", &offload::cpus_near, py::arg("pci_bus_id"),
             "The CPUs this process may use nearest the GPU with that bus id (all the allowed ones for '')");
  py::class_<HeldInterrupts>(module, "InterruptHold",
                             "While entered, this thread's waits outlast Ctrl-C (to their deadlines): "
                             "Note [Whole steps] in offload/slot_book.hpp")
      .def(py::init<>())
      .def("__enter__", [](HeldInterrupts& self) { self.hold.emplace(); })
      .def("__exit__", [](HeldInterrupts& self, const py::args&) { self.hold.reset(); })
      .def_static("active", &InterruptHold::active);
}

}  // namespace

}  // namespace stowage::torch_offload

namespace stowage::python {

void bind_optimizer(py::module_& module) {
  module.def("adamw_takes_torch_sqrt", [] { return torch_offload::torch_vector_sqrt() != nullptr; },
             "Whether the host update takes torch's own (MKL's) square root");
  module.def("content_checksums", &torch_offload::content_checksums, py::arg("tensors"),
             "[len(tensors), 3] int64 checksums of the tensors' bytes, on their device "
             "(python/tensors/content_checksum.hpp): equal bytes give equal rows.");
  torch_offload::bind_update(module);
  torch_offload::bind_narrow_update(module);
  torch_offload::bind_store(module);
  torch_offload::bind_layout(module);
  torch_offload::bind_engine_parts(module);
}

}  // namespace stowage::python
