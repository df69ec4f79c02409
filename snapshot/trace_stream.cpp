#include "snapshot/trace_stream.hpp"

#include <bit>

#include "snapshot/event_row.hpp"
#include "snapshot/limits.hpp"
#include "snapshot/refusal.hpp"

namespace stowage::snapshot {

namespace {

bool is_scalar(Kind kind) {
  return kind == Kind::kNone || kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat ||
         kind == Kind::kStr || kind == Kind::kBytes;
}

bool is_stand_in(Kind kind) { return kind >= Kind::kEvent; }

// Fields of one event that the columns do not keep (compile_context, ...): torch writes one or
// two; an event with more is read as a dict, whose keys are found by hashing, not one by one.
constexpr std::size_t kMaxOtherFields = 32;

// Whether a trace, device_traces or any open MARK lies at a dict made now: what makes it an event.
bool in_trace(const StackView& stack) {
  const Value* outer = stack.outer();
  const Value* top = stack.top();
  return (outer != nullptr && outer->kind == Kind::kTrace) || (top != nullptr && top->kind == Kind::kTrace);
}

// Whether a list made now is the value of an event's "frames".
bool is_event_frames(const StackView& stack) {
  const std::span<const Value> region = stack.region();
  const Value* outer = stack.outer();
  if (outer != nullptr && outer->kind == Kind::kEvent && region.size() % 2 == 1 &&
      region.back().is(Name::kFrames)) {
    return true;
  }
  return region.size() >= 2 && region[region.size() - 2].kind == Kind::kEvent &&
         region.back().is(Name::kFrames);
}

// Whether a list made now is the value of the snapshot's "device_traces".
bool is_device_traces(const StackView& stack) {
  const std::span<const Value> values = stack.values;
  if (!stack.marks.empty()) {
    const std::span<const Value> region = stack.region();
    return stack.marks.size() == 1 && stack.marks[0] == 1 && values[0].kind == Kind::kDict &&
           region.size() % 2 == 1 && region.back().is(Name::kDeviceTraces);
  }
  return values.size() == 2 && values[0].kind == Kind::kDict && values[1].is(Name::kDeviceTraces);
}

}  // namespace

const Value* StackView::outer() const {
  if (marks.empty()) return nullptr;
  const std::size_t below = marks.size() >= 2 ? marks[marks.size() - 2] : 0;
  return marks.back() > below ? &values[marks.back() - 1] : nullptr;
}

TraceStream::~TraceStream() { clear(); }

std::optional<Value> TraceStream::new_dict(const StackView& stack) {
  if (!in_trace(stack)) return std::nullopt;
  std::uint32_t slot;
  if (free_events_.empty()) {
    slot = static_cast<std::uint32_t>(events_.size());
    events_.emplace_back();
  } else {
    slot = free_events_.back();
    free_events_.pop_back();
  }
  OpenEvent& event = events_[slot];
  event.open = true;
  event.memo_index = -1;
  event.present = 0;
  ++event.generation;
  Value made = Value::of_index(Kind::kEvent, slot);
  made.aux = event.generation;
  return made;
}

std::optional<Value> TraceStream::new_list(const StackView& stack) {
  const Value* outer = stack.outer();
  const Value* top = stack.top();
  if ((outer != nullptr && outer->kind == Kind::kDeviceTraces) ||
      (top != nullptr && top->kind == Kind::kDeviceTraces)) {
    const std::size_t waiting = outer != nullptr && outer->kind == Kind::kDeviceTraces ? stack.region().size() : 0;
    if (traces_.size() >= static_cast<std::size_t>(kMaxDevices)) throw ReadWhole();  // more than any machine has
    traces_.push_back(Trace{TraceColumnsBuilder(static_cast<std::int64_t>(in_device_traces_ + waiting)), -1});
    return Value::of_index(Kind::kTrace, static_cast<std::uint32_t>(traces_.size() - 1));
  }
  if (is_event_frames(stack)) {
    lists_.push_back(EventList{});
    return Value::of_index(Kind::kEventList, static_cast<std::uint32_t>(lists_.size() - 1));
  }
  if (is_device_traces(stack)) {
    if (device_traces_) throw ReadWhole();  // a second device_traces: the plain reading says which holds
    device_traces_ = true;
    return Value::of_index(Kind::kDeviceTraces, 0);
  }
  return std::nullopt;
}

TraceStream::OpenEvent& TraceStream::open_event(const Value& event) {
  OpenEvent& found = events_[event.index];
  if (!found.open || found.generation != event.aux) throw ReadWhole();  // a row already: changed after
  return found;
}

void TraceStream::set_items(const Value& target, std::span<const Value> items) {
  OpenEvent& event = open_event(target);
  // Every pair is looked at before any is taken, so that a ReadWhole leaves the items the
  // machine's alone to give back.
  std::size_t others = event.others.size();
  for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
    const Value& key = items[i];
    const Value& value = items[i + 1];
    if (key.kind != Kind::kStr) throw ReadWhole();
    const std::optional<int> slot = field_slot(key.name());
    const bool allowed = is_scalar(value.kind) ||
                         (slot == field_slot(Name::kFrames) &&
                          (value.kind == Kind::kList || value.kind == Kind::kEventList)) ||
                         (slot == field_slot(Name::kUserMetadata) && !is_stand_in(value.kind));
    if (!allowed) throw ReadWhole();  // a container the columns would drop, or a stand-in
    if (!slot && ++others > kMaxOtherFields) throw ReadWhole();  // no event has that many: a dict says
  }
  for (std::size_t i = 0; i + 1 < items.size(); i += 2) set_field(event, items[i], items[i + 1]);
}

void TraceStream::set_field(OpenEvent& event, const Value& key, const Value& value) {
  const std::optional<int> slot = field_slot(key.name());
  if (slot) {
    const auto bit = static_cast<std::uint8_t>(1u << *slot);
    Value& field = event.fields[static_cast<std::size_t>(*slot)];
    if ((event.present & bit) != 0) release(field);
    field = value;
    event.present = static_cast<std::uint8_t>(event.present | bit);
    release(key);
    return;
  }
  for (auto& [other, held] : event.others) {
    if (objects_.same_str(other.handle, key.handle)) {
      release(held);
      held = value;
      release(key);
      return;
    }
  }
  event.others.emplace_back(key, value);
}

void TraceStream::append(const Value& target, std::span<const Value> items) {
  if (target.kind == Kind::kTrace) {
    take(traces_[target.index], items);
    return;
  }
  if (target.kind == Kind::kDeviceTraces) {
    for (const Value& item : items) {
      if (item.kind != Kind::kTrace || traces_[item.index].position >= 0) throw ReadWhole();
      traces_[item.index].position = in_device_traces_++;
    }
    return;
  }
  if (target.kind == Kind::kEventList && !lists_[target.index].frozen) {
    for (const Value& item : items) {
      if (is_stand_in(item.kind)) throw ReadWhole();
    }
    std::vector<Value>& frames = open_frames_[target.index];
    frames.insert(frames.end(), items.begin(), items.end());
    return;
  }
  throw ReadWhole();  // a stored event list, an event, device_traces' list changed after
}

void TraceStream::take(Trace& trace, std::span<const Value> items) {
  for (const Value& item : items) {
    if (item.kind != Kind::kEvent) throw ReadWhole();  // an event made elsewhere, or not a dict
    open_event(item);
  }
  for (const Value& item : items) {
    OpenEvent& event = events_[item.index];
    make_row(trace, event);
    close_event(item);
  }
}

void TraceStream::close_event(const Value& item) {
  OpenEvent& event = events_[item.index];
  if (event.memo_index >= 0) memo_.kill(static_cast<std::size_t>(event.memo_index));
  discard_event(item.index);
}

void TraceStream::discard_event(std::uint32_t slot) {
  OpenEvent& event = events_[slot];
  for (int field = 0; field < kFieldCount; ++field) {
    if ((event.present & (1u << field)) != 0) release(event.fields[static_cast<std::size_t>(field)]);
  }
  for (auto& [key, value] : event.others) {
    release(key);
    release(value);
  }
  event.others.clear();
  event.present = 0;
  event.open = false;
  free_events_.push_back(slot);
}

void TraceStream::make_row(Trace& trace, OpenEvent& event) {
  const auto slot = [](Name name) { return static_cast<std::size_t>(*field_slot(name)); };
  const auto has = [&](Name name) { return (event.present & (1u << slot(name))) != 0; };
  const Value& frames = event.fields[slot(Name::kFrames)];
  const Value& metadata = event.fields[slot(Name::kUserMetadata)];
  const bool frames_list = has(Name::kFrames) && (frames.kind == Kind::kList || frames.kind == Kind::kEventList);
  const bool container = has(Name::kUserMetadata) && is_container(metadata.kind);
  const std::uint64_t fields = static_cast<std::uint64_t>(std::popcount(event.present)) + event.others.size();
  const std::uint64_t nodes = 1 + 2 * fields - (frames_list ? 1 : 0) - (container ? 1 : 0);
  TraceColumnsBuilder& columns = trace.columns;
  if (has(Name::kFrames) && frames.kind == Kind::kList && frozen_.try_emplace(frames.handle, kUnstored).second) {
    objects_.retain(frames.handle);  // its stack is a copy: it may not change after
  }
  Row row;
  std::string error;
  bool ok = !columns.failed();
  if (ok) {
    EventFields checked;
    for (int i = 0; i < kFieldCount; ++i) {
      if ((event.present & (1u << i)) != 0) checked[static_cast<std::size_t>(i)] = Field::of(event.fields[static_cast<std::size_t>(i)]);
    }
    bool empty = false;
    ok = event_row(checked, columns.device(), columns.count(), objects_, row, error) &&
         (!frames_list || frames_stack(frames, columns.device(), columns.count(), row, empty, error));
    if (ok) {
      columns.count_shape(nodes, row.stack, empty, container ? metadata.handle : nullptr, objects_);
      row.metadata = row.has_metadata ? new_reference(objects_, metadata) : nullptr;
      columns.add(row, objects_);
      if (row.metadata != nullptr) objects_.release(row.metadata);
      return;
    }
  }
  columns.count_shape(nodes, kNoStack, false, nullptr, objects_);
  columns.fail(std::move(error));
}

bool TraceStream::frames_stack(const Value& frames, std::int64_t device, std::uint64_t index, Row& row,
                               bool& empty, std::string& error) {
  std::vector<Handle> handles;
  if (frames.kind == Kind::kList) {
    std::int32_t& known = frozen_.at(frames.handle);
    if (known != kUnstored) {
      row.stack = known;
      empty = known == kNoStack;
      return true;
    }
    const std::size_t count = objects_.length(frames.handle);
    for (std::size_t j = 0; j < count; ++j) {
      const Handle frame = objects_.item(frames.handle, j);
      error = check_frame(objects_.kind_of(frame), device, index, j);
      if (!error.empty()) return false;
      handles.push_back(frame);
    }
    row.stack = stacks_.index_of(handles, objects_);
    empty = handles.empty();
    known = row.stack;
    return true;
  }
  EventList& list = lists_[frames.index];
  list.frozen = true;
  if (!list.stored) {
    const auto open = open_frames_.find(frames.index);
    const std::vector<Value> none;
    const std::vector<Value>& listed = open != open_frames_.end() ? open->second : none;
    for (std::size_t j = 0; j < listed.size(); ++j) {
      const Value& frame = listed[j];
      if (is_stand_in(frame.kind)) throw ReadWhole();
      error = check_frame(frame.kind, device, index, j);
      if (!error.empty()) return false;
      handles.push_back(frame.handle);
    }
    list.stack = stacks_.index_of(handles, objects_);
    list.stored = true;
    for (const Value& frame : listed) release(frame);
    if (open != open_frames_.end()) open_frames_.erase(open);
  }
  row.stack = list.stack;
  empty = list.stack == kNoStack;
  return true;
}

Handle TraceStream::object_of(const Value& value) {
  if (value.kind != Kind::kDeviceTraces || placeholder_ != nullptr) throw ReadWhole();
  placeholder_ = objects_.make_list({});
  objects_.retain(placeholder_);  // one reference for the container that takes it, one kept
  return placeholder_;
}

void TraceStream::memoized(const Value& value, std::size_t index, bool appended, const Value& old) {
  if (!appended && (is_stand_in(value.kind) || is_stand_in(old.kind))) throw ReadWhole();
  if (value.kind == Kind::kEvent) {
    OpenEvent& event = open_event(value);
    if (event.memo_index >= 0) throw ReadWhole();  // memoized twice
    event.memo_index = static_cast<std::int64_t>(index);
  }
}

void TraceStream::got(const Value& value) const {
  if (value.kind == Kind::kEvent || value.kind == Kind::kDead || value.kind == Kind::kTrace ||
      value.kind == Kind::kDeviceTraces) {
    throw ReadWhole();  // an event, a trace or device_traces referred to twice
  }
}

void TraceStream::dropped(const Value& value) const {
  if (value.kind == Kind::kEvent) throw ReadWhole();
}

void TraceStream::duplicated(const Value& value) const { got(value); }

std::uint64_t TraceStream::planned_bytes() const {
  constexpr std::uint64_t kEntry = 112;  // a dict entry, its int key and (device_free) value
  std::uint64_t planned = stacks_.planned_bytes();
  for (const Trace& trace : traces_) {
    planned += kEntry * (trace.columns.device_free.size() + trace.columns.metadata.size());
  }
  return planned;
}

std::vector<TraceColumnsBuilder*> TraceStream::traces_in_order() {
  std::vector<TraceColumnsBuilder*> ordered(traces_.size(), nullptr);
  for (Trace& trace : traces_) {
    const std::int64_t position = trace.position;
    if (position < 0 || position != trace.columns.device()) throw ReadWhole();
    ordered[static_cast<std::size_t>(position)] = &trace.columns;
  }
  return ordered;
}

void TraceStream::release(const Value& value) {
  if (owns_handle(value.kind)) objects_.release(value.handle);
}

void TraceStream::clear() {
  for (std::size_t slot = 0; slot < events_.size(); ++slot) {
    if (events_[slot].open) discard_event(static_cast<std::uint32_t>(slot));
  }
  for (const auto& [list, frames] : open_frames_) {
    for (const Value& frame : frames) release(frame);
  }
  open_frames_.clear();
  for (Trace& trace : traces_) trace.columns.clear(objects_);
  for (const auto& [list, stack] : frozen_) objects_.release(list);
  frozen_.clear();
  if (placeholder_ != nullptr) objects_.release(placeholder_);
  placeholder_ = nullptr;
  stacks_.clear(objects_);
}

}  // namespace stowage::snapshot
