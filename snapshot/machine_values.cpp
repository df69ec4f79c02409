// The machine's stack, and the opcodes that make numbers and strings.
#include <cstring>

#include "snapshot/limits.hpp"
#include "snapshot/machine.hpp"
#include "snapshot/opcodes.hpp"
#include "snapshot/refusal.hpp"

namespace stowage::snapshot {

namespace {

[[noreturn]] void number_error(const std::string& shown, std::size_t at) {
  SNAPSHOT_REFUSE("number ", shown, " at byte ", at, " is out of any snapshot's range");
}

bool in_range(std::int64_t value) { return value > -kMaxNumber && value < kMaxNumber; }

// A little-endian two's-complement integer of `count` bytes (at most 8), sign-extended.
std::int64_t little_signed(const std::uint8_t* bytes, std::size_t count) {
  std::uint64_t value = (bytes[count - 1] & 0x80) != 0 ? ~std::uint64_t{0} : 0;
  for (std::size_t i = count; i-- > 0;) value = (value << 8) | bytes[i];
  return static_cast<std::int64_t>(value);
}

}  // namespace

Value& Machine::top() {
  if (stack_.size() <= region_start()) throw BadPickle("unpickling stack underflow");
  return stack_.back();
}

Value Machine::pop() {
  const Value value = top();
  stack_.pop_back();
  return value;
}

std::span<Value> Machine::pop_mark() {
  if (marks_.empty()) throw BadPickle("could not find MARK");
  const std::size_t start = marks_.back();
  marks_.pop_back();
  return std::span<Value>(stack_.data(), stack_.size()).subspan(start);
}

void Machine::drop(std::span<const Value> values) {
  for (const Value& value : values) release(value);
}

void Machine::release(const Value& value) {
  if (owns_handle(value.kind)) objects_.release(value.handle);
}

Handle Machine::object_of(const Value& value) {
  if (value.kind >= Kind::kEvent) {
    if (stream_ == nullptr) throw BadPickle("a value the reader cannot make");
    return stream_->object_of(value);
  }
  return new_reference(objects_, value);
}

// LONG1, LONG4, the strings and bytes whose length precedes them.
void Machine::counted(std::uint8_t opcode, std::size_t width, bool is_signed) {
  const std::size_t at = pos_ - 1;
  std::uint64_t count = take_uint(width);
  if (is_signed && (count & 0x80000000u) != 0) {
    throw BadPickle(std::string(op::name_of(opcode)) + " pickle has negative byte count");
  }
  if (count > size_ - pos_) throw BadPickle("pickle data was truncated");
  const std::uint8_t* bytes = take(static_cast<std::size_t>(count));
  const std::string_view text(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(count));
  switch (opcode) {
    case op::kLong1:
    case op::kLong4: long_number(opcode, static_cast<std::size_t>(count), bytes, at); return;
    case op::kShortBinString:
    case op::kBinString: {
      Value made = Value::of_handle(Kind::kStr, objects_.make_ascii(text));
      made.aux = static_cast<std::uint16_t>(name_of(text));
      push(made);
      return;
    }
    case op::kShortBinBytes:
    case op::kBinBytes:
    case op::kBinBytes8: push(Value::of_handle(Kind::kBytes, objects_.make_bytes(text))); return;
    default: {
      Value made = Value::of_handle(Kind::kStr, objects_.make_str(text));
      made.aux = static_cast<std::uint16_t>(name_of(text));
      push(made);
    }
  }
}

void Machine::long_number(std::uint8_t /*opcode*/, std::size_t count, const std::uint8_t* bytes, std::size_t at) {
  if (count == 0) {
    push(Value::of_int(0));
    return;
  }
  // The bytes beyond the last that carries the value (sign extension) say nothing.
  const std::uint8_t sign = (bytes[count - 1] & 0x80) != 0 ? 0xff : 0x00;
  std::size_t used = count;
  while (used > 1 && bytes[used - 1] == sign && (bytes[used - 2] & 0x80) == (sign & 0x80)) --used;
  if (used > 8) number_error(objects_.long_repr(std::span<const std::uint8_t>(bytes, count)), at);
  const std::int64_t value = little_signed(bytes, used);
  if (!in_range(value)) number_error(std::to_string(value), at);
  push(Value::of_int(value));
}

// The text from the machine's position to the end of its line; the position moves past it.
std::string_view Machine::line() {
  const std::size_t start = pos_;
  std::size_t searched = start;
  for (;;) {
    const void* found = std::memchr(data_ + searched, '\n', filled_ - searched);
    if (found != nullptr) {
      const auto end = static_cast<std::size_t>(static_cast<const std::uint8_t*>(found) - data_);
      pos_ = end + 1;
      if (frame_start_ != kNoFrame && pos_ > frame_end_) {
        SNAPSHOT_REFUSE("an opcode runs past the end of its frame (the frame at byte ", frame_start_,
                        "); refused, as the unpickler would read other opcodes than those checked");
      }
      update_limit();
      return {reinterpret_cast<const char*>(data_ + start), end - start};
    }
    if (filled_ >= size_) {
      pos_ = size_;
      throw BadPickle("pickle data was truncated");
    }
    searched = filled_;
    filled_ = std::min(size_, source_.fill(filled_ + 1));
  }
}

void Machine::text_number(std::uint8_t /*opcode*/, std::string_view text, std::size_t at) {
  const TextNumber number = objects_.parse_int(text);
  if (!number.fits) number_error(number.shown, at);
  if (!in_range(number.integer)) number_error(std::to_string(number.integer), at);
  push(Value::of_int(number.integer));
}

// INT, LONG, FLOAT, STRING, UNICODE, GET and PUT: protocols 0 and 1, whose argument is a line.
void Machine::text_opcode(std::uint8_t opcode) {
  const std::size_t at = pos_ - 1;
  std::string_view text = line();
  if (opcode == op::kInt && (text == "00" || text == "01")) {
    push(Value::of_bool(text == "01"));
  } else if (opcode == op::kInt || opcode == op::kLong) {
    if (opcode == op::kLong && !text.empty() && text.back() == 'L') text.remove_suffix(1);
    text_number(opcode, text, at);
  } else if (opcode == op::kFloat) {
    const TextNumber number = objects_.parse_float(text);
    if (!(number.real > -static_cast<double>(kMaxNumber) && number.real < static_cast<double>(kMaxNumber))) {
      number_error(objects_.float_repr(number.real), at);
    }
    push(Value::of_float(number.real));
  } else if (opcode == op::kString || opcode == op::kUnicode) {
    if (opcode == op::kString &&
        (text.size() < 2 || text.front() != text.back() || (text.front() != '\'' && text.front() != '"'))) {
      throw BadPickle("the STRING opcode argument must be quoted");
    }
    Value made = Value::of_handle(Kind::kStr, opcode == op::kString
                                                  ? objects_.make_escaped_ascii(text.substr(1, text.size() - 2))
                                                  : objects_.make_raw_unicode_escape(text));
    push(made);
    stack_.back().aux = static_cast<std::uint16_t>(name_of(objects_.utf8_of(made.handle)));
  } else {
    const TextNumber index = objects_.parse_int(text);
    if (opcode == op::kPut && (!index.fits || index.integer < 0)) {
      if (index.fits) throw BadPickle("negative PUT argument");
      SNAPSHOT_REFUSE("memo index ", index.shown, " at byte ", at, " is beyond the file");
    }
    if (!index.fits) SNAPSHOT_REFUSE("memo index ", index.shown, " at byte ", at, " is beyond the file");
    if (index.integer < 0) throw BadPickle("memo value not found at index " + std::to_string(index.integer));
    if (opcode == op::kGet) get(static_cast<std::uint64_t>(index.integer), at);
    else put(static_cast<std::uint64_t>(index.integer), at);
  }
}

}  // namespace stowage::snapshot
