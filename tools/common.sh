# Shared by the tools/ scripts: where things live. Source it; it defines variables only and
# works before python3 is installed (tools/bootstrap installs it, then calls stowage_find_venv).
STOWAGE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STOWAGE_HOME="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
STOWAGE_CACHE="${XDG_CACHE_HOME:-$STOWAGE_HOME/.cache}"
STOWAGE_JOBS="${STOWAGE_JOBS:-$(nproc)}"
export CCACHE_DIR="${CCACHE_DIR:-$STOWAGE_CACHE/ccache}"
# Paths inside the clone are hashed relative to it, so every clone (CI's fresh ones included)
# shares one warm cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$STOWAGE_ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"

# The one Python: the python3 on PATH, asked from the clone's root (so a pyenv .python-version
# elsewhere cannot change the answer). The virtual environment is built from it and kept outside
# the clone, one per Python version, so a fresh clone (and CI) reuses the installed torch.
stowage_find_venv() {
  STOWAGE_VENV_PYTHON=""
  command -v python3 >/dev/null 2>&1 || return 0
  local version
  version="$(cd "$STOWAGE_ROOT" && python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  STOWAGE_VENV="${STOWAGE_VENV:-$STOWAGE_CACHE/stowage/venv-py$version}"
  STOWAGE_VENV_PYTHON="$STOWAGE_VENV/bin/python"
}
stowage_find_venv
