#include "offload/step_order.hpp"

#include <algorithm>
#include <exception>

#include "base/errors.hpp"

namespace stowage::offload {

namespace {

void at(const StepWork& work, const std::string& point) {
  if (work.at_point) work.at_point(point);
}

std::function<void()> write_back_part(const SlotBook& book, const StepWork& work, std::size_t bucket) {
  return [&book, &work, bucket] {
    at(work, "write_back " + std::to_string(bucket));
    if (book.updated(bucket)) work.write_back(bucket);  // (none: written back already, or none made)
    if (work.landed) work.landed(bucket);
  };
}

std::function<void()> update_part(const SlotBook& book, const StepWork& work, std::size_t bucket) {
  return [&book, &work, bucket] {
    at(work, "update " + std::to_string(bucket));
    if (!book.updated(bucket)) work.update(bucket);
  };
}

std::function<void()> end_part(const StepWork& work) {
  return [&work] {
    at(work, "end");
    work.end();
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
  for (std::size_t bucket = 0; bucket < book.bucket_count(); ++bucket) parts.push_back(update_part(book, work, bucket));
  for (std::size_t bucket = 0; book.mode() != UpdateMode::kDelayed && bucket < book.bucket_count(); ++bucket) {
    parts.push_back(write_back_part(book, work, bucket));
  }
  parts.push_back(end_part(work));
  run_whole(parts);
}

void run_staged_step(const SlotBook& book, const StepWork& work, std::size_t slots) {
  // (no bucket, no slot: an optimizer whose parameters all live elsewhere still ends its steps)
  STOWAGE_CHECK(slots >= 1 || book.bucket_count() == 0, "a staging ring without slots for ", book.bucket_count(),
                " buckets");
  STOWAGE_CHECK(book.mode() == UpdateMode::kExact, "only update='exact' stages its buckets");
  std::vector<std::function<void()>> parts;
  // Updates issued ahead of the oldest write-back not yet issued: a bucket's slot was last written
  // back from one part earlier (one slot: just before).
  const std::size_t lag = std::max<std::size_t>(slots - 1, 1);
  std::size_t written = 0;
  for (std::size_t bucket = 0; bucket < book.bucket_count(); ++bucket) {
    if (bucket >= lag) parts.push_back(write_back_part(book, work, written++));
    parts.push_back(update_part(book, work, bucket));
  }
  for (; written < book.bucket_count(); ++written) parts.push_back(write_back_part(book, work, written));
  parts.push_back(end_part(work));
  run_whole(parts);
}

void run_pending_write_backs(const SlotBook& book, const StepWork& work) {
  std::vector<std::function<void()>> parts;
  for (const std::size_t bucket : book.pending_buckets()) parts.push_back(write_back_part(book, work, bucket));
  run_whole(parts);
}

}  // namespace stowage::offload
