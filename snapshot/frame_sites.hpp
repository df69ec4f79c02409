// Where an allocation came from, as `stowage inspect` names it (its "site"): a stack's innermost
// user frame ("file:line in function"; frames of torch, of installed packages and of Python's own
// library left out), else its innermost Python frame, else the allocation's size class (requests
// by powers of four: "size 64 KiB-256 KiB").
//
// Pure functions over frames as the snapshot holds them (str() of each field, UTF-8).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace stowage::snapshot {

// One frame of a stack: str() of its "filename", "line" and "name" fields ("" and "0" where the
// first two are missing; `name` empty and `has_name` false where the last is).
struct Frame {
  std::string filename, line, name;
  bool has_name = false;
};

// The innermost user frame, else the innermost Python frame (a filename ending in .py); none
// when the stack has neither.
std::optional<std::string> frame_site(std::span<const Frame> frames);

// "size <= 512 B", or "size A-B" for A < size <= B = 4 A, A = 512 * 4**k.
std::string size_class(std::uint64_t size);

// The size class number of size_class(): -1 for <= 512 B, else k.
std::int64_t size_class_number(std::uint64_t size);

// size_class() of the sizes of class `number`.
std::string size_class_name(std::int64_t number);

}  // namespace stowage::snapshot
