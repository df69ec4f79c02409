// Reading: a memory snapshot's pickle read safely, as plain data or with its traces as columns.
//
// Note [Reading snapshots]
// A snapshot is a pickle (torch.cuda.memory._dump_snapshot's, or stowage's) of plain data, from
// anywhere: pickles can run code, and a hostile one can be built to exhaust memory or time. So
// no snapshot is given to an unpickler. One stack machine (machine.hpp) reads every pickle, for
// both readings, and builds what its opcodes make through an Objects (objects.hpp: Python's
// objects in stowage._core), refusing as it meets them:
//   - every opcode but those that build plain data: no global, reduce, build, extension,
//     persistent id, set or buffer, so nothing but dicts, lists, tuples, str, bytes, int,
//     float, bool and None is ever made, and no code runs;
//   - memo indices beyond the file (a memo store may not make a list of the file's size);
//   - numbers of kMaxNumber or more in magnitude, and NaN (they can collide in hash tables);
//   - an opcode that runs past the end of its FRAME, or a FRAME that begins before the last one
//     ends (the C unpickler does not check them, and would read other opcodes than these);
//   - tuples nested deeper than kMaxDepth, and dict keys that are tuples other than ().
// Once built, the result is walked once (PlainWalk): a memo bomb, deep nesting and a container
// holding itself are refused from the graph, without expanding it; then the snapshot format is
// checked, naming the first field that does not fit (structure.hpp, event_row.hpp).
//
// Memory: a pickle makes up to about 90 bytes of objects a byte (an EMPTY_LIST is a list), and
// nothing but the budget bounds what a file of one repeated opcode builds. Every report_every
// bytes read, the machine measures the process's resident memory and refuses a reading that grew
// it by more than kMemoryFloor and a share a byte of pickle, or than a ceiling whatever the file's
// size (MemoryBudget: a 1.5 GB file is refused within the ceiling, not within 4.5 GB).
// What a file may expand to before the machine sees it (gzip, pipes) is bounded by
// stowage.snapshot_reader.reading.
//
// Read for columns (inspect, diff, replay), device_traces' events become rows as they are read
// (Note [Streaming traces] in trace_stream.hpp), so that a trace never exists as an object per
// event; a pickle laid out unlike torch's is read again as plain data (ReadWhole), within the
// same budget, and its traces made columns after. Every refusal is a Refused naming the reason.
#pragma once

#include <memory>
#include <vector>

#include "snapshot/byte_source.hpp"
#include "snapshot/machine.hpp"
#include "snapshot/memo.hpp"
#include "snapshot/objects.hpp"
#include "snapshot/trace_columns.hpp"
#include "snapshot/trace_stream.hpp"

namespace stowage::snapshot {

// One reading of a snapshot (Note [Reading snapshots]). plain() gives the snapshot as plain data;
// columns() and columns_of() leave it in root(), its traces in traces() (as columns, in device
// order) to stand for root()'s device_traces, and their stacks in stacks(). Holds references to
// what it made until it is destroyed. Throws Refused, and ReadWhole from columns(). One use;
// not thread-safe.
class Reading {
 public:
  explicit Reading(Objects& objects) : objects_(objects) {}
  Reading(const Reading&) = delete;
  Reading& operator=(const Reading&) = delete;
  ~Reading();

  // The pickle's snapshot, checked: a new reference.
  Handle plain(ByteSource& source, const ReadOptions& options);
  // The pickle's snapshot with its traces as columns.
  void columns(ByteSource& source, const ReadOptions& options);
  // A snapshot already read as plain data (and checked) with its traces as columns: throws
  // Refused at the first event that cannot be a row (frames that are not a list of dicts).
  void columns_of(Handle snapshot);

  Handle root() const { return root_; }
  // root()'s device_traces, which traces() stand for; nullptr where it has none.
  Handle device_traces() const { return device_traces_; }
  const std::vector<TraceColumnsBuilder*>& traces() const { return traces_; }
  const StackTable& stacks() const { return stream_ ? stream_->stacks() : stacks_; }

 private:
  Handle finish_machine(Machine& machine);
  void plain_traces();

  Objects& objects_;
  Handle root_ = nullptr;
  Handle device_traces_ = nullptr;
  std::unique_ptr<Memo> memo_;
  std::unique_ptr<TraceStream> stream_;
  std::vector<TraceColumnsBuilder> plain_;
  std::vector<TraceColumnsBuilder*> traces_;
  StackTable stacks_;
};

}  // namespace stowage::snapshot
