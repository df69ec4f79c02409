# Shared by the tools/ scripts: where things live. Source it; it defines variables only.
STOWAGE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The one Python: the python3 on PATH. The virtual environment is built from it and kept outside
# the clone, one per Python version, so a fresh clone (and CI) reuses the installed torch.
STOWAGE_PYTHON_VERSION="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
STOWAGE_VENV="${STOWAGE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/stowage/venv-py${STOWAGE_PYTHON_VERSION}}"
STOWAGE_VENV_PYTHON="$STOWAGE_VENV/bin/python"
STOWAGE_JOBS="${STOWAGE_JOBS:-$(nproc)}"
export CCACHE_DIR="${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ccache}"
# Paths inside the clone are hashed relative to it, so every clone (CI's fresh ones included)
# shares one warm cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$STOWAGE_ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
