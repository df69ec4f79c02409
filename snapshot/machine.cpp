// The machine's loop and where it reads: frames, a large file's window, progress and memory.
#include "snapshot/machine.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "snapshot/limits.hpp"
#include "snapshot/opcodes.hpp"
#include "snapshot/refusal.hpp"

namespace stowage::snapshot {

namespace {

std::size_t page_size() {
  const long size = ::sysconf(_SC_PAGESIZE);
  return size > 0 ? static_cast<std::size_t>(size) : 4096;
}

// Python's repr of a one-byte bytes object: b'\xff', b'A', b'\n'.
std::string byte_repr(std::uint8_t byte) {
  static constexpr char kHex[] = "0123456789abcdef";
  if (byte == '\\') return "b'\\\\'";
  if (byte == '\'') return "b\"'\"";
  if (byte == '\t') return "b'\\t'";
  if (byte == '\n') return "b'\\n'";
  if (byte == '\r') return "b'\\r'";
  if (byte >= 0x20 && byte < 0x7f) return std::string("b'") + static_cast<char>(byte) + "'";
  return std::string("b'\\x") + kHex[byte >> 4] + kHex[byte & 15] + "'";
}

}  // namespace

Machine::Machine(ByteSource& source, Objects& objects, const ReadOptions& options, Memo& memo,
                 TraceStream* stream)
    : source_(source),
      objects_(objects),
      options_(options),
      stream_(stream),
      budget_(source.size(), options.memory,
              options.memory_start != 0 ? std::optional<std::uint64_t>(options.memory_start) : std::nullopt),
      data_(source.data()),
      size_(source.size()),
      frame_end_(source.size()),
      memo_(memo) {
  filled_ = std::min(size_, source_.fill(std::min(size_, std::size_t{1})));
  update_limit();
}

Machine::~Machine() { clear(); }

void Machine::clear() {
  release_scratch();
  for (const Value& value : stack_) release(value);
  stack_.clear();
  marks_.clear();
  memo_.clear(objects_);
}

Value Machine::run() {
  try {
    return loop();
  } catch (const BadPickle& error) {
    refuse_unreadable(pos_ >= size_ ? "pickle data was truncated" : error.what());
  } catch (const std::bad_alloc&) {
    refuse_unreadable(pos_ >= size_ ? "pickle data was truncated" : "MemoryError");
  }
}

Value Machine::loop() {
  for (;;) {
    if (pos_ >= limit_) boundary();
    const std::uint8_t opcode = data_[pos_++];
    if (opcode == op::kStop) return stop();
    if (!step(opcode)) rare(opcode);
  }
}

void Machine::update_limit() {
  avail_ = std::min(frame_end_, filled_);
  limit_ = std::min(avail_, next_report_);
}

// At the end of the bytes the machine may read without a look: reports, leaves a frame that has
// ended, reads more of a large file, or finds the pickle truncated.
void Machine::boundary() {
  if (pos_ >= next_report_) report(pos_);
  if (frame_start_ != kNoFrame && pos_ >= frame_end_) {
    if (pos_ > frame_end_) {
      SNAPSHOT_REFUSE("an opcode runs past the end of its frame (the frame at byte ", frame_start_,
                      "); refused, as the unpickler would read other opcodes than those checked");
    }
    frame_start_ = kNoFrame;  // the frame is read: on to what follows it
    frame_end_ = size_;
  }
  if (pos_ >= size_) throw BadPickle("pickle data was truncated");
  if (pos_ >= filled_) filled_ = std::min(size_, source_.fill(pos_ + 1));
  update_limit();
}

// Tells the progress how far the machine has read, checks the memory the reading has taken, and
// gives back a large file's bytes behind.
void Machine::report(std::size_t position) {
  next_report_ = position + options_.report_every;
  budget_.check(position, stream_ != nullptr ? stream_->planned_bytes() : 0);
  if (options_.progress) options_.progress(std::min(position, size_), size_);
  const std::size_t done = position & ~(page_size() - 1);
  if (done > released_ && done - released_ >= options_.release_every) {
    source_.release(done);
    released_ = done;
  }
  update_limit();
}

void Machine::need_slow(std::size_t count) {
  if (count > size_ - pos_) throw BadPickle("pickle data was truncated");
  if (frame_start_ != kNoFrame && pos_ + count > frame_end_) {
    SNAPSHOT_REFUSE("an opcode runs past the end of its frame (the frame at byte ", frame_start_,
                    "); refused, as the unpickler would read other opcodes than those checked");
  }
  filled_ = std::min(size_, source_.fill(pos_ + count));
  update_limit();
  STOWAGE_INTERNAL_ASSERT(count <= avail_ - pos_, "the byte source did not fill what it was asked to");
}

std::uint64_t Machine::take_uint(std::size_t width) {
  const std::uint8_t* bytes = take(width);
  std::uint64_t value = 0;
  for (std::size_t i = width; i-- > 0;) value = (value << 8) | bytes[i];
  return value;
}

void Machine::frame(std::size_t at) {
  if (frame_start_ != kNoFrame) {
    SNAPSHOT_REFUSE("a frame begins at byte ", at, " before the frame at byte ", frame_start_, " ends");
  }
  const std::uint64_t count = take_uint(8);
  if (count > size_ - pos_) throw BadPickle("pickle data was truncated");
  frame_start_ = at;
  frame_end_ = pos_ + count;
  update_limit();
}

Value Machine::stop() {
  if (options_.progress || pos_ >= next_report_) report(size_);
  if (pos_ < size_) {
    SNAPSHOT_REFUSE(with_commas(size_ - pos_), " bytes after the pickle's end at byte ", with_commas(pos_ - 1),
                    " (several files joined?): a snapshot is one pickle");
  }
  return pop();
}

// The opcodes met most, and those of fixed width.
bool Machine::step(std::uint8_t opcode) {
  const std::size_t at = pos_ - 1;
  switch (opcode) {
    case op::kLongBinGet: get(take_uint(4), at); return true;
    case op::kBinGet: get(take_uint(1), at); return true;
    case op::kMemoize: memoize(); return true;
    case op::kBinInt1: push(Value::of_int(take(1)[0])); return true;
    case op::kBinInt:
      push(Value::of_int(static_cast<std::int32_t>(static_cast<std::uint32_t>(take_uint(4)))));
      return true;
    case op::kBinInt2: push(Value::of_int(static_cast<std::int64_t>(take_uint(2)))); return true;
    case op::kMark: marks_.push_back(stack_.size()); return true;
    case op::kEmptyDict: empty_dict(); return true;
    case op::kEmptyList: empty_list(); return true;
    case op::kSetItems: set_items(true); return true;
    case op::kSetItem: set_items(false); return true;
    case op::kAppends: appends(true); return true;
    case op::kAppend: appends(false); return true;
    case op::kShortBinUnicode: counted(opcode, 1, false); return true;
    case op::kBinUnicode: counted(opcode, 4, false); return true;
    case op::kBinUnicode8: counted(opcode, 8, false); return true;
    case op::kShortBinBytes: counted(opcode, 1, false); return true;
    case op::kBinBytes: counted(opcode, 4, false); return true;
    case op::kBinBytes8: counted(opcode, 8, false); return true;
    case op::kShortBinString: counted(opcode, 1, false); return true;
    case op::kBinString: counted(opcode, 4, true); return true;
    case op::kLong1: counted(opcode, 1, false); return true;
    case op::kLong4: counted(opcode, 4, true); return true;
    default: return step_scalars(opcode);
  }
}

bool Machine::step_scalars(std::uint8_t opcode) {
  const std::size_t at = pos_ - 1;
  switch (opcode) {
    case op::kNone: push(Value{}); return true;
    case op::kNewTrue: push(Value::of_bool(true)); return true;
    case op::kNewFalse: push(Value::of_bool(false)); return true;
    case op::kBinFloat: {
      const double number = std::bit_cast<double>(__builtin_bswap64(take_uint(8)));
      if (!(number > -static_cast<double>(kMaxNumber) && number < static_cast<double>(kMaxNumber))) {
        SNAPSHOT_REFUSE("number ", objects_.float_repr(number), " at byte ", at, " is out of any snapshot's range");
      }
      push(Value::of_float(number));
      return true;
    }
    case op::kFrame: frame(at); return true;
    case op::kProto: {
      const std::uint8_t protocol = take(1)[0];
      if (protocol > kHighestProtocol) {
        throw BadPickle("unsupported pickle protocol: " + std::to_string(protocol));
      }
      return true;
    }
    default: return step_containers(opcode);
  }
}

// An opcode the loop does not run itself: a text opcode of protocols 0 and 1, one that would
// build more than plain data (refused), or no opcode at all.
void Machine::rare(std::uint8_t opcode) {
  const std::string_view name = op::name_of(opcode);
  if (name.empty()) throw BadPickle("unknown opcode " + byte_repr(opcode) + " at byte " + std::to_string(pos_ - 1));
  if (opcode == op::kInt || opcode == op::kLong || opcode == op::kFloat || opcode == op::kString ||
      opcode == op::kUnicode || opcode == op::kGet || opcode == op::kPut) {
    text_opcode(opcode);
    return;
  }
  SNAPSHOT_REFUSE("opcode ", name, " at byte ", pos_ - 1, " would build objects beyond plain data; refused");
}

}  // namespace stowage::snapshot
