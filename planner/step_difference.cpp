#include "planner/step_difference.hpp"

#include <algorithm>
#include <cstddef>
#include <map>
#include <sstream>
#include <vector>

namespace stowage::planner {
namespace {

std::string op_at(const LifetimeTrace& trace, std::size_t index) {
  if (index >= trace.ops.size()) return "no op (the step had ended)";
  const TraceOp& op = trace.ops[index];
  return op.name + " (" + (op.module.empty() ? "the model" : op.module) + ", " + phase_name(op.phase) + ")";
}

// A value as Python's repr writes it, as the message has always quoted it.
void shown(std::ostream& out, const std::string& text) {
  const char quote = text.find('\'') != std::string::npos && text.find('"') == std::string::npos ? '"' : '\'';
  out << quote;
  for (const char c : text) {
    if (c == '\\' || c == quote) out << '\\';
    out << c;
  }
  out << quote;
}
void shown(std::ostream& out, bool value) { out << (value ? "True" : "False"); }
template <typename Number>
void shown(std::ostream& out, Number value) { out << value; }
void shown(std::ostream& out, const SaveSite& site) {
  out << '(';
  shown(out, std::get<0>(site));
  out << ", " << std::get<1>(site) << ", " << std::get<2>(site) << ')';
}
template <typename Item>
void shown(std::ostream& out, const std::vector<Item>& items) {
  out << '[';
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out << ", ";
    shown(out, items[i]);
  }
  out << ']';
}

template <typename Value>
std::string shown_short(const Value& value) {
  std::ostringstream out;
  shown(out, value);
  std::string text = out.str();
  return text.size() <= 120 ? text : text.substr(0, 117) + "...";
}

// The modules whose saved tensors differ in number, at most three.
std::string saves_by_module(const LifetimeTrace& first, const LifetimeTrace& other, const std::string& at_first,
                            const std::string& at_other) {
  std::vector<std::string> modules;  // in order of first appearance
  std::map<std::string, std::pair<std::size_t, std::size_t>> counts;
  for (const auto* trace : {&first, &other}) {
    for (const SavedTensor& t : trace->tensors) {
      auto [found, added] = counts.try_emplace(t.module);
      if (added) modules.push_back(t.module);
      ++(trace == &first ? found->second.first : found->second.second);
    }
  }
  std::erase_if(modules, [&](const std::string& m) { return counts[m].first == counts[m].second; });
  std::ostringstream out;
  for (std::size_t i = 0; i < std::min<std::size_t>(modules.size(), 3); ++i) {
    const std::string& m = modules[i];
    out << (i > 0 ? "; " : "") << (m.empty() ? "(the model)" : m) << " saved " << counts[m].first << " at "
        << at_first << " and " << counts[m].second << " at " << at_other;
  }
  if (modules.size() > 3) out << "; " << modules.size() - 3 << " modules more";
  return out.str();
}

// The first field two saved tensors differ in, with the two values shown.
std::optional<std::string> tensor_difference(const SavedTensor& a, const SavedTensor& b, const std::string& at_first,
                                             const std::string& at_other) {
  std::optional<std::string> found;
  const auto compare = [&](const char* key, const auto& x, const auto& y) {
    if (!found && x != y) {
      found = std::string(key) + " between " + at_first + " (" + shown_short(x) + ") and " + at_other + " (" +
              shown_short(y) + ")";
    }
  };
  compare("created", a.created, b.created);
  compare("last_forward_use", a.last_forward_use, b.last_forward_use);
  compare("first_backward_use", a.first_backward_use, b.first_backward_use);
  compare("last_backward_use", a.last_backward_use, b.last_backward_use);
  compare("recomputable", a.recomputable, b.recomputable);
  compare("offloadable", a.offloadable, b.offloadable);
  compare("recompute_inputs", a.recompute_inputs, b.recompute_inputs);
  compare("region", a.region, b.region);
  compare("packs", a.packs, b.packs);
  return found;
}

bool same_op(const TraceOp& a, const TraceOp& b) {
  return a.name == b.name && a.phase == b.phase && a.region == b.region && a.region_op == b.region_op;
}

bool same_region(const TraceRegion& a, const TraceRegion& b) {
  return a.module == b.module && a.checkpointable == b.checkpointable && a.inputs == b.inputs;
}

}  // namespace

std::optional<std::string> step_difference(const LifetimeTrace& first, const LifetimeTrace& other,
                                           const std::string& at_first, const std::string& at_other) {
  const auto [op, _] = std::mismatch(first.ops.begin(), first.ops.end(), other.ops.begin(), other.ops.end(), same_op);
  const auto index = static_cast<std::size_t>(op - first.ops.begin());
  std::ostringstream out;
  if (index < std::max(first.ops.size(), other.ops.size())) {
    out << "the step ran " << first.ops.size() << " ops at " << at_first << " and " << other.ops.size() << " at "
        << at_other << "; the first to differ is op " << index << ": " << op_at(first, index) << " at " << at_first
        << ", " << op_at(other, index) << " at " << at_other
        << ".\nRecording at several sizes needs a step whose ops do not depend on its sizes (a size of 1 often "
           "changes them: broadcasting over it needs no reduction in backward)";
    return out.str();
  }
  if (first.tensors.size() != other.tensors.size()) {
    out << "the step saved " << first.tensors.size() << " tensors at " << at_first << " and " << other.tensors.size()
        << " at " << at_other << " (" << saves_by_module(first, other, at_first, at_other) << ")";
    return out.str();
  }
  for (std::size_t i = 0; i < first.tensors.size(); ++i) {
    const SavedTensor& a = first.tensors[i];
    if (auto differs = tensor_difference(a, other.tensors[i], at_first, at_other)) {
      out << "saved tensor " << i << " (" << a.module << ", made by op " << a.created << ": "
          << first.ops[a.created].name << ") differs in " << *differs;
      return out.str();
    }
  }
  if (!std::equal(first.regions.begin(), first.regions.end(), other.regions.begin(), other.regions.end(),
                  same_region)) {
    return "the step's checkpoint regions differ between " + at_first + " and " + at_other;
  }
  return std::nullopt;
}

}  // namespace stowage::planner
