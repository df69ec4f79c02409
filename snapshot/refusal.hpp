// How the snapshot reader says no (Note [Reading snapshots] in snapshot/reader.hpp).
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "base/byte_units.hpp"  // with_commas, which every refusal quoting a count uses
#include "base/errors.hpp"

namespace stowage::snapshot {

// A snapshot refused: unreadable, hostile, or not a snapshot. message() is the reason, as the
// user reads it (stowage.snapshot_reader.SnapshotError carries it, after the file's name).
class Refused : public Error {
 public:
  using Error::Error;
};

// The streaming reading met a pickle laid out unlike those torch and stowage write (Note
// [Streaming traces] in snapshot/trace_stream.hpp): read it again as plain data. Not an error.
class ReadWhole : public std::exception {
 public:
  const char* what() const noexcept override { return "read the pickle again as plain data"; }
};

// "not a readable pickle (<reason>); is the file truncated?": every malformed pickle's message.
[[noreturn]] void refuse_unreadable(const std::string& reason);

}  // namespace stowage::snapshot

#define SNAPSHOT_REFUSE(...) STOWAGE_THROW(::stowage::snapshot::Refused, __VA_ARGS__)
