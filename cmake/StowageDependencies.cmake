# Finds what the build needs and decides the AUTO options. Every dependency comes from Debian's
# packages or from the virtual environment that tools/bootstrap prepares; nothing is vendored.
find_package(Threads REQUIRED)
# Boost.Intrusive (headers only) indexes the allocator's blocks without allocating.
find_package(Boost 1.74 REQUIRED)

# --- CUDA: CudaBackend needs the runtime headers and libcudart only (never libcuda). ---
set(STOWAGE_HAVE_CUDA OFF)
if(STOWAGE_WITH_CUDA STREQUAL "ON")
  find_package(CUDAToolkit REQUIRED)
  set(STOWAGE_HAVE_CUDA ON)
elseif(STOWAGE_WITH_CUDA STREQUAL "AUTO")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(STOWAGE_HAVE_CUDA ON)
  endif()
elseif(NOT STOWAGE_WITH_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "STOWAGE_WITH_CUDA must be ON, OFF or AUTO, not '${STOWAGE_WITH_CUDA}'")
endif()
set(STOWAGE_CUDA_VERSION "")
if(STOWAGE_HAVE_CUDA)
  set(STOWAGE_CUDA_VERSION "${CUDAToolkit_VERSION}")
endif()

# --- torch: found through the one Python the build uses (pass -DPython3_EXECUTABLE=...). ---
set(STOWAGE_HAVE_TORCH OFF)
set(STOWAGE_TORCH_VERSION "none")
if(NOT STOWAGE_WITH_TORCH STREQUAL "OFF")
  if(NOT STOWAGE_WITH_TORCH STREQUAL "ON" AND NOT STOWAGE_WITH_TORCH STREQUAL "AUTO")
    message(FATAL_ERROR "STOWAGE_WITH_TORCH must be ON, OFF or AUTO, not '${STOWAGE_WITH_TORCH}'")
  endif()
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "import os, torch; print(torch.__version__, torch.utils.cmake_prefix_path, os.path.dirname(torch.__file__), sep=';', end='')"
      OUTPUT_VARIABLE _stowage_torch RESULT_VARIABLE _stowage_torch_status ERROR_QUIET)
    if(_stowage_torch_status EQUAL 0)
      list(GET _stowage_torch 0 STOWAGE_TORCH_VERSION)
      list(GET _stowage_torch 1 STOWAGE_TORCH_CMAKE_PREFIX_PATH)
      list(GET _stowage_torch 2 STOWAGE_TORCH_DIR)  # the torch package: include/ and lib/
      set(STOWAGE_HAVE_TORCH ON)
    endif()
  endif()
  if(STOWAGE_WITH_TORCH STREQUAL "ON" AND NOT STOWAGE_HAVE_TORCH)
    message(FATAL_ERROR "STOWAGE_WITH_TORCH=ON but '${Python3_EXECUTABLE}' cannot import torch: run tools/bootstrap")
  endif()
endif()

# --- offload: hwloc places pinned host memory on the GPU's NUMA node. Found by path rather than
# pkg-config so a prefix of unpacked Debian packages (tests/gpu/run.sh) works as well. ---
find_path(STOWAGE_HWLOC_INCLUDE_DIR hwloc.h)
find_library(STOWAGE_HWLOC_LIBRARY hwloc)
if(NOT STOWAGE_HWLOC_INCLUDE_DIR OR NOT STOWAGE_HWLOC_LIBRARY)
  message(FATAL_ERROR "hwloc not found (Debian: libhwloc-dev): run tools/bootstrap")
endif()
add_library(stowage::hwloc UNKNOWN IMPORTED)
set_target_properties(stowage::hwloc PROPERTIES
  IMPORTED_LOCATION "${STOWAGE_HWLOC_LIBRARY}"
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${STOWAGE_HWLOC_INCLUDE_DIR}"
  INTERFACE_INCLUDE_DIRECTORIES "${STOWAGE_HWLOC_INCLUDE_DIR}")

if(STOWAGE_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(STOWAGE_BUILD_BENCHMARKS AND NOT STOWAGE_SANITIZER)
  find_package(benchmark REQUIRED)
endif()
