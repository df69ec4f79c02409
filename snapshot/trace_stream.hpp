// TraceStream: trace events read into columns as the pickle machine meets them.
//
// Note [Streaming traces]
// A stock-PyTorch snapshot of 1 GB holds millions of trace events; unpickled, each is a dict
// with its own frames list and integers, about three to four times the file. Read for columns
// (inspect, diff, replay), the machine builds everything as pickle does except the lists of
// snapshot["device_traces"] and the events in them: device_traces is a DeviceTraces stand-in,
// each of its lists a trace (a TraceColumnsBuilder), each dict made in a trace an event, kept as
// its fields until the APPENDS that puts it in the trace makes it a row. An event's frames list
// (an event list) is kept as its frame objects until its event is a row, then stored once in the
// StackTable. Events, event lists, traces and device_traces are never objects.
//
// That holds only while nothing can tell: pickle lets a memo reference reach any value again,
// and change it. So anything the pickles torch and stowage write never do raises ReadWhole, and
// the loader reads the pickle again as plain data and makes columns of its traces: an event
// referred to again (GET, DUP) or dropped, an event or an event list memoized twice or stored
// over, an event holding a container where the columns keep none, a key that is not a string,
// an event list taken anywhere but an event's frames or changed after it was stored, a plain
// list used as frames changed after (it is frozen), a trace or device_traces referred to again
// or put anywhere but where torch puts them, anything in device_traces but traces or in a trace
// but events, a second device_traces. What is left is read alike: the columns of a streamed
// trace are those of the plain trace, its first bad event named with the same message, and the
// plain-data walk (plain_walk.hpp) counts each trace as the events it stood for (TraceShape).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "snapshot/memo.hpp"
#include "snapshot/objects.hpp"
#include "snapshot/pod_column.hpp"
#include "snapshot/trace_columns.hpp"
#include "snapshot/value.hpp"

namespace stowage::snapshot {

// The machine's stack as the stream sees it when it decides what a new container is: all its
// values, and where each open MARK begins.
struct StackView {
  std::span<const Value> values;
  std::span<const std::size_t> marks;

  std::span<const Value> region() const {  // above the last mark
    return values.subspan(marks.empty() ? 0 : marks.back());
  }
  // The value just below the last mark, when the mark's region below holds any.
  const Value* outer() const;
  const Value* top() const { return region().empty() ? nullptr : &region().back(); }
};

// The streaming state of one reading for columns (Note [Streaming traces]). Owns the references
// held by open events and event lists, the frozen lists, the traces' kept objects and the stack
// table; clear() gives them back. Not thread-safe.
class TraceStream {
 public:
  TraceStream(Objects& objects, Memo& memo) : objects_(objects), memo_(memo) {}
  TraceStream(const TraceStream&) = delete;
  TraceStream& operator=(const TraceStream&) = delete;
  ~TraceStream();

  // What EMPTY_DICT and EMPTY_LIST make here: an event, a trace, an event list, device_traces;
  // nullopt for a plain dict or list.
  std::optional<Value> new_dict(const StackView& stack);
  std::optional<Value> new_list(const StackView& stack);
  // SETITEMS on an event, APPENDS to a stand-in: takes the items' references.
  void set_items(const Value& event, std::span<const Value> items);
  void append(const Value& target, std::span<const Value> items);
  // The object a stand-in is where a container takes it (only device_traces, once).
  Handle object_of(const Value& value);
  // The memo: a Value stored at `index` (append: a new slot), a Value read back.
  void memoized(const Value& value, std::size_t index, bool append, const Value& old);
  void got(const Value& value) const;
  // A Value dropped from the stack (POP, POP_MARK) or duplicated (DUP).
  void dropped(const Value& value) const;
  void duplicated(const Value& value) const;
  // A list the reader must not see changed (a plain list used as frames).
  bool frozen(Handle list) const { return frozen_.count(list) != 0; }
  // The memory the result will still take beyond what the reading holds: a Python dict entry
  // for each event's device_free and user_metadata, a list for each stack.
  std::uint64_t planned_bytes() const;

  // --- once the pickle is read
  bool streamed() const { return device_traces_ || !traces_.empty(); }
  Handle placeholder() const { return placeholder_; }
  // The traces in device_traces order; ReadWhole where any is not where torch puts it.
  std::vector<TraceColumnsBuilder*> traces_in_order();
  StackTable& stacks() { return stacks_; }
  void clear();

 private:
  struct OpenEvent {
    std::array<Value, kFieldCount> fields{};
    std::uint8_t present = 0;  // a bit per kept field
    std::vector<std::pair<Value, Value>> others;  // the fields the columns do not keep
    std::int64_t memo_index = -1;
    std::uint16_t generation = 0;
    bool open = false;
  };
  struct EventList {  // its frames, until it is stored, in open_frames_
    std::int32_t stack = kNoStack;
    bool stored = false;  // in the stack table, as `stack`
    bool frozen = false;  // an event's row was made of it (stored, or named as bad)
  };
  struct Trace {
    TraceColumnsBuilder columns;
    std::int64_t position = -1;  // in device_traces
  };

  OpenEvent& open_event(const Value& event);
  void set_field(OpenEvent& event, const Value& key, const Value& value);
  void take(Trace& trace, std::span<const Value> items);
  void make_row(Trace& trace, OpenEvent& event);
  bool frames_stack(const Value& frames, std::int64_t device, std::uint64_t index, Row& row,
                    bool& empty, std::string& error);
  void close_event(const Value& event);
  void discard_event(std::uint32_t slot);
  void release(const Value& value);

  Objects& objects_;
  Memo& memo_;
  std::vector<OpenEvent> events_;
  std::vector<std::uint32_t> free_events_;
  PodColumn<EventList> lists_;  // one an event's frames list: millions, so small
  std::unordered_map<std::uint32_t, std::vector<Value>> open_frames_;
  std::vector<Trace> traces_;
  bool device_traces_ = false;
  std::uint32_t in_device_traces_ = 0;
  Handle placeholder_ = nullptr;
  // Plain lists used as frames -> their stack (kUnstored until one is made of them): they may not
  // change after, and a list used by many events is looked at once.
  std::unordered_map<Handle, std::int32_t> frozen_;
  StackTable stacks_;
};

}  // namespace stowage::snapshot
