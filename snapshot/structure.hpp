// The snapshot format, checked over what a reading built, and a plain trace made columns.
#pragma once

#include <cstdint>
#include <vector>

#include "snapshot/objects.hpp"
#include "snapshot/trace_columns.hpp"

namespace stowage::snapshot {

// Traces read into columns as they streamed: `list` (an object of the result) stands for them,
// each carrying its first bad event's message.
struct StreamedTraces {
  Handle list = nullptr;
  std::vector<const TraceColumnsBuilder*> traces;
};

// Throws Refused naming the first field that does not fit the snapshot format
// ("device_traces[0][12].size: expected int, got str"), in the order stowage.snapshot_reader
// .schema.check_structure names them: the snapshot, its segments and their blocks, then each
// trace's events (their frames are checked when they become columns).
void check_structure(Handle snapshot, Objects& objects, const StreamedTraces* streamed);

// A list of event dicts as columns, into `out`; throws Refused for a trace that is not a list, at
// the first malformed event, or at frames that are not a list of dicts.
void trace_columns_of(Handle events, Objects& objects, StackTable& stacks, TraceColumnsBuilder& out);

}  // namespace stowage::snapshot
