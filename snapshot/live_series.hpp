// A trace's live-bytes series as the trace analyses read it (trace_findings.hpp: live bytes just
// after each LivePairs position), and the positions arguments they share.
//
// Note [Live bytes in 128 bits]: sizes are below 2**50 each (kMaxSize), but a hostile trace's
// running sums can pass 2**63, where Python counts exactly in its integers. The analyses sum in
// Wide (128 bits), so they count exactly wherever Python did; a series is read as int64 (numpy's,
// the rule) or as Wide (the values Python held as integers past int64), without a copy of the
// former. Non-owning: the spans must outlive the view. Thread-compatible (read-only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace stowage::snapshot {

__extension__ typedef __int128 Wide;

class LiveSeries {
 public:
  LiveSeries() = default;
  explicit LiveSeries(std::span<const std::int64_t> narrow) : narrow_(narrow), size_(narrow.size()) {}
  explicit LiveSeries(std::span<const Wide> wide) : wide_(wide), size_(wide.size()), wide_used_(true) {}

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Whether the values are Python's integers (past int64): comparisons with a float are exact
  // there, and in float64 otherwise, as numpy makes them (at_most).
  bool wide() const { return wide_used_; }
  Wide operator[](std::size_t i) const { return wide_used_ ? wide_[i] : Wide{narrow_[i]}; }

 private:
  std::span<const std::int64_t> narrow_;
  std::span<const Wide> wide_;
  std::size_t size_ = 0;
  bool wide_used_ = false;
};

// `value <= bound` where `bound` is a float64 (a share of a byte count): in float64 as numpy
// compares an int64 with a float, or exactly as Python compares an integer with a float.
bool at_most(Wide value, double bound, bool exact);

// The index of the first element not less than / greater than `value` in sorted `values`
// (numpy's searchsorted, side "left" / "right").
std::size_t lower_index(std::span<const std::int64_t> values, std::int64_t value);
std::size_t upper_index(std::span<const std::int64_t> values, std::int64_t value);

// numpy's searchsorted over keys searched in turn, in one call: where `values` are unsorted
// (steps' starts with fit's trial steps among them) its answers depend on the keys searched before
// in the same call, and this gives the same ones. Non-owning; not thread-safe.
class NumpySearch {
 public:
  NumpySearch(std::span<const std::int64_t> values, bool right) : values_(values), right_(right) {}
  std::size_t next(std::int64_t key);

 private:
  bool before(std::int64_t a, std::int64_t b) const { return right_ ? a <= b : a < b; }
  std::span<const std::int64_t> values_;
  bool right_;
  bool started_ = false;
  std::int64_t last_key_ = 0;
  std::size_t low_ = 0, high_ = 0;
};

// Checks that `values` are ascending (ties allowed) and within [0, limit], naming `what`.
void check_positions(std::span<const std::int64_t> values, std::int64_t limit, const char* what, bool sorted);

}  // namespace stowage::snapshot
