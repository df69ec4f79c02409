#include "offload/update_queue.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <sstream>

#include "device/numa_topology.hpp"

namespace stowage::offload {

namespace {

// Binds the calling thread to `cpus`; a cpuset that changed since leaves it where it is.
void place_on(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(static_cast<std::size_t>(cpu), &set);
  }
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(static_cast<std::size_t>(cpu), &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}.
std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::istringstream parts(text);
  std::string part;
  while (std::getline(parts, part, ',')) {
    if (part.empty()) continue;
    const std::size_t dash = part.find('-');
    const int first = std::stoi(part.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace

std::vector<int> cpus_near(const std::string& pci_bus_id) {
  const std::vector<int> allowed = allowed_cpus();
  if (pci_bus_id.empty()) return allowed;
  std::vector<int> near;
  try {
    const NumaTopology topology = read_numa_topology({pci_bus_id});
    if (topology.pci_devices.empty() || !topology.pci_devices.front().found) return allowed;
    for (const int cpu : parse_cpu_list(topology.pci_devices.front().cpus)) {
      if (std::find(allowed.begin(), allowed.end(), cpu) != allowed.end()) near.push_back(cpu);
    }
  } catch (const std::exception&) {  // no hwloc topology, or a bus id it does not parse
    return allowed;
  }
  return near.empty() ? allowed : near;
}

void UpdateTicket::take() {
  if (error_ == nullptr) return;
  const std::exception_ptr error = std::exchange(error_, nullptr);
  std::rethrow_exception(error);
}

UpdateQueue::UpdateQueue(std::vector<int> cpus)
    : cpus_(std::move(cpus)), thread_([this](const std::stop_token& stop) { serve(stop); }) {}

UpdateQueue::~UpdateQueue() {
  thread_.request_stop();
  wake_.notify_all();
  thread_.join();  // serve() drains the queue before it returns
}

std::shared_ptr<UpdateTicket> UpdateQueue::submit(std::function<void()> job) {
  auto ticket = std::make_shared<UpdateTicket>();
  {
    std::scoped_lock lock(mutex_);
    jobs_.emplace_back(std::move(job), ticket);
  }
  wake_.notify_one();
  return ticket;
}

void UpdateQueue::serve(const std::stop_token& stop) {
  place_on(cpus_);
  while (true) {
    std::pair<std::function<void()>, std::shared_ptr<UpdateTicket>> next;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, stop, [&] { return !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopped, nothing left
      next = std::move(jobs_.front());
      jobs_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      next.first();
    } catch (...) {
      next.second->error_ = std::current_exception();
    }
    busy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    next.first = nullptr;  // what the job held goes before the ticket says it is done
    next.second->done_.store(true, std::memory_order_release);
  }
}

}  // namespace stowage::offload
