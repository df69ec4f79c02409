#include "planner/fit_weighing_table.hpp"

#include <algorithm>
#include <array>
#include <cstdio>

#include "base/byte_units.hpp"
#include "base/errors.hpp"

namespace stowage::planner {

namespace {

std::string bytes_text(std::int64_t bytes) {
  return format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 0)));
}

// `value` with `decimals` digits after the point, as printf's %.*f (Python's format spec "f" alike).
std::string fixed(double value, int decimals) {
  std::array<char, 64> text{};
  std::snprintf(text.data(), text.size(), "%.*f", decimals, value);
  return text.data();
}

std::string percent(double share) { return fixed(share * 100.0, 0) + "%"; }  // Python's ".0%"

std::string left(std::string text, std::size_t width) {  // Python's "<width"
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

std::string right(const std::string& text, std::size_t width) {  // Python's ">width"
  return text.size() < width ? std::string(width - text.size(), ' ') + text : text;
}

std::string with_thousands(std::int64_t value) {  // Python's ","
  const std::string digits = std::to_string(value);
  const std::size_t first = value < 0 ? 1 : 0;  // past the sign
  std::string grouped;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > first && (digits.size() - i) % 3 == 0) grouped.push_back(',');
    grouped.push_back(digits[i]);
  }
  return grouped;
}

std::string activations(const FitOption& chosen, const ChosenPlan& plan, std::int64_t unplanned) {
  std::array<std::int64_t, 3> by_decision{};  // keep, recompute, offload: the order the table names them
  const std::size_t count = std::min(chosen.decisions.size(), plan.saved_bytes.size());
  for (std::size_t i = 0; i < count; ++i) {
    const Decision decision = chosen.decisions[i];
    by_decision[decision == Decision::kKeep ? 0 : decision == Decision::kRecompute ? 1 : 2] += plan.saved_bytes[i];
  }
  std::int64_t saved = by_decision[0] + by_decision[1] + by_decision[2];
  if (saved == 0) saved = 1;
  const auto share = [&](std::size_t i) {
    return percent(static_cast<double>(by_decision[i]) / static_cast<double>(saved));
  };
  return "step adds " + bytes_text(unplanned) + " unplanned -> " + bytes_text(plan.predicted_peak) +
         " planned (saved bytes: keep " + share(0) + ", recompute " + share(1) + ", offload " + share(2) + ")";
}

std::string batch_row(const FitOption& chosen, const FitBatch& batch) {
  std::string said;
  if (chosen.micro_batches > 1) {
    STOWAGE_CHECK(batch.units.has_value(), "fit_table: micro-batches without the loss's units");
    const std::string verified = batch.units_given ? "as loss_units says" : "verified: " + batch.checked;
    said = std::to_string(chosen.micro_batches) + " micro-batches of up to " + std::to_string(chosen.micro_rows) +
           " rows, gradients accumulated, each loss weighted by its share of the batch's " + *batch.units + " (" +
           verified + ")";
  } else {
    said = "run whole (" + std::to_string(batch.rows) + " rows)";
    if (batch.units) {
      said += "; cut into micro-batches where that is faster (the loss a mean over " + *batch.units + ")";
    }
  }
  if (!batch.not_cut.empty()) said += "; not cut: " + batch.not_cut;
  return "  " + left("batch", 24) + right(std::to_string(batch.rows), 12) + "  " + said;
}

std::string placement(const FitOption& option) { return option.parameters_on_host ? "host" : "device"; }

std::string option_row(const FitOption& option, bool chosen, std::int64_t rows) {
  const std::string share = option.fraction == 1.0 ? "all (the factory's optimizer)" : percent(option.fraction);
  const std::string micro = option.micro_batches <= 1 ? "whole (" + std::to_string(rows) + ")"
                                                      : std::to_string(option.micro_batches) + " x " +
                                                            std::to_string(option.micro_rows);
  const std::string outcome = option.feasible() ? right(fixed(option.step_ms(), 0), 13) + " ms" : "  " + option.reason;
  return "  " + left(share, 30) + right(placement(option), 11) + right(micro, 14) +
         right(bytes_text(option.activation_budget), 18) + right(bytes_text(option.device_bytes), 15) +
         right(bytes_text(option.host_bytes), 14) + outcome + (chosen ? "  <- chosen" : "");
}

// How far ahead the blocks' parameters come in (Note [Parameter prefetch depth]).
std::string blocks_ahead(std::size_t depth) {
  if (depth == 0) return "as it runs (its copy waited for: copies ahead would not shorten the step)";
  return std::to_string(depth) + (depth == 1 ? " block" : " blocks") + " ahead of its use";
}

}  // namespace

std::string busy_host_note(const std::optional<HostLoad>& load) {
  if (!load || load->first <= static_cast<double>(load->second)) return "";
  const double cores = static_cast<double>(load->second);
  return "; measured on a busy host (load " + fixed(load->first, 1) + " on " + std::to_string(load->second) +
         " cores): the times may be up to " + fixed(load->first / cores, 1) +
         "x long, every share's alike, so the choice between them holds";
}

std::string fit_table(const std::vector<FitOption>& options, std::size_t chosen_index, const ChosenPlan& plan,
                      const FitFacts& facts, const FitBatch& batch) {
  STOWAGE_CHECK(chosen_index < options.size(), "fit_table: the chosen option is not among those weighed");
  const FitOption& chosen = options[chosen_index];
  const FitMemory& memory = facts.memory;
  const auto row = [](const std::string& what, const std::string& figure) {
    return "  " + left(what, 24) + right(figure, 12) + "  ";
  };
  std::string table = "stowage.fit on " + facts.device + ": " + bytes_text(facts.capacity) + " (" +
                      facts.capacity_bound + "), " + bytes_text(memory.usable) + " usable; " + facts.recorded + "\n";
  table += row("in use before the step", bytes_text(memory.in_use)) + "parameters (" +
           with_thousands(memory.parameter_count) + "), buffers, the batch\n";
  if (chosen.parameters_on_host) {
    const FitBlocks& blocks = facts.blocks;
    table += row("parameters on the host", bytes_text(blocks.parameter_bytes)) + "of the model's " +
             std::to_string(blocks.units) + " blocks: they live on the host (stowage.offload.parameters, as under "
             "FSDP2's CPU offload), each block's brought in " + blocks_ahead(chosen.parameter_prefetch) + ", " +
             bytes_text(chosen.window_bytes) + " at most on the device; fitted.close() puts them back\n";
    table += row("gradients", bytes_text(memory.gradients - blocks.gradient_bytes)) +
             "on the device, made in backward, freed after the optimizer; the blocks' " +
             bytes_text(blocks.gradient_bytes) + " go to the host as made\n";
  } else {
    table += row("gradients", bytes_text(memory.gradients)) + "made in backward, freed after the optimizer\n";
  }
  table += row("optimizer states", bytes_text(chosen.device_state_bytes)) + "on the device; " +
           bytes_text(memory.states() - chosen.device_state_bytes) + " in host memory (" + facts.optimizer + ")" +
           (facts.states_kept_because.empty() ? "" : "; kept on the device: " + facts.states_kept_because) + "\n";
  table += row("activations", bytes_text(chosen.activation_budget)) + "budget; " +
           activations(chosen, plan, facts.unplanned_peak) + "\n";
  const std::string held = chosen.parameters_on_host ? "the blocks' parameters, gradients and states and the "
                                                       "offloaded activations"
                                                     : "the offloaded states and activations";
  table += row("host memory", bytes_text(chosen.host_bytes)) + "for " + held + ", of " +
           bytes_text(facts.host.available) + " the process may take (" + facts.host.limited_by + ")\n";
  table += batch_row(chosen, batch) + "\n";
  if (!facts.tried.empty()) table += row("tried before training", "") + facts.tried + "\n";
  const double step_ms = chosen.step_ms();
  const std::string copies = chosen.parameters_on_host
                                 ? ", the parameters' copies waited for " + fixed(chosen.parameter_copy_ms, 0) + " ms"
                                 : "";
  table += "  " + left("predicted step", 24) + right(fixed(step_ms, 0), 9) + " ms  (forward and backward " +
           fixed(step_ms - chosen.update_ms - chosen.parameter_copy_ms, 0) + " ms" + copies +
           ", optimizer update " + fixed(chosen.update_ms, 0) + " ms)" + busy_host_note(facts.load) + "\n\n";
  table += "  " + left("states on the device", 30) + right("parameters", 11) + right("micro-batches", 14) +
           right("activation budget", 18) + right("device memory", 15) + right("host memory", 14) +
           right("predicted step", 16);
  for (std::size_t i = 0; i < options.size(); ++i) {
    table.push_back('\n');
    table += option_row(options[i], i == chosen_index, batch.rows);
  }
  return table;
}

std::string no_fit_message(const std::vector<FitOption>& options, const FitMemory& memory, std::int64_t unplanned,
                           const std::string& states_kept_because, const std::string& tried,
                           const std::string& whole) {
  std::string lines;
  bool host_short = false;
  const FitOption* least_on_host = nullptr;  // of the options the host refused with the parameters there
  for (const FitOption& option : options) {
    lines += "  " + percent(option.fraction) + " of the states on the device";
    if (option.parameters_on_host) lines += ", the blocks' parameters on the host";
    if (option.micro_batches > 1) {
      lines += ", " + std::to_string(option.micro_batches) + " micro-batches of " + std::to_string(option.micro_rows) +
               " rows";
    }
    lines += " (room for the step " + bytes_text(option.activation_budget) +
             "): " + (option.reason.empty() ? "fits here, not on every rank" : option.reason) + "\n";
    const bool refused_by_host = option.reason.find("the host cannot") != std::string::npos;
    host_short = host_short || refused_by_host;
    if (refused_by_host && option.parameters_on_host &&
        (least_on_host == nullptr || option.host_bytes < least_on_host->host_bytes)) {
      least_on_host = &option;
    }
  }
  if (least_on_host != nullptr) {
    lines += "  (with the blocks' parameters on the host, the host is what bounds the step: it would need " +
             bytes_text(least_on_host->host_bytes) + " there; give the process more host memory (host_budget=, "
             "the cgroup's limit) or train a smaller model)\n";
  }
  if (!states_kept_because.empty()) lines += "  (the states cannot move to host memory: " + states_kept_because + ")\n";
  if (!tried.empty()) lines += "  (tried before training: " + tried + ")\n";
  if (!whole.empty()) lines += "  (the batch runs whole: " + whole + ")\n";
  return "stowage.fit: the step does not fit in " + bytes_text(memory.usable) + " usable (" +
         bytes_text(memory.in_use) + " in use before it, states " + bytes_text(memory.states()) + ", gradients " +
         bytes_text(memory.gradients) + ", the step adding " + bytes_text(unplanned) +
         " unplanned) with any share of optimizer states on the device:\n" + lines +
         "Train on a smaller batch or sequence, or on a larger device" + (host_short ? ", or give the offloaded states more host memory." : ".");
}

}  // namespace stowage::planner
