// Machine: the snapshot reader's one pickle stack machine (Note [Reading snapshots] in
// snapshot/reader.hpp), which both readings run.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "snapshot/byte_source.hpp"
#include "snapshot/memo.hpp"
#include "snapshot/memory_budget.hpp"
#include "snapshot/objects.hpp"
#include "snapshot/pod_column.hpp"
#include "snapshot/trace_stream.hpp"
#include "snapshot/value.hpp"

namespace stowage::snapshot {

// How a reading goes: its memory budget, how often it measures (and reports), how much of a
// large file it gives back at a time, and who hears its progress (bytes read, bytes in all;
// called every report_every bytes and once at the end; it may throw to end the reading).
struct ReadOptions {
  MemoryBound memory;
  // The resident memory the budget counts from: 0 for the process's when the reading begins; a
  // second reading of one file gives the first's, so that the two together keep within one budget.
  std::uint64_t memory_start = 0;
  std::uint64_t report_every = std::uint64_t{256} << 10;
  std::uint64_t release_every = std::uint64_t{8} << 20;
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

// Reads a pickle's opcodes in order and builds what they make through an Objects, as pickle's
// unpickler does, for the opcodes that build plain data only, and enforces the reader's policy
// as it meets each: refused opcodes, memo indices within the file, numbers below kMaxNumber,
// opcodes within their frame, tuples at most kMaxDepth deep and never dict keys but (), the
// memory budget. With a TraceStream, device_traces' events become rows as they are read (Note
// [Streaming traces]). One use: run() once. Owns a reference for every Value on its stack and in
// the memo it is given, given back when it ends; run()'s Value is the caller's. Throws Refused for a file it
// refuses (for a pickle it cannot read: "not a readable pickle (...); is the file truncated?"),
// ReadWhole where the stream gives up. Not thread-safe.
class Machine {
 public:
  Machine(ByteSource& source, Objects& objects, const ReadOptions& options, Memo& memo,
          TraceStream* stream);
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;
  ~Machine();

  Value run();
  // Gives back the stack's and the memo's references (done by the destructor too).
  void clear();

 private:
  static constexpr std::size_t kNoFrame = std::numeric_limits<std::size_t>::max();

  Value loop();
  bool step(std::uint8_t opcode);
  bool step_containers(std::uint8_t opcode);
  bool step_scalars(std::uint8_t opcode);
  bool step_memo(std::uint8_t opcode);
  void rare(std::uint8_t opcode);
  Value stop();

  // --- where the machine reads (machine.cpp)
  void boundary();
  void report(std::size_t position);
  void need_slow(std::size_t count);
  const std::uint8_t* take(std::size_t count) {
    if (count > avail_ - pos_) need_slow(count);
    const std::uint8_t* at = data_ + pos_;
    pos_ += count;
    return at;
  }
  std::uint64_t take_uint(std::size_t width);
  void frame(std::size_t at);
  void update_limit();

  // --- values (machine_values.cpp)
  void push(Value value) { stack_.push_back(value); }
  Value& top();
  Value pop();
  std::size_t region_start() const { return marks_.empty() ? 0 : marks_.back(); }
  std::span<Value> pop_mark();
  void drop(std::span<const Value> values);
  void release(const Value& value);
  Handle object_of(const Value& value);  // a new reference
  StackView view() const {
    return {{stack_.data(), stack_.size()}, {marks_.data(), marks_.size()}};
  }
  void counted(std::uint8_t opcode, std::size_t width, bool is_signed);
  void long_number(std::uint8_t opcode, std::size_t count, const std::uint8_t* bytes, std::size_t at);
  void text_opcode(std::uint8_t opcode);
  std::string_view line();
  void text_number(std::uint8_t opcode, std::string_view text, std::size_t at);

  // --- containers and the memo (machine_containers.cpp)
  void empty_dict();
  void empty_list();
  void set_items(bool many);
  void appends(bool many);
  void make_tuple(std::span<const Value> items);
  void close_mark(std::uint8_t opcode);
  void tuple_n(std::size_t count);
  void get(std::uint64_t index, std::size_t at);
  void put(std::uint64_t index, std::size_t at);
  void memoize();
  void no_tuple_keys(std::span<const Value> items, std::size_t stride) const;
  // scratch_: new references to the objects of `items`, given back when a ScratchHeld goes.
  void objects_of(std::span<const Value> items);
  void release_scratch();
  struct ScratchHeld {
    Machine& machine;
    ~ScratchHeld() { machine.release_scratch(); }
  };

  ByteSource& source_;
  Objects& objects_;
  ReadOptions options_;
  TraceStream* stream_;
  MemoryBudget budget_;
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::size_t filled_ = 0;
  std::size_t frame_start_ = kNoFrame;
  std::size_t frame_end_;
  std::size_t avail_ = 0;  // the first of frame_end_ and filled_
  std::size_t limit_ = 0;  // the first of avail_ and next_report_
  std::size_t next_report_ = 0;
  std::size_t released_ = 0;
  PodColumn<Value> stack_;
  PodColumn<std::size_t> marks_;
  Memo& memo_;
  std::vector<Handle> scratch_;
};

}  // namespace stowage::snapshot
