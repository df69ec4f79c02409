#include "snapshot/reader.hpp"

#include "snapshot/limits.hpp"
#include "snapshot/plain_walk.hpp"
#include "snapshot/refusal.hpp"
#include "snapshot/structure.hpp"

namespace stowage::snapshot {

Reading::~Reading() {
  for (TraceColumnsBuilder& trace : plain_) trace.clear(objects_);
  stacks_.clear(objects_);
  stream_.reset();  // before the memo it refers to
  memo_.reset();
  if (root_ != nullptr) objects_.release(root_);
}

// The machine's result as an object; the machine gives back everything else it holds first, so
// that what the walk sees shared is shared by the result.
Handle Reading::finish_machine(Machine& machine) {
  const Value root = machine.run();
  machine.clear();
  if (root.kind >= Kind::kEvent) {
    throw ReadWhole();  // the pickle is device_traces, a trace or an event itself
  }
  Handle made = new_reference(objects_, root);
  if (owns_handle(root.kind)) objects_.release(root.handle);
  return made;
}

Handle Reading::plain(ByteSource& source, const ReadOptions& options) {
  memo_ = std::make_unique<Memo>();
  Machine machine(source, objects_, options, *memo_, nullptr);
  root_ = finish_machine(machine);
  PlainWalk(objects_, node_budget(source.size())).check(root_);
  check_structure(root_, objects_, nullptr);
  objects_.retain(root_);
  return root_;
}

void Reading::columns(ByteSource& source, const ReadOptions& options) {
  memo_ = std::make_unique<Memo>();
  stream_ = std::make_unique<TraceStream>(objects_, *memo_);
  Machine machine(source, objects_, options, *memo_, stream_.get());
  root_ = finish_machine(machine);
  PlainWalk walk(objects_, node_budget(source.size()));
  if (!stream_->streamed()) {
    walk.check(root_);
    check_structure(root_, objects_, nullptr);
    plain_traces();
    return;
  }
  traces_ = stream_->traces_in_order();
  device_traces_ = stream_->placeholder();
  const bool in_place = device_traces_ != nullptr && objects_.kind_of(root_) == Kind::kDict &&
                        objects_.find(root_, Name::kDeviceTraces) == device_traces_;
  if (!in_place) throw ReadWhole();  // device_traces, or its traces, not where torch puts them
  const std::vector<const TraceColumnsBuilder*> shapes(traces_.begin(), traces_.end());
  walk.set_traces(device_traces_, shapes, stream_->stacks());
  walk.check(root_);
  const StreamedTraces streamed{device_traces_, shapes};
  check_structure(root_, objects_, &streamed);
}

void Reading::columns_of(Handle snapshot) {
  objects_.retain(snapshot);
  root_ = snapshot;
  plain_traces();
}

// The traces of a snapshot read as plain data, as columns.
void Reading::plain_traces() {
  if (objects_.kind_of(root_) != Kind::kDict) return;
  device_traces_ = objects_.find(root_, Name::kDeviceTraces);
  if (device_traces_ == nullptr || objects_.kind_of(device_traces_) != Kind::kList) {
    device_traces_ = nullptr;
    return;
  }
  const std::size_t count = objects_.length(device_traces_);
  plain_.reserve(count);
  for (std::size_t d = 0; d < count; ++d) {
    plain_.emplace_back(static_cast<std::int64_t>(d));
    trace_columns_of(objects_.item(device_traces_, d), objects_, stream_ ? stream_->stacks() : stacks_,
                     plain_.back());
    traces_.push_back(&plain_.back());
  }
}

}  // namespace stowage::snapshot
