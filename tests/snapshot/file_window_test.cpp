// FileWindow: a large file read as the machine goes gives its bytes as they were, fills ahead of
// the reader, and refuses a file that shrinks or changes while it is read (never a SIGBUS).
#include "snapshot/file_window.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "snapshot/refusal.hpp"

namespace stowage::snapshot {
namespace {

class FileWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() / ("file_window_test." + std::to_string(::getpid()));
    for (std::size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = static_cast<std::uint8_t>(i * 7 + i / 251);
    write(bytes_);
  }
  void TearDown() override { std::filesystem::remove(path_); }
  void write(const std::vector<std::uint8_t>& bytes) const {
    std::ofstream(path_, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }

  std::filesystem::path path_;
  std::vector<std::uint8_t> bytes_ = std::vector<std::uint8_t>(1 << 20);
};

TEST_F(FileWindowTest, GivesTheFileAsItIsFillingAheadAndGivingBackBehind) {
  const auto window = FileWindow::open(path_.string(), 4096);
  ASSERT_NE(window, nullptr);
  ASSERT_EQ(window->size(), bytes_.size());
  std::size_t read = 0;
  while (read < bytes_.size()) {
    const std::size_t filled = window->fill(read + 1);
    ASSERT_GE(filled, std::min(bytes_.size(), read + 4096));  // fill_ahead beyond what is read
    ASSERT_TRUE(std::equal(bytes_.begin() + static_cast<std::ptrdiff_t>(read),
                           bytes_.begin() + static_cast<std::ptrdiff_t>(filled), window->data() + read));
    window->release(filled);
    read = filled;
  }
  window->rewind();  // and again from the start
  EXPECT_EQ(window->fill(bytes_.size()), bytes_.size());
  EXPECT_TRUE(std::equal(bytes_.begin(), bytes_.end(), window->data()));
}

TEST_F(FileWindowTest, AFileThatShrinksOrIsRewrittenWhileItIsReadIsRefused) {
  auto window = FileWindow::open(path_.string(), 4096);
  ASSERT_NE(window, nullptr);
  window->fill(1);
  std::filesystem::resize_file(path_, bytes_.size() / 2);  // as _dump_snapshot truncates, then writes
  try {
    window->fill(bytes_.size());
    FAIL() << "a shrunk file was read";
  } catch (const Refused& refused) {
    EXPECT_EQ(refused.message(), "the file changed while it was read");
  }
  window = FileWindow::open(path_.string(), 4096);
  ASSERT_NE(window, nullptr);
  std::filesystem::resize_file(path_, bytes_.size() * 2);  // grown: its size changed
  EXPECT_THROW(window->fill(1), Refused);
  EXPECT_THROW(window->rewind(), Refused);
}

TEST_F(FileWindowTest, AFileThatCannotBeOpenedIsRefusedNamingWhy) {
  try {
    (void)FileWindow::open((path_ / "missing").string(), 4096);
    FAIL() << "opened a file that is not there";
  } catch (const Refused& refused) {
    EXPECT_EQ(refused.message().rfind("cannot read: ", 0), 0U) << refused.message();
  }
}

}  // namespace
}  // namespace stowage::snapshot
