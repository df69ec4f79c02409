"""stowage's CUDA integration where CI can check it, without a GPU: the torch allocator and the C
library build and load, their symbols resolve, the version check holds, and the .pth hook does
nothing unless STOWAGE_ALLOC_CONF is set (and never imports torch itself). tests/gpu/python runs
the rest on a GPU."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage import _torch  # noqa: E402

TOOLKIT = shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()
needs_cuda_build = pytest.mark.skipif(not _torch.has_cuda, reason="built without the CUDA toolkit")
HAS_GPU = torch.cuda.device_count() > 0  # (does not initialise CUDA)
# Without a device, enable() refuses and installs nothing (tests/python/test_hostile_inputs.py):
# installing needs one.
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="installing the CUDA allocator needs a CUDA device")
NO_DEVICE = "this machine has no CUDA device"


def run_python(code: str, conf: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STOWAGE_ALLOC_CONF"}
    if conf is not None:
        env["STOWAGE_ALLOC_CONF"] = conf
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=300)


def test_a_build_with_the_toolkit_has_the_cuda_allocator() -> None:
    if TOOLKIT and torch.version.cuda is not None:
        assert _torch.has_cuda, "the CUDA toolkit and a CUDA torch are here, but stowage._torch was built without CUDA"


@needs_cuda_build
def test_the_torch_version_is_one_the_allocator_supports() -> None:
    supported = _torch.cuda_torch_versions.split(",")
    assert supported == ["2.11"]
    assert any(torch.__version__.startswith(version + ".") for version in supported)
    assert _torch.built_for_torch == torch.__version__


@needs_cuda_build
def test_the_c_library_loads_with_every_symbol_resolved() -> None:
    path = Path(stowage.c_library_path())
    assert path.name == "libstowage.so" and path.exists()
    library = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    for name in ("stowage_malloc", "stowage_free", "stowage_init", "stowage_reset",
                 "stowage_set_memory_fraction", "stowage_record_stream", "stowage_base_alloc",
                 "stowage_configure", "stowage_last_error"):
        assert hasattr(library, name), name
    torch_library = ctypes.CDLL(str(path.with_name("libstowage_torch.so")), mode=os.RTLD_NOW)
    # The C++ entry point for libtorch programs: stowage::torch_cuda::enable(std::string const&).
    assert hasattr(torch_library, "_ZN7stowage10torch_cuda6enableERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE")


@needs_cuda_build
def test_the_c_library_reports_failures_instead_of_crashing() -> None:
    result = run_python(f"""
        import ctypes, torch
        lib = ctypes.CDLL({stowage.c_library_path()!r})
        lib.stowage_malloc.restype = ctypes.c_void_p
        lib.stowage_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.stowage_last_error.restype = ctypes.c_char_p
        lib.stowage_configure.argtypes = [ctypes.c_char_p]
        assert lib.stowage_configure(b"bogus:1") != 0
        print(lib.stowage_last_error().decode())
        assert lib.stowage_configure(b"reserve_headroom:0.1") == 0
        assert lib.stowage_configure(b"reserve_headroom:0.1") == 0
        assert lib.stowage_configure(b"") != 0
        print(lib.stowage_last_error().decode())
        devices = torch.cuda.device_count()
        ptr = lib.stowage_malloc(1024, devices, None)   # one past the last device
        assert ptr is None
        print(lib.stowage_last_error().decode())
        lib.stowage_free(None, 0, 0, None)
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "unknown key 'bogus'" in lines[0]
    assert "already configured" in lines[1]
    assert "does not exist" in lines[2]
    assert lines[-1] == "ok"


def test_the_pth_hook_does_nothing_without_the_variable() -> None:
    result = run_python("""
        import sys
        print(sorted(m for m in ("torch", "stowage", "stowage._autoload") if m in sys.modules))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@needs_cuda_build
def test_the_pth_hook_installs_stowage_when_torch_is_imported_and_not_before() -> None:
    result = run_python("""
        import sys
        print("torch" in sys.modules, "stowage._autoload" in sys.modules)
        import torch
        from stowage import _torch
        print(_torch.cuda_enabled(), _torch.cuda_configuration())
    """, conf="reserve_headroom:0.1")
    assert result.returncode == 0, result.stderr
    if HAS_GPU:
        assert result.stdout.splitlines() == ["False True", "True reserve_headroom:0.1"]
    else:  # the hook ran when torch was imported, and found no device
        assert result.stdout.splitlines() == ["False True", "False "]
        assert NO_DEVICE in result.stderr


# A stand-in for the CUDA driver (libcuda.so.1) that notes every call made into it, and one for
# NVML that reports one device: torch.cuda.device_count() then says 1 without the driver.
FAKE_DRIVER = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void note(const char* what) {
  int fd = open(getenv("FAKE_DRIVER_CALLS"), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  if (write(fd, what, strlen(what)) < 0 || write(fd, "\n", 1) < 0) {}
  close(fd);
}
int cuInit(unsigned flags) { (void)flags; note("cuInit"); return 100; }
int cuDriverGetVersion(int* version) { note("cuDriverGetVersion"); *version = 13000; return 0; }
int cuDeviceGetCount(int* count) { note("cuDeviceGetCount"); *count = 0; return 3; }
int cuGetProcAddress(const char* symbol, void** fn, int version, unsigned long long flags) {
  (void)version; (void)flags; note("cuGetProcAddress"); note(symbol); *fn = NULL; return 500;
}
int cuGetProcAddress_v2(const char* symbol, void** fn, int version, unsigned long long flags, void* status) {
  (void)version; (void)flags; (void)status; note("cuGetProcAddress_v2"); note(symbol); *fn = NULL; return 500;
}
int cuGetExportTable(const void** table, const void* id) { (void)id; note("cuGetExportTable"); *table = NULL; return 500; }
"""
FAKE_NVML = """
int nvmlInit(void) { return 0; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned* count) { *count = 1; return 0; }
"""


@needs_cuda_build
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the stand-in driver")
def test_import_torch_with_the_variable_set_calls_no_cuda_driver_function(tmp_path: Path) -> None:
    """torch initialises CUDA lazily, so a process that has not used CUDA can fork children that
    do (DataLoader workers); STOWAGE_ALLOC_CONF installs stowage at `import torch`, which must
    call into the driver no more than torch does: not at all (test_cuda.py's test_lazy_init and
    test_is_pinned_no_context check it on a GPU)."""
    for name, source in (("libcuda.so.1", FAKE_DRIVER), ("libnvidia-ml.so.1", FAKE_NVML)):
        (tmp_path / f"{name}.c").write_text(source)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / name), str(tmp_path / f"{name}.c")],
                       check=True)
    calls = tmp_path / "calls"
    env = {k: v for k, v in os.environ.items() if k != "STOWAGE_ALLOC_CONF"}
    env.update(STOWAGE_ALLOC_CONF="", FAKE_DRIVER_CALLS=str(calls),
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("LD_LIBRARY_PATH")])))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, torch
        from stowage import _torch
        x = torch.randn(10)
        print(torch.cuda.device_count(), _torch.cuda_enabled(), torch.cuda.is_initialized(), x.is_pinned())
        print(os.path.exists({str(calls)!r}))
        torch._C._cuda_getDeviceCount()  # a CUDA runtime call: the stand-in driver notes it
        print(os.path.exists({str(calls)!r}))
    """)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    noted = calls.read_text().split() if calls.exists() else []
    assert result.stdout.splitlines()[:2] == ["1 True False False", "False"], (result.stdout, noted)
    assert result.stdout.splitlines()[2] == "True", "the stand-in driver notes nothing: the check checks nothing"


@needs_cuda_build
def test_a_bad_configuration_in_the_variable_fails_import_torch_with_stowages_message() -> None:
    result = run_python("import torch", conf="virtual_memory:sometimes")
    assert result.returncode != 0
    assert "virtual_memory" in result.stderr and "sometimes" in result.stderr


@needs_cuda_build
@needs_gpu
def test_enable_installs_the_allocator_and_refuses_another_configuration() -> None:
    result = run_python("""
        import torch, stowage
        stowage.enable()
        print(stowage.is_enabled(), torch.cuda.is_initialized())
        stowage.enable("")
        try:
            stowage.enable("reserve_headroom:0.5")
        except RuntimeError as error:
            print("refused:", error)
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "True False"
    assert lines[1].startswith("refused:") and "cannot change" in lines[1]


def test_enable_rejects_an_unknown_device() -> None:
    with pytest.raises(ValueError, match="device"):
        stowage.enable(device="tpu")


@needs_cuda_build
@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_the_allocator_is_in_the_process_once() -> None:
    """stowage._torch and libstowage_torch.so use libstowage.so's allocator: a second copy of
    its code (and its statics) in the same process corrupts state."""
    package = Path(stowage.c_library_path()).parent
    for module in [*package.glob("_torch*.so"), package / "libstowage_torch.so"]:
        defined = subprocess.run(["nm", "-DC", "--defined-only", str(module)], capture_output=True,
                                 text=True, check=True).stdout
        assert "stowage::CachingAllocator::malloc" not in defined, module.name
        assert "stowage::cuda_allocators::get" not in defined, module.name


@needs_cuda_build
@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_the_libraries_share_the_process_libstdcxx() -> None:
    """A toolchain that links libstdc++ statically gives each library its own locale tables,
    which clash with torch's (number formatting then crashes): every library python loads must
    use the shared libstdc++."""
    package = Path(stowage.c_library_path()).parent
    for module in [*package.glob("_*.so"), package / "libstowage.so", package / "libstowage_torch.so"]:
        needed = subprocess.run(["ldd", str(module)], capture_output=True, text=True, check=True).stdout
        assert "libstdc++" in needed, f"{module.name} links libstdc++ statically"


@needs_cuda_build
def test_the_hook_survives_a_find_spec_for_torch() -> None:
    """Libraries check for torch with importlib.util.find_spec before importing it."""
    result = run_python("""
        import importlib.util
        assert importlib.util.find_spec("torch") is not None
        import torch
        from stowage import _torch
        print(_torch.cuda_enabled())
    """, conf="")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(HAS_GPU)
    assert HAS_GPU or NO_DEVICE in result.stderr  # the hook ran: it found no device


@needs_cuda_build
def test_the_c_library_takes_the_variable_only_without_a_configuration() -> None:
    # (No torch here: with the variable set, importing torch would install stowage with it.)
    result = run_python(f"""
        import ctypes
        lib = ctypes.CDLL({stowage.c_library_path()!r})
        lib.stowage_malloc.restype = ctypes.c_void_p
        lib.stowage_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.stowage_last_error.restype = ctypes.c_char_p
        assert lib.stowage_configure(b"reserve_headroom:0.1") == 0
        lib.stowage_malloc(1024, 0, None)
        print(lib.stowage_last_error().decode())
    """, conf="reserve_headroom:0.5")
    assert result.returncode == 0, result.stderr
    # No GPU here: the failure is the missing device, not a configuration conflict.
    assert "already configured" not in result.stdout
    assert "does not exist" in result.stdout


@needs_cuda_build
@needs_gpu
def test_disable_in_cuda_mode_says_why_it_cannot() -> None:
    result = run_python("""
        import torch, stowage
        stowage.enable()
        try:
            stowage.disable()
        except RuntimeError as error:
            print("refused:", error)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused:") and "rest of this process" in result.stdout
