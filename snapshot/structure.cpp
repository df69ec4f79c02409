#include "snapshot/structure.hpp"

#include <string>
#include <unordered_map>

#include "snapshot/event_row.hpp"
#include "snapshot/limits.hpp"
#include "snapshot/refusal.hpp"

namespace stowage::snapshot {

namespace {

// Python's expect(): refuses `object` at `where` unless it is of `kind` (an int: not a bool).
void expect(Handle object, Kind kind, const std::string& where, Objects& objects) {
  const Kind found = objects.kind_of(object);
  if (found == kind) return;
  const std::string got = found == Kind::kOther ? objects.other_type_name(object) : type_name(found);
  SNAPSHOT_REFUSE(where, ": expected ", type_name(kind), ", got ", got);
}

void check_segment(Handle segment, std::size_t i, Objects& objects) {
  const std::string where = "segments[" + std::to_string(i) + "]";
  expect(segment, Kind::kDict, where, objects);
  for (const Name field : {Name::kAddress, Name::kTotalSize}) {
    const Handle value = objects.find(segment, field);
    if (value == nullptr) SNAPSHOT_REFUSE(where, ": missing '", text_of(field), "'");
    expect(value, Kind::kInt, where + "." + std::string(text_of(field)), objects);
  }
  if (const Handle device = objects.find(segment, Name::kDevice)) {
    expect(device, Kind::kInt, where + ".device", objects);
    bool fits = true;
    const std::int64_t value = objects.int_of(device, fits);
    if (!fits || value < 0 || value >= kMaxDevices) {
      SNAPSHOT_REFUSE(where, ".device: ", fits ? std::to_string(value) : objects.repr(device),
                      " is out of range [0, ", kMaxDevices, ")");
    }
  }
  const Handle blocks = objects.find(segment, Name::kBlocks);
  if (blocks == nullptr) return;
  expect(blocks, Kind::kList, where + ".blocks", objects);
  const std::size_t count = objects.length(blocks);
  for (std::size_t j = 0; j < count; ++j) {
    const std::string at = where + ".blocks[" + std::to_string(j) + "]";
    const Handle block = objects.item(blocks, j);
    expect(block, Kind::kDict, at, objects);
    for (const Name field : {Name::kAddress, Name::kSize}) {
      if (const Handle value = objects.find(block, field)) {
        expect(value, Kind::kInt, at + "." + std::string(text_of(field)), objects);
      }
    }
  }
}

void check_trace(Handle trace, std::int64_t device, Objects& objects) {
  expect(trace, Kind::kList, "device_traces[" + std::to_string(device) + "]", objects);
  const std::size_t count = objects.length(trace);
  for (std::size_t k = 0; k < count; ++k) {
    const Handle entry = objects.item(trace, k);
    expect(entry, Kind::kDict, event_where(device, k), objects);
    Row row;
    std::string error;
    if (!event_row(fields_of(entry, objects), device, k, objects, row, error, false)) SNAPSHOT_REFUSE(error);
  }
}

}  // namespace

void check_structure(Handle snapshot, Objects& objects, const StreamedTraces* streamed) {
  expect(snapshot, Kind::kDict, "snapshot", objects);
  const Handle segments = objects.find(snapshot, Name::kSegments);
  const Handle traces = objects.find(snapshot, Name::kDeviceTraces);
  if (segments == nullptr && traces == nullptr) {
    SNAPSHOT_REFUSE("snapshot: has neither 'segments' nor 'device_traces'");
  }
  if (segments != nullptr) {
    expect(segments, Kind::kList, "segments", objects);
    const std::size_t count = objects.length(segments);
    for (std::size_t i = 0; i < count; ++i) check_segment(objects.item(segments, i), i, objects);
  }
  if (traces == nullptr) return;
  if (streamed != nullptr && traces == streamed->list) {
    for (const TraceColumnsBuilder* trace : streamed->traces) {
      if (trace->error()) SNAPSHOT_REFUSE(*trace->error());
    }
    return;
  }
  expect(traces, Kind::kList, "device_traces", objects);
  const std::size_t count = objects.length(traces);
  for (std::size_t d = 0; d < count; ++d) check_trace(objects.item(traces, d), static_cast<std::int64_t>(d), objects);
}

void trace_columns_of(Handle events, Objects& objects, StackTable& stacks, TraceColumnsBuilder& out) {
  const std::int64_t device = out.device();
  expect(events, Kind::kList, "device_traces[" + std::to_string(device) + "]", objects);
  const std::size_t count = objects.length(events);
  std::vector<Handle> frames;
  std::unordered_map<Handle, std::int32_t> seen;  // a frames list many events share, looked at once
  for (std::size_t k = 0; k < count; ++k) {
    const Handle entry = objects.item(events, k);
    expect(entry, Kind::kDict, event_where(device, k), objects);
    const EventFields fields = fields_of(entry, objects);
    Row row;
    std::string error;
    if (!event_row(fields, device, k, objects, row, error)) SNAPSHOT_REFUSE(error);
    const Field& listed = fields[static_cast<std::size_t>(*field_slot(Name::kFrames))];
    const auto known = listed.present && listed.kind == Kind::kList ? seen.find(listed.handle) : seen.end();
    if (known != seen.end()) {
      row.stack = known->second;
    } else if (listed.present && listed.kind == Kind::kList) {
      frames.clear();
      const std::size_t depth = objects.length(listed.handle);
      for (std::size_t j = 0; j < depth; ++j) {
        const Handle frame = objects.item(listed.handle, j);
        const std::string bad = check_frame(objects.kind_of(frame), device, k, j);
        if (!bad.empty()) SNAPSHOT_REFUSE(bad);
        frames.push_back(frame);
      }
      row.stack = stacks.index_of(frames, objects);
      seen.emplace(listed.handle, row.stack);
    }
    if (row.has_metadata) row.metadata = fields[static_cast<std::size_t>(*field_slot(Name::kUserMetadata))].handle;
    out.add(row, objects);
  }
}

}  // namespace stowage::snapshot
