// The rows of text cells that `stowage inspect`'s terminal report and its HTML report share, made
// from the findings (inspection.hpp); the formatters add titles, headers and layout. `stowage diff`
// writes its byte counts as bytes_text does.
//
// Contract: pure functions, no state. Byte counts as format_bytes writes them ("-" before a
// negative one; one past 64 bits in plain bytes, "18446744073709551616 B"); a share of a whole in
// percent with one decimal ("12.5%"); event indexes with thousands commas.
#pragma once

#include <string>
#include <vector>

#include "snapshot/segment_findings.hpp"
#include "snapshot/trace_findings.hpp"
#include "snapshot/trace_steps.hpp"

namespace stowage::snapshot {

using TextRows = std::vector<std::vector<std::string>>;

std::string bytes_text(Wide value);

// live, share of `total` ("-" of a total of 0), allocations, site.
TextRows site_rows(const std::vector<SiteLive>& sites, Wide total);

// live, share of the peak, category; largest first (ties in the findings' order), with the bytes live
// before the trace began last where `before_trace` and there are any.
TextRows category_rows(const Peak& peak, bool before_trace);

// live, share of the peak, module ("(outside any module's forward)" for none).
TextRows module_rows(const Peak& peak);

// segment, live, held back, site.
TextRows held_rows(const std::vector<HeldSegment>& held);

// step, its events ("12-345"), peak, at its end.
TextRows step_rows(const std::vector<Step>& steps);

}  // namespace stowage::snapshot
