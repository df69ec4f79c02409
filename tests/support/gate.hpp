// A stream gate for tests: a host function that blocks its stream until open() is called.
#pragma once

#include <functional>
#include <future>

namespace stowage::testing {

class Gate {
 public:
  Gate() : opened_(promise_.get_future().share()) {}
  // A host function to enqueue: it returns once the gate is open.
  std::function<void()> blocker() const {
    return [opened = opened_] { opened.wait(); };
  }
  void open() { promise_.set_value(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_;
};

}  // namespace stowage::testing
