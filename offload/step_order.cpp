#include "offload/step_order.hpp"

#include <exception>

namespace stowage::offload {

namespace {

void at(const StepWork& work, const std::string& point) {
  if (work.at_point) work.at_point(point);
}

std::function<void()> write_back_part(const SlotBook& book, const StepWork& work, std::size_t bucket) {
  return [&book, &work, bucket] {
    at(work, "write_back " + std::to_string(bucket));
    if (book.updated(bucket)) work.write_back(bucket);  // (none: written back already, or none made)
  };
}

}  // namespace

void run_whole(const std::vector<std::function<void()>>& parts) {
  std::exception_ptr first;
  for (const std::function<void()>& part : parts) {
    try {
      part();
    } catch (...) {  // (an interrupt too: the step is finished first)
      if (first == nullptr) first = std::current_exception();
      part();
    }
  }
  if (first != nullptr) std::rethrow_exception(first);
}

void run_step(const SlotBook& book, const StepWork& work) {
  std::vector<std::function<void()>> parts;
  for (std::size_t bucket = 0; bucket < book.bucket_count(); ++bucket) {
    parts.emplace_back([&book, &work, bucket] {
      at(work, "update " + std::to_string(bucket));
      if (!book.updated(bucket)) work.update(bucket);
    });
  }
  for (std::size_t bucket = 0; book.mode() != UpdateMode::kDelayed && bucket < book.bucket_count(); ++bucket) {
    parts.push_back(write_back_part(book, work, bucket));
  }
  parts.emplace_back([&work] {
    at(work, "end");
    work.end();
  });
  run_whole(parts);
}

void run_pending_write_backs(const SlotBook& book, const StepWork& work) {
  std::vector<std::function<void()>> parts;
  for (const std::size_t bucket : book.pending_buckets()) parts.push_back(write_back_part(book, work, bucket));
  run_whole(parts);
}

}  // namespace stowage::offload
